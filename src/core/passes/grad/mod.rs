//! Gradients: [`Grad`] turns a trace with a scalar loss into one that also computes the
//! gradient of the loss with respect to chosen inputs (the parameters), by reverse-mode
//! differentiation with a vector-Jacobian rule per symbol.

mod buckets;
mod rules;

use std::collections::HashMap;
use std::sync::Arc;

use crate::core::guards::{Attachment, Guard, OnBackward, Relabeled};
use crate::core::ir::optimizers::Optimizer;
use crate::core::ir::{prims, Arena, Arg, BoundSymbol, DType, Trace, TraceBuilder, ValueId, VjpInput, SCOPE_SEPARATOR};
use crate::error::{Error, Result};

use super::decompose::decompose;
use super::Pass;
use buckets::Bucketing;
pub use buckets::{FinishReduction, GradientBuckets, StartReduction, GRAD_SYNC_SCOPE};

/// The name of the top-level scope that holds the backward ops (each op's backward sits in a
/// scope of the forward op's path under it: `backward.h.3.attn`).
pub const BACKWARD_SCOPE: &str = "backward";

/// Reverse-mode differentiation: the trace's first output is the loss (one float element), and
/// the result computes the same outputs followed by the gradient of the loss with respect to
/// each of `wrt` (inputs of the trace, in that order; each gradient has its input's shape and
/// dtype; an input the loss does not depend on gets zeros).
///
/// Each op on the path from a parameter to the loss is differentiated by its symbol's rule:
/// every built-in prim has one, and so do the composites that executors run whole (`softmax`,
/// `log_softmax`, `layer_norm`, `linear`, `matmul_transposed`, `cross_entropy`,
/// `scaled_dot_product_attention`), which stay whole in the forward trace; other composites
/// (`linear_gelu`, users' own without a [`Symbol::vjp`](crate::Symbol::vjp)) are decomposed
/// first and differentiated through their prims. A prim of your own without a rule on that
/// path is [`Error::NoGradient`]. Values the backward uses are the forward's own (nothing is
/// recomputed except inside the whole composites' rules: their normalised rows, their
/// probabilities).
///
/// The backward ops follow the forward in reverse, in a top-level scope
/// [`BACKWARD_SCOPE`] with the forward op's scope path under it, so that a profile of a
/// step reads forward, then backward, grouped by module. Guards stay on the forward ops, and
/// each puts around the backward of what it surrounds what its
/// [`Guard::on_backward`] says: the built-in profiling
/// guards repeat themselves there, labelled `<label> (backward)` (an NVTX range's payload is
/// the forward op's position), so that one forward op's backward ops get one range per domain;
/// guards on a scope go to its backward scope. Guards on a composite's subsymbols stay on the
/// forward only. The gradients of unguarded slices that tile an axis (a `split`) are joined
/// with `concat` in the backward of the sliced value's producer, rather than each padded in its
/// own; a slice under a guard keeps its own `pad`, and so its backward range.
///
/// Take gradients before fusing (`passes::FuseRegions`): a fused trace is
/// [`Error::InvalidGradient`], as are a loss that is not one float element and parameters
/// that are not float inputs (or are listed twice).
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::passes::{Grad, Pass};
/// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
/// let (registry, arena) = (Registry::with_builtins(), Arena::new());
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 3]).unwrap();
/// let w = b.input(&[4, 3]).unwrap();
/// let h = b.linear(x, w, None).unwrap();
/// let y = b.tanh(h).unwrap();
/// let rows = b.sum(y).unwrap(); // [2, 1]
/// let rows = b.reshape(rows, &[1, 2]).unwrap();
/// let loss = b.sum(rows).unwrap(); // [1, 1]
/// b.output(loss).unwrap();
/// let trace = b.finish().unwrap();
/// let grads = Grad::new(&[w]).run(&trace, &arena).unwrap();
/// assert_eq!(grads.outputs().len(), 2); // the loss, then d loss / d w
/// assert!(grads.scopes().iter().any(|s| s.path() == "backward"));
/// let plan = Plan::compile(&grads, &[CpuReference::shared()]).unwrap();
/// let x = Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
/// let w = Tensor::from_fn(&[4, 3], |i| 0.05 * i as f32 - 0.2);
/// let out = plan.run(&[&x, &w]).unwrap();
/// assert_eq!(out[1].shape(), &[4, 3]);
/// // d loss / d w[o][i] = sum over rows r of (1 - tanh(h[r][o])^2) x[r][i]
/// let (xv, wv) = (x.to_f32_vec(), w.to_f32_vec());
/// let h = |r: usize, o: usize| (0..3).map(|i| xv[r * 3 + i] * wv[o * 3 + i]).sum::<f32>();
/// let expected: f32 = (0..2).map(|r| (1.0 - h(r, 1).tanh().powi(2)) * xv[r * 3 + 2]).sum();
/// assert!((out[1].to_f32_vec()[1 * 3 + 2] - expected).abs() < 1e-6);
/// ```
#[derive(Clone, Debug)]
pub struct Grad {
    wrt: Vec<ValueId>,
    buckets: Option<GradientBuckets>,
}

