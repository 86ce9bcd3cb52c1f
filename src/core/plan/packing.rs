//! Values of every dtype on a device, in their own bits, in the 32-bit words of a device buffer,
//! so that the `Device` trait keeps moving words: the little-endian layout of an array of the
//! dtype (`float`, `__nv_bfloat16`, `__half`, `int64_t`, `int32_t`). 16-bit values go two per
//! word: value `2i` is the low half of word `i`, value `2i + 1` its high half; an odd count
//! leaves the last high half zero. An `i64` takes two words, its low half first.

use super::device::{Device, DeviceBuffer};
use crate::core::ir::DType;
use crate::core::tensor::{Data, DataMut};
use crate::error::{Error, Result};

/// Whether values of `dtype` are stored two per word on a device.
pub(crate) fn is_packed(dtype: DType) -> bool {
    dtype.size_bytes() == 2
}

/// Device words that `n` values of `dtype` take.
pub(crate) fn words(dtype: DType, n: usize) -> usize {
    n.saturating_mul(dtype.size_bytes()).div_ceil(4)
}

/// Values of `dtype` that `words` device words hold.
pub(crate) fn values_in(dtype: DType, words: usize) -> usize {
    words.saturating_mul(4) / dtype.size_bytes()
}

/// Device words holding the values of `values`, in their dtype's own bits, into `words` (cleared
/// first; it keeps its capacity: no allocation once it is large enough). `f32` values are one
/// word each, `i32` values their bits, `i64` values two words (low, then high), 16-bit values
/// two per word.
pub(crate) fn pack(values: Data<'_>, words: &mut Vec<f32>) {
    words.clear();
    let word = |bits: u32| f32::from_bits(bits);
    match values {
        Data::F32(x) => words.extend_from_slice(x),
        Data::BF16(x) => words.extend(x.chunks(2).map(|p| word(pair(p[0].to_bits(), p.get(1).map(|h| h.to_bits()))))),
        Data::F16(x) => words.extend(x.chunks(2).map(|p| word(pair(p[0].to_bits(), p.get(1).map(|h| h.to_bits()))))),
        Data::I32(x) => words.extend(x.iter().map(|&v| word(v as u32))),
        Data::I64(x) => words.extend(x.iter().flat_map(|&v| [word(v as u32), word((v >> 32) as u32)])),
    }
}

/// Makes room for `n` words in `scratch` (which keeps its capacity between calls), or
/// [`Error::OutOfMemory`] naming `what` where the host cannot give it: a transfer of a tensor
/// too large for the host's memory is an error, not an abort.
pub(crate) fn reserve_words(scratch: &mut Vec<f32>, n: usize, what: &str) -> Result<()> {
    let more = n.saturating_sub(scratch.len());
    scratch.try_reserve_exact(more).map_err(|_| Error::OutOfMemory {
        what: what.into(),
        shape: vec![n],
        bytes: n.saturating_mul(std::mem::size_of::<f32>()),
    })
}

fn pair(low: u16, high: Option<u16>) -> u32 {
    u32::from(low) | (u32::from(high.unwrap_or(0)) << 16)
}

/// The values that `words` holds (as [`pack`] lays them out) into `values`, as many as it holds.
pub(crate) fn unpack(words: &[f32], values: DataMut<'_>) {
    let word = |i: usize| words.get(i).map_or(0, |w| w.to_bits());
    let half = |i: usize| (if i.is_multiple_of(2) { word(i / 2) } else { word(i / 2) >> 16 }) as u16;
    match values {
        DataMut::F32(x) => x.iter_mut().enumerate().for_each(|(i, v)| *v = f32::from_bits(word(i))),
        DataMut::BF16(x) => x.iter_mut().enumerate().for_each(|(i, v)| *v = half::bf16::from_bits(half(i))),
        DataMut::F16(x) => x.iter_mut().enumerate().for_each(|(i, v)| *v = half::f16::from_bits(half(i))),
        DataMut::I32(x) => x.iter_mut().enumerate().for_each(|(i, v)| *v = word(i) as i32),
        DataMut::I64(x) => x
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (u64::from(word(2 * i)) | (u64::from(word(2 * i + 1)) << 32)) as i64),
    }
}

/// Uploads `values` into `target`, through `scratch` (grown once, then reused) unless they are
/// `f32`.
pub(crate) fn upload(
    device: &dyn Device,
    values: Data<'_>,
    target: &mut dyn DeviceBuffer,
    scratch: &mut Vec<f32>,
) -> Result<()> {
    if let Data::F32(x) = values {
        return device.upload(x, target);
    }
    reserve_words(scratch, words(values.dtype(), values.len()), "an upload's staging")?;
    pack(values, scratch);
    device.upload(scratch, target)
}

/// Downloads `source` into `values`, through `scratch` (grown once, then reused) unless they
/// are `f32`.
pub(crate) fn download(
    device: &dyn Device,
    source: &dyn DeviceBuffer,
    values: DataMut<'_>,
    scratch: &mut Vec<f32>,
) -> Result<()> {
    let dtype = values.dtype();
    if let DataMut::F32(x) = values {
        return device.download(source, x);
    }
    scratch.clear();
    let n = words(dtype, values.len());
    reserve_words(scratch, n, "a download's staging")?;
    scratch.resize(n, 0.0);
    device.download(source, scratch)?;
    unpack(scratch, values);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_in_each_dtypes_own_bits() {
        use half::{bf16, f16};
        let b: Vec<bf16> = [1.0f32, -2.5, 0.0, f32::INFINITY, 3.0].iter().map(|&x| bf16::from_f32(x)).collect();
        let mut packed = Vec::new();
        pack(Data::BF16(&b), &mut packed);
        assert_eq!(packed.len(), words(DType::BF16, 5));
        assert_eq!(packed[0].to_bits() & 0xFFFF, u32::from(b[0].to_bits()));
        let mut back = [bf16::ZERO; 5];
        unpack(&packed, DataMut::BF16(&mut back));
        assert_eq!(back[..], b[..]);
        let h: Vec<f16> = [0.5f32, 65504.0, -1.0].iter().map(|&x| f16::from_f32(x)).collect();
        pack(Data::F16(&h), &mut packed);
        let mut back = [f16::ZERO; 3];
        unpack(&packed, DataMut::F16(&mut back));
        assert_eq!(back[..], h[..]);
        let ids = [i64::MIN, -1, (1 << 53) + 1, i64::MAX];
        pack(Data::I64(&ids), &mut packed);
        assert_eq!(packed.len(), 8);
        let mut back = [0i64; 4];
        unpack(&packed, DataMut::I64(&mut back));
        assert_eq!(back, ids);
        let small = [i32::MIN, 7, -7];
        pack(Data::I32(&small), &mut packed);
        let mut back = [0i32; 3];
        unpack(&packed, DataMut::I32(&mut back));
        assert_eq!(back, small);
        assert_eq!((words(DType::F32, 5), words(DType::BF16, 5), words(DType::I64, 5)), (5, 3, 10));
        assert_eq!((values_in(DType::BF16, 3), values_in(DType::I64, 10)), (6, 5));
    }
}
