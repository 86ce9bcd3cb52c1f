//! `scaled_dot_product_attention` whole on the GPU, through cuDNN's fused attention (the kernel
//! PyTorch's `scaled_dot_product_attention` picks for bf16 and f16 on Hopper).
//!
//! cuDNN 9 takes attention as a graph of its backend API: the product `q k^T`, the scale, the
//! causal mask (row and column indices compared, the masked scores set to `-inf`), the softmax
//! (maximum, subtraction, exponential, sum, the rows' log-sum-exp, division; scores and
//! statistics in `f32`, the probabilities rounded to the operands' dtype for the second
//! product) and the product with `v`, which its fusion engine runs as one flash-attention
//! kernel. This module builds that
//! graph (as NVIDIA's cudnn-frontend does for cuDNN before 9.21), asks cuDNN's heuristic for an
//! engine when the plan is compiled, and runs it on the run's stream, with a workspace per
//! stream. A shape, dtype or library cuDNN cannot run goes to the generated flash-attention
//! kernel (`flash_attention.rs`) where that one takes it, else to the decomposition;
//! [`fused_attention`] says whether cuDNN was found.
//!
//! `scaled_dot_product_attention_backward` runs as two graphs: the forward again, now writing
//! the rows' log-sum-exp (the plan's forward does not keep it), then cudnn-frontend's SDPA
//! backward graph (`rowsum(do * o)`, the probabilities from `q k^T` and the statistics, `dv = p^T
//! do`, `ds = p (do v^T - rowsum) scale`, `dk = ds^T q`, `dq = ds k` accumulated in `f32`), which
//! the fusion engine runs as a flash-attention backward kernel. The recomputed result, the
//! statistics and the `f32` accumulator live in the per-stream workspace (about 40 MB at GPT-2's
//! shape, batch 8). What cuDNN does not run here (f32; cuDNN before 9.10.2; heads not a multiple
//! of 8; before 9.16, key lengths not a multiple of 128; one query and one key) runs through the
//! generated flash-attention backward (`flash_attention_backward.rs`) where that one takes it
//! (f32, heads a multiple of 16 up to 64), else as its decomposition.
//!
//! cudarc loads `libcudnn.so.9` at run time; nothing here calls it before
//! [`library`] has found it.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};

use smallvec::SmallVec;

use cudarc::cudnn::sys;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

use super::device::{address, CudaDevice};
use super::device_checks::BufferLengths;
use super::stream_workspaces::StreamWorkspaces;
use crate::core::ir::{prims, DType, PackedHeads};
use crate::core::plan::{packing, DeviceBuffer, DeviceKernel, OpView};
use crate::error::{Error, Result};

use sys::cudnnBackendAttributeName_t as Attr;
use sys::cudnnBackendAttributeType_t as Type;
use sys::cudnnBackendDescriptorType_t as Kind;
use sys::cudnnDataType_t as Data;

/// The cuDNN version found (for example 91900 for 9.19.0), or why fused attention cannot run.
///
/// ```
/// # #[cfg(feature = "cuda")] {
/// match boundscope::executors::cuda::fused_attention() {
///     Ok(version) => println!("attention runs through cuDNN {version}"),
///     Err(why) => println!("attention runs decomposed: {why}"),
/// }
/// # }
/// ```
///
/// # Errors
/// Why not: no `libcudnn.so.9` on the library path, or a cuDNN older than 9.0.
pub fn fused_attention() -> std::result::Result<usize, String> {
    library().clone()
}

/// Whether cuDNN can be loaded, and its version: checked once per process.
pub(crate) fn library() -> &'static std::result::Result<usize, String> {
    static FOUND: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    FOUND.get_or_init(|| {
        // SAFETY: only tries to load the library; cudarc's loader panics on a call without it.
        if !unsafe { sys::is_culib_present() } {
            return Err("no cuDNN library (libcudnn.so.9) was found on the library path".into());
        }
        // SAFETY: the library is present; `cudnnGetVersion` takes no argument.
        let version = unsafe { sys::cudnnGetVersion() };
        if version < 90000 {
            return Err(format!("cuDNN {version} is older than 9.0, whose graph API this uses"));
        }
        Ok(version)
    })
}

/// The operands of a built-in `scaled_dot_product_attention` of one float dtype: q `[...,
/// q_tokens, head]`, k `[..., kv_tokens, head]`, v `[..., kv_tokens, v_head]`, the leading
/// dimensions folded into `batch` (all but the last) and `heads` (the last); or of a
/// `qkv_attention`, whose q, k and v are `packed` side by side in one `[..., tokens, 3 * heads *
/// head]` tensor and whose result is `[..., tokens, heads * head]`. Shared by the cuDNN plan and
/// the generated kernel (`flash_attention.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttentionOperands {
    pub batch: usize,
    pub heads: usize,
    pub q_tokens: usize,
    pub kv_tokens: usize,
    pub head: usize,
    pub v_head: usize,
    pub dtype: DType,
    pub causal: bool,
    pub scale: f32,
    /// q, k and v side by side in one tensor, the result's heads side by side (`qkv_attention`).
    pub packed: bool,
}

impl AttentionOperands {
    /// `None` for any op but `scaled_dot_product_attention` and `qkv_attention`, mixed or
    /// integer dtypes, or ranks below 2.
    pub fn of(op: &OpView<'_>) -> Option<Self> {
        match op.symbol().builtin_composite()? {
            prims::SCALED_DOT_PRODUCT_ATTENTION => Self::read(op, 3),
            prims::QKV_ATTENTION => Self::read_packed(op, 1),
            _ => None,
        }
    }

    /// The forward's operands of a `scaled_dot_product_attention_backward(q, k, v, grad,
    /// scale, causal)` or a `qkv_attention_backward(qkv, grad, [heads], scale, causal)`; `None`
    /// as [`of`](Self::of).
    pub fn of_backward(op: &OpView<'_>) -> Option<Self> {
        match op.symbol().builtin_composite()? {
            prims::SCALED_DOT_PRODUCT_ATTENTION_BACKWARD => Self::read(op, 4),
            prims::QKV_ATTENTION_BACKWARD => Self::read_packed(op, 2),
            _ => None,
        }
    }

    /// The one float dtype of `op`'s tensors.
    fn dtype(op: &OpView<'_>) -> Option<DType> {
        let dtypes = op.dtypes();
        let dtype = *dtypes.first()?;
        (dtype.is_float() && dtypes.iter().all(|d| *d == dtype)).then_some(dtype)
    }

    /// A `qkv_attention` (or its backward) whose heads count is argument `heads`, followed by
    /// the scale and the causal flag.
    fn read_packed(op: &OpView<'_>, heads: usize) -> Option<Self> {
        let dtype = Self::dtype(op)?;
        let split = PackedHeads::of(op.input_shape(0).ok()?, op.dims(heads).ok()?).ok()?;
        Some(Self {
            batch: split.batch.iter().product(),
            heads: split.heads,
            q_tokens: split.tokens,
            kv_tokens: split.tokens,
            head: split.head,
            v_head: split.head,
            dtype,
            causal: op.scalar(heads + 2).ok()? != 0.0,
            scale: op.scalar(heads + 1).ok()?,
            packed: true,
        })
    }

