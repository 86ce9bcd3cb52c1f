//! Invariants 3 and 4, as the NVTX API sees them: for random programs x executor sets x guard
//! attachments (NVTX guards in up to three domains, attached before and after decomposition and
//! fusion, `ProfileOps` zero to two times, one recorder attached twice, user labels), what one
//! run pushes equals the plan's range map exactly, in order, and no range has a direct parent
//! with the same label in the same domain, also with a `RangeFilter` on (levels, executors,
//! categories). Also the targeted cases of the rule, one test each.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use boundscope::executors::{math, CpuFusion, CpuReference};
use boundscope::guards::{
    ClosureGuard, Guard, GuardKind, GuardSite, Level, NvtxRange, Recorder, ScopedGuard, Selection,
};
use boundscope::passes::{FuseRegions, FusionStrategy, Grad, Pass, Pipeline, ProfileOps};
use boundscope::{
    prims, Arena, BoundSymbolId, Category, EmittedRange, Error, Executor, Fusible, Kernel, OpView, Plan, PushedBy,
    RangeFilter, Registry, Tensor, Trace, TraceBuilder, ValueId,
};
use common::nvtx_capture::{self, NvtxEvent, NvtxEventKind};
use common::program::{programs, transformer_programs};
use common::ranges::{pushes_in, pushes_of};
use proptest::prelude::*;

const DOMAINS: [&str; 3] = ["boundscope", "user", "test_fuser"];

/// A user's fusion executor: fuses unary elementwise ops, and pushes its region range itself,
/// in the domain it declares.
struct TestFuser {
    emits: [EmittedRange; 1],
    /// Claims only regions with one input (others are decomposed when compiled).
    single_input_only: bool,
}

impl TestFuser {
    fn new(domain: &str, single_input_only: bool) -> Self {
        Self { emits: [EmittedRange::nvtx_regions_in(domain)], single_input_only }
    }
}

/// The test executors' unary ops, with the CPU reference's scalar functions: the same bits as
/// the reference plan, whose results an ill-conditioned op (a `layer_norm` of two close values)
/// would otherwise amplify past the tolerance from an ulp (`f32::tanh` is not `math::tanh`).
fn unary(name: &str) -> Option<fn(f32) -> f32> {
    Some(match name {
        "neg" => math::neg,
        "exp" => math::exp,
        "tanh" => math::tanh,
        "relu" => math::relu,
        "sigmoid" => math::sigmoid,
        _ => return None,
    })
}

impl Executor for TestFuser {
    fn name(&self) -> &str {
        "test_fuser"
    }

    fn fusion_prefix(&self) -> &str {
        "Test"
    }

    fn fusible(&self, op: &OpView<'_>) -> Fusible {
        if unary(op.name()).is_some() && op.bound_symbol().inputs().count() == 1 {
            Fusible::Elementwise
        } else {
            Fusible::No
        }
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        op.is_region_of(self) && (!self.single_input_only || op.bound_symbol().inputs().count() == 1)
    }

    fn compile(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn Kernel>> {
        // Slots: the region's inputs, then each op's output.
        let mut slots: Vec<ValueId> = op.bound_symbol().inputs().collect();
        let mut program = Vec::new();
        for sub in op.region_ops()? {
            let input = sub.bound_symbol().inputs().next().expect("unary");
            let from = slots.iter().position(|&v| v == input).expect("defined earlier");
            slots.push(sub.bound_symbol().outputs()[0]);
            program.push((unary(sub.name()).expect("fusible"), from, slots.len() - 1));
        }
        let outputs: Vec<usize> =
            op.bound_symbol().outputs().iter().map(|o| slots.iter().position(|v| v == o).expect("defined")).collect();
        let slot_count = slots.len();
        let range = op.region_range().map(|r| r.prepare()).transpose()?;
        Ok(boundscope::kernel_fn(move |inputs, outs| {
            let run = || {
                let mut values = vec![0.0f32; slot_count];
                for i in 0..outs[0].data.len() {
                    for (k, input) in inputs.iter().enumerate() {
                        values[k] = input.data.f32_at(i);
                    }
                    for &(f, from, to) in &program {
                        values[to] = f(values[from]);
                    }
                    for (out, &slot) in outs.iter_mut().zip(&outputs) {
                        out.data.set_f32(i, values[slot]);
                    }
                }
            };
            in_range(range.as_ref(), run);
            Ok(())
        }))
    }

    fn emits(&self) -> &[EmittedRange] {
        &self.emits
    }
}

/// A user's executor of single ops (the unary ones) that pushes a range of its own around each
/// op it runs, in the domain it declares (as a library that wraps each call in its own range).
struct TestOpRanges {
    emits: [EmittedRange; 1],
}

impl Executor for TestOpRanges {
    fn name(&self) -> &str {
        "test_op_ranges"
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        unary(op.name()).is_some() && op.bound_symbol().inputs().count() == 1
    }