impl Grad {
    /// Differentiates the loss (the trace's first output) with respect to `wrt`.
    pub fn new(wrt: &[ValueId]) -> Self {
        Self { wrt: wrt.to_vec(), buckets: None }
    }

    /// The same, with the gradients reduced in `buckets` as the backward completes them (data
    /// parallelism: `distributed::DataParallel`); see [`GradientBuckets`].
    pub fn in_buckets(mut self, buckets: impl Into<GradientBuckets>) -> Self {
        self.buckets = Some(buckets.into());
        self
    }

    /// The inputs it differentiates with respect to, in order.
    pub fn wrt(&self) -> &[ValueId] {
        &self.wrt
    }
}

/// A training step ([`Grad::training_step`]): the trace, its optimizer's per-run inputs and
/// each parameter's state.
#[derive(Debug)]
pub struct TrainingStep<'a, I> {
    /// Inputs: the forward trace's, then the optimizer's per-run inputs, then each parameter's
    /// state in parameter order; outputs: the forward trace's (the loss first), then the in-place
    /// updates (the new state and parameters).
    pub trace: Trace<'a>,
    /// The optimizer's per-run inputs.
    pub step_inputs: I,
    /// Each parameter's state inputs (zeros at the start), in parameter order.
    pub state: Vec<Vec<ValueId>>,
}

impl<I> TrainingStep<'_, I> {
    /// The position of input `value` among the trace's inputs (where a run takes it).
    pub fn input_index(&self, value: ValueId) -> Option<usize> {
        self.trace.inputs().iter().position(|&v| v == value)
    }
}

impl Grad {
    /// The whole training step: the loss, its gradients ([`Pass::run`]) and `optimizer`'s
    /// update of every parameter in place, in the scope `optimizer` (the gradients stay inside
    /// the plan: the outputs are the forward's, the loss first, then the updates). Run it with
    /// [`Plan::run_updating`](crate::Plan::run_updating) or
    /// [`Plan::run_updating_on_device`](crate::Plan::run_updating_on_device).
    ///
    /// ```
    /// use boundscope::executors::CpuReference;
    /// use boundscope::optim::Sgd;
    /// use boundscope::passes::Grad;
    /// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let w = b.input(&[1, 2]).unwrap();
    /// let sq = b.mul(w, w).unwrap();
    /// let loss = b.sum(sq).unwrap(); // |w|^2
    /// b.output(loss).unwrap();
    /// let step = Grad::new(&[w]).training_step(&b.finish().unwrap(), &arena, &Sgd::new()).unwrap();
    /// let plan = Plan::compile(&step.trace, &[CpuReference::shared()]).unwrap();
    /// let mut ws = plan.workspace().unwrap();
    /// let mut w = Tensor::new(&[1, 2], vec![1.0, -2.0]).unwrap();
    /// let [mut lr, mut factor] = Sgd::new().step_values(1, 0.25);
    /// plan.run_updating(&mut ws, &mut [&mut w, &mut lr, &mut factor]).unwrap();
    /// assert_eq!(w.to_f32_vec(), &[0.5, -1.0]); // w - 0.25 * 2w
    /// ```
    ///
    /// # Errors
    /// What [`Pass::run`] and the optimizer's updates return.
    pub fn training_step<'a, O: Optimizer>(
        &self,
        forward: &Trace<'a>,
        arena: &'a Arena,
        optimizer: &O,
    ) -> Result<TrainingStep<'a, O::Inputs>> {
        let backward = self.run(forward, arena)?;
        let mut b = TraceBuilder::continuing(&backward, arena);
        b.set_outputs(&backward.outputs()[..forward.outputs().len()]);
        let grads = &backward.outputs()[forward.outputs().len()..];
        // The per-run inputs, and what the optimizer computes from them once per step (AdamW's
        // `lr * weight_decay`), sit in the scope too.
        let (step_inputs, state) = b.scope("optimizer", |b| {
            let step_inputs = optimizer.step_inputs(b)?;
            let state = self
                .wrt
                .iter()
                .zip(grads)
                .map(|(&p, &g)| optimizer.update(b, &step_inputs, p, g))
                .collect::<Result<_>>()?;
            Ok((step_inputs, state))
        })?;
        Ok(TrainingStep { trace: b.finish()?, step_inputs, state })
    }
}

