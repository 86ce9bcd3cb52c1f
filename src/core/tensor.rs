//! Host tensors: owned (`Tensor`) and borrowed views (`TensorRef`, `TensorMut`) that kernels
//! read and write.

use crate::core::ir::{DType, Shape};
use crate::error::{Error, Result};

/// An owned, contiguous, row-major tensor on the host, of dtype `f32` (the default), `bf16` or
/// `f16`.
///
/// Elements are held as `f32` whatever the dtype: a bf16 or f16 tensor holds values its dtype
/// represents exactly, widened (`Tensor::from_bf16`, `to_dtype`, and every kernel of the CPU
/// executors keep to that), so that kernels read and write `f32` slices. That costs twice the
/// memory of a 2-byte storage, which is not done yet.
///
/// ```
/// use boundscope::Tensor;
/// let t = Tensor::from_fn(&[2, 3], |i| i as f32);
/// assert_eq!(t.shape(), &[2, 3]);
/// assert_eq!(t.data()[5], 5.0);
/// assert!(Tensor::new(&[2, 3], vec![0.0; 5]).is_err());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Shape,
    dtype: DType,
    data: Vec<f32>,
}

impl Tensor {
    /// A tensor of this shape holding `data` in row-major order.
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if `data.len()` is not the product of `shape`.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        if crate::core::ir::checked_numel(shape) != Some(data.len()) {
            return Err(Error::InvalidTensor { shape: shape.to_vec(), len: data.len() });
        }
        Ok(Self { shape: Shape::from_slice(shape), dtype: DType::F32, data })
    }

    /// A bf16 tensor of this shape holding `data` (from the `half` crate) in row-major order.
    ///
    /// ```
    /// use boundscope::{DType, Tensor};
    /// use half::bf16;
    /// let t = Tensor::from_bf16(&[2], vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]).unwrap();
    /// assert_eq!((t.dtype(), t.data()), (DType::BF16, &[1.5, -2.0][..]));
    /// assert_eq!(t.to_bf16(), vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if `data.len()` is not the product of `shape`.
    pub fn from_bf16(shape: &[usize], data: Vec<half::bf16>) -> Result<Self> {
        let widened = data.iter().map(|x| x.to_f32()).collect();
        Ok(Self { dtype: DType::BF16, ..Self::new(shape, widened)? })
    }

    /// An f16 tensor of this shape holding `data` (from the `half` crate) in row-major order.
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if `data.len()` is not the product of `shape`.
    pub fn from_f16(shape: &[usize], data: Vec<half::f16>) -> Result<Self> {
        let widened = data.iter().map(|x| x.to_f32()).collect();
        Ok(Self { dtype: DType::F16, ..Self::new(shape, widened)? })
    }

    /// The same values converted to `dtype`, each rounded to nearest (ties to even; past the
    /// range, an infinity), as [`DType::round`] does.
    ///
    /// ```
    /// use boundscope::{DType, Tensor};
    /// let t = Tensor::new(&[3], vec![1.0, 1.0 + 1.0 / 128.0, 70000.0]).unwrap();
    /// let h = t.to_dtype(DType::F16);
    /// assert_eq!(h.data(), &[1.0, 1.0 + 1.0 / 128.0, f32::INFINITY]);
    /// assert_eq!(t.to_dtype(DType::BF16).data(), &[1.0, 1.0078125, 70144.0]);
    /// ```
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        let data = self.data.iter().map(|&x| dtype.round(x)).collect();
        Tensor { shape: self.shape.clone(), dtype, data }
    }

    /// Its dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Its elements as bf16 (rounded, if it is not bf16).
    pub fn to_bf16(&self) -> Vec<half::bf16> {
        self.data.iter().map(|&x| half::bf16::from_f32(x)).collect()
    }

    /// Its elements as f16 (rounded, if it is not f16).
    pub fn to_f16(&self) -> Vec<half::f16> {
        self.data.iter().map(|&x| half::f16::from_f32(x)).collect()
    }

    /// A tensor of zeros.
    ///
    /// ```
    /// use boundscope::Tensor;
    /// assert_eq!(Tensor::zeros(&[2, 3]).data(), &[0.0; 6]);
    /// ```
    ///
    /// # Panics
    /// If [`checked_numel`](crate::checked_numel) refuses the shape or the allocation fails;
    /// [`try_zeros`](Self::try_zeros) returns an error instead.
    pub fn zeros(shape: &[usize]) -> Self {
        Self::try_zeros(shape).unwrap_or_else(|e| panic!("Tensor::zeros: {e}"))
    }

    /// A tensor of zeros, or an error if it cannot be made.
    ///
    /// ```
    /// use boundscope::{Error, Tensor};
    /// assert_eq!(Tensor::try_zeros(&[2, 3]).unwrap().shape(), &[2, 3]);
    /// assert!(matches!(Tensor::try_zeros(&[2, usize::MAX]), Err(Error::InvalidShape { .. })));
    /// assert!(matches!(Tensor::try_zeros(&[1 << 60]), Err(Error::OutOfMemory { .. })));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidShape`] if [`checked_numel`](crate::checked_numel) refuses the shape,
    /// [`Error::OutOfMemory`] if its buffer cannot be allocated.
    pub fn try_zeros(shape: &[usize]) -> Result<Self> {
        let (mut data, numel) = Self::try_buffer(shape)?;
        data.resize(numel, 0.0);
        Ok(Self { shape: Shape::from_slice(shape), dtype: DType::F32, data })
    }

    /// A tensor whose element at flat index `i` is `f(i)`.
    ///
    /// # Panics
    /// If [`checked_numel`](crate::checked_numel) refuses the shape or the allocation fails;
    /// [`try_from_fn`](Self::try_from_fn) returns an error instead.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> f32) -> Self {
        Self::try_from_fn(shape, f).unwrap_or_else(|e| panic!("Tensor::from_fn: {e}"))
    }

    /// A tensor whose element at flat index `i` is `f(i)`, or an error if it cannot be made.
    ///
    /// ```
    /// use boundscope::{Error, Tensor};
    /// assert_eq!(Tensor::try_from_fn(&[3], |i| i as f32).unwrap().data(), &[0.0, 1.0, 2.0]);
    /// assert!(matches!(Tensor::try_from_fn(&[usize::MAX, 2], |_| 0.0), Err(Error::InvalidShape { .. })));
    /// ```
    ///
    /// # Errors
    /// As for [`try_zeros`](Self::try_zeros); `f` is not called on error.
    pub fn try_from_fn(shape: &[usize], f: impl FnMut(usize) -> f32) -> Result<Self> {
        let (mut data, numel) = Self::try_buffer(shape)?;
        data.extend((0..numel).map(f));
        Ok(Self { shape: Shape::from_slice(shape), dtype: DType::F32, data })
    }

    /// An empty buffer with room for the elements of `shape`, and their number.
    fn try_buffer(shape: &[usize]) -> Result<(Vec<f32>, usize)> {
        let numel = crate::core::ir::checked_numel(shape).ok_or_else(|| Error::InvalidShape {
            shape: shape.to_vec(),
            detail: crate::core::ir::unusable_shape_detail(shape),
        })?;
        let mut data = Vec::new();
        data.try_reserve_exact(numel).map_err(|_| Error::OutOfMemory {
            what: "Tensor".into(),
            shape: shape.to_vec(),
            bytes: numel * std::mem::size_of::<f32>(),
        })?;
        Ok((data, numel))
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Its elements, mutable. In a bf16 or f16 tensor, write values its dtype represents
    /// (round them with [`DType::round`]): kernels take the values as they are.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// A borrowed view.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef { shape: &self.shape, dtype: self.dtype, data: &self.data }
    }

    /// The largest absolute difference to `other`, or infinity if the shapes differ; NaN in
    /// either gives NaN.
    pub fn max_abs_diff(&self, other: &Tensor) -> f32 {
        self.view().max_abs_diff(other.view())
    }
}