    /// A `scaled_dot_product_attention` (or its backward) whose scale is argument `scalars`.
    fn read(op: &OpView<'_>, scalars: usize) -> Option<Self> {
        let dtype = Self::dtype(op)?;
        let (q, k, v) = (op.input_shape(0).ok()?, op.input_shape(1).ok()?, op.input_shape(2).ok()?);
        let rank = q.len();
        if rank < 2 || k.len() != rank || v.len() != rank {
            return None;
        }
        let (batch, heads) = match q[..rank - 2].split_last() {
            Some((&heads, rest)) => (rest.iter().product(), heads),
            None => (1, 1),
        };
        Some(Self {
            batch,
            heads,
            q_tokens: q[rank - 2],
            kv_tokens: k[rank - 2],
            head: q[rank - 1],
            v_head: v[rank - 1],
            dtype,
            causal: op.scalar(scalars + 1).ok()? != 0.0,
            scale: op.scalar(scalars).ok()?,
            packed: false,
        })
    }

    /// Elements of `tokens` rows of `head` values in every `(batch, head)` plane.
    pub fn elements(&self, tokens: usize, head: usize) -> usize {
        self.batch * self.heads * tokens * head
    }

    /// Bytes between the starts of q, k and v in one buffer (and of dq, dk and dv): each
    /// part's elements when they are packed one after the other (`scaled_dot_product_attention
    /// _backward`'s result), a row's width of a part when side by side (`qkv_attention`).
    pub fn part_bytes(&self, tokens: usize, head: usize) -> u64 {
        let elements = if self.packed { self.heads * self.head } else { self.elements(tokens, head) };
        (elements * self.dtype.size_bytes()) as u64
    }

    /// Elements between the starts of q, k and v (0 when they are separate tensors).
    pub fn part_offset(&self) -> usize {
        if self.packed {
            self.heads * self.head
        } else {
            0
        }
    }

    /// The strides, in elements, of q, k or v (`tokens` rows of `head` values) seen as `[batch,
    /// heads, tokens, head]`: the batch stride, the heads stride and the row stride (the last
    /// axis is contiguous). Packed parts all have the query's tokens and head size, and rows
    /// `3 * heads * head` apart.
    pub fn qkv_strides(&self, tokens: usize, head: usize) -> [usize; 3] {
        if self.packed {
            let width = 3 * self.heads * self.head;
            [self.q_tokens * width, self.head, width]
        } else {
            [self.heads * tokens * head, tokens * head, head]
        }
    }

    /// The strides of the result (and its gradient), as [`qkv_strides`](Self::qkv_strides).
    pub fn o_strides(&self) -> [usize; 3] {
        if self.packed {
            let width = self.heads * self.v_head;
            [self.q_tokens * width, self.v_head, width]
        } else {
            [self.heads * self.q_tokens * self.v_head, self.q_tokens * self.v_head, self.v_head]
        }
    }
}

/// What one attention computes: `[batch, heads, tokens, head]` operands (the leading dimensions
/// of the op's tensors folded into `batch` and `heads`), one 16-bit dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttentionShape {
    batch: usize,
    heads: usize,
    q_tokens: usize,
    kv_tokens: usize,
    head: usize,
    v_head: usize,
    dtype: DType,
    causal: bool,
    /// The scale's bits, so that shapes compare exactly.
    scale: u32,
    /// q, k and v in one tensor, the result's heads side by side (`qkv_attention`).
    packed: bool,
}

impl AttentionShape {
    /// The shape of a built-in `scaled_dot_product_attention` on bf16 or f16 operands of one
    /// dtype; `None` for anything else.
    pub fn of(op: &OpView<'_>) -> Option<Self> {
        Self::from_operands(AttentionOperands::of(op)?)
    }

    /// The forward's shape of a built-in `scaled_dot_product_attention_backward`, as [`of`](Self::of).
    pub fn of_backward(op: &OpView<'_>) -> Option<Self> {
        Self::from_operands(AttentionOperands::of_backward(op)?)
    }

    fn from_operands(a: AttentionOperands) -> Option<Self> {
        let shape = Self {
            batch: a.batch,
            heads: a.heads,
            q_tokens: a.q_tokens,
            kv_tokens: a.kv_tokens,
            head: a.head,
            v_head: a.v_head,
            dtype: a.dtype,
            causal: a.causal,
            scale: a.scale.to_bits(),
            packed: a.packed,
        };
        let sizes = [shape.batch, shape.heads, shape.q_tokens, shape.kv_tokens, shape.head, shape.v_head];
        (matches!(a.dtype, DType::BF16 | DType::F16) && sizes.iter().all(|&x| x > 0)).then_some(shape)
    }

    fn elements(&self, tokens: usize, head: usize) -> usize {
        self.operands().elements(tokens, head)
    }

    fn operands(&self) -> AttentionOperands {
        AttentionOperands {
            batch: self.batch,
            heads: self.heads,
            q_tokens: self.q_tokens,
            kv_tokens: self.kv_tokens,
            head: self.head,
            v_head: self.v_head,
            dtype: self.dtype,
            causal: self.causal,
            scale: f32::from_bits(self.scale),
            packed: self.packed,
        }
    }

    /// cuDNN's strides of q, k or v (`tokens` rows of `head`), or of their gradients.
    fn part_strides(&self, tokens: usize, head: usize) -> [i64; 4] {
        let [b, h, row] = self.operands().qkv_strides(tokens, head);
        [b as i64, h as i64, row as i64, 1]
    }

    /// cuDNN's strides of the result and its gradient.
    fn o_strides(&self) -> [i64; 4] {
        let [b, h, row] = self.operands().o_strides();
        [b as i64, h as i64, row as i64, 1]
    }

    /// [`AttentionOperands::part_bytes`].
    fn part_bytes(&self, tokens: usize, head: usize) -> u64 {
        self.operands().part_bytes(tokens, head)
    }

    /// Whether k and v (and dk and dv) start a multiple of 16 bytes after q (and dq), as the
    /// graph's tensors declare (for packed parts: a part's width, `heads * head` values).
    fn parts_aligned(&self) -> bool {
        self.part_bytes(self.q_tokens, self.head).is_multiple_of(16)
            && self.part_bytes(self.kv_tokens, self.head).is_multiple_of(16)
    }

    /// Bytes of the one buffer that holds q, k and v side by side.
    fn qkv_bytes(&self) -> usize {
        3 * self.bytes(self.q_tokens, self.head)
    }

    /// Bytes of a `[batch, heads, tokens, head]` tensor in the operands' dtype.
    fn bytes(&self, tokens: usize, head: usize) -> usize {
        self.elements(tokens, head) * self.dtype.size_bytes()
    }

    /// Bytes of an `f32` tensor of one value per query row (the softmax statistics).
    fn row_bytes(&self) -> usize {
        self.elements(self.q_tokens, 1) * 4
    }