impl Pass for Grad {
    fn name(&self) -> &str {
        "grad"
    }

    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        let loss = self.check(trace)?;
        // Composites without a rule of their own become the prims they are made of.
        let forward = decompose(trace, arena, self.name(), &|bsym| has_rule(trace, bsym))?;
        let path = GradientPath::new(&forward, &self.wrt, loss);
        let builder = TraceBuilder::continuing(&forward, arena);
        let guarded = guarded_ops(&forward);
        let mut backward =
            Backward { builder, cotangents: HashMap::new(), pieces: HashMap::new(), guarded, open: Vec::new() };
        backward.builder.enter_scope(BACKWARD_SCOPE)?;
        let seed = rules::full_like(&mut backward.builder, loss, 1.0)?;
        backward.cotangents.insert(loss, seed);
        // Where the backward of each forward op lies: `start..end` in the new trace.
        let mut spans = vec![0..0; forward.len()];
        // With buckets: the parameters whose gradient is final once the backward of each
        // position has run (that of their first use).
        let mut bucketing = self.buckets.as_ref().map(Bucketing::new);
        let mut completes: HashMap<usize, Vec<usize>> = HashMap::new();
        if bucketing.is_some() {
            for (index, &w) in self.wrt.iter().enumerate() {
                let first = forward.bound_symbols().iter().position(|bsym| bsym.inputs().any(|v| v == w));
                if let Some(first) = first {
                    completes.entry(first).or_default().push(index);
                }
            }
        }
        for (position, bsym) in forward.bound_symbols().iter().enumerate().rev() {
            'op: {
                let Some(&output) = bsym.outputs().first() else { break 'op };
                if !path.on_path(output) || !backward.has_cotangent(output) {
                    break 'op;
                }
                backward.enter(forward.scope_path(position))?;
                let start = backward.builder.len();
                let Some(cotangent) = backward.cotangent(&forward, output)? else { break 'op };
                backward.differentiate(&forward, position, output, cotangent, &path)?;
                spans[position] = start..backward.builder.len();
            }
            if let (Some(bucketing), Some(complete)) = (&mut bucketing, completes.get(&position)) {
                backward.add_to_buckets(&forward, bucketing, complete, &self.wrt)?;
            }
        }
        backward.enter(None)?;
        let reduced = match bucketing {
            Some(mut bucketing) => backward.builder.scope(GRAD_SYNC_SCOPE, |b| {
                bucketing.flush(b)?;
                bucketing.finish(b, self.wrt.len())
            })?,
            None => vec![None; self.wrt.len()],
        };
        let mut gradients = Vec::with_capacity(self.wrt.len());
        for (&w, reduced) in self.wrt.iter().zip(reduced) {
            gradients.push(match reduced {
                Some(g) => g,
                None => match backward.cotangent(&forward, w)? {
                    Some(g) => g,
                    None => rules::full_like(&mut backward.builder, w, 0.0)?,
                },
            });
        }
        let mut builder = backward.builder;
        builder.exit_scope()?;
        let outputs: Vec<ValueId> = forward.outputs().iter().copied().chain(gradients).collect();
        builder.set_outputs(&outputs);
        carry_op_guards(&mut builder, &forward, &spans);
        let grads = builder.finish()?;
        let mut grads = prune_backward(&grads, forward.len(), arena)?;
        carry_scope_guards(&mut grads);
        Ok(grads)
    }
}

