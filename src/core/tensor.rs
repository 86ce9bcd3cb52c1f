//! Host tensors: owned (`Tensor`) and borrowed views (`TensorRef`, `TensorMut`) that kernels
//! read and write, each holding its dtype's own values ([`Data`], [`DataMut`]).

use std::fmt;

use half::{bf16, f16};

use crate::core::ir::{DType, Shape};
use crate::error::{Error, Result};

mod sealed {
    /// The owned values of a tensor, one vector of its element type. Public in a private
    /// module: the [`Element`](super::Element) trait names it, users cannot.
    #[derive(Clone, Debug, PartialEq)]
    pub enum Storage {
        F32(Vec<f32>),
        BF16(Vec<half::bf16>),
        F16(Vec<half::f16>),
        I64(Vec<i64>),
        I32(Vec<i32>),
    }

    pub trait Sealed: Sized {
        fn into_storage(values: Vec<Self>) -> Storage;
    }
}

pub(crate) use sealed::Storage;

impl Default for Storage {
    /// No values (what a buffer taken out of a workspace for a step leaves behind: steps with
    /// one output and a few inputs borrow it in place instead).
    fn default() -> Self {
        Storage::F32(Vec::new())
    }
}

/// A type that holds the values of one [`DType`]: `f32`, `half::bf16`, `half::f16`, `i64`,
/// `i32`. Sealed: the dtypes are the library's.
///
/// Conversions follow PyTorch's casts: between floats, rounding to nearest (ties to even);
/// floats to integers truncate toward zero (saturating; NaN gives 0); integers to floats round
/// to nearest; `i64` to `i32` wraps.
///
/// ```
/// use boundscope::{DType, Element};
/// assert_eq!(<i64 as Element>::DTYPE, DType::I64);
/// assert_eq!(i64::from_f32(-2.7), -2);
/// assert_eq!(half::bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
/// ```
pub trait Element: Copy + Default + PartialEq + fmt::Debug + Send + Sync + 'static + sealed::Sealed {
    /// Its dtype.
    const DTYPE: DType;
    /// The values of `data`, if they are of this type.
    fn slice(data: Data<'_>) -> Option<&[Self]>;
    /// The values of `data`, if they are of this type.
    fn slice_mut(data: DataMut<'_>) -> Option<&mut [Self]>;
    /// `values` as [`Data`].
    fn data(values: &[Self]) -> Data<'_>;
    /// `values` as [`DataMut`].
    fn data_mut(values: &mut [Self]) -> DataMut<'_>;
    /// The value as `f32` (exact for every float dtype; integers rounded to nearest).
    fn to_f32(self) -> f32;
    /// `x` as this type (floats: rounded to nearest; integers: truncated toward zero).
    fn from_f32(x: f32) -> Self;
    /// The value as `i64` (floats truncated toward zero).
    fn to_i64(self) -> i64;
    /// `x` as this type (floats: rounded to nearest; `i32`: wrapped).
    fn from_i64(x: i64) -> Self;
    /// `x` (of another element type) converted to this one, as a `cast` does.
    #[inline]
    fn convert<S: Element>(x: S) -> Self {
        if S::DTYPE.is_integer() {
            Self::from_i64(x.to_i64())
        } else {
            Self::from_f32(x.to_f32())
        }
    }
}

macro_rules! element {
    ($t:ty, $variant:ident, $to_f32:expr, $from_f32:expr, $to_i64:expr, $from_i64:expr) => {
        impl sealed::Sealed for $t {
            fn into_storage(values: Vec<Self>) -> Storage {
                Storage::$variant(values)
            }
        }
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            #[inline]
            fn slice(data: Data<'_>) -> Option<&[Self]> {
                match data {
                    Data::$variant(x) => Some(x),
                    _ => None,
                }
            }
            #[inline]
            fn slice_mut(data: DataMut<'_>) -> Option<&mut [Self]> {
                match data {
                    DataMut::$variant(x) => Some(x),
                    _ => None,
                }
            }
            #[inline]
            fn data(values: &[Self]) -> Data<'_> {
                Data::$variant(values)
            }
            #[inline]
            fn data_mut(values: &mut [Self]) -> DataMut<'_> {
                DataMut::$variant(values)
            }
            #[inline]
            fn to_f32(self) -> f32 {
                ($to_f32)(self)
            }
            #[inline]
            fn from_f32(x: f32) -> Self {
                ($from_f32)(x)
            }
            #[inline]
            fn to_i64(self) -> i64 {
                ($to_i64)(self)
            }
            #[inline]
            fn from_i64(x: i64) -> Self {
                ($from_i64)(x)
            }
        }
    };
}