    /// The device buffers `pass` reads and writes, by unique id, and their bytes.
    fn buffers(&self, pass: Pass) -> Vec<(i64, usize)> {
        let (sq, skv, d, dv) = (self.q_tokens, self.kv_tokens, self.head, self.v_head);
        // Packed parts are strided views of one buffer: each tuning buffer holds all of it.
        let part = |tokens: usize, head: usize| if self.packed { self.qkv_bytes() } else { self.bytes(tokens, head) };
        let mut buffers = vec![(Q, part(sq, d)), (K, part(skv, d)), (V, part(skv, dv))];
        buffers.push((O, self.bytes(sq, dv)));
        match pass {
            Pass::Forward => {}
            Pass::Training => buffers.push((STATS, self.row_bytes())),
            Pass::Backward => buffers.extend([
                (DO, self.bytes(sq, dv)),
                (STATS, self.row_bytes()),
                (DQ, part(sq, d)),
                (DK, part(skv, d)),
                (DV, part(skv, dv)),
                (SOFTMAX_SUM, self.row_bytes()),
                (DQ_ACCUM, self.elements(sq, d) * 4),
            ]),
        }
        buffers
    }
}

/// What an attention plan computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// The result `o` of `q`, `k` and `v`.
    Forward,
    /// The result and the rows' softmax statistics (log-sum-exp), which the backward reads.
    Training,
    /// `dq`, `dk` and `dv` from `q`, `k`, `v`, `o`, `do` and the statistics.
    Backward,
}

/// cuDNN's error for `what`, with its last error message.
fn cudnn_error(what: &str, status: sys::cudnnStatus_t) -> String {
    let mut message = [0 as std::ffi::c_char; 512];
    // SAFETY: both calls write at most the given size into buffers they do not keep;
    // `cudnnGetErrorString` returns a static string.
    let (name, last) = unsafe {
        sys::cudnnGetLastErrorString(message.as_mut_ptr(), message.len());
        let name = CStr::from_ptr(sys::cudnnGetErrorString(status)).to_string_lossy().into_owned();
        (name, CStr::from_ptr(message.as_ptr()).to_string_lossy().into_owned())
    };
    if last.is_empty() {
        format!("{what}: {name}")
    } else {
        format!("{what}: {name} ({last})")
    }
}

fn check(what: &str, status: sys::cudnnStatus_t) -> std::result::Result<(), String> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(cudnn_error(what, status))
    }
}

/// A backend descriptor, destroyed when dropped.
struct Descriptor(sys::cudnnBackendDescriptor_t);

impl Descriptor {
    fn new(kind: Kind) -> std::result::Result<Self, String> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one descriptor handle into `raw`.
        check("cudnnBackendCreateDescriptor", unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut raw) })?;
        Ok(Self(raw))
    }

    /// Sets attribute `name` to `values`, each of the C type cuDNN documents for `ty`.
    fn set<T>(&self, name: Attr, ty: Type, values: &[T]) -> std::result::Result<(), String> {
        // SAFETY: `values` holds `values.len()` elements of the type `ty` names (each caller
        // passes the matching Rust type), read during the call only.
        let status = unsafe {
            sys::cudnnBackendSetAttribute(self.0, name, ty, values.len() as i64, values.as_ptr().cast::<c_void>())
        };
        check("cudnnBackendSetAttribute", status).map_err(|e| format!("{e} [{name:?}]"))
    }

    fn set_descriptors(&self, name: Attr, descriptors: &[&Descriptor]) -> std::result::Result<(), String> {
        let raw: Vec<_> = descriptors.iter().map(|d| d.0).collect();
        self.set(name, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    fn finalize(self) -> std::result::Result<Self, String> {
        // SAFETY: a descriptor this module created, with its attributes set.
        check("cudnnBackendFinalize", unsafe { sys::cudnnBackendFinalize(self.0) })?;
        Ok(self)
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: created once by `new` and destroyed once, here.
        unsafe {
            let _ = sys::cudnnBackendDestroyDescriptor(self.0);
        }
    }
}

/// How a tensor of the graph is given.
#[derive(Clone, Copy, PartialEq)]
enum Given {
    /// A device buffer of the variant pack.
    Buffer,
    /// An intermediate that cuDNN keeps on chip.
    Virtual,
    /// A host scalar passed by value.
    Value,
}

/// The unique ids of the variant pack's tensors.
const Q: i64 = 1;
const K: i64 = 2;
const V: i64 = 3;
const O: i64 = 4;
const SCALE: i64 = 5;
const NEG_INF: i64 = 6;
const STATS: i64 = 7;
const DO: i64 = 8;
const DQ: i64 = 9;
const DK: i64 = 10;
const DV: i64 = 11;
/// The backward's `rowsum(do * o)`, written to scratch.
const SOFTMAX_SUM: i64 = 12;
/// The backward's `dq` accumulated in `f32`, in scratch.
const DQ_ACCUM: i64 = 13;
/// By value: 1.0 (the dropout scale the backward's pattern multiplies by).
const ONE: i64 = 14;

/// The descriptors of the graph being built; all are kept as long as its plan.
struct Builder {
    kept: Vec<Descriptor>,
    next_virtual: i64,
}

impl Builder {
    fn keep(&mut self, d: Descriptor) -> usize {
        self.kept.push(d);
        self.kept.len() - 1
    }

    fn tensor(&mut self, uid: Option<i64>, data: Data, dims: &[i64], strides: &[i64], given: Given) -> Res<usize> {
        let uid = uid.unwrap_or_else(|| {
            self.next_virtual += 1;
            self.next_virtual
        });
        let d = Descriptor::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        d.set(Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, Type::CUDNN_TYPE_DATA_TYPE, &[data])?;
        d.set(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, Type::CUDNN_TYPE_INT64, dims)?;
        d.set(Attr::CUDNN_ATTR_TENSOR_STRIDES, Type::CUDNN_TYPE_INT64, strides)?;
        d.set(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, Type::CUDNN_TYPE_INT64, &[uid])?;
        d.set(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, Type::CUDNN_TYPE_INT64, &[16i64])?;
        d.set(Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL, Type::CUDNN_TYPE_BOOLEAN, &[given == Given::Virtual])?;
        if given == Given::Value {
            d.set(Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE, Type::CUDNN_TYPE_BOOLEAN, &[true])?;
        }
        Ok(self.keep(d.finalize()?))
    }

    /// A pointwise operation `y = mode(x[, b][, t])`, computing in `precision`.
    fn pointwise(&mut self, mode: sys::cudnnPointwiseMode_t, precision: Data, axis: Option<i64>, io: Io) -> Res<usize> {
        let pw = Descriptor::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        pw.set(Attr::CUDNN_ATTR_POINTWISE_MODE, Type::CUDNN_TYPE_POINTWISE_MODE, &[mode])?;
        pw.set(Attr::CUDNN_ATTR_POINTWISE_MATH_PREC, Type::CUDNN_TYPE_DATA_TYPE, &[precision])?;
        if let Some(axis) = axis {
            pw.set(Attr::CUDNN_ATTR_POINTWISE_AXIS, Type::CUDNN_TYPE_INT64, &[axis])?;
        }
        let pw = pw.finalize()?;
        let op = Descriptor::new(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[&self.kept[io.x]])?;
        if let Some(b) = io.b {
            op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[&self.kept[b]])?;
        }
        if let Some(t) = io.t {
            op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[&self.kept[t]])?;
        }
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[&self.kept[io.y]])?;
        self.keep(pw);
        Ok(self.keep(op.finalize()?))
    }

    /// A reduction of `x` over its last axis into `y`.
    fn reduction(&mut self, operator: sys::cudnnReduceTensorOp_t, x: usize, y: usize) -> Res<usize> {
        let desc = Descriptor::new(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        desc.set(Attr::CUDNN_ATTR_REDUCTION_OPERATOR, Type::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &[operator])?;
        desc.set(Attr::CUDNN_ATTR_REDUCTION_COMP_TYPE, Type::CUDNN_TYPE_DATA_TYPE, &[Data::CUDNN_DATA_FLOAT])?;
        let desc = desc.finalize()?;
        let op = Descriptor::new(Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[&self.kept[x]])?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[&self.kept[y]])?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&desc])?;
        self.keep(desc);
        Ok(self.keep(op.finalize()?))
    }

    /// A batched product `c = a b`, accumulating in `f32`.
    fn matmul(&mut self, a: usize, b: usize, c: usize) -> Res<usize> {
        let desc = Descriptor::new(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        desc.set(Attr::CUDNN_ATTR_MATMUL_COMP_TYPE, Type::CUDNN_TYPE_DATA_TYPE, &[Data::CUDNN_DATA_FLOAT])?;
        let desc = desc.finalize()?;
        let op = Descriptor::new(Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[&self.kept[a]])?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[&self.kept[b]])?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[&self.kept[c]])?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&desc])?;
        self.keep(desc);
        Ok(self.keep(op.finalize()?))
    }

    /// `y`, the elements of `x` described by `y`'s dimensions and strides (a transposed view,
    /// or a cast to `y`'s dtype).
    fn reshape(&mut self, x: usize, y: usize) -> Res<usize> {
        let op = Descriptor::new(Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[&self.kept[x]])?;
        op.set_descriptors(Attr::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[&self.kept[y]])?;
        Ok(self.keep(op.finalize()?))
    }
}