/// `trace` without the backward ops (those from position `forward` on) whose results nothing
/// uses: the gradients rules give for arguments off the path to a parameter (the data's).
fn prune_backward<'a>(trace: &Trace<'a>, forward: usize, arena: &'a Arena) -> Result<Trace<'a>> {
    let mut live = vec![false; trace.value_count()];
    for &o in trace.outputs() {
        live[o.index()] = true;
    }
    let mut keep = vec![true; trace.len()];
    for (i, bsym) in trace.bound_symbols().iter().enumerate().rev() {
        keep[i] = i < forward || bsym.outputs().iter().any(|o| live[o.index()]);
        if keep[i] {
            for input in bsym.inputs() {
                live[input.index()] = true;
            }
        }
    }
    if keep.iter().all(|&k| k) {
        return Ok(trace.clone());
    }
    let mut builder = TraceBuilder::rewrite(trace, arena);
    let mut new_position = Vec::with_capacity(trace.len());
    for (bsym, &kept) in trace.bound_symbols().iter().zip(&keep) {
        new_position.push(kept.then(|| builder.len()));
        if kept {
            builder.push_copy(bsym);
        }
    }
    builder.carry_guards(trace, &new_position, "grad", |_| "a gradient nothing uses".to_string())?;
    builder.finish()
}

/// What `guard` (attached to a forward op or scope labelled `label`) puts around its backward.
fn backward_guard(guard: &Arc<dyn Guard>, label: &str, position: Option<usize>) -> Option<Arc<dyn Guard>> {
    match guard.on_backward(label, position) {
        OnBackward::Nothing => None,
        OnBackward::Relabeled(label) => Some(Arc::new(Relabeled { inner: guard.clone(), label })),
        OnBackward::Guard(g) => Some(g),
    }
}

/// Each guard on forward ops, as its [`Guard::on_backward`] says, around the backward of the ops
/// it surrounds (`spans[p]`: the backward of forward op `p`). Backward spans come in reverse
/// order, so guards that nest in the forward nest in the backward.
fn carry_op_guards(builder: &mut TraceBuilder<'_>, forward: &Trace<'_>, spans: &[std::ops::Range<usize>]) {
    let table = &forward.guards;
    for (position, attachments) in table.per_op.iter().enumerate() {
        for a in attachments.iter().filter(|a| a.depth == 0) {
            let covered =
                spans[position..(position + a.span as usize).min(spans.len())].iter().filter(|r| !r.is_empty());
            let Some((start, end)) = covered.fold(None, |acc: Option<(usize, usize)>, r| match acc {
                Some((s, e)) => Some((s.min(r.start), e.max(r.end))),
                None => Some((r.start, r.end)),
            }) else {
                continue;
            };
            let label = table.label_of(a, forward.registry());
            let Some(guard) = backward_guard(&table.guards[a.guard.index()], &label, Some(position)) else { continue };
            let guards = builder.guards_mut();
            let id = guards.add_guard(guard);
            guards.attach(start, Attachment { guard: id, span: (end - start) as u32, ..*a });
        }
    }
}

/// Each guard on a forward scope, as its [`Guard::on_backward`] says, on the backward scopes
/// of the same path (`backward.<path>`).
fn carry_scope_guards(trace: &mut Trace<'_>) {
    let forward: Vec<(String, Vec<crate::core::ir::GuardId>)> = trace
        .scopes
        .scopes
        .iter()
        .filter(|s| s.guard_count() > 0 && !crate::core::ir::path_matches(&format!("{BACKWARD_SCOPE}.*"), s.path()))
        .map(|s| (s.path().to_string(), s.guard_ids().to_vec()))
        .collect();
    for (path, ids) in forward {
        let target = format!("{BACKWARD_SCOPE}{SCOPE_SEPARATOR}{path}");
        for id in ids {
            let guard = trace.guards.guards[id.index()].clone();
            let label = guard.label().unwrap_or(&path).to_string();
            let Some(guard) = backward_guard(&guard, &label, None) else { continue };
            let new = trace.guards.add_guard(guard);
            for scope in trace.scopes.scopes.iter_mut().filter(|s| s.path() == target) {
                scope.guards.push(new);
            }
        }
    }
}

