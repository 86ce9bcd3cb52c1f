//! The overhead ladder of guards, on one plan of 1,000 trivial ops (1-element tensors):
//!
//! (a) no guards; (b) an NVTX range on every op, profiling off; (b2) the same plus one guard
//! that is not a profiling guard (a no-op `ClosureGuard` around the whole run), profiling off;
//! (c) an NVTX range on every op, profiling on, no tool attached; (d) the inserted-node
//! approach: push and pop bound symbols around every op, run by the same runtime; (e) the
//! floor: a bare `nvtx::sys` push/pop pair, 1,000 times; (e2) the calls a range makes, 1,000
//! times: `nvtxDomainRangePushEx` with a registered label, a category and a colour, and
//! `nvtxDomainRangePop` (no goal: it splits (c) - (a) into NVTX's own cost and the runtime's).
//!
//! With profiling off and only profiling guards, (b) runs the very loop of (a) (the plan's
//! profiling-off schedule is empty), so (b) - (a) only shows that the switch itself is free.
//! (b2) is where profiling off costs something: a guard that always runs keeps the guarded
//! loop, which looks up every step's entries and exits and skips the switched-off ranges; its
//! own enter and exit happen once per run, so (b2) - (a) is the cost of that loop per op.
//!
//! Figures it exists to show: (b) within 1 ns per op of (a); (c) - (a) at most 1.5x (e); (c)
//! cheaper than (d); and (b2) - (a), the price of profiling off next to a guard that always
//! runs (measured and printed; no goal is set for it yet). Criterion measures each; the ratios
//! are then measured side by side, interleaved in rounds, and printed.
//!
//! `cargo bench --bench guards`

use std::hint::black_box;
use std::time::Instant;

use boundscope::executors::CpuReference;
use boundscope::guards::ClosureGuard;
use boundscope::passes::{InsertRangeNodes, Pass, ProfileOps};
use boundscope::{Arena, Plan, Registry, Tensor, Trace, Workspace};
use criterion::{Criterion, Throughput};

mod chains;

const OPS: usize = 1_000;

/// The guards ladder's chain: `OPS` trivial ops (`chains::trivial_chain`).
fn chain<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    chains::trivial_chain(arena, registry, OPS)
}

struct Variant {
    name: &'static str,
    plan: Option<Plan>,
    workspace: Option<Workspace>,
    /// For a rung without a plan: the NVTX calls it makes.
    bare: fn(),
}

impl Variant {
    fn new(name: &'static str, plan: Plan) -> Self {
        let workspace = plan.workspace().expect("allocates");
        Self { name, plan: Some(plan), workspace: Some(workspace), bare: || {} }
    }

    fn bare(name: &'static str, calls: fn()) -> Self {
        Self { name, plan: None, workspace: None, bare: calls }
    }

    #[inline]
    fn run(&mut self, input: &Tensor) {
        match (&self.plan, &mut self.workspace) {
            (Some(plan), Some(ws)) => {
                black_box(plan.run_with(ws, &[input.view()]).expect("runs").get(0).map(|t| t.data.f32_at(0)));
            }
            _ => (self.bare)(),
        }
    }
}

/// What (e2) pushes: a domain's registered label, a category and a colour, as a prepared range.
struct DomainRange {
    domain: nvtx::sys::DomainHandle,
    attributes: nvtx::sys::EventAttributes,
}

// SAFETY: the handles are process-wide NVTX handles; the attributes point to a registered
// string, not to memory of this thread.
unsafe impl Send for DomainRange {}
unsafe impl Sync for DomainRange {}

fn domain_range() -> &'static DomainRange {
    static RANGE: std::sync::OnceLock<DomainRange> = std::sync::OnceLock::new();
    RANGE.get_or_init(|| {
        let domain = nvtx::sys::domain_create_ascii(c"boundscope-bench");
        let label = nvtx::sys::domain_register_string_ascii(domain, c"op");
        let attributes = nvtx::sys::EventAttributes {
            version: nvtx::sys::NVTX_VERSION as u16,
            size: nvtx::sys::NVTX_EVENT_ATTRIBUTES_SIZE as u16,
            category: 1,
            colorType: i32::from(nvtx::sys::ColorType::NVTX_COLOR_ARGB),
            color: 0xFF76B900,
            payloadType: i32::from(nvtx::sys::PayloadType::NVTX_PAYLOAD_UNKNOWN),
            reserved0: 0,
            payload: nvtx::sys::PayloadValue { ullValue: 0 },
            messageType: i32::from(nvtx::sys::MessageType::NVTX_MESSAGE_TYPE_REGISTERED),
            message: nvtx::sys::MessageValue { registered: label.into() },
        };
        DomainRange { domain, attributes }
    })
}

