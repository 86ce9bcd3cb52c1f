//! Shared by the property tests: random program descriptions, how to build them as traces,
//! and a naive direct evaluator of the same math that shares no code with boundscope.
#![allow(dead_code)]

pub mod allocations;
pub mod nvtx_capture;
pub mod oracle;
pub mod program;

use boundscope::TensorRef;

/// Whether `got` equals `expected` within a relative tolerance, NaN matching NaN and
/// infinities matching by sign. `spread` (per element, or empty for none) is how far the
/// expected value itself moves when the inputs move by a few ulps (see
/// [`oracle::evaluate_with_spread`]): an ill-conditioned element (a division by a difference
/// that nearly cancels, say) may differ by that much more, for reasons of f32 rounding alone.
pub fn close(got: TensorRef<'_>, expected: &oracle::Value, spread: &[f32], tolerance: f32) -> Result<(), String> {
    if got.shape != expected.shape.as_slice() {
        return Err(format!("shape {:?} vs expected {:?}", got.shape, expected.shape));
    }
    for (i, (&g, &e)) in got.data.iter().zip(&expected.data).enumerate() {
        let allowed = tolerance * e.abs().max(1.0) + 4.0 * spread.get(i).copied().unwrap_or(0.0);
        let same = (g.is_nan() && e.is_nan()) || (g.is_infinite() && g == e) || (g - e).abs() <= allowed;
        if !same {
            return Err(format!("element {i}: got {g}, expected {e}"));
        }
    }
    Ok(())
}

/// Every output within `tolerance` of the expected tensor (see [`close`]).
pub fn close_all(got: &[boundscope::Tensor], expected: &[boundscope::Tensor], tolerance: f32) -> Result<(), String> {
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let e = oracle::Value { shape: e.shape().to_vec(), data: e.data().to_vec() };
        close(g.view(), &e, &[], tolerance).map_err(|m| format!("output {i}: {m}"))?;
    }
    Ok(())
}
