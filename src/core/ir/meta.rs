//! Value metadata: element type and shape.

use std::fmt;

use smallvec::SmallVec;

/// Element type of a tensor: `f32`, one of the 16-bit floats models run in on GPUs, or one of
/// the integer types token ids and indices are held in (`i64`, `i32`, as PyTorch holds them).
///
/// Every tensor stores its dtype's own values ([`Tensor`](crate::Tensor): 2 bytes per bf16 or
/// f16 value, 8 per `i64`). Float ops compute in `f32` and round each op's result to its dtype,
/// as PyTorch's CPU kernels do; [`DType::round`] is that rounding (to nearest, ties to even;
/// overflow gives an infinity of the same sign, as in PyTorch; NaN stays NaN). Float ops on
/// integer tensors are typed errors ([`Error::ShapeMismatch`](crate::Error::ShapeMismatch)
/// naming the dtype): `cast` them first. Integer values are exact everywhere; `cast` converts
/// between integer and float dtypes as PyTorch's `.to()` does (floats to integers truncate
/// toward zero).
///
/// Where results are rounded, on every executor:
/// - **An op** rounds its result once. Products and reductions accumulate in `f32`.
/// - **A composite that PyTorch runs as one kernel** (`softmax`, `layer_norm`, `gelu`,
///   `linear`, `linear_gelu`) is computed in `f32` and rounded once: its decomposition casts
///   16-bit operands to `f32`, does the math in `f32` and casts the result back, so the CPU
///   reference (which rounds each prim) and CpuFusion give what PyTorch gives, and an executor
///   that runs the composite whole (CudaOps' row kernels) rounds once too. (A `linear_gelu`
///   that [`FoldEpilogues`](crate::passes::FoldEpilogues) made of a `linear` and a `gelu` keeps
///   those two ops as its decomposition, so executors other than CudaOps round twice, as the
///   trace the user wrote does; CudaOps' fused epilogue rounds once.)
/// - **Inside a fused region** (CpuFusion, CudaFusion) values stay in `f32`: an op reads the
///   `f32` value of an earlier op of the region even when that value is also an output of the
///   region, which is stored rounded. This is `torch.compile`'s rule; op by op (the CPU
///   reference, CudaOps), each op reads the rounded value, as in PyTorch eager. So a fused
///   plan can differ from the reference by the roundings it skips, never by more.
///
/// ```
/// use boundscope::DType;
/// assert_eq!(DType::BF16.to_string(), "bf16");
/// assert_eq!(DType::promote(DType::BF16, DType::F16), DType::F32);
/// assert_eq!(DType::BF16.round(1.0 + 1.0 / 256.0), 1.0); // 8 bits of mantissa: a tie, to even
/// assert_eq!(DType::F16.round(1.0e6), f32::INFINITY); // past f16's 65504
/// assert_eq!("f16".parse::<DType>().unwrap(), DType::F16);
/// ```
///
/// Inputs are declared with [`TraceBuilder::input_with`](crate::TraceBuilder::input_with);
/// mixed operands promote as PyTorch promotes them ([`DType::promote`]: bf16 with f16 is f32, a
/// zero-dimensional tensor promotes only other zero-dimensional ones, a scalar never promotes);
/// host data of another dtype than an input's is a typed error when the plan runs:
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::{Arena, DType, Error, Plan, Registry, Tensor, TensorMeta, TraceBuilder};
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input_with(&TensorMeta::new(DType::BF16, &[2, 3]))?;
/// let w = b.input(&[3, 2])?; // f32
/// let y = b.matmul(x, w)?; // bf16 x f32 promotes to f32
/// let ids = b.argmax(y, 1, false)?; // i64 [2]
/// b.output(ids)?;
/// let plan = Plan::compile(&b.finish()?, &[CpuReference::shared()])?;
/// let x = Tensor::from_fn(&[2, 3], |i| i as f32 / 3.0).to_dtype(DType::BF16);
/// assert_eq!(x.bytes(), 12);
/// let out = plan.run(&[&x, &Tensor::new(&[3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0])?])?;
/// assert_eq!(out[0].values::<i64>()?, &[0, 0]);
/// // Host data of another dtype is a typed error, found when the plan runs.
/// let wrong = Tensor::zeros(&[2, 3]);
/// assert!(matches!(plan.run(&[&wrong, &wrong]), Err(Error::InputDType { index: 0, .. })));
/// # Ok::<(), boundscope::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
// A whole word: kernel views (`TensorRef`, `TensorMut`) carry it, and a one-byte field written
// just before a view is copied as a whole stalls the copy's loads (store forwarding); measured
// on the dispatch benchmark: 19.0 us per 1,000 ops with a byte, 13.2 with a word.
#[repr(u64)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// bfloat16: `f32`'s 8 exponent bits, 8 bits of mantissa (7 stored).
    BF16,
    /// IEEE half precision: 5 exponent bits, 11 bits of mantissa (10 stored).
    F16,
    /// 64-bit signed integer: token ids and indices (PyTorch's `torch.long`).
    I64,
    /// 32-bit signed integer.
    I32,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 5] = [DType::F32, DType::BF16, DType::F16, DType::I64, DType::I32];

    /// The floating-point dtypes, in declaration order.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

    /// The integer dtypes, in declaration order.
    pub const INTEGERS: [DType; 2] = [DType::I64, DType::I32];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// The Rust type that holds its values: `f32`, `half::bf16`, `half::f16`, `i64`, `i32`.
    pub const fn rust_type(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "half::bf16",
            DType::F16 => "half::f16",
            DType::I64 => "i64",
            DType::I32 => "i32",
        }
    }

    /// Whether it is a floating-point dtype (`f32`, `bf16`, `f16`).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    /// Whether it is an integer dtype (`i64`, `i32`).
    pub const fn is_integer(self) -> bool {
        !self.is_float()
    }

    /// The dtype of an op on tensors of dtypes `a` and `b`, as PyTorch promotes them: equal
    /// dtypes stay, `f32` with anything is `f32`, and bf16 with f16 is `f32` (neither holds the
    /// other); a float with an integer is the float, `i64` with `i32` is `i64`.
    ///
    /// As in PyTorch, operands come in three categories, and only the highest one present
    /// promotes: tensors with dimensions, then zero-dimensional tensors, then scalars. So
    /// `bf16[4] + f32[]` is bf16 (the zero-dimensional `f32` does not promote a dimensioned
    /// tensor), `bf16[] + f32[]` is `f32`, and `bf16 * 2.0` is bf16 (a scalar never promotes).
    ///
    /// ```
    /// use boundscope::{Arena, DType, Registry, TensorMeta, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input_with(&TensorMeta::new(DType::BF16, &[4])).unwrap();
    /// let s = b.input_with(&TensorMeta::new(DType::F32, &[])).unwrap();
    /// let y = b.add(x, s).unwrap();
    /// assert_eq!(b.dtype(y).unwrap(), DType::BF16);
    /// let t = b.input_with(&TensorMeta::new(DType::BF16, &[])).unwrap();
    /// let z = b.add(t, s).unwrap();
    /// assert_eq!(b.dtype(z).unwrap(), DType::F32);
    /// ```
    pub const fn promote(a: DType, b: DType) -> DType {
        match (a, b) {
            (DType::BF16, DType::BF16) => DType::BF16,
            (DType::F16, DType::F16) => DType::F16,
            (DType::I32, DType::I32) => DType::I32,
            (DType::I64 | DType::I32, DType::I64 | DType::I32) => DType::I64,
            (x, y) if x.is_integer() => y,
            (x, y) if y.is_integer() => x,
            _ => DType::F32,
        }
    }

    /// `x` rounded to this dtype (and widened back to `f32`); for an integer dtype, truncated
    /// toward zero and saturated to its range, as a cast to it does.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::BF16 => half::bf16::from_f32(x).to_f32(),
            DType::F16 => half::f16::from_f32(x).to_f32(),
            DType::I64 => x as i64 as f32,
            DType::I32 => x as i32 as f32,
        }
    }

    /// Its name: `f32`, `bf16`, `f16`, `i64`, `i32`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I64 => "i64",
            DType::I32 => "i32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = crate::Error;

    /// `f32`, `bf16`, `f16`, `i64` or `i32` (also `float32`, `bfloat16`, `float16`, `int64`,
    /// `long`, `int32`, `int`, as PyTorch names them).
    fn from_str(s: &str) -> crate::Result<DType> {
        match s {
            "f32" | "float32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "f16" | "float16" | "half" => Ok(DType::F16),
            "i64" | "int64" | "long" => Ok(DType::I64),
            "i32" | "int32" | "int" => Ok(DType::I32),
            other => Err(crate::Error::UnknownDType {
                name: other.to_string(),
                known: DType::ALL.iter().map(|d| d.name().to_string()).collect(),
            }),
        }
    }
}