fn domain_range_pairs() {
    let range = domain_range();
    for _ in 0..OPS {
        nvtx::sys::domain_range_push_ex(range.domain, &range.attributes);
        nvtx::sys::domain_range_pop(range.domain);
    }
}

fn bare_nvtx_pairs() {
    for _ in 0..OPS {
        nvtx::sys::range_push_ascii(c"op");
        nvtx::sys::range_pop();
    }
}

fn variants() -> Vec<Variant> {
    let mut registry = Registry::with_builtins();
    InsertRangeNodes::register(&mut registry).expect("fresh registry");
    let arena = Arena::new();
    let plain = chain(&arena, &registry);
    let profiled = ProfileOps::new().run(&plain, &arena).expect("attaches");
    let inserted = InsertRangeNodes.run(&plain, &arena).expect("inserts");
    let cpu = [CpuReference::shared()];
    let off = Plan::compile(&profiled, &cpu).expect("compiles");
    off.set_profiling(false);
    let mut guarded = ProfileOps::new().run(&plain, &arena).expect("attaches");
    guarded.attach_trace_guard(ClosureGuard::new(|| {}, || {})).expect("attaches");
    let guarded_off = Plan::compile(&guarded, &cpu).expect("compiles");
    guarded_off.set_profiling(false);
    vec![
        Variant::new("a_no_guards", Plan::compile(&plain, &cpu).expect("compiles")),
        Variant::new("b_nvtx_profiling_off", off),
        Variant::new("b2_nvtx_off_one_closure_guard", guarded_off),
        Variant::new("c_nvtx_profiling_on", Plan::compile(&profiled, &cpu).expect("compiles")),
        Variant::new("d_inserted_push_pop_nodes", Plan::compile(&inserted, &cpu).expect("compiles")),
        Variant::bare("e_bare_nvtx_sys_pairs", bare_nvtx_pairs),
        Variant::bare("e2_nvtx_domain_push_ex_pairs", domain_range_pairs),
    ]
}

fn ladder(c: &mut Criterion, variants: &mut [Variant], input: &Tensor) {
    let mut group = c.benchmark_group("guards");
    group.throughput(Throughput::Elements(OPS as u64));
    for v in variants.iter_mut() {
        group.bench_function(v.name, |b| b.iter(|| v.run(input)));
    }
    group.finish();
}

/// Nanoseconds per op of each variant, measured side by side: rounds of 200 runs each,
/// interleaved, the median round kept.
fn side_by_side(variants: &mut [Variant], input: &Tensor) -> Vec<f64> {
    let rounds = 31;
    let mut samples = vec![Vec::with_capacity(rounds); variants.len()];
    for _ in 0..rounds {
        for (v, s) in variants.iter_mut().zip(&mut samples) {
            let start = Instant::now();
            for _ in 0..200 {
                v.run(input);
            }
            s.push(start.elapsed().as_nanos() as f64 / (200 * OPS) as f64);
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect()
}

fn main() {
    let mut variants = variants();
    let input = Tensor::new(&[1], vec![0.5]).expect("valid");
    let mut criterion = Criterion::default().configure_from_args();
    ladder(&mut criterion, &mut variants, &input);
    criterion.final_summary();

    let ns = side_by_side(&mut variants, &input);
    println!("\nguards overhead ladder, ns per op (median of 31 interleaved rounds of 200 runs x {OPS} ops):");
    for (v, t) in variants.iter().zip(&ns) {
        println!("  {:<30} {t:8.2}", v.name);
    }
    let (a, b, b2, c, d, e) = (ns[0], ns[1], ns[2], ns[3], ns[4], ns[5]);
    println!("  (b) - (a) = {:+.2} ns per op            goal: within 1 ns   {}", b - a, verdict((b - a).abs() <= 1.0));
    println!("  (b2) - (a) = {:+.2} ns per op           the guarded loop with profiling off (no goal yet)", b2 - a);
    println!(
        "  ((c) - (a)) / (e) = {:.2}                 goal: <= 1.5      {}",
        (c - a) / e,
        verdict((c - a) / e <= 1.5)
    );
    println!("  (c) / (d) = {:.2}                         goal: < 1         {}", c / d, verdict(c < d));
    let e2 = ns[6];
    println!(
        "  (c) - (a) = {:.2} ns per op: (e2) {e2:.2} in NVTX's domain calls, {:.2} in the runtime around them",
        c - a,
        c - a - e2
    );
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}
