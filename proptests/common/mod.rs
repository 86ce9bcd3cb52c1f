//! Shared by the property tests: random program descriptions, how to build them as traces,
//! and a naive direct evaluator of the same math that shares no code with boundscope.
#![allow(dead_code)]

pub mod allocations;
pub mod nvtx_capture;
pub mod oracle;
pub mod program;

use boundscope::TensorRef;

/// Whether `got` equals `expected` within a relative tolerance, NaN matching NaN and
/// infinities matching by sign.
pub fn close(got: TensorRef<'_>, expected: &oracle::Value, tolerance: f32) -> Result<(), String> {
    if got.shape != expected.shape.as_slice() {
        return Err(format!("shape {:?} vs expected {:?}", got.shape, expected.shape));
    }
    for (i, (&g, &e)) in got.data.iter().zip(&expected.data).enumerate() {
        let same =
            (g.is_nan() && e.is_nan()) || (g.is_infinite() && g == e) || (g - e).abs() <= tolerance * e.abs().max(1.0);
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
        close(g.view(), &e, tolerance).map_err(|m| format!("output {i}: {m}"))?;
    }
    Ok(())
}