    fn compile(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn Kernel>> {
        let f = unary(op.name()).expect("claimed");
        let range = op.region_range().map(|r| r.prepare()).transpose()?;
        Ok(boundscope::kernel_fn(move |inputs, outs| {
            let run = || {
                for i in 0..outs[0].data.len() {
                    outs[0].data.set_f32(i, f(inputs[0].data.f32_at(i)));
                }
            };
            in_range(range.as_ref(), run);
            Ok(())
        }))
    }

    fn emits(&self) -> &[EmittedRange] {
        &self.emits
    }
}

/// Runs `run` inside the range its executor pushes, if the plan gave it one.
fn in_range(range: Option<&boundscope::PreparedRegionRange>, run: impl FnOnce()) {
    match range {
        Some(range) => range.in_scope(run),
        None => run(),
    }
}

/// Balanced per domain, and no push whose direct parent in its domain has the same label.
fn check_nesting(events: &[NvtxEvent]) -> Result<(), String> {
    let mut stacks: std::collections::HashMap<Option<String>, Vec<String>> = Default::default();
    for e in events {
        let stack = stacks.entry(e.domain.clone()).or_default();
        match e.kind {
            NvtxEventKind::Push => {
                let label = e.message.clone().unwrap_or_default();
                if stack.last() == Some(&label) {
                    return Err(format!("`{label}` directly inside `{label}` in domain {:?}", e.domain));
                }
                stack.push(label);
            }
            NvtxEventKind::Pop => {
                stack.pop().ok_or_else(|| format!("a pop without a push in domain {:?}", e.domain))?;
            }
        }
    }
    match stacks.iter().find(|(_, s)| !s.is_empty()) {
        Some((domain, s)) => Err(format!("{} range(s) left open in domain {domain:?}", s.len())),
        None => Ok(()),
    }
}

/// Where in the pipeline a guard is attached.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// On the trace as built (composites whole).
    Built,
    /// After decomposition.
    Decomposed,
    /// After fusion.
    Fused,
}

#[derive(Clone, Debug)]
enum Target {
    All,
    Op(usize),
    Trace,
    Positions(usize, usize),
    /// The subsymbols of an op, one level down (only where it has some).
    Subsymbols(usize),
    /// The first region (after fusion only).
    FirstRegion,
    /// Every scope matching a pattern, as a whole.
    Scope(&'static str),
    /// The ops inside the scopes matching a pattern.
    InScope(&'static str),
}

#[derive(Clone, Debug)]
struct GuardSpec {
    stage: Stage,
    target: Target,
    domain: usize,
    label: Option<&'static str>,
    color: Option<u32>,
}

fn stages() -> impl Strategy<Value = Stage> {
    prop_oneof![Just(Stage::Built), Just(Stage::Decomposed), Just(Stage::Fused)]
}

fn guard_specs() -> impl Strategy<Value = Vec<GuardSpec>> {
    let target = prop_oneof![
        Just(Target::All),
        (0usize..20).prop_map(Target::Op),
        Just(Target::Trace),
        (0usize..20, 0usize..20).prop_map(|(a, b)| Target::Positions(a, b)),
        (0usize..20).prop_map(Target::Subsymbols),
        Just(Target::FirstRegion),
        prop::sample::select(vec!["**", "*", "layer.*", "**.attn", "**.exp"]).prop_map(Target::Scope),
        prop::sample::select(vec!["**", "layer.**"]).prop_map(Target::InScope),
    ];
    let label = prop_oneof![3 => Just(None), 1 => Just(Some("mine")), 1 => Just(Some("other"))];
    let color = prop_oneof![3 => Just(None), 1 => Just(Some(0xFF11_2233u32))];
    let spec = (stages(), target, 0usize..3, label, color)
        .prop_map(|(stage, target, domain, label, color)| GuardSpec { stage, target, domain, label, color });
    prop::collection::vec(spec, 0..5)
}

/// The executors a case compiles with, besides the reference.
#[derive(Clone, Debug)]
enum Fuser {
    None,
    CpuFusion { emit: bool },
    Test { domain: usize, single_input_only: bool },
}

fn fusers() -> impl Strategy<Value = Fuser> {
    prop_oneof![
        Just(Fuser::None),
        any::<bool>().prop_map(|emit| Fuser::CpuFusion { emit }),
        (0usize..3, any::<bool>()).prop_map(|(domain, single_input_only)| Fuser::Test { domain, single_input_only }),
    ]
}

/// The filters a case compiles with: often none, else a random choice of levels, and maybe of
/// executors (one that no plan has among them) and categories.
fn range_filters() -> impl Strategy<Value = (Vec<Level>, RangeFilter)> {
    let executors = ["cpu_fusion", "cpu_reference", "test_fuser", "test_op_ranges", "runtime", "nobody"];
    let categories =
        [Category::Elementwise, Category::Reduction, Category::Matmul, Category::Composite, Category::Fusion];
    let chosen = (
        prop::sample::subsequence(Level::ALL.to_vec(), 0..=5),
        prop::option::weighted(0.3, prop::sample::subsequence(executors.to_vec(), 0..=3)),
        prop::option::weighted(0.3, prop::sample::subsequence(categories.to_vec(), 0..=3)),
    )
        .prop_map(|(levels, executors, categories)| {
            let mut filter = RangeFilter::new().levels(&levels);
            if let Some(names) = executors {
                filter = filter.executors(names);
            }
            if let Some(categories) = categories {
                filter = filter.categories(&categories);
            }
            (levels, filter)
        });
    prop_oneof![1 => Just((Level::ALL.to_vec(), RangeFilter::new())), 2 => chosen]
}

fn attach(trace: &mut Trace<'_>, specs: &[GuardSpec], stage: u8) {
    for spec in specs.iter().filter(|s| s.stage as u8 == stage) {
        let mut range = NvtxRange::new().domain(DOMAINS[spec.domain]).unwrap();
        if let Some(label) = spec.label {
            range = range.label(label).unwrap();
        }
        if let Some(color) = spec.color {
            range = range.color(color);
        }
        let len = trace.len();
        match spec.target {
            Target::All => {
                trace.attach_guard(Selection::All, range).unwrap();
            }
            Target::Op(i) => {
                trace.attach_guard(Selection::Op(BoundSymbolId::from_index(i % len)), range).unwrap();
            }
            Target::Trace => {
                trace.attach_trace_guard(range).unwrap();
            }
            Target::Positions(a, b) => {
                let (a, b) = (a % (len + 1), b % (len + 1));
                trace.attach_guard(Selection::Positions(a.min(b)..a.max(b)), range).unwrap();
            }
            Target::Subsymbols(i) => {
                let op = BoundSymbolId::from_index(i % len);
                if !trace.bound_symbols()[i % len].subsymbols().is_empty()
                    && trace.bound_symbols()[i % len].symbol() != prims::REGION
                {
                    trace.attach_subsymbol_guard(op, 1, range).unwrap();
                }
            }
            Target::FirstRegion => {
                if let Some(p) = (0..len).find(|&p| trace.bound_symbols()[p].symbol() == prims::REGION) {
                    trace.attach_guard(Selection::Op(BoundSymbolId::from_index(p)), range).unwrap();
                }
            }
            // A pattern that matches no scope of this case is a typed error, and nothing is
            // attached.
            Target::Scope(pattern) => match trace.attach_guard(Selection::Scope(pattern), range) {
                Ok(n) => assert!(n > 0),
                Err(e) => assert!(matches!(e, Error::NoSuchScope { .. }), "{e}"),
            },
            Target::InScope(pattern) => match trace.attach_guard(Selection::InScope(pattern), range) {
                Ok(_) => {}
                Err(e) => assert!(matches!(e, Error::NoSuchScope { .. }), "{e}"),
            },
        }
    }
}

fn profile<'a>(trace: Trace<'a>, arena: &'a Arena, times: u8) -> Trace<'a> {
    let mut trace = trace;
    for _ in 0..times {
        trace = ProfileOps::new().with_trace_range(NvtxRange::new()).run(&trace, arena).unwrap();
    }
    trace
}

/// Runs `plan` once on this thread and returns what the NVTX API saw.
fn captured_run(plan: &Plan, inputs: &[Tensor]) -> (boundscope::Result<Vec<Tensor>>, Vec<NvtxEvent>) {
    let refs: Vec<&Tensor> = inputs.iter().collect();
    nvtx_capture::events_on_current_thread();
    let out = plan.run(&refs);
    (out, nvtx_capture::events_on_current_thread())
}

/// The property for one case: the capture equals the map, ranges nest, results equal
/// `reference`'s within a relative `tolerance` (0: exactly).
fn check_case(
    plan: &Plan,
    (reference, tolerance): (&Plan, f32),
    inputs: &[Tensor],
    listing: &str,
) -> Result<(), TestCaseError> {
    let (got, events) = captured_run(plan, inputs);
    let got = got.map_err(|e| TestCaseError::fail(format!("{e}\n{listing}")))?;
    prop_assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{:#}\n{}", plan, listing);
    check_nesting(&events).map_err(|m| TestCaseError::fail(format!("{m}\n{plan:#}")))?;
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let expected = reference.run(&refs).unwrap();
    common::close_all(&got, &expected, tolerance).map_err(|m| TestCaseError::fail(format!("{m}\n{listing}")))?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// What one run pushes equals the plan's range map, in order and in every attribute;
    /// ranges are balanced and no range sits directly inside one with its label and domain.
    #[test]
    fn one_run_pushes_exactly_the_range_map(
        program in prop_oneof![programs(true), transformer_programs()],
        fuser in fusers(),
        op_ranges in prop::option::weighted(0.3, 0usize..3),
        strategy in prop_oneof![Just(FusionStrategy::Consecutive), Just(FusionStrategy::Dataflow)],
        specs in guard_specs(),
        profile_at in prop::collection::vec((0u8..3, 1u8..3), 0..3),
        recorder_twice in any::<bool>(),
        profiling_off in prop::bool::weighted(0.1),
        (levels, filter) in range_filters(),
        seed in any::<u64>(),
        scopes in prop::collection::vec((0u8..3, 0u8..3, 0usize..6), 0..14),
        within_scopes in prop::bool::weighted(0.25),
    ) {
        prop_assume!(nvtx_capture::is_installed());
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        // Random nested scopes (some named like ops) around the program's ops.
        let built = program.build_in_scopes(&arena, &registry, &scopes).unwrap();
        let times = |stage: u8| profile_at.iter().filter(|(s, _)| *s == stage).map(|(_, n)| *n).sum::<u8>();

        let mut trace = profile(built.clone(), &arena, times(0));
        attach(&mut trace, &specs, 0);
        let mut trace = profile(Pipeline::standard().run(&trace, &arena).unwrap(), &arena, times(1));
        attach(&mut trace, &specs, 1);
        // The unary ops the fuser leaves, on an executor that pushes its own op ranges.
        let op_ranges: Option<Arc<dyn Executor>> = op_ranges
            .map(|domain| Arc::new(TestOpRanges { emits: [EmittedRange::nvtx_ops_in(DOMAINS[domain])] }) as Arc<dyn Executor>);
        let fuser: Option<Arc<dyn Executor>> = match fuser {
            Fuser::None => None,
            Fuser::CpuFusion { emit } => Some(Arc::new(CpuFusion::new().emit_region_ranges(emit))),
            Fuser::Test { domain, single_input_only } => Some(Arc::new(TestFuser::new(DOMAINS[domain], single_input_only))),
        };
        if let Some(fuser) = &fuser {
            trace = FuseRegions::new(fuser.clone())
                .strategy(strategy)
                .within_scopes(within_scopes)
                .run(&trace, &arena)
                .unwrap();
        }
        let mut trace = profile(trace, &arena, times(2));
        attach(&mut trace, &specs, 2);
        let recorder = Recorder::new();
        if recorder_twice {
            trace.attach_guard(Selection::All, recorder.clone()).unwrap();
            trace.attach_guard(Selection::All, recorder.clone()).unwrap();
        }

        let mut executors: Vec<Arc<dyn Executor>> = fuser.into_iter().chain(op_ranges).collect();
        executors.push(CpuReference::shared());
        let plan = Plan::compile_filtered(&trace, &executors, &filter).unwrap();
        plan.set_profiling(!profiling_off);
        // Only admitted levels have ranges (pushed by the runtime or by an executor).
        for range in plan.range_map().ranges() {
            prop_assert!(levels.contains(&range.level), "{:?} range `{}` with {:?}\n{:#}", range.level, range.label, filter, plan);
        }
        // The CPU reference on the same prims: neither guards, scopes nor fusion change an op's
        // math or its order, so the results are exact (no tolerance could hold here: a
        // division by what cancels to zero amplifies one rounding past any bound).
        let prims_only = Pipeline::standard().run(&built, &arena).unwrap();
        let reference = Plan::compile(&prims_only, &[CpuReference::shared()]).unwrap();
        let inputs = program.input_data(seed);
        check_case(&plan, (&reference, 0.0), &inputs, &trace.to_string())?;
        if recorder_twice && !profiling_off {
            // One recorder attached twice to each op records each op once (regions as one).
            let scopes = (0..trace.len()).count();
            let recorded = recorder.ranges().iter().filter(|r| r.level != boundscope::guards::Level::Subsymbol).count();
            prop_assert!(recorded <= scopes + plan.len(), "{recorded} ranges for {scopes} bound symbols");
            prop_assert_eq!(recorder.ranges().iter().filter(|r| r.parent.is_none()).count(), scopes);
        }
        // And again: a second run pushes the same.
        let (_, again) = captured_run(&plan, &inputs);
        prop_assert_eq!(pushes_of(&again), pushes_in(plan.range_map()));
    }
}

/// A training trace: `depth` layers (`layer.<i>.attn`: softmax of a product, added back;
/// `layer.<i>.mlp`: gelu of a linear with a bias, added back), a scalar loss, and its backward
/// (`passes::Grad`) with respect to every weight.
fn joint_trace<'a>(arena: &'a Arena, registry: &'a Registry, depth: usize, width: usize) -> (Trace<'a>, Vec<ValueId>) {
    let mut b = TraceBuilder::new(arena, registry);
    let mut x = b.input(&[2, width]).unwrap();
    let mut weights = Vec::new();
    for i in 0..depth {
        let (wa, wm, bm) =
            (b.input(&[width, width]).unwrap(), b.input(&[width, width]).unwrap(), b.input(&[width]).unwrap());
        weights.extend([wa, wm, bm]);
        x = b
            .scope("layer", |b| {
                b.scope(&i.to_string(), |b| {
                    let a = b.scope("attn", |b| {
                        let s = b.linear(x, wa, None)?;
                        b.softmax(s)
                    })?;
                    let x = b.add(x, a)?;
                    let m = b.scope("mlp", |b| {
                        let h = b.linear(x, wm, Some(bm))?;
                        b.gelu(h)
                    })?;
                    b.add(x, m)
                })
            })
            .unwrap();
    }
    let t = b.tanh(x).unwrap();
    let flat = b.reshape(t, &[1, 2 * width]).unwrap();
    let loss = b.sum(flat).unwrap();
    b.output(loss).unwrap();
    (b.finish().unwrap(), weights)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Forward and backward in one trace, guards attached before and after `passes::Grad` and
    /// fusion: what one run pushes equals the plan's range map, ranges nest, the backward of an
    /// op with a range has one (`<label> (backward)`), and the gradients are the unguarded ones.
    #[test]
    fn joint_forward_backward_traces_push_exactly_their_range_map(
        depth in 1usize..3,
        width in 1usize..5,
        fuse in any::<bool>(),
        specs in guard_specs(),
        profile_at in prop::collection::vec((0u8..3, 1u8..3), 0..2),
        (levels, filter) in range_filters(),
    ) {
        prop_assume!(nvtx_capture::is_installed());
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let (built, weights) = joint_trace(&arena, &registry, depth, width);
        let times = |stage: u8| profile_at.iter().filter(|(s, _)| *s == stage).map(|(_, n)| *n).sum::<u8>();
        let mut trace = profile(built.clone(), &arena, times(0));
        attach(&mut trace, &specs, 0);
        let forward_ranges = trace.guard_attachment_count() > 0;
        let mut trace = profile(Grad::new(&weights).run(&trace, &arena).unwrap(), &arena, times(1));
        attach(&mut trace, &specs, 1);
        let mut executors: Vec<Arc<dyn Executor>> = vec![CpuReference::shared()];
        if fuse {
            let fusion = CpuFusion::shared();
            trace = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
            executors.insert(0, fusion);
        }
        let mut trace = profile(trace, &arena, times(2));
        attach(&mut trace, &specs, 2);
        let plan = Plan::compile_filtered(&trace, &executors, &filter).unwrap();
        for range in plan.range_map().ranges() {
            prop_assert!(levels.contains(&range.level), "{:?} range `{}`\n{:#}", range.level, range.label, plan);
        }
        let reference = Plan::compile(&Grad::new(&weights).run(&built, &arena).unwrap(), &[CpuReference::shared()]).unwrap();
        let inputs: Vec<Tensor> = built
            .inputs()
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                let shape = built.value_meta(v).unwrap().shape;
                Tensor::from_fn(&shape, |i| ((i * 7 + k * 13) % 11) as f32 / 11.0 - 0.5)
            })
            .collect();
        check_case(&plan, (&reference, 1e-5), &inputs, &trace.to_string())?;
        let all_levels = levels.len() == Level::ALL.len();
        if forward_ranges && all_levels && times(0) > 0 {
            let (_, events) = captured_run(&plan, &inputs);
            prop_assert!(pushes_of(&events).iter().any(|p| p.label.ends_with(" (backward)")), "{:#}", plan);
        }
    }
}

/// Whether the NVTX capture is this process's NVTX tool (not so under a profiler); says why a
/// test is skipped when it is not.
fn capture_installed() -> bool {
    let installed = nvtx_capture::is_installed();
    if !installed {
        eprintln!("SKIPPED: the NVTX capture is not this process's NVTX tool");
    }
    installed
}

fn swish_chain<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[8, 8]).unwrap();
    let e = b.exp(x).unwrap();
    let t = b.tanh(e).unwrap();
    let y = b.neg(t).unwrap();
    let z = b.matmul(y, x).unwrap();
    b.output(z).unwrap();
    b.finish().unwrap()
}

