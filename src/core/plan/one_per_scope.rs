//! The rule "one range per scope per domain": the guards that land on one scope, merged.
//!
//! A scope is what a guard surrounds in a compiled plan: a run, a region, an op or a subsymbol
//! span, as a range of steps and a level. Several attachments can land on one scope (a pass
//! applied twice, the front end profiling what the user already profiled, one recorder
//! attached twice, a fused op's guards moving to its region). Per scope, guards that report
//! an NVTX domain become one range per domain, and other guards run once per guard object or
//! merge key. The plan compiler uses this for regions (to give an executor the range it must
//! push in its declared domain) and for every scope it prepares, so both see the same merge.

use crate::core::guards::{Attachment, GuardKind, GuardTable, NvtxRange};
use crate::core::ir::GuardId;

/// One entry of a scope: an NVTX domain's one range, or another guard.
pub(crate) enum ScopeEntry {
    /// The NVTX guards of one domain on the scope.
    Nvtx {
        domain: String,
        /// The first guard of the domain attached to the scope: it is the range.
        guard: GuardId,
        /// For a built-in range, its settings merged with those of the later ones.
        merged: Option<NvtxRange>,
    },
    /// Any other guard, once per guard object or merge key.
    Other { guard: GuardId },
}

/// The guards on one scope, merged by the rule, in attach order.
#[derive(Default)]
pub(crate) struct ScopeGuards {
    pub entries: Vec<ScopeEntry>,
}

impl ScopeGuards {
    /// Adds one attachment. `note` receives a sentence for each conflict or guard merged away
    /// that the plan should report.
    pub fn add(&mut self, table: &GuardTable, attachment: Attachment, mut note: impl FnMut(String)) {
        let id = attachment.guard;
        let guard = table.guard(id);
        if let Some(domain) = guard.nvtx_domain() {
            let existing = self.entries.iter_mut().find_map(|e| match e {
                ScopeEntry::Nvtx { domain: d, guard, merged, .. } if d == domain => Some((*guard, merged)),
                _ => None,
            });
            match existing {
                None => self.entries.push(ScopeEntry::Nvtx {
                    domain: domain.to_string(),
                    guard: id,
                    merged: guard.as_nvtx_range().cloned(),
                }),
                Some((first, _)) if first == id => {}
                Some((_, Some(merged))) if guard.as_nvtx_range().is_some() => {
                    let later = guard.as_nvtx_range().expect("checked");
                    for conflict in merged.merge(later) {
                        note(format!("NVTX ranges of domain `{domain}` merged into one: {conflict}"));
                    }
                }
                Some((first, _)) => note(format!(
                    "a `{}` guard in NVTX domain `{domain}` merged into the `{}` guard attached first \
                     (one range per scope and domain)",
                    guard.kind(),
                    table.guard(first).kind()
                )),
            }
            return;
        }
        let key = guard.merge_key();
        let duplicate = self.entries.iter().find_map(|e| match e {
            ScopeEntry::Other { guard: other, .. }
                if *other == id || (key.is_some() && table.guard(*other).merge_key() == key) =>
            {
                Some(*other)
            }
            _ => None,
        });
        match duplicate {
            None => self.entries.push(ScopeEntry::Other { guard: id }),
            // Merged into the one attached first: said where the later one's label is lost
            // (two `TracingSpan`s, one of them labelled).
            Some(first) if first != id && table.guard(first).label() != guard.label() => note(format!(
                "a `{}` guard labelled {:?} merged into the one attached first, labelled {:?} (one per scope and \
                 merge key)",
                guard.kind(),
                guard.label().unwrap_or("after its site"),
                table.guard(first).label().unwrap_or("after its site"),
            )),
            Some(_) => {}
        }
    }

    /// Whether any guard on the scope reports an NVTX domain.
    pub fn has_nvtx(&self) -> bool {
        self.entries.iter().any(|e| matches!(e, ScopeEntry::Nvtx { .. }))
    }

    /// The merged built-in range of `domain`, or for another guard kind in that domain, a range
    /// with its label only.
    pub fn nvtx_settings(&self, table: &GuardTable, domain: &str) -> Option<NvtxRange> {
        self.entries.iter().find_map(|e| match e {
            ScopeEntry::Nvtx { domain: d, guard, merged, .. } if d == domain => {
                Some(merged.clone().unwrap_or_else(|| {
                    let label = table.guard(*guard).label();
                    label.and_then(|l| NvtxRange::new().label(l).ok()).unwrap_or_default()
                }))
            }
            _ => None,
        })
    }
}

/// Whether an executor's declared emissions include NVTX ranges at `level` (regions, or
/// ops): their domain (the first such declaration; the runtime emits ranges at every other
/// level itself).
pub(crate) fn emitted_domain(
    emits: &[crate::core::plan::EmittedRange],
    level: crate::core::guards::Level,
) -> Option<&str> {
    emits.iter().find(|e| e.kind == GuardKind::NvtxRange && e.level == level).map(|e| e.domain.as_ref())
}

/// What the runtime does not use of an executor's declared emissions, as plan notes: a second
/// NVTX declaration at the region or op level (only the first counts: an executor pushes one
/// range per region or op), NVTX ranges at other levels (the runtime emits those itself), and
/// kinds other than NVTX ranges (which the runtime does not coordinate).
pub(crate) fn ignored_emissions(executor: &str, emits: &[crate::core::plan::EmittedRange]) -> Vec<String> {
    use crate::core::guards::Level;
    let mut notes = Vec::new();
    for (i, e) in emits.iter().enumerate() {
        let first = emits[..i].iter().find(|f| f.kind == e.kind && f.level == e.level);
        let nvtx = e.kind == GuardKind::NvtxRange;
        let note = match (nvtx, e.level, first) {
            (true, Level::Region | Level::Op, None) => continue,
            (true, level @ (Level::Region | Level::Op), Some(first)) => format!(
                "executor `{executor}` declares NVTX ranges per {} in domain `{}` and again in `{}`; only the first \
                 is used (an executor pushes one range per {}): remove the others from `Executor::emits`",
                level.name(),
                first.domain,
                e.domain,
                level.name()
            ),
            (true, level, _) => format!(
                "executor `{executor}` declares NVTX ranges at the `{}` level (domain `{}`), which the runtime \
                 emits itself; only region and op declarations are used: remove it from `Executor::emits`",
                level.name(),
                e.domain
            ),
            (false, level, _) => format!(
                "executor `{executor}` declares {:?} at the `{}` level; only NVTX ranges are coordinated with the \
                 runtime's, so the declaration changes nothing",
                e.kind,
                level.name()
            ),
        };
        notes.push(note);
    }
    notes
}