type Res<T> = std::result::Result<T, String>;

/// A plan, or why cuDNN cannot run its shape.
type Planned = Res<Arc<AttentionPlan>>;

/// The tensors of a pointwise operation (indices into [`Builder::kept`]).
struct Io {
    x: usize,
    b: Option<usize>,
    t: Option<usize>,
    y: usize,
}

impl Io {
    fn unary(x: usize, y: usize) -> Self {
        Self { x, b: None, t: None, y }
    }
    fn binary(x: usize, b: usize, y: usize) -> Self {
        Self { x, b: Some(b), t: None, y }
    }
}

/// The strides of the last two axes swapped: a transposed view.
fn transposed([b, h, row, column]: [i64; 4]) -> [i64; 4] {
    [b, h, column, row]
}

/// Row-major strides of `dims`.
fn contiguous(dims: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

/// cuDNN's handle for one executor, and the workspaces of the streams it ran on.
pub(crate) struct CudnnContext {
    handle: sys::cudnnHandle_t,
    workspaces: StreamWorkspaces,
    /// The CUDA context the handle was made in, kept until the handle is destroyed.
    cuda: Arc<cudarc::driver::CudaContext>,
}

// SAFETY: the handle and buffers are only used under the executor's mutex.
unsafe impl Send for CudnnContext {}

impl CudnnContext {
    fn new(device: &CudaDevice) -> Res<Self> {
        library().clone()?;
        device.context().bind_to_thread().map_err(|e| format!("bind the CUDA context: {e:?}"))?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: the library is loaded and a context is bound; writes one handle.
        check("cudnnCreate", unsafe { sys::cudnnCreate(&mut handle) })?;
        Ok(Self { handle, workspaces: StreamWorkspaces::default(), cuda: device.context().clone() })
    }
}

impl Drop for CudnnContext {
    fn drop(&mut self) {
        // SAFETY: created once by `new`, destroyed once, in the context it was made in.
        let _ = self.cuda.bind_to_thread();
        unsafe {
            let _ = sys::cudnnDestroy(self.handle);
        }
    }
}

/// The executors' shared cuDNN state: the handle (made on first use) and the plans made so far,
/// one per attention shape and pass, or why cuDNN cannot run that shape.
#[derive(Default)]
pub(crate) struct Attention {
    // Plans first: fields drop in order, and the plans' descriptors go before the handle.
    plans: Mutex<Vec<((AttentionShape, Pass), Planned)>>,
    context: Arc<Mutex<Option<CudnnContext>>>,
}

impl Attention {
    /// The plan of `shape`'s `pass` on `device`, made (and remembered) the first time it is
    /// asked for.
    fn plan(&self, device: &CudaDevice, shape: AttentionShape, pass: Pass) -> Planned {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, found)) = plans.iter().find(|(key, _)| *key == (shape, pass)) {
            return found.clone();
        }
        let made = self.make(device, shape, pass).map(Arc::new);
        plans.push(((shape, pass), made.clone()));
        made
    }

    fn make(&self, device: &CudaDevice, shape: AttentionShape, pass: Pass) -> Res<AttentionPlan> {
        let mut context = self.context.lock().unwrap_or_else(|p| p.into_inner());
        if context.is_none() {
            *context = Some(CudnnContext::new(device)?);
        }
        let handle = context.as_ref().map(|c| c.handle).ok_or("no cuDNN handle")?;
        device.context().bind_to_thread().map_err(|e| format!("bind the CUDA context: {e:?}"))?;
        build(handle, &device.stream(), shape, pass)
    }

    /// The kernel that runs `plan`.
    pub fn kernel(&self, device: Arc<CudaDevice>, plan: Arc<AttentionPlan>) -> AttentionKernel {
        let s = plan.shape;
        let words = |tokens: usize, head: usize| packing::words(s.dtype, s.elements(tokens, head));
        let inputs = if s.packed {
            vec![packing::words(s.dtype, 3 * s.elements(s.q_tokens, s.head))]
        } else {
            vec![words(s.q_tokens, s.head), words(s.kv_tokens, s.head), words(s.kv_tokens, s.v_head)]
        };
        let lengths = BufferLengths { inputs, outputs: vec![words(s.q_tokens, s.v_head)] };
        AttentionKernel { plan, lengths, context: self.context.clone(), device }
    }

    /// The kernel that runs `plans` (the forward with statistics, then the backward).
    pub fn backward_kernel(&self, device: Arc<CudaDevice>, plans: BackwardPlans) -> AttentionBackwardKernel {
        let s = plans.backward.shape;
        let words = |tokens: usize, head: usize| packing::words(s.dtype, s.elements(tokens, head));
        let (q, k, v) = (words(s.q_tokens, s.head), words(s.kv_tokens, s.head), words(s.kv_tokens, s.v_head));
        let grads =
            packing::words(s.dtype, s.elements(s.q_tokens, s.head) + s.elements(s.kv_tokens, s.head + s.v_head));
        let d_o = words(s.q_tokens, s.v_head);
        let lengths = if s.packed {
            BufferLengths { inputs: vec![grads, d_o], outputs: vec![grads] }
        } else {
            BufferLengths { inputs: vec![q, k, v, d_o], outputs: vec![grads] }
        };
        AttentionBackwardKernel { plans, lengths, context: self.context.clone(), device }
    }
}

