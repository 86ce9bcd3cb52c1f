//! Instruction counts of the guard paths, under Valgrind's Callgrind (gungraun): an overhead
//! budget that the noise of a shared machine cannot blur.
//!
//! The plan is the guards ladder's (`benches/guards.rs`): 1,000 trivial ops on 1-element
//! tensors. Each case measures one `Plan::run_with` in a workspace that a setup function has
//! warmed up outside the measured function (plan compiled, workspace allocated, NVTX
//! initialized, three runs done), so each count is the instructions (Ir) of one run; divide by
//! 1,000 for the count per op.
//!
//! (a) no guards; (b) an NVTX range on every op, profiling off; (c) the same, profiling on, no
//! NVTX tool attached; (d) as (c) under a null tool that takes payload schemas and reads each
//! range's payload descriptor (`null_nvtx_tool.rs`), every range carrying its details; (e) as
//! (d), the ranges without details (`NvtxRange::details(false)`): only the op count; (f) as
//! (d), the tool copying each payload block, as a profiler does; (g) as (b), the ops in 100
//! named scopes of 10 (inside one more), every scope and op with its range, profiling off:
//! scopes cost nothing per op then, so (g) = (b); (h) the same, profiling on: (c) plus one push
//! and pop per scope instance (101).
//!
//! Figures it exists to show: the count per run of each case, against the budgets in
//! `benches/instruction_budgets.tsv`, checked by `scripts/check-instruction-budgets` (which
//! also prints the counts per op and the ratios (b)/(a), (c)/(a) and (d)/(e), the cost of a
//! structured payload).
//!
//! `cargo bench --bench instruction_counts` (needs `valgrind` and `gungraun-runner` 0.20.0)

use std::hint::black_box;

use boundscope::executors::CpuReference;
use boundscope::guards::NvtxRange;
use boundscope::passes::{Pass, ProfileOps};
use boundscope::{Arena, Plan, Registry, Tensor, Trace, Workspace};
use gungraun::{library_benchmark, library_benchmark_group, main, LibraryBenchmarkConfig};

mod chains;
mod null_nvtx_tool;

const OPS: usize = 1_000;

/// The guards ladder's chain: `OPS` trivial ops (`chains::trivial_chain`).
fn chain<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    chains::trivial_chain(arena, registry, OPS)
}

/// Which guards the plan carries, and whether profiling is on.
#[derive(Clone, Copy, Debug)]
enum Case {
    NoGuards,
    NvtxProfilingOff,
    NvtxProfilingOn,
    NvtxDetailsNullTool,
    NvtxNoDetailsNullTool,
    NvtxDetailsCopyingTool,
    ScopesProfilingOff,
    ScopesProfilingOn,
}

/// Ops per named scope in cases (g) and (h).
const OPS_PER_SCOPE: usize = 10;

/// A compiled plan, its workspace and its input, warmed up: what one measured run needs.
struct WarmPlan {
    plan: Plan,
    workspace: Workspace,
    input: Tensor,
}

/// Compiles the case's plan and runs it three times, outside the measured function.
fn warmed_up(case: Case) -> WarmPlan {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let plain = chain(&arena, &registry);
    let trace = match case {
        Case::NoGuards => plain,
        Case::NvtxProfilingOff | Case::NvtxProfilingOn => ProfileOps::new().run(&plain, &arena).expect("attaches"),
        Case::NvtxDetailsNullTool | Case::NvtxDetailsCopyingTool => {
            ProfileOps::new().run(&plain, &arena).expect("attaches")
        }
        Case::NvtxNoDetailsNullTool => {
            ProfileOps::new().with_range(NvtxRange::new().details(false)).run(&plain, &arena).expect("attaches")
        }
        Case::ScopesProfilingOff | Case::ScopesProfilingOn => {
            let scoped = chains::scoped_trivial_chain(&arena, &registry, OPS, OPS_PER_SCOPE);
            ProfileOps::new().run(&scoped, &arena).expect("attaches")
        }
    };
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).expect("compiles");
    plan.set_profiling(!matches!(case, Case::NvtxProfilingOff | Case::ScopesProfilingOff));
    let pushed = plan.range_map().len();
    let expected = match case {
        Case::NoGuards | Case::NvtxProfilingOff | Case::ScopesProfilingOff => 0,
        Case::ScopesProfilingOn => OPS + OPS / OPS_PER_SCOPE + 1,
        Case::NvtxProfilingOn
        | Case::NvtxDetailsNullTool
        | Case::NvtxNoDetailsNullTool
        | Case::NvtxDetailsCopyingTool => OPS,
    };
    assert_eq!(pushed, expected, "{case:?}: ranges pushed per run");
    let details = plan.range_map().ranges().iter().filter(|r| r.details.is_some()).count();
    let expected = match case {
        Case::NvtxDetailsNullTool | Case::NvtxDetailsCopyingTool => OPS,
        // Off: none pushed; on, without a tool: no schema taken, so no details.
        _ => 0,
    };
    assert_eq!(details, expected, "{case:?}: ranges with a structured payload");
    let mut workspace = plan.workspace().expect("allocates");
    let input = Tensor::new(&[1], vec![0.5]).expect("valid");
    for _ in 0..3 {
        plan.run_with(&mut workspace, &[input.view()]).expect("runs");
    }
    WarmPlan { plan, workspace, input }
}

// One run of the warmed-up plan; the plan is handed back so that dropping it is not measured.
// (A doc comment here would be refused: `#[library_benchmark]` takes no attribute but `bench`.)
#[library_benchmark]
#[bench::a_no_guards(args = (Case::NoGuards), setup = warmed_up)]
#[bench::b_nvtx_profiling_off(args = (Case::NvtxProfilingOff), setup = warmed_up)]
#[bench::c_nvtx_profiling_on(args = (Case::NvtxProfilingOn), setup = warmed_up)]
#[bench::d_nvtx_details_null_tool(
    args = (Case::NvtxDetailsNullTool),
    setup = warmed_up,
    config = LibraryBenchmarkConfig::default().env(null_nvtx_tool::ENABLE, "1")
)]
#[bench::e_nvtx_no_details_null_tool(
    args = (Case::NvtxNoDetailsNullTool),
    setup = warmed_up,
    config = LibraryBenchmarkConfig::default().env(null_nvtx_tool::ENABLE, "1")
)]
#[bench::f_nvtx_details_copying_tool(
    args = (Case::NvtxDetailsCopyingTool),
    setup = warmed_up,
    config = LibraryBenchmarkConfig::default().env(null_nvtx_tool::ENABLE, "copy")
)]
#[bench::g_scopes_profiling_off(args = (Case::ScopesProfilingOff), setup = warmed_up)]
#[bench::h_scopes_profiling_on(args = (Case::ScopesProfilingOn), setup = warmed_up)]
fn plan_run(mut warm: WarmPlan) -> WarmPlan {
    let outputs = warm.plan.run_with(&mut warm.workspace, &[warm.input.view()]).expect("runs");
    black_box(outputs.get(0).map(|t| t.data.f32_at(0)));
    warm
}

library_benchmark_group!(name = guards, benchmarks = plan_run);

main!(library_benchmark_groups = guards);