impl Grad {
    /// Checks the request; returns the loss.
    fn check(&self, trace: &Trace<'_>) -> Result<ValueId> {
        let invalid = |detail: String| Error::InvalidGradient { detail };
        let loss = *trace.outputs().first().ok_or_else(|| invalid("the trace has no outputs".into()))?;
        let meta = trace.value_meta(loss)?;
        if meta.dtype.is_integer() || meta.numel() != 1 {
            return Err(invalid(format!(
                "the loss (the trace's first output, {loss}) is {meta}; it must be one float element \
                 (reduce it with `sum` or `mean_dim`, and put it first)"
            )));
        }
        if trace.bound_symbols().iter().any(|b| b.symbol() == prims::REGION) {
            return Err(invalid(
                "the trace holds fusion regions; take gradients before `passes::FuseRegions` (plans fuse afterwards)"
                    .into(),
            ));
        }
        for (i, &w) in self.wrt.iter().enumerate() {
            if !trace.inputs().contains(&w) {
                return Err(invalid(format!("{w} is not an input of the trace; differentiate with respect to inputs")));
            }
            if self.wrt[..i].contains(&w) {
                return Err(invalid(format!("{w} is listed twice; list each parameter once")));
            }
            let dtype = trace.value_meta(w)?.dtype;
            if dtype.is_integer() {
                return Err(invalid(format!("{w} is {dtype}; only float inputs have gradients")));
            }
        }
        Ok(loss)
    }
}

/// For each op of `forward`, whether an op guard surrounds it (a difference array over the
/// guards' spans, `position..position + span` as `carry_op_guards` reads them: linear in the
/// ops and attachments).
fn guarded_ops(forward: &Trace<'_>) -> Vec<bool> {
    let n = forward.len();
    let mut delta = vec![0i64; n + 1];
    for (p, attachments) in forward.guards.per_op.iter().enumerate().take(n) {
        for a in attachments {
            delta[p] += 1;
            delta[(p + a.span as usize).min(n)] -= 1;
        }
    }
    let mut open = 0;
    delta[..n]
        .iter()
        .map(|d| {
            open += d;
            open > 0
        })
        .collect()
}

/// Whether `bsym` is differentiated whole: its symbol has a rule (its own or a built-in's).
fn has_rule(trace: &Trace<'_>, bsym: &BoundSymbol<'_>) -> bool {
    trace.registry().get(bsym.symbol()).is_ok_and(|s| {
        s.symbol.has_vjp()
            || s.symbol.builtin_prim().or(s.symbol.builtin_composite()).and_then(rules::builtin_rule).is_some()
    })
}

/// The values on the path from a parameter to the loss: float values that depend on a
/// parameter and that the loss depends on.
struct GradientPath {
    on_path: Vec<bool>,
}

impl GradientPath {
    fn new(trace: &Trace<'_>, wrt: &[ValueId], loss: ValueId) -> Self {
        let float = |v: ValueId| trace.value_meta(v).is_ok_and(|m| m.dtype.is_float());
        let mut depends = vec![false; trace.value_count()];
        for &w in wrt {
            depends[w.index()] = true;
        }
        for bsym in trace.bound_symbols() {
            if bsym.inputs().any(|v| depends[v.index()]) {
                for &o in bsym.outputs() {
                    depends[o.index()] = float(o);
                }
            }
        }
        let mut needed = vec![false; trace.value_count()];
        needed[loss.index()] = depends[loss.index()];
        for bsym in trace.bound_symbols().iter().rev() {
            if bsym.outputs().iter().any(|o| needed[o.index()]) {
                for v in bsym.inputs() {
                    needed[v.index()] = depends[v.index()];
                }
            }
        }
        Self { on_path: needed }
    }

    fn on_path(&self, v: ValueId) -> bool {
        self.on_path.get(v.index()).copied().unwrap_or(false)
    }
}