element!(f32, F32, |x| x, |x| x, |x: f32| x as i64, |x: i64| x as f32);
element!(bf16, BF16, bf16::to_f32, bf16::from_f32, |x: bf16| x.to_f32() as i64, |x: i64| bf16::from_f32(x as f32));
element!(f16, F16, f16::to_f32, f16::from_f32, |x: f16| x.to_f32() as i64, |x: i64| f16::from_f32(x as f32));
element!(i64, I64, |x: i64| x as f32, |x: f32| x as i64, |x| x, |x| x);
element!(i32, I32, |x: i32| x as f32, |x: f32| x as i32, |x: i32| i64::from(x), |x: i64| x as i32);

/// Runs `$body` with `$x` bound to the typed slice inside a [`Data`] or [`DataMut`] (or the
/// vector inside a `Storage`), whatever its element type: code written once for every dtype.
macro_rules! with_values {
    ($kind:ident, $data:expr, $x:ident => $body:expr) => {
        match $data {
            $kind::F32($x) => $body,
            $kind::BF16($x) => $body,
            $kind::F16($x) => $body,
            $kind::I64($x) => $body,
            $kind::I32($x) => $body,
        }
    };
}
pub(crate) use with_values;

/// Runs `$body` with `$x` and `$y` bound to the typed slices of two views of the same dtype,
/// or evaluates `$mismatch` when their dtypes differ.
macro_rules! with_same_values {
    ($a:expr, $b:expr, ($x:ident, $y:ident) => $body:expr, _ => $mismatch:expr) => {{
        use $crate::core::tensor::{Data, DataMut};
        match ($a, $b) {
            (Data::F32($x), DataMut::F32($y)) => $body,
            (Data::BF16($x), DataMut::BF16($y)) => $body,
            (Data::F16($x), DataMut::F16($y)) => $body,
            (Data::I64($x), DataMut::I64($y)) => $body,
            (Data::I32($x), DataMut::I32($y)) => $body,
            _ => $mismatch,
        }
    }};
}
pub(crate) use with_same_values;

