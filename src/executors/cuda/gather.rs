//! `embedding` and `gather_last` on the GPU (and their gradients, `scatter_last` and, for f32
//! tables, `embedding_backward` by atomic adds into a zeroed table), with their ids checked there: one thread per
//! output element reads its id, and an id outside its table records one such `(position, id)`
//! (the first to arrive) in a small fault buffer of the run's stream (its element gets NaN, or
//! zeros). Rows whose width is a whole number of 16-byte vectors move a vector per thread. The
//! plan waits for the run and reads that buffer after it
//! ([`DeviceKernel::check_after_run`]), so a bad id is [`Error::IndexOutOfRange`] from the run
//! that queued it, never a silent wrong row. Values move as bits, in every dtype; ids are `i64`
//! or `i32`.

use std::ffi::c_void;
use std::fmt::Write;
use std::sync::Arc;

use cudarc::driver::{sys, CudaFunction, DevicePtrMut, LaunchConfig};

use super::codegen::{element_type, RegionSource};
use super::device::{address, slice_mut, CudaDevice};
use super::device_checks::{launch, record_fault, BufferLengths, PerStream};
use crate::core::ir::{prims, DType};
use crate::core::plan::{packing, DeviceBuffer, DeviceKernel, OpView};
use crate::error::{Error, Result};
use crate::executors::cpu_reference::{builtin_prim, check_builtin};

/// Whether `op` is a gather (or a gradient's scatter) this module runs.
pub(crate) fn generates(op: &OpView<'_>) -> bool {
    // Rows of width 0 leave no thread to check the ids: the CPU reference checks those.
    let wide = |i: usize| op.input_shape(i).is_ok_and(|s| s.last().is_some_and(|&width| width > 0));
    match builtin_prim(op) {
        Some(prims::EMBEDDING) => op.input_shape(0).is_ok_and(|w| w.get(1).is_some_and(|&width| width > 0)),
        Some(prims::GATHER_LAST) => true,
        Some(prims::SCATTER_LAST) => op.dims(2).is_ok_and(|n| n.first().is_some_and(|&n| n > 0)),
        // Sums by f32 atomics: f32 tables only (16-bit ones on the CPU reference, which sums in
        // f32 and rounds once).
        Some(prims::EMBEDDING_BACKWARD) => wide(0) && op.output_dtypes().all(|d| d == DType::F32),
        _ => false,
    }
}

/// What a [`CheckedGather`] computes.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `embedding`: `out[i]` is element `i % width` of row `ids[i / width]`.
    Embedding,
    /// `gather_last`: `out[r]` is element `ids[r]` of row `r`.
    GatherLast,
    /// `scatter_last`: `out[i]` of row `r = i / n` is `values[r]` at column `ids[r]`, else 0.
    ScatterLast,
    /// `embedding_backward`: row `i / width` of the gradient added (atomically) into row
    /// `ids[i / width]` of the zeroed table.
    EmbeddingBackward,
}

/// A compiled gather and the fault buffers of the streams it ran on.
pub(crate) struct CheckedGather {
    kind: Kind,
    device: Arc<CudaDevice>,
    function: CudaFunction,
    name: &'static str,
    numel: usize,
    /// Size of the axis the ids index.
    bound: usize,
    lengths: BufferLengths,
    config: LaunchConfig,
    faults: PerStream<()>,
}

impl CheckedGather {
    pub(crate) fn new(device: &Arc<CudaDevice>, op: &OpView<'_>, kernel: &str) -> Result<Self> {
        let id = builtin_prim(op).ok_or_else(|| precondition(op, "not a built-in prim".into()))?;
        check_builtin(id, op).map_err(|detail| precondition(op, detail))?;
        let (table, ids) = (op.input_shape(0)?, op.input_shape(1)?);
        let tensors: Vec<_> = op.bound_symbol().inputs().collect();
        let (dtype, id_dtype) = (op.dtype_of(tensors[0]), op.dtype_of(tensors[1]));
        let ids_numel: usize = ids.iter().product();
        let out_numel: usize = op.output_shape(0)?.iter().product();
        let (kind, name, bound, width, numel) = match id {
            prims::EMBEDDING => (Kind::Embedding, "embedding", table[0], table[1], ids_numel * table[1]),
            prims::SCATTER_LAST => {
                let n = op.dims(2)?.first().copied().unwrap_or(1);
                (Kind::ScatterLast, "scatter_last", n, n, ids_numel * n)
            }
            prims::EMBEDDING_BACKWARD => {
                let rows = op.dims(2)?.first().copied().unwrap_or(1);
                let width = table.last().copied().unwrap_or(1);
                (Kind::EmbeddingBackward, "embedding_backward", rows, width, ids_numel * width)
            }
            _ => {
                let n = table.last().copied().unwrap_or(1);
                (Kind::GatherLast, "gather_last", n, n, ids_numel)
            }
        };
        // Rows of 16-byte vectors where the width allows: a vector per thread.
        let per_vector = 16 / dtype.size_bytes();
        let vector = if kind == Kind::Embedding && width % per_vector == 0 && width > 0 { per_vector } else { 1 };
        let source = source(kernel, kind, dtype, id_dtype, bound, width / vector, vector > 1);
        let numel = numel / vector;
        let generated = RegionSource {
            kernel: kernel.to_string(),
            source,
            inputs: 2,
            outputs: 1,
            numel,
            vectorized: false,
            threads: numel,
            input_lengths: vec![packing::words(dtype, table.iter().product()), packing::words(id_dtype, ids_numel)],
            output_lengths: vec![packing::words(dtype, out_numel)],
            in_place: Vec::new(),
            cluster: 1,
        };
        let function = device.function(&generated)?;
        let threads = super::codegen::BLOCK_THREADS;
        let blocks = (numel.div_ceil(threads as usize).min(i32::MAX as usize) as u32).max(1);
        Ok(Self {
            kind,
            device: device.clone(),
            function,
            name,
            numel,
            bound,
            lengths: BufferLengths {
                inputs: generated.input_lengths.clone(),
                outputs: generated.output_lengths.clone(),
            },
            config: LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 },
            faults: PerStream::new(),
        })
    }
}