/// A finalized execution plan and every descriptor it was made from.
pub(crate) struct AttentionPlan {
    shape: AttentionShape,
    pass: Pass,
    plan: Descriptor,
    workspace_bytes: usize,
    _graph: Vec<Descriptor>,
}

// SAFETY: host descriptors, read-only once finalized; executed under the context's mutex.
unsafe impl Send for AttentionPlan {}
unsafe impl Sync for AttentionPlan {}

impl std::fmt::Debug for AttentionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttentionPlan").field("shape", &self.shape).field("pass", &self.pass).finish_non_exhaustive()
    }
}

/// The two plans of an attention's backward: the forward again, keeping the softmax statistics
/// (the plan's forward ran without them), and the backward that reads them.
#[derive(Clone, Debug)]
pub(crate) struct BackwardPlans {
    training: Arc<AttentionPlan>,
    backward: Arc<AttentionPlan>,
}

/// The tensors of the attention graph, as indices into [`Builder::kept`].
struct Operands {
    q: usize,
    k_transposed: usize,
    o: usize,
    scale: usize,
}

/// `q`, `k` (as `k^T`, which the first product reads), the result `o` and the scale: what
/// both passes read.
fn operands(g: &mut Builder, s: AttentionShape, io: Data) -> Res<Operands> {
    let (b, h, sq, skv, d, dv) =
        (s.batch as i64, s.heads as i64, s.q_tokens as i64, s.kv_tokens as i64, s.head as i64, s.v_head as i64);
    let one = [1i64, 1, 1, 1];
    Ok(Operands {
        q: g.tensor(Some(Q), io, &[b, h, sq, d], &s.part_strides(s.q_tokens, s.head), Given::Buffer)?,
        // k `[b, h, skv, d]` read as k^T `[b, h, d, skv]`: the product reads it transposed.
        k_transposed: g.tensor(
            Some(K),
            io,
            &[b, h, d, skv],
            &transposed(s.part_strides(s.kv_tokens, s.head)),
            Given::Buffer,
        )?,
        o: g.tensor(Some(O), io, &[b, h, sq, dv], &s.o_strides(), Given::Buffer)?,
        scale: g.tensor(Some(SCALE), Data::CUDNN_DATA_FLOAT, &one, &one, Given::Value)?,
    })
}

/// Sets the scores above the diagonal to `-inf` (column > row: PyTorch's `is_causal`, the
/// mask aligned to the top left); the masked scores.
fn causal_mask(g: &mut Builder, ops: &mut Vec<usize>, scores: usize, dims: &[i64]) -> Res<usize> {
    use sys::cudnnPointwiseMode_t::*;
    let float = Data::CUDNN_DATA_FLOAT;
    let one = [1i64, 1, 1, 1];
    let virtual_scores = |g: &mut Builder, data| g.tensor(None, data, dims, &contiguous(dims), Given::Virtual);
    let rows = virtual_scores(g, Data::CUDNN_DATA_INT32)?;
    let cols = virtual_scores(g, Data::CUDNN_DATA_INT32)?;
    let keep = virtual_scores(g, Data::CUDNN_DATA_BOOLEAN)?;
    let masked = virtual_scores(g, float)?;
    let neg_inf = g.tensor(Some(NEG_INF), float, &one, &one, Given::Value)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_GEN_INDEX, float, Some(2), Io::unary(scores, rows))?);
    ops.push(g.pointwise(CUDNN_POINTWISE_GEN_INDEX, float, Some(3), Io::unary(scores, cols))?);
    ops.push(g.pointwise(CUDNN_POINTWISE_CMP_GE, Data::CUDNN_DATA_BOOLEAN, None, Io::binary(rows, cols, keep))?);
    let select = Io { x: scores, b: Some(neg_inf), t: Some(keep), y: masked };
    ops.push(g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, float, None, select)?);
    Ok(masked)
}

/// The forward graph's operations: the product `q k^T`, the scale, the causal mask, the softmax
/// (with the rows' log-sum-exp, written to the `STATS` buffer when `stats`) and the product
/// with `v`.
fn forward_ops(g: &mut Builder, s: AttentionShape, io: Data, stats: bool) -> Res<Vec<usize>> {
    use sys::cudnnPointwiseMode_t::*;
    let (b, h, sq, skv) = (s.batch as i64, s.heads as i64, s.q_tokens as i64, s.kv_tokens as i64);
    let float = Data::CUDNN_DATA_FLOAT;
    let scores = [b, h, sq, skv];
    let row = [b, h, sq, 1];
    let t = operands(g, s, io)?;
    let v_dims = [b, h, skv, s.v_head as i64];
    let v = g.tensor(Some(V), io, &v_dims, &s.part_strides(s.kv_tokens, s.v_head), Given::Buffer)?;
    let virtual_scores = |g: &mut Builder, data| g.tensor(None, data, &scores, &contiguous(&scores), Given::Virtual);
    let virtual_row = |g: &mut Builder| g.tensor(None, float, &row, &contiguous(&row), Given::Virtual);

    let mut ops = Vec::new();
    let product = virtual_scores(g, float)?;
    ops.push(g.matmul(t.q, t.k_transposed, product)?);
    let mut scaled = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_MUL, float, None, Io::binary(product, t.scale, scaled))?);
    if s.causal {
        scaled = causal_mask(g, &mut ops, scaled, &scores)?;
    }
    let max = virtual_row(g)?;
    ops.push(g.reduction(sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX, scaled, max)?);
    let shifted = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_SUB, float, None, Io::binary(scaled, max, shifted))?);
    let exp = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_EXP, float, None, Io::unary(shifted, exp))?);
    let sum = virtual_row(g)?;
    ops.push(g.reduction(sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD, exp, sum)?);
    // The rows' log-sum-exp (`max + log(sum)`), which the fusion engine's pattern includes: kept
    // on chip, or written out for a backward pass.
    let log_sum = virtual_row(g)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_LOG, float, None, Io::unary(sum, log_sum))?);
    let stats =
        if stats { g.tensor(Some(STATS), float, &row, &contiguous(&row), Given::Buffer)? } else { virtual_row(g)? };
    ops.push(g.pointwise(CUDNN_POINTWISE_ADD, float, None, Io::binary(max, log_sum, stats))?);
    // The probabilities in the operands' dtype: what the second product reads.
    let p = virtual_scores(g, io)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_DIV, float, None, Io::binary(exp, sum, p))?);
    ops.push(g.matmul(p, v, t.o)?);
    Ok(ops)
}

