//! What each scope of a plan surrounds ([`ScopeDetails`]), computed once when it is compiled.

use crate::core::guards::ScopeDetails;
use crate::core::ir::{BoundSymbol, Category, TensorMeta, Trace, ValueId};

/// Computes [`ScopeDetails`] for the scopes of one plan.
pub(crate) struct DetailsOf<'t, 'a> {
    trace: &'t Trace<'a>,
    plan: u64,
    /// Per value: the last top-level position that reads it (`usize::MAX` for a trace output).
    last_read: Vec<usize>,
}

impl<'t, 'a> DetailsOf<'t, 'a> {
    pub fn new(trace: &'t Trace<'a>, plan: u64) -> Self {
        let mut last_read = vec![0; trace.value_count()];
        for (position, bsym) in trace.bound_symbols().iter().enumerate() {
            for v in bsym.inputs() {
                if let Some(slot) = last_read.get_mut(v.index()) {
                    *slot = position;
                }
            }
        }
        for v in trace.outputs() {
            if let Some(slot) = last_read.get_mut(v.index()) {
                *slot = usize::MAX;
            }
        }
        Self { trace, plan, last_read }
    }

    /// A whole run: the trace's inputs and outputs.
    pub fn of_run(&self, steps: usize) -> ScopeDetails {
        let bsyms = self.trace.bound_symbols();
        self.details(bsyms, self.trace.inputs().to_vec(), self.trace.outputs().to_vec(), 0, steps)
    }

    /// The top-level bound symbols `position..position + span`, over steps `first..end`.
    pub fn of_span(&self, position: usize, span: usize, first: usize, end: usize) -> ScopeDetails {
        let all = self.trace.bound_symbols();
        let bsyms = &all[position.min(all.len())..(position + span).min(all.len())];
        let last = position + span.max(1) - 1;
        let outputs = produced(bsyms)
            .into_iter()
            .filter(|v| self.last_read.get(v.index()).is_some_and(|&reader| reader > last))
            .collect();
        self.details(bsyms, inputs_of(bsyms), outputs, first, end)
    }

    /// One subsymbol of a composite, over steps `first..end`.
    pub fn of_subsymbol(&self, bsym: &BoundSymbol<'_>, first: usize, end: usize) -> ScopeDetails {
        let one = std::slice::from_ref(bsym);
        self.details(one, inputs_of(one), bsym.outputs().to_vec(), first, end)
    }

    fn details(
        &self,
        bsyms: &[BoundSymbol<'_>],
        inputs: Vec<ValueId>,
        outputs: Vec<ValueId>,
        first: usize,
        end: usize,
    ) -> ScopeDetails {
        let inputs: Vec<TensorMeta> = inputs.iter().filter_map(|&v| self.trace.value_meta(v).ok()).collect();
        let outputs: Vec<TensorMeta> = outputs.iter().filter_map(|&v| self.trace.value_meta(v).ok()).collect();
        ScopeDetails {
            plan: self.plan,
            first_step: first as u32,
            steps: end.saturating_sub(first) as u32,
            ops: bsyms.iter().map(leaf_count).sum::<usize>() as u32,
            bytes_read: inputs.iter().map(bytes).fold(0, u64::saturating_add),
            bytes_written: outputs.iter().map(bytes).fold(0, u64::saturating_add),
            flops: bsyms.iter().map(|b| self.flops(b)).fold(0, u64::saturating_add),
            inputs,
            outputs,
        }
    }

    /// The estimate [`ScopeDetails::flops`] documents.
    fn flops(&self, bsym: &BoundSymbol<'_>) -> u64 {
        let numel = |v: Option<ValueId>| v.and_then(|v| self.trace.value_meta(v).ok()).map_or(0, |m| elements(&m));
        let category = self.trace.registry().get(bsym.symbol()).map(|s| s.symbol.category());
        let first_output = bsym.outputs().first().copied();
        match category {
            _ if !bsym.subsymbols().is_empty() => {
                bsym.subsymbols().iter().map(|s| self.flops(s)).fold(0, u64::saturating_add)
            }
            Ok(Category::Matmul) => {
                let k = bsym
                    .inputs()
                    .next()
                    .and_then(|v| self.trace.value_meta(v).ok())
                    .and_then(|m| m.shape.last().copied())
                    .unwrap_or(0) as u64;
                numel(first_output).saturating_mul(k).saturating_mul(2)
            }
            Ok(Category::Reduction) => numel(bsym.inputs().next()),
            Ok(Category::Shape) => 0,
            _ => bsym.outputs().iter().map(|&v| numel(Some(v))).fold(0, u64::saturating_add),
        }
    }
}

/// The values `bsyms` read that none of them computed before, in order of first use (linear
/// in the ops: a named scope can hold a whole model).
fn inputs_of(bsyms: &[BoundSymbol<'_>]) -> Vec<ValueId> {
    let mut seen: std::collections::HashSet<ValueId> = std::collections::HashSet::new();
    let mut inputs: Vec<ValueId> = Vec::new();
    for b in bsyms {
        for v in b.inputs() {
            if seen.insert(v) {
                inputs.push(v);
            }
        }
        seen.extend(b.outputs().iter().copied());
    }
    inputs
}

/// The values `bsyms` compute, in order.
fn produced(bsyms: &[BoundSymbol<'_>]) -> Vec<ValueId> {
    bsyms.iter().flat_map(|b| b.outputs().iter().copied()).collect()
}

/// Prims under `bsym`: itself if it has no subsymbols.
fn leaf_count(bsym: &BoundSymbol<'_>) -> usize {
    match bsym.subsymbols() {
        [] => 1,
        subs => subs.iter().map(leaf_count).sum(),
    }
}

fn elements(meta: &TensorMeta) -> u64 {
    meta.checked_numel().unwrap_or(0) as u64
}

fn bytes(meta: &TensorMeta) -> u64 {
    elements(meta).saturating_mul(meta.dtype.size_bytes() as u64)
}