/// Shapes are small: four dimensions live inline.
pub type Shape = SmallVec<[usize; 4]>;

/// The metadata of one tensor value: dtype and shape (row-major, contiguous).
///
/// ```
/// use boundscope::{DType, TensorMeta};
/// let m = TensorMeta::new(DType::F32, &[64, 256]);
/// assert_eq!(m.numel(), 64 * 256);
/// assert_eq!(m.to_string(), "f32[64, 256]");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Shape,
}

impl TensorMeta {
    /// Metadata for a tensor of this dtype and shape.
    pub fn new(dtype: DType, shape: &[usize]) -> Self {
        Self { dtype, shape: Shape::from_slice(shape) }
    }

    /// An `f32` tensor of this shape.
    pub fn f32(shape: &[usize]) -> Self {
        Self::new(DType::F32, shape)
    }

    /// Number of elements.
    ///
    /// # Panics
    /// If [`checked_numel`] refuses the shape, which cannot happen for the metadata of a value
    /// of a trace (the builder checks every shape); [`checked_numel`](Self::checked_numel)
    /// returns `None` instead.
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or_else(|| {
            panic!("TensorMeta::numel: shape {:?} cannot be used: {}", self.shape, unusable_shape_detail(&self.shape))
        })
    }

    /// Number of elements, or `None` if [`checked_numel`] refuses the shape.
    ///
    /// ```
    /// use boundscope::TensorMeta;
    /// assert_eq!(TensorMeta::f32(&[4, 0, 8]).checked_numel(), Some(0));
    /// assert_eq!(TensorMeta::f32(&[2, 1 << 63]).checked_numel(), None);
    /// ```
    pub fn checked_numel(&self) -> Option<usize> {
        checked_numel(&self.shape)
    }
}

