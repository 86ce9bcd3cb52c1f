//! Fusion: group the ops an executor can fuse into regions, each a bound symbol named
//! `<Executor>Fusion<N>` whose subsymbols are the fused ops.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::core::guards::{carried_span, Attachment, GuardPolicy, Level};
use crate::core::ir::{prims, Arena, FusedBy, Trace, TraceBuilder, ValueId};
use crate::core::plan::{Executor, Fusible, OpView};
use crate::error::Result;

use super::Pass;

/// How ops are grouped into regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FusionStrategy {
    /// Runs of consecutive fusible ops; any other op ends a region.
    #[default]
    Consecutive,
    /// Fusible ops may join a region across ops that the executor cannot fuse and that use none
    /// of the region's values; an op that uses them (or a fusible op of another shape) ends the
    /// region, which is placed where its last op was.
    Dataflow,
}

/// Groups the ops that an executor can fuse ([`Executor::fusible`]) into regions.
///
/// Regions are named `<prefix>Fusion<N>`, numbered in order from the first number that no
/// region of the trace has yet, so names stay unique across any number of fusion passes.
///
/// All the elementwise ops of a region have the same output shape (the region's iteration
/// shape); a last-axis reduction over that shape may end a region. A region's inputs are the
/// values its ops use from outside it; its outputs are the values its ops define that are used
/// outside it or returned; a group with none (dead code) is left unfused. Guards of fused ops
/// follow their policy: one with [`GuardPolicy::MoveToEnclosing`] (NVTX range, recorder,
/// timer) moves to the region (several of one kind merge into one), one with
/// [`GuardPolicy::DropWithReason`] is dropped and listed in `Trace::dropped_guards`, and an op
/// with a [`GuardPolicy::Keep`] guard (a [`ClosureGuard`](crate::guards::ClosureGuard) by
/// default) is not fused, so that the guard still surrounds that op alone.
///
/// An executor that runs independent regions in one launch ([`Executor::joins`]; `CudaFusion`
/// does, for an optimizer's updates of many parameters) gets consecutive regions that read
/// nothing from one another, under the same guards and scopes, joined into one region of several
/// shapes (see [`join`](Self::join)).
///
/// ```
/// use boundscope::executors::CpuFusion;
/// use boundscope::passes::{FuseRegions, Pass};
/// use boundscope::{Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let a = b.input(&[1024]).unwrap();
/// let c = b.input(&[1024]).unwrap();
/// let ab = b.mul(a, c).unwrap();
/// let x = b.add_scalar(ab, 1.0).unwrap();
/// let s = b.sigmoid(x).unwrap();
/// let y = b.mul(x, s).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
/// assert_eq!(fused.len(), 1);
/// assert!(fused.to_string().contains("t5 = CpuFusion0(t0, t1)"));
/// ```
#[derive(Clone)]
pub struct FuseRegions {
    executor: Arc<dyn Executor>,
    strategy: FusionStrategy,
    min_ops: usize,
    max_ops: usize,
    within_scopes: bool,
    join: bool,
}

impl FuseRegions {
    /// Consecutive fusion for `executor`, regions of at least 2 ops.
    pub fn new(executor: Arc<dyn Executor>) -> Self {
        Self {
            executor,
            strategy: FusionStrategy::Consecutive,
            min_ops: 2,
            max_ops: usize::MAX,
            within_scopes: false,
            join: true,
        }
    }

