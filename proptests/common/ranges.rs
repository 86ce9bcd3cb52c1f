//! What a run pushed, as the NVTX capture saw it, next to what the plan's range map says, in
//! one comparable form.

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
        })
        .collect()
}