fn precondition(op: &OpView<'_>, detail: String) -> Error {
    Error::KernelPrecondition { executor: super::CudaOps::NAME.into(), symbol: op.name().into(), detail }
}

/// The kernel: `out[i]` from the table (or, for the gradients, `out` from the values), or the
/// fault recorded. With `vectors`, `width` counts 16-byte vectors (`uint4`), and a bad id's row
/// is zeros.
fn source(
    kernel: &str,
    kind: Kind,
    dtype: DType,
    id_dtype: DType,
    bound: usize,
    width: usize,
    vectors: bool,
) -> String {
    let (element, id_type) = (if vectors { "uint4" } else { element_type(dtype) }, element_type(id_dtype));
    let nan = match dtype {
        _ if vectors => "make_uint4(0u, 0u, 0u, 0u)",
        DType::F32 => "__int_as_float(0x7fc00000)",
        DType::BF16 => "(unsigned short)0x7fc0",
        DType::F16 => "(unsigned short)0x7e00",
        _ => "0",
    };
    let zero = if dtype == DType::F32 { "0.0f" } else { "0" };
    let (row, good, bad) = match kind {
        Kind::Embedding => {
            ("i / {width}ll", "out[i] = table[id * {width}ll + i % {width}ll];", format!("out[i] = {nan};"))
        }
        Kind::GatherLast => ("i", "out[i] = table[i * {width}ll + id];", format!("out[i] = {nan};")),
        // Every element of the row is written: the value at the id's column, zeros elsewhere.
        Kind::ScatterLast => (
            "i / {width}ll",
            "out[i] = (i % {width}ll == id) ? table[i / {width}ll] : ({element})0;",
            format!("out[i] = ({element}){zero};"),
        ),
        // The zeroed table (cleared before the launch) accumulates; a bad id adds nothing.
        Kind::EmbeddingBackward => {
            ("i / {width}ll", "atomicAdd(&out[id * {width}ll + i % {width}ll], table[i]);", String::new())
        }
    };
    let (row, good) = (row.replace("{width}", &width.to_string()), good.replace("{width}", &width.to_string()));
    let good = good.replace("{element}", element);
    let mut s = String::new();
    let _ = writeln!(s, "// Generated by boundscope: a gather with its ids checked on the device.");
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void {kernel}(const {element}* __restrict__ table, const {id_type}* __restrict__ ids, \
         {element}* __restrict__ out, unsigned int* fault, long long n) {{"
    );
    let _ = writeln!(s, "  const long long stride = (long long)blockDim.x * gridDim.x;");
    let _ =
        writeln!(s, "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{");
    let _ = writeln!(s, "    const long long r = {row};");
    let _ = writeln!(s, "    const long long id = (long long)ids[r];");
    let _ = writeln!(s, "    if (id < 0 || id >= {bound}ll) {{");
    let _ = writeln!(s, "      {}", record_fault("r", "id"));
    let _ = writeln!(s, "      {bad}");
    let _ = writeln!(s, "    }} else {{");
    let _ = writeln!(s, "      {good}");
    let _ = writeln!(s, "    }}\n  }}\n}}");
    s
}

impl DeviceKernel for CheckedGather {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        self.lengths.check(self.name, inputs, outputs)?;
        let stream = self.device.stream();
        self.faults.with(
            &stream,
            |_| Ok(()),
            |fault, ()| {
                if self.kind == Kind::EmbeddingBackward {
                    stream
                        .memset_zeros(slice_mut(&mut *outputs[0])?)
                        .map_err(|e| super::device::cuda_error("clear the table", e))?;
                }
                let mut pointers: [sys::CUdeviceptr; 4] =
                    [address(inputs[0])?, address(inputs[1])?, address(&*outputs[0])?, fault.device_ptr_mut(&stream).0];
                let mut n = self.numel as i64;
                let mut params: [*mut c_void; 5] = [
                    (&mut pointers[0] as *mut sys::CUdeviceptr).cast(),
                    (&mut pointers[1] as *mut sys::CUdeviceptr).cast(),
                    (&mut pointers[2] as *mut sys::CUdeviceptr).cast(),
                    (&mut pointers[3] as *mut sys::CUdeviceptr).cast(),
                    (&mut n as *mut i64).cast(),
                ];
                // SAFETY: the kernel takes the table, the ids, the output, the fault buffer (4 words)
                // and `long long n`, and `params` points at exactly those values, which outlive the
                // call; the buffers hold at least what the kernel reads and writes (checked above:
                // the ids are checked against the table on the device before any table read).
                unsafe { launch(&self.function, &stream, self.config, &mut params) }
            },
        )
    }

    fn checks_after_run(&self) -> bool {
        true
    }

    fn check_after_run(&self) -> Result<()> {
        self.faults.check(&self.device.stream(), self.name, self.bound)
    }
}