    /// Uses this grouping strategy.
    pub fn strategy(mut self, strategy: FusionStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Makes regions of at most `max_ops` ops (at least 1).
    pub fn max_ops(mut self, max_ops: usize) -> Self {
        self.max_ops = max_ops.max(1);
        self
    }

    /// Keeps every region within one scope (off by default): for exact attribution, at the
    /// cost of more kernels where `torch.compile` would fuse across modules (the residual add
    /// of one layer with the norm of the next). By default regions may straddle scopes, and
    /// each sits in the innermost scope holding all of its ops ([`Trace::scope_notes`] says
    /// which scopes were cut around it). Scopes never change fusion otherwise, and profiling
    /// never does.
    ///
    /// ```
    /// use boundscope::executors::CpuFusion;
    /// use boundscope::passes::{FuseRegions, Pass};
    /// use boundscope::{Arena, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[64]).unwrap();
    /// let h = b.scope("a", |b| { let e = b.exp(x)?; b.neg(e) }).unwrap();
    /// let y = b.scope("b", |b| { let t = b.tanh(h)?; b.relu(t) }).unwrap();
    /// b.output(y).unwrap();
    /// let trace = b.finish().unwrap();
    /// let across = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
    /// assert_eq!((across.len(), across.scopes().len()), (1, 0)); // one region; both scopes cut
    /// assert_eq!(across.scope_notes().len(), 2);
    /// let within = FuseRegions::new(CpuFusion::shared()).within_scopes(true).run(&trace, &arena).unwrap();
    /// assert_eq!((within.len(), within.scope_path(0), within.scope_path(1)), (2, Some("a"), Some("b")));
    /// ```
    pub fn within_scopes(mut self, within: bool) -> Self {
        self.within_scopes = within;
        self
    }

    /// Whether to join consecutive independent regions that the executor runs in one launch
    /// ([`Executor::joins`]; on by default, and no executor joins unless it says so). With
    /// an executor that joins, regions then hold independent chains of several shapes.
    pub fn join(mut self, join: bool) -> Self {
        self.join = join;
        self
    }

    /// Leaves groups of fewer than `min_ops` ops unfused (at least 1).
    pub fn min_ops(mut self, min_ops: usize) -> Self {
        self.min_ops = min_ops.max(1);
        self
    }
}

struct Group<'t> {
    members: Vec<usize>,
    shape: &'t [usize],
    spans: SmallVec<[usize; 2]>,
}

impl Pass for FuseRegions {
    fn name(&self) -> &str {
        "fuse_regions"
    }

    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        let n = trace.len();
        let ops = trace.bound_symbols();
        // What each op is to the executor, and the shape it iterates over.
        let mut kinds = Vec::with_capacity(n);
        let mut shapes: Vec<&[usize]> = Vec::with_capacity(n);
        for bsym in ops {
            let op = OpView::new(trace, bsym)?;
            // A guard that keeps to its op (`GuardPolicy::Keep`) keeps the op out of regions.
            let kept = trace
                .guards
                .at(kinds.len())
                .iter()
                .any(|a| a.depth == 0 && a.span == 1 && trace.guards.guard(a.guard).policy() == GuardPolicy::Keep);
            // An op of a dtype the executor does not take stays out of its regions.
            let foreign = op.dtypes().iter().any(|d| !self.executor.dtypes().contains(d));
            let kind = if bsym.symbol() == prims::REGION || !bsym.subsymbols().is_empty() || kept || foreign {
                Fusible::No
            } else {
                self.executor.fusible(&op)
            };
            shapes.push(match kind {
                Fusible::EndsRegion => op.input_shape(0)?,
                _ => op.output_shape(0)?,
            });
            kinds.push(kind);
        }
        // Guards that cover several ops (a decomposed composite's) are barriers: a region lies
        // inside all of them or outside each, so that ranges keep nesting.
        let mut covering: Vec<SmallVec<[usize; 2]>> = vec![SmallVec::new(); n];
        let mut span_id = 0;
        for (i, attachments) in trace.guards.per_op.iter().enumerate() {
            for a in attachments.iter().filter(|a| a.span > 1 && a.depth == 0) {
                for c in &mut covering[i..(i + a.span as usize).min(n)] {
                    c.push(span_id);
                }
                span_id += 1;
            }
        }
        if self.within_scopes {
            for scope in trace.scopes() {
                for c in &mut covering[scope.positions().start..scope.positions().end.min(n)] {
                    c.push(span_id);
                }
                span_id += 1;
            }
        }