/// The backward graph's operations, as cudnn-frontend composes them for cuDNN before 9.21
/// (`CompositeSDPABackwardNode`, without dropout, bias or grouped heads): `rowsum(do * o)`; the
/// probabilities again from `q k^T`, the scale and the forward's statistics; `dv = p^T do`;
/// `ds = p (do v^T - rowsum) scale`; `dk = ds^T q`; `dq = ds k`, accumulated in `f32`.
fn backward_ops(g: &mut Builder, s: AttentionShape, io: Data) -> Res<Vec<usize>> {
    use sys::cudnnPointwiseMode_t::*;
    let (b, h, sq, skv, d, dv) =
        (s.batch as i64, s.heads as i64, s.q_tokens as i64, s.kv_tokens as i64, s.head as i64, s.v_head as i64);
    let float = Data::CUDNN_DATA_FLOAT;
    let scores = [b, h, sq, skv];
    let transposed_scores = [b, h, skv, sq];
    let transposed_strides = [h * sq * skv, sq * skv, 1, skv];
    let row = [b, h, sq, 1];
    let one = [1i64, 1, 1, 1];
    let t = operands(g, s, io)?;
    // v read as v^T `[b, h, dv, skv]` by `do v^T`.
    let v_strides = transposed(s.part_strides(s.kv_tokens, s.v_head));
    let v_transposed = g.tensor(Some(V), io, &[b, h, dv, skv], &v_strides, Given::Buffer)?;
    let d_o = g.tensor(Some(DO), io, &[b, h, sq, dv], &s.o_strides(), Given::Buffer)?;
    let stats = g.tensor(Some(STATS), float, &row, &contiguous(&row), Given::Buffer)?;
    let dq = g.tensor(Some(DQ), io, &[b, h, sq, d], &s.part_strides(s.q_tokens, s.head), Given::Buffer)?;
    let dk = g.tensor(Some(DK), io, &[b, h, skv, d], &s.part_strides(s.kv_tokens, s.head), Given::Buffer)?;
    let d_v = g.tensor(Some(DV), io, &[b, h, skv, dv], &s.part_strides(s.kv_tokens, s.v_head), Given::Buffer)?;
    let softmax_sum = g.tensor(Some(SOFTMAX_SUM), float, &row, &contiguous(&row), Given::Buffer)?;
    let dq_accum = g.tensor(Some(DQ_ACCUM), float, &[b, h, sq, d], &contiguous(&[b, h, sq, d]), Given::Buffer)?;
    let unit = g.tensor(Some(ONE), float, &one, &one, Given::Value)?;
    let virtual_scores = |g: &mut Builder, data| g.tensor(None, data, &scores, &contiguous(&scores), Given::Virtual);

    let mut ops = Vec::new();
    // rowsum(do * o), times the dropout scale's inverse (1 here), into scratch.
    let do_o = g.tensor(None, float, &[b, h, sq, dv], &contiguous(&[b, h, sq, dv]), Given::Virtual)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_MUL, float, None, Io::binary(d_o, t.o, do_o))?);
    let summed = g.tensor(None, float, &row, &contiguous(&row), Given::Virtual)?;
    ops.push(g.reduction(sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD, do_o, summed)?);
    ops.push(g.pointwise(CUDNN_POINTWISE_MUL, float, None, Io::binary(summed, unit, softmax_sum))?);
    // p = exp(q k^T scale - stats), masked.
    let product = virtual_scores(g, float)?;
    ops.push(g.matmul(t.q, t.k_transposed, product)?);
    let scaled = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_MUL, float, None, Io::binary(product, t.scale, scaled))?);
    let mut shifted = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_SUB, float, None, Io::binary(scaled, stats, shifted))?);
    if s.causal {
        shifted = causal_mask(g, &mut ops, shifted, &scores)?;
    }
    let p = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_EXP, float, None, Io::unary(shifted, p))?);
    // dv = p^T do.
    let p_transposed = g.tensor(None, io, &transposed_scores, &transposed_strides, Given::Virtual)?;
    ops.push(g.reshape(p, p_transposed)?);
    ops.push(g.matmul(p_transposed, d_o, d_v)?);
    // ds = (do v^T - rowsum) p scale.
    let dp = virtual_scores(g, float)?;
    ops.push(g.matmul(d_o, v_transposed, dp)?);
    let centered = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_SUB, float, None, Io::binary(dp, softmax_sum, centered))?);
    let weighted = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_MUL, float, None, Io::binary(centered, p, weighted))?);
    let ds = virtual_scores(g, float)?;
    ops.push(g.pointwise(CUDNN_POINTWISE_MUL, float, None, Io::binary(weighted, t.scale, ds))?);
    // dk = ds^T q.
    let ds_transposed = g.tensor(None, io, &transposed_scores, &transposed_strides, Given::Virtual)?;
    ops.push(g.reshape(ds, ds_transposed)?);
    ops.push(g.matmul(ds_transposed, t.q, dk)?);
    // dq = ds k, accumulated in f32, then converted.
    let k = g.tensor(None, io, &[b, h, skv, d], &s.part_strides(s.kv_tokens, s.head), Given::Virtual)?;
    ops.push(g.reshape(t.k_transposed, k)?);
    ops.push(g.matmul(ds, k, dq_accum)?);
    ops.push(g.pointwise(CUDNN_POINTWISE_IDENTITY, float, None, Io::unary(dq_accum, dq))?);
    Ok(ops)
}