/// The values of a tensor view: a slice of its dtype's own type.
///
/// ```
/// use boundscope::{Data, DType, Tensor};
/// let ids = Tensor::from_vec(&[3], vec![7i64, 0, 2]).unwrap();
/// match ids.data() {
///     Data::I64(ids) => assert_eq!(ids, &[7, 0, 2]),
///     other => panic!("{:?}", other.dtype()),
/// }
/// assert_eq!(ids.data().dtype(), DType::I64);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Data<'r> {
    /// `f32` values.
    F32(&'r [f32]),
    /// bf16 values.
    BF16(&'r [bf16]),
    /// f16 values.
    F16(&'r [f16]),
    /// `i64` values.
    I64(&'r [i64]),
    /// `i32` values.
    I32(&'r [i32]),
}

/// The values of a mutable tensor view (a kernel's output): a slice of its dtype's own type.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum DataMut<'r> {
    /// `f32` values.
    F32(&'r mut [f32]),
    /// bf16 values.
    BF16(&'r mut [bf16]),
    /// f16 values.
    F16(&'r mut [f16]),
    /// `i64` values.
    I64(&'r mut [i64]),
    /// `i32` values.
    I32(&'r mut [i32]),
}

impl<'r> Data<'r> {
    /// The dtype of its values.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::BF16(_) => DType::BF16,
            Data::F16(_) => DType::F16,
            Data::I64(_) => DType::I64,
            Data::I32(_) => DType::I32,
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        with_values!(Data, self, x => x.len())
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i` as `f32` (see [`Element::to_f32`]).
    ///
    /// # Panics
    /// If `i` is out of bounds, as slice indexing does.
    #[inline]
    pub fn f32_at(&self, i: usize) -> f32 {
        with_values!(Data, self, x => x[i].to_f32())
    }

    /// Every value as `f32` (see [`Element::to_f32`]).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        with_values!(Data, self, x => x.iter().map(|v| v.to_f32()).collect())
    }

    /// No values, of `dtype`.
    pub fn empty(dtype: DType) -> Data<'static> {
        match dtype {
            DType::F32 => Data::F32(&[]),
            DType::BF16 => Data::BF16(&[]),
            DType::F16 => Data::F16(&[]),
            DType::I64 => Data::I64(&[]),
            DType::I32 => Data::I32(&[]),
        }
    }

    /// The values as `&[T]`, or `None` if they are of another type.
    pub fn as_slice<T: Element>(self) -> Option<&'r [T]> {
        T::slice(self)
    }
}

impl<'r> DataMut<'r> {
    /// The dtype of its values.
    pub fn dtype(&self) -> DType {
        self.as_data().dtype()
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        with_values!(DataMut, self, x => x.len())
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A shorter-lived copy of the borrow, to pass on without giving it up.
    pub fn reborrow(&mut self) -> DataMut<'_> {
        with_values!(DataMut, self, x => Element::data_mut(x))
    }

    /// A shared view of the values.
    pub fn as_data(&self) -> Data<'_> {
        with_values!(DataMut, self, x => Element::data(x))
    }

    /// The values as `&mut [T]`, or `None` if they are of another type.
    pub fn into_slice<T: Element>(self) -> Option<&'r mut [T]> {
        T::slice_mut(self)
    }

    /// Sets value `i` to `x`, converted to the values' type (see [`Element::from_f32`]).
    ///
    /// # Panics
    /// If `i` is out of bounds, as slice indexing does.
    #[inline]
    pub fn set_f32(&mut self, i: usize, x: f32) {
        with_values!(DataMut, self, v => v[i] = Element::from_f32(x))
    }
}

impl<'r, T: Element> From<&'r [T]> for Data<'r> {
    fn from(values: &'r [T]) -> Self {
        T::data(values)
    }
}

impl<'r, T: Element> From<&'r mut [T]> for DataMut<'r> {
    fn from(values: &'r mut [T]) -> Self {
        T::data_mut(values)
    }
}

impl Storage {
    /// `numel` zeros of `dtype`, or [`Error::OutOfMemory`] naming `what` and `shape`.
    pub(crate) fn try_zeros(dtype: DType, numel: usize, what: &str, shape: &[usize]) -> Result<Self> {
        fn zeros<T: Element>(numel: usize, what: &str, shape: &[usize]) -> Result<Storage> {
            let mut values: Vec<T> = Vec::new();
            values.try_reserve_exact(numel).map_err(|_| Error::OutOfMemory {
                what: what.into(),
                shape: shape.to_vec(),
                bytes: numel.saturating_mul(std::mem::size_of::<T>()),
            })?;
            values.resize(numel, T::default());
            Ok(T::into_storage(values))
        }
        match dtype {
            DType::F32 => zeros::<f32>(numel, what, shape),
            DType::BF16 => zeros::<bf16>(numel, what, shape),
            DType::F16 => zeros::<f16>(numel, what, shape),
            DType::I64 => zeros::<i64>(numel, what, shape),
            DType::I32 => zeros::<i32>(numel, what, shape),
        }
    }

    /// A view of its values.
    #[inline]
    pub(crate) fn data(&self) -> Data<'_> {
        with_values!(Storage, self, x => Element::data(x.as_slice()))
    }

    /// A mutable view of its values.
    #[inline]
    pub(crate) fn data_mut(&mut self) -> DataMut<'_> {
        with_values!(Storage, self, x => Element::data_mut(x.as_mut_slice()))
    }

    /// The number of values.
    pub(crate) fn len(&self) -> usize {
        with_values!(Storage, self, x => x.len())
    }

    /// Bytes its values take.
    pub(crate) fn bytes(&self) -> usize {
        self.len() * self.data().dtype().size_bytes()
    }

    /// A copy of `data`.
    pub(crate) fn copy_of(data: Data<'_>) -> Self {
        with_values!(Data, data, x => sealed::Sealed::into_storage(x.to_vec()))
    }

    /// `data` converted to `dtype`, as a `cast` converts (see [`Element`]).
    fn converted(data: Data<'_>, dtype: DType) -> Self {
        fn to<S: Element, T: Element>(x: &[S]) -> Storage {
            T::into_storage(x.iter().map(|&v| T::convert(v)).collect())
        }
        with_values!(Data, data, x => match dtype {
            DType::F32 => to::<_, f32>(x),
            DType::BF16 => to::<_, bf16>(x),
            DType::F16 => to::<_, f16>(x),
            DType::I64 => to::<_, i64>(x),
            DType::I32 => to::<_, i32>(x),
        })
    }
}

/// Whether `len` values fill `shape`: [`Error::InvalidTensor`] if not.
pub(crate) fn holds(shape: &[usize], len: usize) -> Result<()> {
    if crate::core::ir::checked_numel(shape) != Some(len) {
        return Err(Error::InvalidTensor { shape: shape.to_vec(), len });
    }
    Ok(())
}

/// An owned, contiguous, row-major tensor on the host, holding the values of its dtype (4 bytes
/// per `f32` or `i32`, 2 per bf16 or f16, 8 per `i64`).
///
/// ```
/// use boundscope::{DType, Tensor};
/// let t = Tensor::from_fn(&[2, 3], |i| i as f32);
/// assert_eq!(t.shape(), &[2, 3]);
/// assert_eq!(t.values::<f32>().unwrap()[5], 5.0);
/// assert!(Tensor::new(&[2, 3], vec![0.0; 5]).is_err());
/// let ids = Tensor::from_vec(&[2], vec![50256i64, 11]).unwrap();
/// assert_eq!((ids.dtype(), ids.bytes()), (DType::I64, 16));
/// assert!(ids.values::<f32>().is_err()); // a typed error: it holds i64
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Shape,
    storage: Storage,
}

impl Tensor {
    /// An `f32` tensor of this shape holding `data` in row-major order.
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if `data.len()` is not the product of `shape`.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        Self::from_vec(shape, data)
    }

    /// A tensor of this shape holding `values` (of any [`Element`] type: `f32`, `half::bf16`,
    /// `half::f16`, `i64`, `i32`) in row-major order; its dtype is theirs.
    ///
    /// ```
    /// use boundscope::{DType, Tensor};
    /// let t = Tensor::from_vec(&[2, 2], vec![1i32, 2, 3, 4]).unwrap();
    /// assert_eq!(t.dtype(), DType::I32);
    /// assert_eq!(t.to_dtype(DType::F32).values::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if `values.len()` is not the product of `shape`.
    pub fn from_vec<T: Element>(shape: &[usize], values: Vec<T>) -> Result<Self> {
        holds(shape, values.len())?;
        Ok(Self { shape: Shape::from_slice(shape), storage: T::into_storage(values) })
    }

    /// A tensor of this shape holding `storage` (whose length the caller checked).
    pub(crate) fn from_storage(shape: &[usize], storage: Storage) -> Self {
        debug_assert_eq!(crate::core::ir::checked_numel(shape), Some(storage.len()));
        Self { shape: Shape::from_slice(shape), storage }
    }

    /// A bf16 tensor of this shape holding `data` (from the `half` crate) in row-major order:
    /// [`from_vec`](Self::from_vec) for bf16.
    ///
    /// ```
    /// use boundscope::{DType, Tensor};
    /// use half::bf16;
    /// let t = Tensor::from_bf16(&[2], vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]).unwrap();
    /// assert_eq!((t.dtype(), t.to_f32_vec()), (DType::BF16, vec![1.5, -2.0]));
    /// assert_eq!(t.bytes(), 4);
    /// assert_eq!(t.to_bf16(), vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if `data.len()` is not the product of `shape`.
    pub fn from_bf16(shape: &[usize], data: Vec<bf16>) -> Result<Self> {
        Self::from_vec(shape, data)
    }

    /// An f16 tensor of this shape holding `data` (from the `half` crate) in row-major order:
    /// [`from_vec`](Self::from_vec) for f16.
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if `data.len()` is not the product of `shape`.
    pub fn from_f16(shape: &[usize], data: Vec<f16>) -> Result<Self> {
        Self::from_vec(shape, data)
    }

    /// The same values converted to `dtype` as a `cast` converts them (see [`Element`]):
    /// floats rounded to nearest (ties to even; past the range, an infinity), as
    /// [`DType::round`] does; floats to integers truncated toward zero.
    ///
    /// ```
    /// use boundscope::{DType, Tensor};
    /// let t = Tensor::new(&[3], vec![1.0, 1.0 + 1.0 / 128.0, 70000.0]).unwrap();
    /// let h = t.to_dtype(DType::F16);
    /// assert_eq!(h.to_f32_vec(), [1.0, 1.0 + 1.0 / 128.0, f32::INFINITY]);
    /// assert_eq!(t.to_dtype(DType::BF16).to_f32_vec(), [1.0, 1.0078125, 70144.0]);
    /// assert_eq!(t.to_dtype(DType::I64).values::<i64>().unwrap(), &[1, 1, 70000]);
    /// ```
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        Tensor { shape: self.shape.clone(), storage: Storage::converted(self.data(), dtype) }
    }

    /// Its dtype.
    pub fn dtype(&self) -> DType {
        self.data().dtype()
    }

    /// Its values.
    pub fn data(&self) -> Data<'_> {
        self.storage.data()
    }

    /// Its values, mutable. In a float tensor, write values its dtype represents: a bf16 or
    /// f16 tensor holds nothing else.
    pub fn data_mut(&mut self) -> DataMut<'_> {
        self.storage.data_mut()
    }

    /// Its values as `&[T]`.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] if they are of another dtype than `T`'s.
    pub fn values<T: Element>(&self) -> Result<&[T]> {
        let got = self.dtype();
        T::slice(self.data()).ok_or_else(|| Error::DTypeMismatch { what: "the tensor".into(), expected: T::DTYPE, got })
    }

    /// Its values as `&mut [T]`.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] if they are of another dtype than `T`'s.
    pub fn values_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        let got = self.dtype();
        T::slice_mut(self.data_mut()).ok_or_else(|| Error::DTypeMismatch {
            what: "the tensor".into(),
            expected: T::DTYPE,
            got,
        })
    }

    /// Its values as `f32` (exact for every float dtype; see [`Element::to_f32`]).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.data().to_f32_vec()
    }

    /// Its elements as bf16 (rounded, if it is not bf16).
    pub fn to_bf16(&self) -> Vec<bf16> {
        with_values!(Data, self.data(), x => x.iter().map(|&v| bf16::convert(v)).collect())
    }

    /// Its elements as f16 (rounded, if it is not f16).
    pub fn to_f16(&self) -> Vec<f16> {
        with_values!(Data, self.data(), x => x.iter().map(|&v| f16::convert(v)).collect())
    }

    /// An `f32` tensor of zeros.
    ///
    /// ```
    /// use boundscope::Tensor;
    /// assert_eq!(Tensor::zeros(&[2, 3]).to_f32_vec(), [0.0; 6]);
    /// ```
    ///
    /// # Panics
    /// If [`checked_numel`](crate::checked_numel) refuses the shape or the allocation fails;
    /// [`try_zeros`](Self::try_zeros) returns an error instead.
    pub fn zeros(shape: &[usize]) -> Self {
        Self::try_zeros(shape).unwrap_or_else(|e| panic!("Tensor::zeros: {e}"))
    }

    /// An `f32` tensor of zeros, or an error if it cannot be made.
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
        Self::try_zeros_of(DType::F32, shape)
    }

    /// A tensor of zeros of `dtype`, or an error if it cannot be made.
    ///
    /// ```
    /// use boundscope::{DType, Tensor};
    /// let t = Tensor::try_zeros_of(DType::I64, &[4]).unwrap();
    /// assert_eq!(t.values::<i64>().unwrap(), &[0; 4]);
    /// ```
    ///
    /// # Errors
    /// As for [`try_zeros`](Self::try_zeros).
    pub fn try_zeros_of(dtype: DType, shape: &[usize]) -> Result<Self> {
        let numel = Self::numel_of(shape)?;
        Ok(Self { shape: Shape::from_slice(shape), storage: Storage::try_zeros(dtype, numel, "Tensor", shape)? })
    }

    /// An `f32` tensor whose element at flat index `i` is `f(i)`.
    ///
    /// # Panics
    /// If [`checked_numel`](crate::checked_numel) refuses the shape or the allocation fails;
    /// [`try_from_fn`](Self::try_from_fn) returns an error instead.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> f32) -> Self {
        Self::try_from_fn(shape, f).unwrap_or_else(|e| panic!("Tensor::from_fn: {e}"))
    }

    /// An `f32` tensor whose element at flat index `i` is `f(i)`, or an error if it cannot be
    /// made.
    ///
    /// ```
    /// use boundscope::{Error, Tensor};
    /// assert_eq!(Tensor::try_from_fn(&[3], |i| i as f32).unwrap().to_f32_vec(), [0.0, 1.0, 2.0]);
    /// assert!(matches!(Tensor::try_from_fn(&[usize::MAX, 2], |_| 0.0), Err(Error::InvalidShape { .. })));
    /// ```
    ///
    /// # Errors
    /// As for [`try_zeros`](Self::try_zeros); `f` is not called on error.
    pub fn try_from_fn(shape: &[usize], f: impl FnMut(usize) -> f32) -> Result<Self> {
        let numel = Self::numel_of(shape)?;
        let mut data = Vec::new();
        data.try_reserve_exact(numel).map_err(|_| Error::OutOfMemory {
            what: "Tensor".into(),
            shape: shape.to_vec(),
            bytes: numel.saturating_mul(std::mem::size_of::<f32>()),
        })?;
        data.extend((0..numel).map(f));
        Ok(Self { shape: Shape::from_slice(shape), storage: Storage::F32(data) })
    }

    fn numel_of(shape: &[usize]) -> Result<usize> {
        crate::core::ir::checked_numel(shape).ok_or_else(|| Error::InvalidShape {
            shape: shape.to_vec(),
            detail: crate::core::ir::unusable_shape_detail(shape),
        })
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of its elements.
    pub fn numel(&self) -> usize {
        self.storage.len()
    }

    /// Bytes its values take.
    pub fn bytes(&self) -> usize {
        self.storage.bytes()
    }

    /// A borrowed view.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef { shape: &self.shape, data: self.storage.data() }
    }

    /// A mutably borrowed view.
    pub fn view_mut(&mut self) -> TensorMut<'_> {
        TensorMut { shape: &self.shape, data: self.storage.data_mut() }
    }

    /// The largest absolute difference to `other`, compared as `f32`, or infinity if the
    /// shapes differ; NaN in either gives NaN.
    pub fn max_abs_diff(&self, other: &Tensor) -> f32 {
        self.view().max_abs_diff(other.view())
    }
}