        // A group none of whose values is used outside it or returned is dead code: fusing it
        // would make a region with no outputs. Its ops stay as they are (dead-code elimination
        // removes them).
        let mut consumers: Vec<SmallVec<[usize; 2]>> = vec![SmallVec::new(); trace.value_count()];
        for (i, bsym) in ops.iter().enumerate() {
            for v in bsym.inputs() {
                consumers[v.index()].push(i);
            }
        }
        // (By the group each op is in, and which values are returned, rather than by scanning
        // the group and the outputs per value: a chain of n ops took n^2 / 2 steps.)
        let candidates = self.group(trace, &kinds, &shapes, &covering);
        let mut member_of = vec![usize::MAX; n];
        for (g, group) in candidates.iter().enumerate() {
            for &m in group {
                member_of[m] = g;
            }
        }
        let mut returned = vec![false; trace.value_count()];
        for o in trace.outputs() {
            returned[o.index()] = true;
        }
        let live = |(g, group): &(usize, Vec<usize>)| {
            group
                .iter()
                .flat_map(|&m| ops[m].outputs())
                .any(|o| returned[o.index()] || consumers[o.index()].iter().any(|&c| member_of[c] != *g))
        };
        let groups: Vec<Vec<usize>> = candidates.into_iter().enumerate().filter(live).map(|(_, group)| group).collect();
        let mut group_of = vec![None; n];
        for (g, group) in groups.iter().enumerate() {
            for &m in group {
                group_of[m] = Some(g);
            }
        }
        // Values used outside the group (or op) that defines them, or returned.
        let mut defined_in: Vec<Option<usize>> = vec![None; trace.value_count()];
        for (i, bsym) in ops.iter().enumerate() {
            for o in bsym.outputs() {
                defined_in[o.index()] = group_of[i];
            }
        }
        let mut used_outside = vec![false; trace.value_count()];
        for (i, bsym) in ops.iter().enumerate() {
            for v in bsym.inputs() {
                if defined_in[v.index()].is_none() || defined_in[v.index()] != group_of[i] {
                    used_outside[v.index()] = true;
                }
            }
        }
        for o in trace.outputs() {
            used_outside[o.index()] = true;
        }

        let mut builder = TraceBuilder::rewrite(trace, arena);
        let mut new_position = vec![0; n];
        let mut names = vec![String::new(); groups.len()];
        // Region names stay unique across fusion passes: number on from the names taken.
        let taken: Vec<&str> = ops.iter().filter(|b| b.symbol() == prims::REGION).filter_map(|b| b.name()).collect();
        let mut next_number = 0usize;
        let mut next_name = || loop {
            let name = format!("{}Fusion{next_number}", self.executor.fusion_prefix());
            next_number += 1;
            if !taken.contains(&name.as_str()) {
                return name;
            }
        };
        for i in 0..n {
            match group_of[i] {
                None => {
                    new_position[i] = builder.len();
                    builder.push_copy(&ops[i]);
                }
                Some(g) if groups[g].last() == Some(&i) => {
                    let members = &groups[g];
                    let mut inputs: Vec<ValueId> = Vec::new();
                    let mut outputs: Vec<ValueId> = Vec::new();
                    for &m in members {
                        for v in ops[m].inputs() {
                            if defined_in[v.index()] != Some(g) && !inputs.contains(&v) {
                                inputs.push(v);
                            }
                        }
                        outputs.extend(ops[m].outputs().iter().filter(|o| used_outside[o.index()]));
                    }
                    names[g] = next_name();
                    let subsymbols: Vec<_> = members.iter().map(|&m| ops[m]).collect();
                    for &m in members {
                        new_position[m] = builder.len();
                    }
                    builder.push_region(&names[g], FusedBy::of(&*self.executor), &inputs, &outputs, &subsymbols);
                }
                Some(_) => {}
            }
        }