/// A borrowed, contiguous, row-major tensor, its elements as `f32` (see [`Tensor`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorRef<'r> {
    /// Dimensions, outermost first.
    pub shape: &'r [usize],
    /// Its dtype: the elements are values of it, widened to `f32`.
    pub dtype: DType,
    /// Elements, row-major.
    pub data: &'r [f32],
}

impl<'r> TensorRef<'r> {
    /// An owned copy.
    pub fn to_tensor(&self) -> Tensor {
        Tensor { shape: Shape::from_slice(self.shape), dtype: self.dtype, data: self.data.to_vec() }
    }

    /// The largest absolute difference to `other` (see [`Tensor::max_abs_diff`]).
    pub fn max_abs_diff(&self, other: TensorRef<'_>) -> f32 {
        if self.shape != other.shape {
            return f32::INFINITY;
        }
        self.data.iter().zip(other.data).fold(0.0f32, |m, (a, b)| {
            let d = (a - b).abs();
            if d.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        })
    }
}

/// A mutably borrowed, contiguous, row-major tensor, its elements as `f32`: a kernel's output.
/// A kernel writes values of its [`dtype`](Self::dtype) (round with [`DType::round`]).
#[derive(Debug, PartialEq)]
pub struct TensorMut<'r> {
    /// Dimensions, outermost first.
    pub shape: &'r [usize],
    /// Its dtype.
    pub dtype: DType,
    /// Elements, row-major.
    pub data: &'r mut [f32],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_refuse_shapes_past_usize_instead_of_wrapping() {
        // 2 x 2^63 wraps to 0 elements in a release build.
        let huge = [2, 1 << 63];
        for result in [
            std::panic::catch_unwind(|| Tensor::zeros(&huge)),
            std::panic::catch_unwind(|| Tensor::from_fn(&huge, |_| 1.0)),
        ] {
            assert!(result.is_err(), "made a tensor of shape {:?} with {} elements", huge, result.unwrap().data.len());
        }
        let numel = std::panic::catch_unwind(|| crate::TensorMeta::f32(&huge).numel());
        assert!(numel.is_err(), "numel {numel:?}");
        assert_eq!(crate::TensorMeta::f32(&huge).checked_numel(), None);
        assert!(matches!(Tensor::try_zeros(&huge), Err(Error::InvalidShape { .. })));
        assert!(matches!(Tensor::try_from_fn(&huge, |_| 1.0), Err(Error::InvalidShape { .. })));
        // A usable shape too large to allocate is an error too.
        let err = Tensor::try_zeros(&[1 << 60]).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        assert!(matches!(Tensor::try_from_fn(&[1 << 60], |_| 1.0), Err(Error::OutOfMemory { .. })));
        assert_eq!(Tensor::try_from_fn(&[2, 2], |i| i as f32).unwrap().data(), &[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(Tensor::try_zeros(&[3, 0]).unwrap().data(), &[] as &[f32]);
    }

    #[test]
    fn diff_reports_shape_mismatch_and_nan() {
        let a = Tensor::zeros(&[2]);
        assert_eq!(a.max_abs_diff(&Tensor::zeros(&[1, 2])), f32::INFINITY);
        let b = Tensor::new(&[2], vec![0.0, f32::NAN]).unwrap();
        assert!(a.max_abs_diff(&b).is_nan());
        let c = Tensor::new(&[2], vec![0.5, -1.0]).unwrap();
        assert_eq!(a.max_abs_diff(&c), 1.0);
    }
}