/// A borrowed, contiguous, row-major tensor: a kernel's input.
///
/// ```
/// use boundscope::{DType, TensorRef};
/// let values = [1.0f32, 2.0, 3.0];
/// let x = TensorRef::new(&[3], &values[..]).unwrap();
/// assert_eq!((x.dtype(), x.values::<f32>().unwrap()), (DType::F32, &values[..]));
/// assert!(TensorRef::new(&[2, 2], &values[..]).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorRef<'r> {
    /// Dimensions, outermost first.
    pub shape: &'r [usize],
    /// Elements, row-major, of the tensor's dtype.
    pub data: Data<'r>,
}

impl<'r> TensorRef<'r> {
    /// A view of `values` with this shape.
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if the number of values is not the product of `shape`.
    pub fn new(shape: &'r [usize], values: impl Into<Data<'r>>) -> Result<Self> {
        let data = values.into();
        holds(shape, data.len())?;
        Ok(Self { shape, data })
    }

    /// Its dtype.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// Its number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Its values as `&[T]`.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] if they are of another dtype than `T`'s.
    #[inline]
    pub fn values<T: Element>(&self) -> Result<&'r [T]> {
        T::slice(self.data).ok_or_else(|| Error::DTypeMismatch {
            what: "the input".into(),
            expected: T::DTYPE,
            got: self.data.dtype(),
        })
    }

    /// An owned copy.
    pub fn to_tensor(&self) -> Tensor {
        Tensor { shape: Shape::from_slice(self.shape), storage: Storage::copy_of(self.data) }
    }

    /// The largest absolute difference to `other` (see [`Tensor::max_abs_diff`]).
    pub fn max_abs_diff(&self, other: TensorRef<'_>) -> f32 {
        if self.shape != other.shape || self.data.len() != other.data.len() {
            return f32::INFINITY;
        }
        (0..self.data.len()).fold(0.0f32, |m, i| {
            let d = (self.data.f32_at(i) - other.data.f32_at(i)).abs();
            if d.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        })
    }
}