fn inputs() -> Vec<Tensor> {
    vec![Tensor::from_fn(&[8, 8], |i| i as f32 / 64.0 - 0.5)]
}

/// The labels pushed in `domain`, in order.
fn labels_in(events: &[NvtxEvent], domain: &str) -> Vec<String> {
    pushes_of(events).into_iter().filter(|p| p.domain == domain).map(|p| p.label).collect()
}

#[test]
fn a_user_executor_in_its_own_domain_gets_no_second_range_there() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = swish_chain(&arena, &registry);
    let fuser: Arc<dyn Executor> = Arc::new(TestFuser::new("test_fuser", false));
    let profiled = ProfileOps::new().run(&trace, &arena).unwrap();
    let mut fused = FuseRegions::new(fuser.clone()).run(&profiled, &arena).unwrap();
    fused.attach_guard(Selection::All, NvtxRange::new().domain("test_fuser").unwrap()).unwrap();
    let plan = Plan::compile(&fused, &[fuser, CpuReference::shared()]).unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    // One range in the executor's domain, pushed by it; the `boundscope` one from the runtime.
    assert_eq!(labels_in(&events, "test_fuser"), ["TestFusion0: (exp, tanh, neg)", "matmul"]);
    let boundscope = labels_in(&events, "boundscope");
    assert!(boundscope.contains(&"TestFusion0: (exp, tanh, neg)".to_string()), "{boundscope:?}");
    let region = plan.range_map().ranges().iter().filter(|r| r.label.starts_with("TestFusion0")).cloned();
    let pushers: Vec<PushedBy> = region.map(|r| r.pushed_by).collect();
    assert_eq!(pushers.len(), 2);
    assert!(pushers.contains(&PushedBy::Runtime) && pushers.contains(&PushedBy::Executor("test_fuser".into())));
    check_nesting(&events).unwrap();
}