impl fmt::Display for TensorMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, DimsDisplay(&self.shape))
    }
}

/// Most `f32` elements a buffer can hold: `isize::MAX` bytes.
const MAX_ELEMENTS: usize = isize::MAX as usize / std::mem::size_of::<f32>();

/// The number of elements of a shape, or `None` if the shape cannot be used.
///
/// A shape can be used when the product of its non-zero dimensions is at most the number of
/// `f32` a buffer can hold (`isize::MAX` bytes): NumPy's and ndarray's rule. Its element count
/// is that product, or 0 when a dimension is 0. The rule does not depend on the order of the
/// dimensions, and every stride and offset computed from a usable shape fits in a `usize`;
/// that is why `[0, usize::MAX, 2]`, which holds no elements, is refused too.
///
/// ```
/// assert_eq!(boundscope::checked_numel(&[2, 3]), Some(6));
/// assert_eq!(boundscope::checked_numel(&[0, 1 << 40, 3]), Some(0));
/// assert_eq!(boundscope::checked_numel(&[usize::MAX, 2]), None);
/// assert_eq!(boundscope::checked_numel(&[0, usize::MAX, 2]), None);
/// assert_eq!(boundscope::checked_numel(&[2, usize::MAX, 0]), None);
/// ```
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    let nonzero = shape.iter().filter(|&&d| d != 0).try_fold(1usize, |n, &d| n.checked_mul(d))?;
    if nonzero > MAX_ELEMENTS {
        return None;
    }
    Some(if shape.contains(&0) { 0 } else { nonzero })
}

/// Whether two shapes are equal: `a == b`, without the call to `memcmp` that slice equality
/// makes, for the few dimensions shapes have.
#[inline]
pub(crate) fn same_dims(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Why [`checked_numel`] refuses `shape`, for error messages.
pub(crate) fn unusable_shape_detail(shape: &[usize]) -> String {
    if shape.contains(&0) {
        format!(
            "it holds no elements, but its non-zero dimensions multiply to more than a buffer can hold \
             ({MAX_ELEMENTS} f32), so its strides overflow; keep the product of its non-zero dimensions \
             within that"
        )
    } else {
        format!("it has more elements than a buffer can hold ({MAX_ELEMENTS} f32)")
    }
}

/// Prints dimensions as `[2, 3]`.
pub(crate) struct DimsDisplay<'d>(pub &'d [usize]);

impl fmt::Display for DimsDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The metadata of a value as stored in the arena (no `Drop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ValueMeta<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ordering of `shape`'s dimensions.
    fn permutations(shape: &[usize]) -> Vec<Vec<usize>> {
        if shape.len() <= 1 {
            return vec![shape.to_vec()];
        }
        let mut all = Vec::new();
        for i in 0..shape.len() {
            let mut rest = shape.to_vec();
            let first = rest.remove(i);
            for mut tail in permutations(&rest) {
                tail.insert(0, first);
                all.push(tail);
            }
        }
        all
    }

    #[test]
    fn checked_numel_does_not_depend_on_the_order_of_dimensions() {
        let most = isize::MAX as usize / 4;
        for (shape, expected) in [
            (vec![0, usize::MAX, 2], None),
            (vec![0, 1 << 40, 1 << 40], None),
            (vec![0, most + 1], None),
            (vec![0, most], Some(0)),
            (vec![0, 1 << 30, 4, 3], Some(0)),
            (vec![2, most / 2], Some(most / 2 * 2)),
            (vec![2, most / 2 + 1], None),
            (vec![3, 4, 5], Some(60)),
            (vec![], Some(1)),
        ] {
            for p in permutations(&shape) {
                assert_eq!(checked_numel(&p), expected, "{p:?}");
            }
        }
    }
}