/// The backward being built: the builder, the gradient of each value so far, the gradients of
/// its slices not yet added to it, which forward ops guards surround, and the scope path open
/// under [`BACKWARD_SCOPE`].
struct Backward<'a> {
    builder: TraceBuilder<'a>,
    cotangents: HashMap<ValueId, ValueId>,
    pieces: HashMap<ValueId, Vec<Piece>>,
    /// For each forward op, whether an op guard surrounds it.
    guarded: Vec<bool>,
    open: Vec<String>,
}

/// The gradient of `x[start..end]` along `axis`, for a value `x`.
struct Piece {
    axis: usize,
    start: usize,
    end: usize,
    grad: ValueId,
}

impl<'a> Backward<'a> {
    fn has_cotangent(&self, v: ValueId) -> bool {
        self.cotangents.contains_key(&v) || self.pieces.contains_key(&v)
    }

    /// The gradient of `v`, with the gradients of its slices added: slices that tile an axis
    /// (a `split`, as attention's q, k and v) join with `concat`s (one per piece after the
    /// first); others are each padded with zeros to `v`'s shape (`slice`'s own rule), then
    /// added. This runs when `v`'s producer is differentiated, so the join sits in that op's
    /// backward (its scope and its guards' ranges), not in the slices'.
    fn cotangent(&mut self, forward: &Trace<'a>, v: ValueId) -> Result<Option<ValueId>> {
        if let Some(mut pieces) = self.pieces.remove(&v) {
            let shape = forward.value_meta(v)?.shape.to_vec();
            pieces.sort_by_key(|p| (p.axis, p.start, p.end));
            let axis = pieces.first().map_or(0, |p| p.axis);
            let tiles = pieces.iter().all(|p| p.axis == axis)
                && pieces.first().is_some_and(|p| p.start == 0)
                && pieces.windows(2).all(|w| w[0].end == w[1].start)
                && pieces.last().map(|p| p.end) == shape.get(axis).copied();
            let b = &mut self.builder;
            let joined = if tiles {
                let grads: Vec<ValueId> = pieces.iter().map(|p| p.grad).collect();
                b.concat(&grads, axis)?
            } else {
                let mut total: Option<ValueId> = None;
                for p in pieces {
                    let padded = b.pad(p.grad, p.axis, p.start, shape[p.axis] - p.end, 0.0)?;
                    total = Some(match total {
                        Some(t) => b.add(t, padded)?,
                        None => padded,
                    });
                }
                match total {
                    Some(total) => total,
                    None => return Ok(self.cotangents.get(&v).copied()),
                }
            };
            let total = match self.cotangents.get(&v) {
                Some(&previous) => self.builder.add(previous, joined)?,
                None => joined,
            };
            self.cotangents.insert(v, total);
        }
        Ok(self.cotangents.get(&v).copied())
    }

    /// Adds the final gradients of parameters `complete` (indices into `wrt`) to the buckets, in
    /// the scope `backward.grad_sync`; a parameter without a gradient keeps its zeros, added
    /// later.
    fn add_to_buckets(
        &mut self,
        forward: &Trace<'a>,
        bucketing: &mut Bucketing<'_>,
        complete: &[usize],
        wrt: &[ValueId],
    ) -> Result<()> {
        // The gradients first, in the backward's scope (joining a sliced parameter's pieces
        // is part of its producer's backward), then the buckets' ops in their own.
        let mut ready = Vec::with_capacity(complete.len());
        for &index in complete {
            if self.has_cotangent(wrt[index]) {
                if let Some(grad) = self.cotangent(forward, wrt[index])? {
                    ready.push((index, grad));
                }
            }
        }
        if ready.is_empty() {
            return Ok(());
        }
        self.enter(None)?;
        self.builder.enter_scope(GRAD_SYNC_SCOPE)?;
        for (index, grad) in ready {
            bucketing.add(&mut self.builder, index, grad)?;
        }
        self.builder.exit_scope()
    }