#[test]
fn a_user_executor_that_pushes_op_ranges_gets_no_second_one_in_its_domain() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = swish_chain(&arena, &registry);
    let ops: Arc<dyn Executor> = Arc::new(TestOpRanges { emits: [EmittedRange::nvtx_ops("test_fuser")] });
    let mut profiled = ProfileOps::new().run(&trace, &arena).unwrap();
    profiled.attach_guard(Selection::All, NvtxRange::new().domain("test_fuser").unwrap()).unwrap();
    let plan = Plan::compile(&profiled, &[ops, CpuReference::shared()]).unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    // One range per op in the executor's domain: its own for the ops it runs, the runtime's
    // for `matmul`; one per op in `boundscope`, from the runtime.
    assert_eq!(labels_in(&events, "test_fuser"), ["exp", "tanh", "neg", "matmul"]);
    assert_eq!(labels_in(&events, "boundscope"), ["exp", "tanh", "neg", "matmul"]);
    let pushed_by = |label: &str, domain: &str| {
        let ranges = plan.range_map().ranges().iter();
        ranges.filter(|r| r.label == label && r.domain == domain).map(|r| r.pushed_by.clone()).collect::<Vec<_>>()
    };
    assert_eq!(pushed_by("tanh", "test_fuser"), [PushedBy::Executor("test_op_ranges".into())]);
    assert_eq!(pushed_by("tanh", "boundscope"), [PushedBy::Runtime]);
    assert_eq!(pushed_by("matmul", "test_fuser"), [PushedBy::Runtime]);
    assert!(plan.range_map().ranges().iter().filter(|r| r.label == "tanh").all(|r| r.level == Level::Op));
    check_nesting(&events).unwrap();
    // Without NVTX guards on an op, it gets no range from its executor either.
    let plan = Plan::compile(
        &trace,
        &[
            Arc::new(TestOpRanges { emits: [EmittedRange::nvtx_ops("test_fuser")] }) as Arc<dyn Executor>,
            CpuReference::shared(),
        ],
    )
    .unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    assert!(labels_in(&events, "test_fuser").is_empty(), "{events:?}");
}

/// A subsymbol guard of a composite that becomes one op of an executor pushing op ranges is a
/// scope of its own over that op: with a range in the executor's domain there, the runtime
/// pushes the op's ranges (keeping one of twins) and the executor none, so no range sits
/// directly inside its twin.
#[test]
fn an_op_range_beside_a_subsymbol_range_in_its_domain_is_not_doubled() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8, 8]).unwrap();
    let y = b.softmax(x).unwrap();
    b.output(y).unwrap();
    let mut trace = b.finish().unwrap();
    trace
        .attach_subsymbol_guard(BoundSymbolId::from_index(0), 1, NvtxRange::new().domain("test_fuser").unwrap())
        .unwrap();
    let decomposed = Pipeline::standard().run(&trace, &arena).unwrap();
    let mut profiled = ProfileOps::new().run(&decomposed, &arena).unwrap();
    profiled.attach_guard(Selection::All, NvtxRange::new().domain("test_fuser").unwrap()).unwrap();
    let ops: Arc<dyn Executor> = Arc::new(TestOpRanges { emits: [EmittedRange::nvtx_ops("test_fuser")] });
    let plan = Plan::compile(&profiled, &[ops, CpuReference::shared()]).unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{plan:#}");
    check_nesting(&events).unwrap();
    assert!(labels_in(&events, "test_fuser").contains(&"exp".to_string()), "{events:?}");
}

#[test]
fn a_label_in_one_domain_renames_no_range_in_another() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = swish_chain(&arena, &registry);
    let fusion = CpuFusion::shared();
    let mut fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
    let region = Selection::Op(BoundSymbolId::from_index(0));
    assert_eq!(fused.bound_symbols()[0].symbol(), prims::REGION, "{fused}");
    fused.attach_guard(region.clone(), NvtxRange::new().domain("user").unwrap().label("mine").unwrap()).unwrap();
    fused.attach_guard(region, NvtxRange::new()).unwrap();
    let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    assert_eq!(labels_in(&events, "user"), ["mine"]);
    assert_eq!(labels_in(&events, "boundscope"), ["CpuFusion0: (exp, tanh, neg)"]);
}

