//! 16-bit values on a device: two per 32-bit word of a device buffer, so that the `Device`
//! trait keeps moving `f32` words. Value `2i` is the low half of word `i`, value `2i + 1` its
//! high half (the little-endian order of a `__nv_bfloat16` or `__half` array); an odd count
//! leaves the last high half zero. The bits are those of the dtype (bf16: `f32`'s upper half;
//! f16: IEEE half precision), rounded to nearest, ties to even, by the `half` crate.

use super::device::{Device, DeviceBuffer};
use crate::core::ir::DType;
use crate::error::Result;

/// Whether values of `dtype` are stored two per word on a device.
pub(crate) fn is_packed(dtype: DType) -> bool {
    dtype.size_bytes() == 2
}

/// Device words that `n` values of `dtype` take.
pub(crate) fn words(dtype: DType, n: usize) -> usize {
    if is_packed(dtype) {
        n.div_ceil(2)
    } else {
        n
    }
}

fn bits(dtype: DType, x: f32) -> u32 {
    match dtype {
        DType::F16 => u32::from(half::f16::from_f32(x).to_bits()),
        _ => u32::from(half::bf16::from_f32(x).to_bits()),
    }
}

fn value(dtype: DType, bits: u32) -> f32 {
    let bits = (bits & 0xFFFF) as u16;
    match dtype {
        DType::F16 => half::f16::from_bits(bits).to_f32(),
        _ => half::bf16::from_bits(bits).to_f32(),
    }
}

/// `values` (of `dtype`, widened to `f32`) packed into `words`, which is cleared first (and
/// keeps its capacity: no allocation once it is large enough).
pub(crate) fn pack(dtype: DType, values: &[f32], words: &mut Vec<f32>) {
    words.clear();
    words.extend(values.chunks(2).map(|pair| {
        let low = bits(dtype, pair[0]);
        let high = pair.get(1).map_or(0, |&x| bits(dtype, x));
        f32::from_bits(low | (high << 16))
    }));
}

/// The values of `dtype` packed in `words`, widened into `values` (as many as it holds).
pub(crate) fn unpack(dtype: DType, words: &[f32], values: &mut [f32]) {
    for (i, v) in values.iter_mut().enumerate() {
        let word = words.get(i / 2).map_or(0, |w| w.to_bits());
        *v = value(dtype, if i % 2 == 0 { word } else { word >> 16 });
    }
}

/// Uploads `values` (of `dtype`, widened to `f32`) into `target`, packing 16-bit ones through
/// `scratch` (grown once, then reused).
pub(crate) fn upload(
    device: &dyn Device,
    dtype: DType,
    values: &[f32],
    target: &mut dyn DeviceBuffer,
    scratch: &mut Vec<f32>,
) -> Result<()> {
    if !is_packed(dtype) {
        return device.upload(values, target);
    }
    pack(dtype, values, scratch);
    device.upload(scratch, target)
}

/// Downloads `source` (values of `dtype`) into `values`, widened to `f32`, unpacking 16-bit
/// ones through `scratch` (grown once, then reused).
pub(crate) fn download(
    device: &dyn Device,
    dtype: DType,
    source: &dyn DeviceBuffer,
    values: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    if !is_packed(dtype) {
        return device.download(source, values);
    }
    scratch.clear();
    scratch.resize(words(dtype, values.len()), 0.0);
    device.download(source, scratch)?;
    unpack(dtype, scratch, values);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_and_orders_halves_little_endian() {
        for dtype in [DType::BF16, DType::F16] {
            let values = [1.0f32, -2.5, 0.0, f32::INFINITY, 3.0];
            let mut packed = Vec::new();
            pack(dtype, &values, &mut packed);
            assert_eq!(packed.len(), words(dtype, values.len()));
            let low = packed[0].to_bits() & 0xFFFF;
            assert_eq!(low, bits(dtype, 1.0), "{dtype}");
            let mut back = [0.0f32; 5];
            unpack(dtype, &packed, &mut back);
            assert_eq!(back, values, "{dtype}");
        }
        assert_eq!((words(DType::F32, 5), words(DType::BF16, 5)), (5, 3));
    }
}