/// Builds the attention graph of `shape`'s `pass` and its execution plan: of the first engine
/// configs cuDNN's heuristic gives that finalize, the fastest on this GPU.
fn build(
    handle: sys::cudnnHandle_t,
    stream: &Arc<CudaStream>,
    shape: AttentionShape,
    pass: Pass,
) -> Res<AttentionPlan> {
    let io = if shape.dtype == DType::BF16 { Data::CUDNN_DATA_BFLOAT16 } else { Data::CUDNN_DATA_HALF };
    let mut g = Builder { kept: Vec::new(), next_virtual: 100 };
    let ops = match pass {
        Pass::Forward => forward_ops(&mut g, shape, io, false)?,
        Pass::Training => forward_ops(&mut g, shape, io, true)?,
        Pass::Backward => backward_ops(&mut g, shape, io)?,
    };

    let graph = Descriptor::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    let op_descriptors: Vec<&Descriptor> = ops.iter().map(|&i| &g.kept[i]).collect();
    graph.set_descriptors(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &op_descriptors)?;
    graph.set(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, Type::CUDNN_TYPE_HANDLE, &[handle])?;
    let graph = graph.finalize().map_err(|e| format!("cuDNN does not take this attention graph ({pass:?}): {e}"))?;

    let heuristic = Descriptor::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heuristic.set_descriptors(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph])?;
    let mode = sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A;
    heuristic.set(Attr::CUDNN_ATTR_ENGINEHEUR_MODE, Type::CUDNN_TYPE_HEUR_MODE, &[mode])?;
    let heuristic = heuristic.finalize()?;
    let mut count = 0i64;
    // SAFETY: asks for the number of results only (no array).
    check("cudnnBackendGetAttribute", unsafe {
        sys::cudnnBackendGetAttribute(
            heuristic.0,
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    })?;
    let configs = (0..count.max(0))
        .map(|_| Descriptor::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Res<Vec<_>>>()?;
    let mut raw: Vec<_> = configs.iter().map(|c| c.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds `count` engine-config descriptors for cuDNN to fill.
    check("cudnnBackendGetAttribute", unsafe {
        sys::cudnnBackendGetAttribute(
            heuristic.0,
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            &mut got,
            raw.as_mut_ptr().cast(),
        )
    })?;
    // The plans of the heuristic's first configs that finalize; the fastest of them on this GPU.
    let mut why = format!("cuDNN's heuristic offers no engine for attention ({pass:?}) of {shape:?}");
    let mut candidates = Vec::new();
    for config in configs.iter().take(got.max(0) as usize) {
        let made = Descriptor::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR).and_then(|plan| {
            plan.set(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, Type::CUDNN_TYPE_HANDLE, &[handle])?;
            plan.set_descriptors(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
            let plan = plan.finalize()?;
            let mut bytes = 0i64;
            let mut n = 0i64;
            // SAFETY: reads one `int64_t`.
            check("cudnnBackendGetAttribute", unsafe {
                sys::cudnnBackendGetAttribute(
                    plan.0,
                    Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                    Type::CUDNN_TYPE_INT64,
                    1,
                    &mut n,
                    (&mut bytes as *mut i64).cast(),
                )
            })?;
            Ok((plan, bytes.max(0) as usize))
        });
        match made {
            Ok(candidate) => candidates.push(candidate),
            Err(e) => why = format!("no engine of cuDNN's heuristic runs attention ({pass:?}) of {shape:?}: {e}"),
        }
        if candidates.len() == TUNED_CANDIDATES {
            break;
        }
    }
    let best = match candidates.len() {
        0 => return Err(why),
        1 => 0,
        _ => fastest(handle, stream, shape, pass, &candidates)?,
    };
    let (plan, workspace_bytes) = candidates.swap_remove(best);
    let mut kept = g.kept;
    kept.extend([graph, heuristic]);
    kept.extend(configs);
    Ok(AttentionPlan { shape, pass, plan, workspace_bytes, _graph: kept })
}

/// How many of the heuristic's engine configs are timed when a plan is compiled.
const TUNED_CANDIDATES: usize = 4;

/// The index of the fastest of `candidates` on `stream`'s GPU: each runs twice, then five times
/// between two events, on zeroed scratch buffers of `shape` (the heuristic's first choice is not
/// always the fastest: at GPT-2's shape it picked a kernel 7% slower than PyTorch's).
fn fastest(
    handle: sys::cudnnHandle_t,
    stream: &Arc<CudaStream>,
    shape: AttentionShape,
    pass: Pass,
    candidates: &[(Descriptor, usize)],
) -> Res<usize> {
    let alloc = |n: usize| stream.alloc_zeros::<u8>(n.max(1)).map_err(|e| format!("attention tuning buffers: {e:?}"));
    let mut buffers = Vec::new();
    for (uid, bytes) in shape.buffers(pass) {
        buffers.push((uid, alloc(bytes)?));
    }
    let mut pointers: Vec<(i64, u64)> = Vec::with_capacity(buffers.len());
    for (uid, buffer) in &mut buffers {
        pointers.push((*uid, buffer.device_ptr_mut(stream).0));
    }
    let workspace = alloc(candidates.iter().map(|c| c.1).max().unwrap_or(0))?;
    let workspace_ptr = workspace.device_ptr(stream).0;
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let event_error = |e| format!("attention tuning events: {e:?}");
    let mut best = (f32::INFINITY, 0);
    for (i, (plan, _)) in candidates.iter().enumerate() {
        // A candidate that fails to run is skipped (the first one stays the default).
        let timed = (|| -> Res<f32> {
            for _ in 0..2 {
                execute(handle, plan, stream, shape, pass, &pointers, workspace_ptr)?;
            }
            let start = stream.record_event(timing).map_err(event_error)?;
            for _ in 0..5 {
                execute(handle, plan, stream, shape, pass, &pointers, workspace_ptr)?;
            }
            let end = stream.record_event(timing).map_err(event_error)?;
            end.synchronize().map_err(event_error)?;
            start.elapsed_ms(&end).map_err(event_error)
        })();
        if let Ok(ms) = timed {
            if ms < best.0 {
                best = (ms, i);
            }
        }
    }
    Ok(best.1)
}

/// The most tensors a variant pack holds: the backward's eleven buffers and three scalars.
const MOST_TENSORS: usize = 16;

/// Queues `plan` on `stream`: `buffers` are its device tensors by unique id (as
/// [`AttentionShape::buffers`] lists them); the scalars the pass reads are added here.
fn execute(
    handle: sys::cudnnHandle_t,
    plan: &Descriptor,
    stream: &CudaStream,
    shape: AttentionShape,
    pass: Pass,
    buffers: &[(i64, u64)],
    workspace: u64,
) -> Res<()> {
    let (scale, neg_inf, one) = (f32::from_bits(shape.scale), f32::NEG_INFINITY, 1.0f32);
    let mut uids: SmallVec<[i64; MOST_TENSORS]> = buffers.iter().map(|b| b.0).collect();
    let mut data: SmallVec<[*mut c_void; MOST_TENSORS]> = buffers.iter().map(|b| b.1 as *mut c_void).collect();
    let by_value = |x: &f32| (x as *const f32).cast_mut().cast::<c_void>();
    uids.push(SCALE);
    data.push(by_value(&scale));
    if shape.causal {
        uids.push(NEG_INF);
        data.push(by_value(&neg_inf));
    }
    if pass == Pass::Backward {
        uids.push(ONE);
        data.push(by_value(&one));
    }
    let pack = Descriptor::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, Type::CUDNN_TYPE_INT64, &uids)?;
    pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, Type::CUDNN_TYPE_VOID_PTR, &data)?;
    pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, Type::CUDNN_TYPE_VOID_PTR, &[workspace as *mut c_void])?;
    let pack = pack.finalize()?;
    // SAFETY: the caller's buffers hold what the plan's tensors describe, the scalars live
    // until the call returns (cuDNN reads by-value tensors when it queues the kernel), and the
    // kernel and everything it touches are ordered on `stream`.
    let status = unsafe {
        let set = sys::cudnnSetStream(handle, stream.cu_stream() as sys::cudaStream_t);
        if set != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
            set
        } else {
            sys::cudnnBackendExecute(handle, plan.0, pack.0)
        }
    };
    check("cudnnBackendExecute", status)
}

fn execution_error(symbol: &str, message: String) -> Error {
    Error::Execution { executor: super::CudaOps::NAME.into(), symbol: symbol.into(), message }
}

/// Runs one attention plan: `inputs` q, k, v; `outputs` the result.
pub(crate) struct AttentionKernel {
    // In drop order: the plan, then the handle, then the device.
    plan: Arc<AttentionPlan>,
    lengths: BufferLengths,
    context: Arc<Mutex<Option<CudnnContext>>>,
    device: Arc<CudaDevice>,
}