#[test]
fn profiling_twice_or_by_the_front_end_again_gives_one_range_per_op() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = swish_chain(&arena, &registry);
    let once = ProfileOps::new().run(&trace, &arena).unwrap();
    let twice = ProfileOps::new().run(&once, &arena).unwrap();
    assert_eq!(once.to_string(), twice.to_string());
    // Attached by hand twice: the plan still pushes one range per op.
    let mut by_hand = trace.clone();
    by_hand.attach_guard(Selection::All, NvtxRange::new()).unwrap();
    by_hand.attach_guard(Selection::All, NvtxRange::new()).unwrap();
    let plan = Plan::compile(&by_hand, &[CpuReference::shared()]).unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    assert_eq!(labels_in(&events, "boundscope").len(), trace.len());
    // The front end on a trace the user already profiled, in another domain: nothing added.
    let mut users = trace.clone();
    users.attach_guard(Selection::All, NvtxRange::new().domain("user").unwrap()).unwrap();
    users.attach_trace_guard(NvtxRange::new().domain("user").unwrap()).unwrap();
    let mut options = boundscope::options::Options::new();
    options.set_str("runtime.profiling", "ops").unwrap();
    options.set("runtime.fusion", false).unwrap();
    let env = boundscope::frontend::Environment::from_pairs(&[]);
    let session = boundscope::frontend::ProfiledSession::new(options, &env).unwrap();
    let plan = session.compile(&users, &arena).unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    assert_eq!(labels_in(&events, "boundscope"), Vec::<String>::new(), "{plan:#}");
    assert_eq!(labels_in(&events, "user").len(), 1 + trace.len());
}

#[test]
fn one_recorder_attached_twice_records_once_fused_or_not() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = swish_chain(&arena, &registry);
    let recorder = Recorder::new();
    let mut twice = trace.clone();
    twice.attach_guard(Selection::All, recorder.clone()).unwrap();
    twice.attach_guard(Selection::All, recorder.clone()).unwrap();
    let plan = Plan::compile(&twice, &[CpuReference::shared()]).unwrap();
    let refs: Vec<Tensor> = inputs();
    plan.run(&[&refs[0]]).unwrap();
    assert_eq!(recorder.len(), trace.len());
    recorder.clear();
    let fusion = CpuFusion::shared();
    let fused = FuseRegions::new(fusion.clone()).run(&twice, &arena).unwrap();
    Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap().run(&[&refs[0]]).unwrap();
    assert_eq!(recorder.len(), fused.len());
}

#[test]
fn region_names_stay_unique_across_fusion_passes() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[16]).unwrap();
    let e = b.exp(x).unwrap();
    let n = b.neg(e).unwrap();
    let s = b.sum(n).unwrap();
    let t = b.tanh(s).unwrap();
    let r = b.relu(t).unwrap();
    b.output(r).unwrap();
    let trace = b.finish().unwrap();
    let first = FuseRegions::new(CpuFusion::shared()).max_ops(2).run(&trace, &arena).unwrap();
    let second = FuseRegions::new(CpuFusion::shared()).run(&first, &arena).unwrap();
    let names: Vec<&str> = second.bound_symbols().iter().filter_map(|b| b.name()).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(names.len(), unique.len(), "{second}");
    assert!(names.len() >= 2, "{second}");
}

#[test]
fn a_run_keeps_its_profiling_decision_to_the_end() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8, 8]).unwrap();
    let m = b.mul(x, x).unwrap();
    let e = b.exp(m).unwrap();
    let y = b.neg(e).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let fusion = CpuFusion::shared();
    let mut fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
    fused.attach_trace_guard(NvtxRange::new().label("run").unwrap()).unwrap();
    fused.attach_guard(Selection::All, NvtxRange::new()).unwrap();
    // A non-profiling guard on the run that flips the plan's switch while the run is going.
    let plan_cell: Arc<OnceLock<Arc<Plan>>> = Arc::new(OnceLock::new());
    let flip = plan_cell.clone();
    let on = Arc::new(AtomicBool::new(false));
    let next = on.clone();
    fused
        .attach_trace_guard(ClosureGuard::new(
            move || {
                if let Some(plan) = flip.get() {
                    plan.set_profiling(next.fetch_xor(true, Ordering::Relaxed));
                }
            },
            || {},
        ))
        .unwrap();
    let plan = Arc::new(Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap());
    plan_cell.set(plan.clone()).ok().unwrap();
    for _ in 0..4 {
        let decided = plan.profiling();
        let (_, events) = captured_run(&plan, &inputs());
        let labels = labels_in(&events, "boundscope");
        if decided {
            assert_eq!(labels, ["run", "CpuFusion0: (mul, exp, neg)"]);
        } else {
            assert!(labels.is_empty(), "{labels:?}");
        }
        check_nesting(&events).unwrap();
    }
}

/// A guard whose exit panics.
struct PanickingExit(Arc<AtomicUsize>);
struct PreparedPanickingExit(Arc<AtomicUsize>);
impl ScopedGuard for PreparedPanickingExit {
    fn on_enter(&self) -> u64 {
        0
    }
    fn on_exit(&self, _: u64) {
        self.0.fetch_add(1, Ordering::Relaxed);
        panic!("this guard's exit panics on purpose");
    }
}
impl Guard for PanickingExit {
    fn kind(&self) -> GuardKind {
        GuardKind::Custom("@panics")
    }
    fn is_profiling(&self) -> bool {
        false
    }
    fn prepare(&self, _: &GuardSite<'_>) -> boundscope::Result<Box<dyn ScopedGuard>> {
        Ok(Box::new(PreparedPanickingExit(self.0.clone())))
    }
}

/// Fails (or panics) on `exp`.
struct FailOnExp {
    panic: bool,
}
impl Executor for FailOnExp {
    fn name(&self) -> &str {
        "fail_on_exp"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::EXP
    }
    fn compile(&self, _: &OpView<'_>) -> boundscope::Result<Box<dyn Kernel>> {
        let panic = self.panic;
        Ok(boundscope::kernel_fn(move |_, _| {
            if panic {
                panic!("the kernel panics on purpose");
            }
            Err(Error::Execution { executor: "fail_on_exp".into(), symbol: "exp".into(), message: "on purpose".into() })
        }))
    }
}

#[test]
fn a_panicking_exit_still_exits_every_guard_and_never_aborts() {
    if !capture_installed() {
        return;
    }
    for kernel_panics in [false, true] {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let trace = swish_chain(&arena, &registry);
        let mut guarded = trace.clone();
        let exits = Arc::new(AtomicUsize::new(0));
        let recorder = Recorder::new();
        guarded.attach_trace_guard(NvtxRange::new().label("run").unwrap()).unwrap();
        guarded.attach_trace_guard(recorder.clone()).unwrap();
        let exp = Selection::Op(BoundSymbolId::from_index(0));
        guarded.attach_guard(exp.clone(), NvtxRange::new()).unwrap();
        guarded.attach_guard(exp.clone(), PanickingExit(exits.clone())).unwrap();
        guarded.attach_guard(exp, recorder.clone()).unwrap();
        let failing: Arc<dyn Executor> = Arc::new(FailOnExp { panic: kernel_panics });
        let plan = Plan::compile(&guarded, &[failing, CpuReference::shared()]).unwrap();
        let inputs = inputs();
        nvtx_capture::events_on_current_thread();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| plan.run(&[&inputs[0]])));
        let events = nvtx_capture::events_on_current_thread();
        let message = outcome.as_ref().err().and_then(|p| p.downcast_ref::<&str>().copied());
        let expected =
            if kernel_panics { "the kernel panics on purpose" } else { "this guard's exit panics on purpose" };
        assert_eq!(message, Some(expected), "kernel panics: {kernel_panics}");
        assert_eq!(exits.load(Ordering::Relaxed), 1);
        check_nesting(&events).unwrap();
        assert_eq!(recorder.len(), 2, "the recorder's two scopes were both exited");
        // The thread's state is sound: a later run on it nests from the top again.
        recorder.clear();
        let clean = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let mut profiled = trace.clone();
        profiled.attach_trace_guard(recorder.clone()).unwrap();
        Plan::compile(&profiled, &[CpuReference::shared()]).unwrap().run(&[&inputs[0]]).unwrap();
        assert_eq!(recorder.ranges()[0].parent, None);
        drop(clean);
    }
}

