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