    /// Opens the scopes of `path` (a forward op's scope path) under [`BACKWARD_SCOPE`], closing
    /// those it does not share with the scopes open now.
    fn enter(&mut self, path: Option<&str>) -> Result<()> {
        let wanted: Vec<&str> = path.map(|p| p.split(SCOPE_SEPARATOR).collect()).unwrap_or_default();
        let common = self.open.iter().zip(&wanted).take_while(|(a, b)| a == b).count();
        while self.open.len() > common {
            self.builder.exit_scope()?;
            self.open.pop();
        }
        for name in &wanted[common..] {
            self.builder.enter_scope(name)?;
            self.open.push(name.to_string());
        }
        Ok(())
    }

    /// Binds the gradient of `bsym`'s arguments and adds each to what its value has so far.
    fn differentiate(
        &mut self,
        forward: &Trace<'a>,
        position: usize,
        output: ValueId,
        cotangent: ValueId,
        path: &GradientPath,
    ) -> Result<()> {
        let bsym = &forward.bound_symbols()[position];
        let symbol = forward.registry().get(bsym.symbol())?.symbol;
        let name = forward.symbol_name(bsym);
        // A built-in slice's gradient waits to be joined with its value's other slices' (see
        // `cotangent`), unless a guard covers the slice: then its backward is its own `pad`.
        if symbol.vjp.is_none()
            && symbol.builtin_prim() == Some(prims::SLICE)
            && !self.guarded.get(position).copied().unwrap_or(true)
        {
            if let (Some(v), Some(Arg::Dims([axis, start, end]))) = (bsym.args()[0].value(), bsym.args().get(1)) {
                if path.on_path(v) {
                    let grad = self.cast(cotangent, forward.value_meta(v)?.dtype)?;
                    let piece = Piece { axis: *axis, start: *start, end: *end, grad };
                    self.pieces.entry(v).or_default().push(piece);
                }
                return Ok(());
            }
        }
        let input = VjpInput { name, args: bsym.args(), output, cotangent };
        let grads =
            match (&symbol.vjp, symbol.builtin_prim().or(symbol.builtin_composite()).and_then(rules::builtin_rule)) {
                (Some(rule), _) => rule(&mut self.builder, &input)?,
                (None, Some(rule)) => rule(&mut self.builder, &input)?,
                (None, None) => {
                    return Err(Error::NoGradient {
                        symbol: name.to_string(),
                        detail: format!(
                        "it lies between a parameter and the loss (it defines {output}) and has neither a gradient \
                         rule nor a decomposition"
                    ),
                    })
                }
            };
        // An argument on the path to the loss left without an entry would silently get a zero
        // gradient (`None` is how a rule says no gradient flows to it).
        let missing = bsym.args().iter().skip(grads.len()).any(|a| a.value().is_some_and(|v| path.on_path(v)));
        if grads.len() > bsym.args().len() || missing {
            return Err(Error::NoGradient {
                symbol: name.to_string(),
                detail: format!(
                    "its gradient rule returned {} gradients for {} arguments; return one entry per argument \
                     (`None` where no gradient flows)",
                    grads.len(),
                    bsym.args().len()
                ),
            });
        }
        for (i, grad) in grads.into_iter().enumerate() {
            let (Some(grad), Some(v)) = (grad, bsym.args()[i].value()) else { continue };
            if !path.on_path(v) {
                continue;
            }
            let meta = forward.value_meta(v)?;
            let got = self.builder.shape(grad)?;
            if got != meta.shape.as_slice() {
                return Err(Error::NoGradient {
                    symbol: name.to_string(),
                    detail: format!(
                        "its gradient rule returned a gradient of shape {got:?} for argument {i}, which is {meta}; \
                         return one of the argument's shape"
                    ),
                });
            }
            let grad = self.cast(grad, meta.dtype)?;
            let total = match self.cotangents.get(&v) {
                Some(&previous) => self.builder.add(previous, grad)?,
                None => grad,
            };
            self.cotangents.insert(v, total);
        }
        Ok(())
    }

    fn cast(&mut self, grad: ValueId, dtype: DType) -> Result<ValueId> {
        if self.builder.dtype(grad)? == dtype {
            Ok(grad)
        } else {
            self.builder.cast(grad, dtype)
        }
    }
}

#[cfg(test)]
mod tests;
