//! Value metadata: element type and shape.

use std::fmt;

use smallvec::SmallVec;

/// Element type of a tensor. Only `F32` today; an enum so that more can follow.
///
/// ```
/// assert_eq!(boundscope::DType::F32.to_string(), "f32");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
}

impl DType {
    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
        })
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
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

impl fmt::Display for TensorMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, DimsDisplay(&self.shape))
    }
}

/// The number of elements of a shape, if a buffer of that many `f32` can exist (at most
/// `isize::MAX` bytes); `None` when the count overflows.
///
/// ```
/// assert_eq!(boundscope::checked_numel(&[2, 3]), Some(6));
/// assert_eq!(boundscope::checked_numel(&[usize::MAX, 2]), None);
/// ```
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize / std::mem::size_of::<f32>())
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