#[test]
fn conflicting_settings_in_one_domain_are_a_note_of_the_plan() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut trace = swish_chain(&arena, &registry);
    let op = Selection::Op(BoundSymbolId::from_index(0));
    trace.attach_guard(op.clone(), NvtxRange::new().label("first").unwrap()).unwrap();
    trace.attach_guard(op, NvtxRange::new().label("second").unwrap().color(7)).unwrap();
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    assert_eq!(plan.notes().len(), 1, "{:?}", plan.notes());
    assert!(plan.notes()[0].contains("\"first\" kept, \"second\" ignored"), "{:?}", plan.notes());
    assert!(plan.to_string().contains("# note: op `exp`"), "{plan}");
    let map = plan.range_map();
    assert_eq!(map.len(), 1);
    assert_eq!(map.ranges()[0].label, "first");
    assert_eq!(map.ranges()[0].color, Some(7), "the colour only the second gave is taken");
}

#[test]
fn a_position_map_that_makes_spans_overlap_is_a_typed_error() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 4]).unwrap();
    let w = b.input(&[4, 4]).unwrap();
    let h = b.linear(x, w, None).unwrap();
    let y = b.softmax(h).unwrap();
    b.output(y).unwrap();
    let mut trace = b.finish().unwrap();
    trace.attach_guard(Selection::All, Recorder::new()).unwrap();
    let prims_only = Pipeline::standard().run(&trace, &arena).unwrap();
    // linear became [transpose, matmul]; softmax several prims: two spans, side by side.
    let n = prims_only.len();
    assert!(n >= 4, "{prims_only}");
    let mut rewritten = TraceBuilder::rewrite(&prims_only, &arena);
    for bsym in prims_only.bound_symbols() {
        rewritten.push_copy(bsym);
    }
    // Swap the last op of the first span with the first op of the second.
    let mut map: Vec<Option<usize>> = (0..n).map(Some).collect();
    map.swap(1, 2);
    let err = rewritten.carry_guards(&prims_only, &map, "swap", |_| unreachable!()).unwrap_err();
    assert!(matches!(err, Error::OverlappingGuards { .. }), "{err}");
    assert!(err.to_string().contains("after `swap`"), "{err}");
    let identity: Vec<Option<usize>> = (0..n).map(Some).collect();
    rewritten.carry_guards(&prims_only, &identity, "keep", |_| unreachable!()).unwrap();
}

/// A user's guard kind that reports an NVTX domain and pushes its range through `NvtxRange`.
struct UserNvtx {
    label: &'static str,
    domain: &'static str,
}
impl Guard for UserNvtx {
    fn kind(&self) -> GuardKind {
        GuardKind::Custom("@user_nvtx")
    }
    fn label(&self) -> Option<&str> {
        Some(self.label)
    }
    fn nvtx_domain(&self) -> Option<&str> {
        Some(self.domain)
    }
    fn prepare(&self, site: &GuardSite<'_>) -> boundscope::Result<Box<dyn ScopedGuard>> {
        NvtxRange::new().domain(self.domain)?.prepare(site)
    }
}

#[test]
fn a_users_nvtx_guard_kind_pushes_what_the_map_says_or_the_plan_notes_why_not() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut trace = swish_chain(&arena, &registry);
    trace
        .attach_guard(Selection::Op(BoundSymbolId::from_index(3)), UserNvtx { label: "custom", domain: "user" })
        .unwrap();
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    assert_eq!(labels_in(&events, "user"), ["custom"]);
    // The map knows its domain and label (its attributes are the guard's own business).
    let where_and_what =
        |pushes: Vec<common::ranges::Push>| pushes.into_iter().map(|p| (p.domain, p.label)).collect::<Vec<_>>();
    assert_eq!(where_and_what(pushes_of(&events)), where_and_what(pushes_in(plan.range_map())));
    // In the domain a region's executor pushes itself, it does not run (its label names the
    // executor's range, as the rule says), and the plan says so.
    let fusion = CpuFusion::shared();
    let mut fused = FuseRegions::new(fusion.clone()).run(&swish_chain(&arena, &registry), &arena).unwrap();
    fused
        .attach_guard(Selection::Op(BoundSymbolId::from_index(0)), UserNvtx { label: "mine", domain: "boundscope" })
        .unwrap();
    let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
    let (_, events) = captured_run(&plan, &inputs());
    assert_eq!(labels_in(&events, "boundscope"), ["mine"]);
    assert_eq!(pushes_of(&events), pushes_in(plan.range_map()));
    assert!(
        plan.notes().iter().any(|n| n.contains("`@user_nvtx` guard in NVTX domain `boundscope` does not run")),
        "{:?}",
        plan.notes()
    );
}

#[test]
fn one_guard_object_attached_twice_runs_once() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut trace = swish_chain(&arena, &registry);
    let entered = Arc::new(AtomicUsize::new(0));
    let count = entered.clone();
    let shared: Arc<dyn Guard> = Arc::new(ClosureGuard::new(
        move || {
            count.fetch_add(1, Ordering::Relaxed);
        },
        || {},
    ));
    trace.attach_shared_guard(Selection::All, shared.clone()).unwrap();
    trace.attach_shared_guard(Selection::All, shared).unwrap();
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    plan.run(&[&inputs()[0]]).unwrap();
    assert_eq!(entered.load(Ordering::Relaxed), trace.len());
}

#[test]
fn an_empty_emitted_domain_is_a_typed_error() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let fuser: Arc<dyn Executor> = Arc::new(TestFuser::new("", false));
    let profiled = ProfileOps::new().run(&swish_chain(&arena, &registry), &arena).unwrap();
    let fused = FuseRegions::new(fuser.clone()).run(&profiled, &arena).unwrap();
    let err = Plan::compile(&fused, &[fuser, CpuReference::shared()]).unwrap_err();
    assert!(matches!(err, Error::InvalidLabel { .. }), "{err}");
    assert!(err.to_string().contains("domain"), "{err}");
}

/// `swish_chain` under a run range `step`, its elementwise ops fused by a `TestFuser` (which
/// pushes its own region ranges), and the executors to compile it for.
fn fused_swish_chain<'a>(arena: &'a Arena, registry: &'a Registry) -> (Trace<'a>, [Arc<dyn Executor>; 2]) {
    let trace = swish_chain(arena, registry);
    let fuser: Arc<dyn Executor> = Arc::new(TestFuser::new("boundscope", false));
    let profiled =
        ProfileOps::new().with_trace_range(NvtxRange::new().label("step").unwrap()).run(&trace, arena).unwrap();
    let fused = FuseRegions::new(fuser.clone()).run(&profiled, arena).unwrap();
    (fused, [fuser, CpuReference::shared()])
}