/// A mutably borrowed, contiguous, row-major tensor: a kernel's output, which it fills with
/// values of its dtype.
#[derive(Debug, PartialEq)]
pub struct TensorMut<'r> {
    /// Dimensions, outermost first.
    pub shape: &'r [usize],
    /// Elements, row-major, of the tensor's dtype.
    pub data: DataMut<'r>,
}

impl<'r> TensorMut<'r> {
    /// A mutable view of `values` with this shape.
    ///
    /// ```
    /// use boundscope::TensorMut;
    /// let mut out = [0i64; 4];
    /// let mut view = TensorMut::new(&[2, 2], &mut out[..]).unwrap();
    /// view.values_mut::<i64>().unwrap()[3] = 9;
    /// assert_eq!(out, [0, 0, 0, 9]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTensor`] if the number of values is not the product of `shape`.
    pub fn new(shape: &'r [usize], values: impl Into<DataMut<'r>>) -> Result<Self> {
        let data = values.into();
        holds(shape, data.len())?;
        Ok(Self { shape, data })
    }

    /// Its dtype.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// Its number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Its values as `&mut [T]`.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] if they are of another dtype than `T`'s.
    #[inline]
    pub fn values_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        let got = self.data.dtype();
        T::slice_mut(self.data.reborrow()).ok_or_else(|| Error::DTypeMismatch {
            what: "the output".into(),
            expected: T::DTYPE,
            got,
        })
    }
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
            assert!(result.is_err(), "made a tensor of shape {:?} with {} elements", huge, result.unwrap().numel());
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
        assert!(matches!(Tensor::try_zeros_of(DType::I64, &[1 << 60]), Err(Error::OutOfMemory { .. })));
        assert_eq!(Tensor::try_from_fn(&[2, 2], |i| i as f32).unwrap().to_f32_vec(), [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(Tensor::try_zeros(&[3, 0]).unwrap().numel(), 0);
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

    #[test]
    fn each_dtype_is_stored_in_its_own_width_and_exactly() {
        let big = (1i64 << 53) + 1; // not an f32, not even an f64
        let ids = Tensor::from_vec(&[2], vec![big, -3]).unwrap();
        assert_eq!((ids.bytes(), ids.values::<i64>().unwrap()), (16, &[big, -3][..]));
        assert_eq!(ids.to_dtype(DType::I32).values::<i32>().unwrap(), &[1, -3]); // wraps, as PyTorch
        let x = Tensor::new(&[2], vec![1.5, -2.25]).unwrap();
        for dtype in DType::ALL {
            let t = x.to_dtype(dtype);
            assert_eq!((t.dtype(), t.bytes()), (dtype, 2 * dtype.size_bytes()));
            let expected = if dtype.is_integer() { [1.0, -2.0] } else { [1.5, -2.25] };
            assert_eq!(t.to_f32_vec(), expected, "{dtype}");
            assert_eq!(t.view().to_tensor(), t);
        }
        let err = ids.values::<f32>().unwrap_err();
        assert!(matches!(err, Error::DTypeMismatch { expected: DType::F32, got: DType::I64, .. }), "{err}");
        assert!(err.to_string().contains("values::<i64>()"), "{err}");
    }

    #[test]
    fn casts_follow_pytorch() {
        assert_eq!(i64::convert(-2.9f32), -2);
        assert_eq!(i32::convert(f32::NAN), 0);
        assert_eq!(i32::convert(1e20f32), i32::MAX);
        assert_eq!(f32::convert(16_777_217i64), 16_777_216.0);
        assert_eq!(bf16::convert(3i32).to_f32(), 3.0);
        assert_eq!(i64::convert(bf16::from_f32(-7.5)), -7);
    }
}