impl DeviceKernel for AttentionKernel {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        let s = self.plan.shape;
        let what = if s.packed { "qkv_attention" } else { "scaled_dot_product_attention" };
        let fail = |message: String| execution_error(what, message);
        self.lengths.check(what, inputs, outputs)?;
        let stream = self.device.stream();
        // cuDNN runs in the thread's current context: this device's.
        stream.context().bind_to_thread().map_err(|e| fail(format!("bind the CUDA context: {e:?}")))?;
        let (q, k, v) = if s.packed {
            let q = address(inputs[0])?;
            let part = s.part_bytes(s.q_tokens, s.head);
            (q, q + part, q + 2 * part)
        } else {
            let q = address(inputs[0])?;
            let k = address(inputs[1])?;
            let v = address(inputs[2])?;
            (q, k, v)
        };
        let o = address(&*outputs[0])?;
        let mut context = self.context.lock().unwrap_or_else(|p| p.into_inner());
        let context = context.as_mut().ok_or_else(|| fail("cuDNN was not created".into()))?;
        let handle = context.handle;
        let workspace = context.workspaces.get(&stream, self.plan.workspace_bytes)?;
        let (workspace, _) = workspace.device_ptr(&stream);
        let buffers = [(Q, q), (K, k), (V, v), (O, o)];
        execute(handle, &self.plan.plan, &stream, s, Pass::Forward, &buffers, workspace).map_err(fail)
    }
}

/// Scratch offsets are multiples of this (cuDNN asks 16-byte aligned tensors).
const SCRATCH_ALIGNMENT: usize = 256;

/// Runs an attention's backward: `inputs` q, k, v and the result's gradient; `outputs` dq, dk
/// and dv packed into one buffer. The forward runs again with its softmax statistics into the
/// executor's per-stream scratch (with the recomputed result, `rowsum(do * o)` and `dq` in
/// `f32`), then the backward.
pub(crate) struct AttentionBackwardKernel {
    // In drop order: the plans, then the handle, then the device.
    plans: BackwardPlans,
    lengths: BufferLengths,
    context: Arc<Mutex<Option<CudnnContext>>>,
    device: Arc<CudaDevice>,
}

impl AttentionBackwardKernel {
    /// The scratch's regions: the recomputed result, the statistics, `rowsum(do * o)` and `dq`
    /// in `f32`, by offset, then cuDNN's workspace; and the total bytes.
    fn scratch(&self) -> ([usize; 5], usize) {
        let s = self.plans.backward.shape;
        let sizes = [
            s.bytes(s.q_tokens, s.v_head),
            s.row_bytes(),
            s.row_bytes(),
            s.elements(s.q_tokens, s.head) * 4,
            self.plans.training.workspace_bytes.max(self.plans.backward.workspace_bytes),
        ];
        let mut offsets = [0; 5];
        let mut end = 0;
        for (offset, size) in offsets.iter_mut().zip(sizes) {
            *offset = end;
            end += size.next_multiple_of(SCRATCH_ALIGNMENT);
        }
        (offsets, end)
    }
}

impl DeviceKernel for AttentionBackwardKernel {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        let s = self.plans.backward.shape;
        let what = if s.packed { "qkv_attention_backward" } else { "scaled_dot_product_attention_backward" };
        let fail = |message: String| execution_error(what, message);
        self.lengths.check(what, inputs, outputs)?;
        let stream = self.device.stream();
        stream.context().bind_to_thread().map_err(|e| fail(format!("bind the CUDA context: {e:?}")))?;
        let ((q, k, v), d_o) = if s.packed {
            let q = address(inputs[0])?;
            let part = s.part_bytes(s.q_tokens, s.head);
            ((q, q + part, q + 2 * part), address(inputs[1])?)
        } else {
            let q = address(inputs[0])?;
            let k = address(inputs[1])?;
            let v = address(inputs[2])?;
            ((q, k, v), address(inputs[3])?)
        };
        let dq = address(&*outputs[0])?;
        let dk = dq + s.part_bytes(s.q_tokens, s.head);
        let dv = dk + s.part_bytes(s.kv_tokens, s.head);
        let (offsets, total) = self.scratch();
        let mut context = self.context.lock().unwrap_or_else(|p| p.into_inner());
        let context = context.as_mut().ok_or_else(|| fail("cuDNN was not created".into()))?;
        let handle = context.handle;
        let (scratch, _) = context.workspaces.get(&stream, total)?.device_ptr(&stream);
        let [o, stats, softmax_sum, dq_accum, workspace] = offsets.map(|offset| scratch + offset as u64);
        let forward = [(Q, q), (K, k), (V, v), (O, o), (STATS, stats)];
        execute(handle, &self.plans.training.plan, &stream, s, Pass::Training, &forward, workspace).map_err(fail)?;
        let backward = [
            (Q, q),
            (K, k),
            (V, v),
            (O, o),
            (DO, d_o),
            (STATS, stats),
            (DQ, dq),
            (DK, dk),
            (DV, dv),
            (SOFTMAX_SUM, softmax_sum),
            (DQ_ACCUM, dq_accum),
        ];
        execute(handle, &self.plans.backward.plan, &stream, s, Pass::Backward, &backward, workspace).map_err(fail)
    }
}

/// Whether `op` is an attention cuDNN runs on `device`, and its plan if so.
pub(crate) fn plan_for(attention: &Attention, device: &CudaDevice, op: &OpView<'_>) -> Option<Planned> {
    let shape = AttentionShape::of(op)?;
    if library().is_err() || !shape.parts_aligned() {
        return None;
    }
    Some(attention.plan(device, shape, Pass::Forward))
}

/// Whether `op` is an attention's backward cuDNN runs on `device`, and its plans if so: cuDNN
/// 9.10.2 or later (cudnn-frontend refuses 9.10.0 and 9.10.1 for known bugs, and before 9.6
/// `dq`'s accumulator would need zeroing), and before 9.16 key lengths a multiple of 128 (for
/// others cudnn-frontend adds a padding mask).
pub(crate) fn backward_plans_for(
    attention: &Attention,
    device: &CudaDevice,
    op: &OpView<'_>,
) -> Option<std::result::Result<BackwardPlans, String>> {
    let shape = AttentionShape::of_backward(op)?;
    let version = *library().as_ref().ok()?;
    // Heads a multiple of 8 (cuDNN's rule) also keep dk and dv, packed after dq, 16-byte aligned.
    let supported = version >= 91002
        && (version >= 91600 || shape.kv_tokens.is_multiple_of(128))
        && shape.q_tokens.max(shape.kv_tokens) > 1
        && shape.head.is_multiple_of(8)
        && shape.v_head.is_multiple_of(8);
    if !supported {
        return None;
    }
    let made = (|| {
        Ok(BackwardPlans {
            training: attention.plan(device, shape, Pass::Training)?,
            backward: attention.plan(device, shape, Pass::Backward)?,
        })
    })();
    Some(made)
}