/// The option `runtime.nvtx_executors` (`BOUNDSCOPE_NVTX_EXECUTORS` in the front end) takes a
/// user's executor by its name, as `RangeFilter::executors` does in code: the plan's ranges are
/// the same either way. Built-in names a plan lacks are taken (plans share their options); a
/// name that is neither its executors' nor a built-in one's is refused when the plan compiles,
/// with the known names; a list that is not of names, when it is set.
#[test]
fn the_executor_option_takes_users_executors_and_refuses_unknown_names() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let (fused, executors) = fused_swish_chain(&arena, &registry);
    let mut options = boundscope::options::Options::new();
    options.set_str("runtime.nvtx_executors", "test_fuser").unwrap();
    let plan = Plan::compile_with_options(&fused, &executors, &options).unwrap();
    let in_code = Plan::compile_filtered(&fused, &executors, &RangeFilter::new().executors(["test_fuser"])).unwrap();
    let all = Plan::compile(&fused, &executors).unwrap();
    let labels = |plan: &Plan| pushes_in(plan.range_map()).into_iter().map(|p| p.label).collect::<Vec<_>>();
    assert_eq!(labels(&plan), ["step", "TestFusion0: (exp, tanh, neg)"]);
    assert_eq!(labels(&plan), labels(&in_code));
    assert_eq!(labels(&all), ["step", "TestFusion0: (exp, tanh, neg)", "matmul"]);
    options.set_str("runtime.nvtx_executors", "cuda_ops,runtime,cpu_reference").unwrap();
    Plan::compile_with_options(&fused, &executors, &options).unwrap();
    options.set_str("runtime.nvtx_executors", "cpu_reference,test_fusr").unwrap();
    let err = Plan::compile_with_options(&fused, &executors, &options).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidOptionValue { name, got, .. } if name == "runtime.nvtx_executors" && got == "test_fusr"),
        "{err}"
    );
    let message = err.to_string();
    for known in ["test_fuser", "cpu_reference", "cuda_fusion", "runtime", "BOUNDSCOPE_NVTX_EXECUTORS"] {
        assert!(message.contains(known), "{message}");
    }
    // Any name an executor may have (`Plan::compile` refuses `,`, the list's separator,
    // surrounding spaces and control characters).
    for name in ["", "my exec", "exécuteur", "my.exec"] {
        options.set_str("runtime.nvtx_executors", name).unwrap();
    }
    for bad in [" test_fuser", "test_fuser,test_fuser", "test_fuser,", ",", "a\tb"] {
        let err = options.set_str("runtime.nvtx_executors", bad).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidOptionValue { name, .. } if name == "runtime.nvtx_executors"),
            "{bad}: {err}"
        );
    }
}

/// With filters by executor, category and level, what one run pushes is the range map, and the
/// map holds exactly the admitted ranges (an executor that pushes its own region ranges pushes
/// none for a region the filter leaves out).
#[test]
fn filters_by_executor_category_and_level_leave_the_capture_equal_to_the_map() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let (fused, executors) = fused_swish_chain(&arena, &registry);
    let labels = |filter: &RangeFilter| {
        let plan = Plan::compile_filtered(&fused, &executors, filter).unwrap();
        let (_, events) = captured_run(&plan, &inputs());
        assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{plan:#}");
        check_nesting(&events).unwrap();
        (labels_in(&events, "boundscope"), plan.notes().to_vec())
    };
    let (all, notes) = labels(&RangeFilter::new());
    assert_eq!(all, ["step", "TestFusion0: (exp, tanh, neg)", "matmul"]);
    assert!(notes.is_empty(), "{notes:?}");
    // By executor: the fuser's own region range goes too; the run's stays.
    assert_eq!(labels(&RangeFilter::new().executors(["cpu_reference"])).0, ["step", "matmul"]);
    assert_eq!(labels(&RangeFilter::new().executors(["test_fuser"])).0, ["step", "TestFusion0: (exp, tanh, neg)"]);
    // By category: a region is elementwise when its ops are.
    assert_eq!(
        labels(&RangeFilter::new().categories(&[Category::Elementwise])).0,
        ["step", "TestFusion0: (exp, tanh, neg)"]
    );
    assert_eq!(labels(&RangeFilter::new().categories(&[Category::Matmul])).0, ["step", "matmul"]);
    // By level.
    assert_eq!(labels(&RangeFilter::new().levels(&[Level::Op])).0, ["matmul"]);
    assert_eq!(labels(&RangeFilter::new().levels(&[])).0, Vec::<String>::new());
    // What matches nothing is in the notes.
    let (none, notes) = labels(&RangeFilter::new().levels(&[Level::Subsymbol]).executors(["cuda_ops"]));
    assert!(none.is_empty());
    assert!(notes.iter().any(|n| n.contains("level `subsymbol` matches no range")), "{notes:?}");
    assert!(notes.iter().any(|n| n.contains("executor `cuda_ops` matches no range")), "{notes:?}");
    // A filter by executor alone chose no levels: no note about levels this plan lacks.
    let (_, notes) = labels(&RangeFilter::new().executors(["cpu_reference"]));
    assert!(notes.is_empty(), "{notes:?}");
}

/// A region range that its executor pushes itself is not pushed directly inside a named scope's
/// range of the same label and domain (one range is what the user meant), and the capture
/// still equals the map.
#[test]
fn a_region_range_its_executor_pushes_is_not_doubled_inside_a_scope_of_its_label() {
    if !capture_installed() {
        return;
    }
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8, 8]).unwrap();
    let y = b
        .scope("L", |b| {
            let e = b.exp(x)?;
            b.tanh(e)
        })
        .unwrap();
    let z = b.matmul(y, x).unwrap();
    b.output(z).unwrap();
    let mut trace = b.finish().unwrap();
    trace.attach_guard(Selection::Scope("L"), NvtxRange::new()).unwrap();
    trace.attach_guard(Selection::All, NvtxRange::new().label("L").unwrap()).unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new().emit_region_ranges(true));
    let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
    let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
    let (got, events) = captured_run(&plan, &inputs());
    got.unwrap();
    assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{plan:#}");
    check_nesting(&events).unwrap();
    let labels: Vec<(Level, String)> = plan.range_map().ranges().iter().map(|r| (r.level, r.label.clone())).collect();
    assert_eq!(labels, [(Level::Scope, "L".to_string()), (Level::Op, "L".to_string())], "{plan:#}");
}

