//! What a run pushed, as the NVTX capture saw it, next to what the plan's range map says, in
//! one comparable form.

use boundscope::guards::ScopeDetails;
use boundscope::RangeMap;

use super::nvtx_capture::{NvtxEvent, NvtxEventKind};

/// One push as the NVTX API saw it, or as the range map says it.
#[derive(Clone, Debug, PartialEq)]
pub struct Push {
    pub domain: String,
    pub label: String,
    pub category: Option<u32>,
    pub color: Option<u32>,
    pub payload: Option<u64>,
    /// The structured payload, as [`super::nvtx_payloads`] decodes it.
    pub details: Option<String>,
}

pub fn pushes_of(events: &[NvtxEvent]) -> Vec<Push> {
    events
        .iter()
        .filter(|e| e.kind == NvtxEventKind::Push)
        .map(|e| Push {
            domain: e.domain.clone().unwrap_or_default(),
            label: e.message.clone().unwrap_or_default(),
            category: Some(e.category),
            color: e.color,
            payload: e.payload,
            details: e.details.clone(),
        })
        .collect()
}

pub fn pushes_in(map: &RangeMap) -> Vec<Push> {
    map.ranges()
        .iter()
        .map(|r| Push {
            domain: r.domain.clone(),
            label: r.label.clone(),
            category: r.category,
            color: r.color,
            payload: r.payload,
            details: r.details.as_ref().map(details_line),
        })
        .collect()
}

/// The line the capture decodes from the payload of a range with these details: boundscope's
/// schema's entries in order, the texts cut to the embedded lengths (159 and 95 bytes, ending
/// in `...` when cut).
pub fn details_line(d: &ScopeDetails) -> String {
    fn cut(text: String, max: usize) -> String {
        if text.len() <= max {
            return text;
        }
        let mut end = max - 3;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &text[..end])
    }
    format!(
        "plan={}; first_step={}; steps={}; ops={}; bytes_read={}; bytes_written={}; flops={}; inputs={}; outputs={}",
        d.plan,
        d.first_step,
        d.steps,
        d.ops,
        d.bytes_read,
        d.bytes_written,
        d.flops,
        cut(d.inputs_text(), 159),
        cut(d.outputs_text(), 95)
    )
}