        // Carry guards: those of fused ops move to their region (merged), or are dropped with
        // the reason their policy gives.
        let registry = trace.registry();
        let old = &trace.guards;
        let mut guards = old.without_attachments();
        for (i, attachments) in old.per_op.iter().enumerate() {
            for a in attachments {
                let guard = old.guard(a.guard);
                let fused_into = group_of[i].filter(|_| a.span == 1 && a.depth == 0);
                let Some(g) = fused_into else {
                    // Nothing is removed: every old bound symbol has a new position.
                    if let Some((first, span)) =
                        carried_span(i, a.span, n, |j| Some(new_position[j]..new_position[j] + 1))
                    {
                        guards.attach(first, Attachment { span, ..*a });
                    }
                    continue;
                };
                if let GuardPolicy::DropWithReason(reason) = guard.policy() {
                    let what =
                        format!("`{}` was fused into region `{}`; {reason}", trace.symbol_name(&ops[i]), names[g]);
                    guards.record_drop(a, registry, self.name(), what);
                    continue;
                }
                let at = new_position[i];
                let key = guard.merge_key();
                let already = guards
                    .at(at)
                    .iter()
                    .any(|b| b.guard == a.guard || (key.is_some() && old.guard(b.guard).merge_key() == key));
                if !already {
                    let moved = Attachment { span: 1, depth: 0, level: Level::Region, origin: prims::REGION, ..*a };
                    guards.attach(at, moved);
                }
            }
        }
        builder.set_guards(guards);
        // A region sits in the innermost scope that holds all of its ops; the scopes it
        // straddles are cut around it (the trace's scope notes say which).
        builder.carry_scopes(trace, |j| Some(new_position[j]..new_position[j] + 1), self.name());
        let fused = builder.finish()?;
        if !self.join {
            return Ok(fused);
        }
        super::join_regions::join_independent(fused, &*self.executor, self.max_ops, self.name(), arena)
    }
}

impl FuseRegions {
    /// The groups of ops (positions, in order) that become regions.
    fn group<'t>(
        &self,
        trace: &Trace<'_>,
        kinds: &[Fusible],
        shapes: &[&'t [usize]],
        covering: &[SmallVec<[usize; 2]>],
    ) -> Vec<Vec<usize>> {
        let ops = trace.bound_symbols();
        let mut groups = Vec::new();
        let mut current: Option<Group<'t>> = None;
        // `in_group[v] == generation`: v is defined by the open group. An op outside the group
        // that uses such a value closes it, so no later op can depend on the group through an
        // op that the region would have to be moved past.
        let mut in_group = vec![0u32; trace.value_count()];
        let mut generation = 1u32;
        let close = |current: &mut Option<Group<'t>>, groups: &mut Vec<Vec<usize>>| {
            if let Some(group) = current.take() {
                if group.members.len() >= self.min_ops {
                    groups.push(group.members);
                }
            }
        };
        for (i, bsym) in ops.iter().enumerate() {
            let kind = kinds[i];
            let depends = bsym.inputs().any(|v| in_group[v.index()] == generation);
            let joinable = kind != Fusible::No
                && current
                    .as_ref()
                    .is_some_and(|g| g.shape == shapes[i] && g.spans == covering[i] && g.members.len() < self.max_ops);
            if joinable {
                let group = current.as_mut().expect("joinable implies open");
                group.members.push(i);
                for o in bsym.outputs() {
                    in_group[o.index()] = generation;
                }
                if kind == Fusible::EndsRegion {
                    close(&mut current, &mut groups);
                }
                continue;
            }
            // An independent op may stay outside the region (which moves past it) only if the
            // same span guards cover it as the region: otherwise it would leave their range.
            let same_spans = current.as_ref().is_some_and(|g| g.spans == covering[i]);
            let skip_over = self.strategy == FusionStrategy::Dataflow && kind == Fusible::No && !depends && same_spans;
            if skip_over {
                continue;
            }
            close(&mut current, &mut groups);
            generation += 1;
            if kind == Fusible::Elementwise {
                current = Some(Group { members: vec![i], shape: shapes[i], spans: covering[i].clone() });
                for o in bsym.outputs() {
                    in_group[o.index()] = generation;
                }
            }
        }
        close(&mut current, &mut groups);
        groups
    }
}