/// An op range its executor pushes itself, which the plan's filter leaves directly inside a
/// named scope's range of the same label and domain (by leaving out, by executor, the range of
/// the composite between them): the scope's range is dropped, with a note, and the capture
/// equals the map. A random case of `one_run_pushes_exactly_the_range_map` found it: `exp`
/// directly inside `exp`. With an `exp` of the runtime's in the scope too, that one keeps its
/// range (it is no twin once the scope's is gone).
#[test]
fn an_op_range_its_executor_pushes_is_not_doubled_where_the_filter_leaves_out_the_range_between() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let op_ranges: Arc<dyn Executor> = Arc::new(TestOpRanges { emits: [EmittedRange::nvtx_ops_in("boundscope")] });
    let by_executor = RangeFilter::new().levels(&[Level::Scope, Level::Op]).executors(["test_op_ranges"]);
    // `exp`'s scope around `softmax` (with an `exp` of its own first, if `exp_first`),
    // profiled before decomposition (`softmax`'s range then spans its prims: max, sub, exp,
    // sum, div), and each op after; the ranges `filter` lets the plan push, and its notes.
    let labels = |exp_first: bool, filter: &RangeFilter| {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[8, 8]).unwrap();
        let y = b
            .scope("exp", |b| {
                let x = if exp_first { b.exp(x)? } else { x };
                b.softmax(x)
            })
            .unwrap();
        b.output(y).unwrap();
        let mut trace = b.finish().unwrap();
        trace.attach_guard(Selection::Scope("exp"), NvtxRange::new()).unwrap();
        let profiled = ProfileOps::new().run(&trace, &arena).unwrap();
        let mut decomposed = Pipeline::standard().run(&profiled, &arena).unwrap();
        decomposed.attach_guard(Selection::All, NvtxRange::new()).unwrap();
        let plan = Plan::compile_filtered(&decomposed, &[op_ranges.clone(), CpuReference::shared()], filter).unwrap();
        if nvtx_capture::is_installed() {
            let (got, events) = captured_run(&plan, &inputs());
            got.unwrap();
            assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{plan:#}");
            check_nesting(&events).unwrap();
        }
        let ranges: Vec<(Level, String, PushedBy)> =
            plan.range_map().ranges().iter().map(|r| (r.level, r.label.clone(), r.pushed_by.clone())).collect();
        (ranges, plan.notes().to_vec())
    };
    let executor = || PushedBy::Executor("test_op_ranges".into());
    // Unfiltered, `softmax`'s range sits between the scope's and the executor's `exp`.
    let (all, notes) = labels(false, &RangeFilter::new());
    let at = |label: &str| all.iter().position(|(_, l, _)| l == label).unwrap_or_else(|| panic!("{label}: {all:?}"));
    assert!(at("exp") < at("softmax"), "{all:?}");
    assert!(all[at("softmax")..].contains(&(Level::Op, "exp".into(), executor())), "{all:?}");
    assert!(notes.is_empty(), "{notes:?}");
    // Ranges around what `test_op_ranges` runs: `softmax`'s spans other executors' steps too,
    // so it goes, and the scope's with it.
    let (some, notes) = labels(false, &by_executor);
    assert_eq!(some, [(Level::Op, "exp".to_string(), executor())]);
    let dropped = "scope `exp` (steps 0..5): its range in NVTX domain `boundscope` is dropped, as the range \
                   executor `test_op_ranges` pushes itself at step 2 would sit directly inside it with the same label";
    assert_eq!(notes, [dropped]);
    // The scope's first `exp` is one the runtime ranges (the executor's own was left out, a
    // twin of the scope's when its kernel was made): with the scope's range gone, it keeps its.
    let (some, notes) = labels(true, &by_executor);
    assert_eq!(some, [(Level::Op, "exp".to_string(), PushedBy::Runtime), (Level::Op, "exp".to_string(), executor())]);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].starts_with("scope `exp` (steps 0..6)"), "{notes:?}");
}

/// A small transformer step (embedding, layer_norm, split into q, k, v, causal attention, the
/// loss) in named scopes, profiled before decomposition (each composite's range surrounds its
/// prims) and fused or not: what the NVTX API sees equals the range map, ranges nest, and the
/// results equal the CPU reference's.
#[test]
fn a_transformer_step_in_scopes_pushes_its_range_map() {
    if !capture_installed() {
        return;
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let wte = b.input(&[16, 12]).unwrap();
    let ids = b.input_with(&boundscope::TensorMeta::new(boundscope::DType::I64, &[2, 5])).unwrap();
    let x = b.scope("wte", |b| b.embedding(wte, ids)).unwrap();
    let y = b
        .scope("h", |b| {
            b.scope("0", |b| {
                let h = b.scope("ln_1", |b| b.layer_norm(x, 1e-5, None, None))?;
                b.scope("attn", |b| {
                    let qkv = b.split(h, 2, &[4, 4, 4])?;
                    b.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true, None)
                })
            })
        })
        .unwrap();
    let loss = b
        .scope("loss", |b| {
            let logits = b.reshape(y, &[10, 4])?;
            let targets = b.argmax(logits, 1, false)?;
            b.cross_entropy(logits, targets)
        })
        .unwrap();
    b.output(loss).unwrap();
    let trace = b.finish().unwrap();
    let profiled = ProfileOps::new().run(&trace, &arena).unwrap();
    let inputs = vec![
        Tensor::from_fn(&[16, 12], |i| (i as f32 * 0.37).sin()),
        Tensor::from_vec(&[2, 5], vec![1i64, 15, 3, 3, 0, 7, 8, 2, 11, 4]).unwrap(),
    ];
    let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let decomposed = Pipeline::standard().run(&profiled, &arena).unwrap();
    let fused = FuseRegions::new(CpuFusion::shared()).run(&decomposed, &arena).unwrap();
    for (what, t, executors) in [
        ("unfused", &profiled, vec![CpuReference::shared()]),
        ("decomposed", &decomposed, vec![CpuReference::shared()]),
        ("fused", &fused, vec![CpuFusion::shared(), CpuReference::shared()]),
    ] {
        let plan = Plan::compile(t, &executors).unwrap();
        let (got, events) = captured_run(&plan, &inputs);
        let got = got.unwrap();
        assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{what}\n{plan:#}");
        check_nesting(&events).unwrap_or_else(|m| panic!("{what}: {m}\n{plan:#}"));
        let labels = labels_in(&events, "boundscope");
        for label in ["h.0.attn", "scaled_dot_product_attention", "cross_entropy", "embedding"] {
            assert!(labels.iter().any(|l| l == label), "{what}: no `{label}` range in {labels:?}");
        }
        let expected = reference.run(&inputs.iter().collect::<Vec<_>>()).unwrap();
        common::close_all(&got, &expected, 1e-5).unwrap_or_else(|m| panic!("{what}: {m}"));
    }
}

/// The collective executor pushes its own op range around each collective, in its domain, as
/// the range map says; the runtime pushes the rest, in every domain. (On one rank, so the run
/// is this thread's alone.)
#[test]
fn collectives_get_their_executors_range_under_a_real_capture() {
    use boundscope::distributed::{CollectiveExecutor, Collectives, InProcessGroup, ReduceOp};
    if !capture_installed() {
        return;
    }
    let mut registry = Registry::with_builtins();
    let collectives = Collectives::register(&mut registry).unwrap();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let y = b.exp(x).unwrap();
    let y = collectives.all_reduce(&mut b, y, ReduceOp::Mean).unwrap();
    b.output(y).unwrap();
    let mut profiled = ProfileOps::new().run(&b.finish().unwrap(), &arena).unwrap();
    profiled.attach_guard(Selection::All, NvtxRange::new().domain("collectives").unwrap()).unwrap();
    let comm = InProcessGroup::new("solo", 1).unwrap().remove(0);
    let executor = CollectiveExecutor::new(comm, &collectives).shared();
    let plan = Plan::compile(&profiled, &[executor, CpuReference::shared()]).unwrap();
    let (out, events) = captured_run(&plan, &[Tensor::new(&[4], vec![0.0; 4]).unwrap()]);
    assert_eq!(out.unwrap()[0].to_f32_vec(), vec![1.0; 4]);
    assert_eq!(labels_in(&events, "collectives"), ["exp", "all_reduce_mean"]);
    assert_eq!(labels_in(&events, "boundscope"), ["exp", "all_reduce_mean"]);
    let pushed: Vec<PushedBy> = plan
        .range_map()
        .ranges()
        .iter()
        .filter(|r| r.domain == "collectives" && r.label == "all_reduce_mean")
        .map(|r| r.pushed_by.clone())
        .collect();
    assert_eq!(pushed, [PushedBy::Executor("collectives".into())]);
    check_nesting(&events).unwrap();
}
