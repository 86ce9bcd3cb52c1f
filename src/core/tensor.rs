//! Host tensors: owned (`Tensor`) and borrowed views (`TensorRef`, `TensorMut`) that kernels
//! read and write.

use crate::core::ir::Shape;
use crate::error::{Error, Result};

/// An owned, contiguous, row-major `f32` tensor on the host.
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
        Ok(Self { shape: Shape::from_slice(shape), data })
    }

    /// A tensor of zeros.
    ///
    /// # Panics
    /// If the shape has more elements than a buffer can hold, as `vec!` would.
    pub fn zeros(shape: &[usize]) -> Self {
        Self { shape: Shape::from_slice(shape), data: vec![0.0; shape.iter().product()] }
    }

    /// A tensor whose element at flat index `i` is `f(i)`.
    ///
    /// # Panics
    /// If the shape has more elements than a buffer can hold, as `Vec` would.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> f32) -> Self {
        Self { shape: Shape::from_slice(shape), data: (0..shape.iter().product()).map(f).collect() }
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Its elements, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// A borrowed view.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef { shape: &self.shape, data: &self.data }
    }

    /// The largest absolute difference to `other`, or infinity if the shapes differ; NaN in
    /// either gives NaN.
    pub fn max_abs_diff(&self, other: &Tensor) -> f32 {
        self.view().max_abs_diff(other.view())
    }
}

/// A borrowed, contiguous, row-major `f32` tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorRef<'r> {
    /// Dimensions, outermost first.
    pub shape: &'r [usize],
    /// Elements, row-major.
    pub data: &'r [f32],
}

impl<'r> TensorRef<'r> {
    /// An owned copy.
    pub fn to_tensor(&self) -> Tensor {
        Tensor { shape: Shape::from_slice(self.shape), data: self.data.to_vec() }
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

/// A mutably borrowed, contiguous, row-major `f32` tensor: a kernel's output.
#[derive(Debug, PartialEq)]
pub struct TensorMut<'r> {
    /// Dimensions, outermost first.
    pub shape: &'r [usize],
    /// Elements, row-major.
    pub data: &'r mut [f32],
}

#[cfg(test)]
mod tests {
    use super::*;

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
