//! Shared by the property tests: random program descriptions, how to build them as traces,
//! and a naive direct evaluator of the same math that shares no code with boundscope.
#![allow(dead_code)]

pub mod allocations;
pub mod f64_interpreter;
pub mod nvtx_capture;
pub mod nvtx_extension_abi;
pub mod nvtx_payloads;
pub mod oracle;
pub mod program;
pub mod ranges;

use boundscope::TensorRef;

/// Whether `got` equals `expected` within a relative tolerance, NaN matching NaN and
/// infinities matching by sign. `spread` (per element, or empty for none) is what the same
/// math gives when the inputs and every intermediate move by a few ulps (see
/// [`oracle::evaluate_with_spread`]): what f32 rounding alone can make of each element.
///
/// An element is right when some evaluation explains it, the plain one or a nudged one:
/// - a finite element must be within `tolerance` (relative, at least absolute) plus 4x the
///   finite spread of a finite evaluation. An ill-conditioned element (a division by a
///   difference that nearly cancels, say) may be off by that much for reasons of rounding
///   alone; a finite element where no evaluation is finite is wrong.
/// - a non-finite element must be what an evaluation gives (NaN for NaN, an infinity of the
///   same sign) or, where the evaluations disagree on finiteness (rounding alone can overflow
///   the element, or keep it from overflowing), NaN or an infinity of a sign some evaluation
///   has. Which non-finite value follows an overflow (an infinity, or NaN after `inf - inf`)
///   depends on which intermediate overflowed first, which two nudges cannot pin down; the
///   sign of an overflow they can.
/// - an element that divides by what cancels to zero (the sum of a `layer_norm`'s row, say) is
///   decided by rounding alone: its sign, its size, and whether the divisor is an exact zero.
///   Two signs show it: finite evaluations of both signs (then a non-finite element is right),
///   and an infinite evaluation (an exact zero divided) beside a finite one far below the
///   overflow threshold (that zero, nudged): then a non-finite element is right, and so is a
///   finite one of either sign at least 1/64 of the smallest finite evaluation in magnitude
///   (nudges move the divisor further from zero than plain rounding does, so they give the
///   smaller quotients). A finite element where the evaluations only disagree on the sign is
///   held to the spread as any other: a value that cancels without being divided is near zero.
///
/// (Counting a disagreement on finiteness as an infinite spread, as this did before, accepts
/// every finite value next to an overflow: a tolerance that cannot fail there.)
pub fn close(
    got: TensorRef<'_>,
    expected: &oracle::Value,
    spread: &[oracle::Spread],
    tolerance: f32,
) -> Result<(), String> {
    if got.shape != expected.shape.as_slice() {
        return Err(format!("shape {:?} vs expected {:?}", got.shape, expected.shape));
    }
    for (i, (g, &e)) in got.data.to_f32_vec().into_iter().zip(&expected.data).enumerate() {
        let s = spread.get(i);
        let evaluations: Vec<f32> =
            std::iter::once(e).chain(s.map_or(&[][..], |s| &s.nudged[..]).iter().copied()).collect();
        let finite_spread = s.map_or(0.0, |s| s.finite);
        // Rounding alone decides the element (see above): the smallest finite evaluation's
        // magnitude, where it does.
        let finite_of_sign =
            |negative: bool| evaluations.iter().any(|&r| r.is_finite() && r != 0.0 && (r < 0.0) == negative);
        let smallest = evaluations.iter().filter(|r| r.is_finite()).map(|r| r.abs()).fold(f32::INFINITY, f32::min);
        let zero_divided = evaluations.iter().any(|r| r.is_infinite()) && smallest < 1e30;
        let undetermined = (finite_of_sign(true) && finite_of_sign(false)) || zero_divided;
        let same = if g.is_finite() {
            evaluations
                .iter()
                .any(|&r| r.is_finite() && (g - r).abs() <= tolerance * r.abs().max(1.0) + 4.0 * finite_spread)
                || (zero_divided && g.abs() >= smallest / 64.0)
        } else {
            let flips = evaluations.iter().any(|r| r.is_finite()) && evaluations.iter().any(|r| !r.is_finite());
            let sign_seen =
                |negative: bool| evaluations.iter().any(|r| !r.is_nan() && r.is_sign_negative() == negative);
            evaluations.iter().any(|&r| (g.is_nan() && r.is_nan()) || g == r)
                || (flips && (g.is_nan() || sign_seen(g.is_sign_negative())))
                || undetermined
        };
        if !same {
            return Err(format!("element {i}: got {g}, expected {e} (nudged: {:?})", s.map(|s| s.nudged)));
        }
    }
    Ok(())
}

/// Every output within `tolerance` of the expected tensor (see [`close`]).
pub fn close_all(got: &[boundscope::Tensor], expected: &[boundscope::Tensor], tolerance: f32) -> Result<(), String> {
    if got.len() != expected.len() {
        return Err(format!("{} outputs, expected {}", got.len(), expected.len()));
    }
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let e = oracle::Value { shape: e.shape().to_vec(), data: e.to_f32_vec() };
        close(g.view(), &e, &[], tolerance).map_err(|m| format!("output {i}: {m}"))?;
    }
    Ok(())
}
