//! The front end: strict environment parsing, detection in child processes, options wired to
//! behaviour.

use std::ffi::OsStr;

use super::*;
use crate::core::ir::{Arena, Registry, TraceBuilder};
use crate::core::tensor::Tensor;
use crate::error::Error;
use crate::options::OptionValue;
use std::sync::Arc;

/// A session from these variables, on the CPU unless they say otherwise (so that listings
/// name CPU regions on a GPU machine too).
fn session(pairs: &[(&str, &str)]) -> crate::Result<ProfiledSession> {
    let mut pairs = pairs.to_vec();
    if !pairs.iter().any(|(k, _)| *k == "BOUNDSCOPE_DEVICE") {
        pairs.push(("BOUNDSCOPE_DEVICE", "cpu"));
    }
    ProfiledSession::new(Options::new(), &Environment::from_pairs(&pairs))
}

#[test]
fn every_environment_variable_is_parsed_strictly() {
    for (variable, bad) in [
        ("BOUNDSCOPE_NVTX", "yes"),
        ("BOUNDSCOPE_NVTX", "true"),
        ("BOUNDSCOPE_NVTX", ""),
        ("BOUNDSCOPE_NVTX", " 1"),
        ("BOUNDSCOPE_FUSION", "2"),
        ("BOUNDSCOPE_FUSION", "on"),
        ("BOUNDSCOPE_FUSION_STRATEGY", "fast"),
        ("BOUNDSCOPE_PROFILING", "verbose"),
        ("BOUNDSCOPE_NVTX_LEVELS", "ops"),
        ("BOUNDSCOPE_NVTX_LEVELS", "op,op"),
        ("BOUNDSCOPE_NVTX_EXECUTORS", "cpu_fusion,"),
        ("BOUNDSCOPE_NVTX_EXECUTORS", "cpu_fusion,cpu_fusion"),
        ("BOUNDSCOPE_NVTX_CATEGORIES", "elementwise;matmul"),
    ] {
        let err = session(&[(variable, bad)]).err().unwrap_or_else(|| panic!("{variable}={bad:?} was accepted"));
        assert!(matches!(&err, Error::InvalidEnvironment { variable: v, .. } if v == variable), "{err}");
        assert!(err.to_string().contains(variable) && err.to_string().contains("expected"), "{err}");
    }
    for (variable, good) in [
        ("BOUNDSCOPE_NVTX", "0"),
        ("BOUNDSCOPE_NVTX", "1"),
        ("BOUNDSCOPE_FUSION", "false"),
        ("BOUNDSCOPE_FUSION_STRATEGY", "dataflow"),
        ("BOUNDSCOPE_PROFILING", "regions"),
        ("BOUNDSCOPE_NVTX_LEVELS", "trace,region"),
        ("BOUNDSCOPE_NVTX_EXECUTORS", "cpu_fusion,runtime"),
        ("BOUNDSCOPE_NVTX_EXECUTORS", "my_executor"),
        ("BOUNDSCOPE_NVTX_CATEGORIES", "matmul"),
    ] {
        session(&[(variable, good)]).unwrap_or_else(|e| panic!("{variable}={good}: {e}"));
    }
}

#[test]
fn profiling_decision_precedence() {
    let on = session(&[("NVTX_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")]).unwrap();
    assert_eq!(on.profiling().level, "ops");
    assert!(on.profiling().reason.contains("NVTX_INJECTION64_PATH"));
    let forced_off =
        session(&[("NVTX_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so"), ("BOUNDSCOPE_NVTX", "0")]).unwrap();
    assert_eq!(forced_off.profiling().level, "off");
    let mut options = Options::new();
    options.set_str("runtime.profiling", "regions").unwrap();
    let explicit = ProfiledSession::new(options, &Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "0")])).unwrap();
    assert_eq!(explicit.profiling().level, "regions");
    // Options set in code win over the environment.
    let mut options = Options::new();
    options.set("runtime.fusion", false).unwrap();
    let code = ProfiledSession::new(options, &Environment::from_pairs(&[("BOUNDSCOPE_FUSION", "1")])).unwrap();
    assert_eq!(code.options().get("runtime.fusion").unwrap(), OptionValue::Bool(false));
}

#[test]
fn option_errors_name_the_problem_and_the_fix() {
    let mut options = Options::new();
    let unknown = options.set_str("runtime.fusoin", "true").unwrap_err();
    assert_eq!(unknown.to_string(), "unknown option `runtime.fusoin`; did you mean `runtime.fusion`? (every option: `boundscope::options::list()`, or `cargo run --example options`)");
    let wrong_type = options.set_str("runtime.fusion", "maybe").unwrap_err();
    assert_eq!(wrong_type.to_string(), "option `runtime.fusion` takes bool, not `maybe`");
    let range = options.set_developer("cpu_fusion.block_size", 0).unwrap_err();
    assert_eq!(range.to_string(), "option `cpu_fusion.block_size` takes integer 1..=4194304, not `0`");
    let dev = options.set("cpu_fusion.max_region_ops", 4).unwrap_err();
    assert!(dev.to_string().contains("Options::set_developer"), "{dev}");
    let ill_typed = options.set("runtime.fusion", 1).unwrap_err();
    assert!(matches!(ill_typed, Error::InvalidOptionValue { .. }));
}

fn chain<'a>(arena: &'a Arena, registry: &'a Registry) -> crate::Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[4, 8]).unwrap();
    let m = b.input(&[8, 2]).unwrap();
    let e = b.exp(x).unwrap();
    let y = b.mul(e, x).unwrap();
    let z = b.sum(y).unwrap();
    let w = b.matmul(x, m).unwrap();
    b.output(z).unwrap();
    b.output(w).unwrap();
    b.finish().unwrap()
}

#[test]
fn options_are_wired_to_behaviour() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = chain(&arena, &registry);
    let fused = session(&[]).unwrap().prepare(&trace, &arena).unwrap();
    assert_eq!(fused.len(), 2, "{fused}"); // region (exp, mul, sum) and matmul
    let unfused = session(&[("BOUNDSCOPE_FUSION", "0")]).unwrap().prepare(&trace, &arena).unwrap();
    assert_eq!(unfused.len(), 4, "{unfused}");
    let mut options = Options::new();
    options.set_developer("cpu_fusion.max_region_ops", 2).unwrap();
    let cpu = Environment::from_pairs(&[("BOUNDSCOPE_DEVICE", "cpu")]);
    let small = ProfiledSession::new(options, &cpu).unwrap().prepare(&trace, &arena).unwrap();
    assert_eq!(small.len(), 3, "{small}"); // (exp, mul), sum, matmul
                                           // Profiling levels: ops puts a range on everything, regions only on regions and the run.
    let ops = session(&[("BOUNDSCOPE_PROFILING", "ops")]).unwrap().prepare(&trace, &arena).unwrap();
    assert_eq!(ops.to_string().matches("@nvtx").count(), 3, "{ops}");
    let regions = session(&[("BOUNDSCOPE_PROFILING", "regions")]).unwrap().prepare(&trace, &arena).unwrap();
    let listing = regions.to_string();
    assert!(listing.contains("CpuFusion0(t0)  # @nvtx") && !listing.contains("matmul(t0, t1)  # @nvtx"), "{listing}");
    let off = session(&[]).unwrap().prepare(&trace, &arena).unwrap();
    assert!(!off.to_string().contains("@nvtx"));
    // Dumping the region programs, and the plan's header naming the developer options.
    let mut options = Options::new();
    options.set_developer("cpu_fusion.dump_regions", true).unwrap();
    let dumping = ProfiledSession::new(options, &cpu).unwrap();
    let plan = dumping.compile(&trace, &arena).unwrap();
    assert!(plan.to_string().contains("# developer options: cpu_fusion.dump_regions=true"), "{plan}");
    let fusion = dumping.executors()[0].clone();
    assert_eq!(fusion.name(), "cpu_fusion");
}

/// `BOUNDSCOPE_NVTX_EXECUTORS` takes any name (a user's executor's too); a name that no
/// executor of the session's plans and no built-in one has is refused when a plan compiles.
#[test]
fn an_executor_name_no_executor_has_is_refused_when_a_plan_compiles() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let typo = session(&[("BOUNDSCOPE_NVTX_EXECUTORS", "cpu_fuson")]).unwrap();
    let err = typo.compile(&chain(&arena, &registry), &arena).unwrap_err();
    assert!(matches!(&err, Error::InvalidOptionValue { got, .. } if got == "cpu_fuson"), "{err}");
    assert!(err.to_string().contains("cpu_fusion") && err.to_string().contains("BOUNDSCOPE_NVTX_EXECUTORS"), "{err}");
    let built_in = session(&[("BOUNDSCOPE_NVTX_EXECUTORS", "cpu_fusion,cuda_ops")]).unwrap();
    built_in.compile(&chain(&arena, &registry), &arena).unwrap();
}

/// A session takes options made with only some specs (the runtime's, or none at all): the rest
/// get their defaults, and what was set is kept. Without the `cpu_fusion.*` specs it failed,
/// naming an option the user never set.
#[test]
fn options_with_only_some_specs_make_a_session() {
    let mut runtime = Options::runtime_only();
    runtime.set_str("runtime.fusion_strategy", "dataflow").unwrap();
    let mut with_fusion = Options::runtime_only();
    with_fusion.declare(crate::executors::CPU_FUSION_OPTIONS).unwrap();
    for options in [runtime, with_fusion, Options::with_specs(&[])] {
        let set = options.to_string();
        let cpu = Environment::from_pairs(&[("BOUNDSCOPE_DEVICE", "cpu")]);
        let session = ProfiledSession::new(options, &cpu).unwrap();
        assert!(session.options().to_string().contains(&set), "what was set is kept: {set}");
        assert_eq!(session.options().specs().len(), Options::new().specs().len());
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let plan = session.compile(&chain(&arena, &registry), &arena).unwrap();
        assert!(plan.unused_options().is_empty() && plan.developer_options().is_empty(), "{plan}");
    }
    // A spec of one's own under a built-in option's name clashes.
    let mine = crate::options::OptionSpec {
        default: OptionValue::Int(3),
        ..Options::new().spec("runtime.cpu_threads").unwrap().clone()
    };
    let err = ProfiledSession::new(Options::with_specs(&[mine]), &Environment::from_pairs(&[])).err().unwrap();
    assert!(matches!(err, crate::Error::ConflictingOption { .. }), "{err}");
}

/// Run by `detection_in_child_processes` in a child process with a chosen environment; it
/// prints what it detects, and what a CPU session makes of the environment.
#[test]
#[ignore = "a child process of detection_in_child_processes, which runs it with a chosen environment"]
fn child_reports_detection() {
    let tool = detect_nvtx_tool(&Environment::process());
    let decision = ProfilingDecision::decide(&Options::new(), &Environment::process());
    let mut cpu = Options::new();
    cpu.set_str("runtime.device", "cpu").unwrap();
    let session = ProfiledSession::new(cpu, &Environment::process()).map(|s| s.profiling().level);
    println!("DETECTED[{tool}] DECISION[{decision:?}] SESSION[{session:?}]");
}

/// What `child_reports_detection` prints in a child process whose `BOUNDSCOPE_*` and
/// `NVTX_INJECTION64_PATH` variables are exactly `env` (values need not be Unicode).
fn child(env: &[(&str, &OsStr)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut command = std::process::Command::new(exe);
    command.args(["--exact", "frontend::tests::child_reports_detection", "--ignored", "--nocapture"]);
    command.env_remove("NVTX_INJECTION64_PATH");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("BOUNDSCOPE_") {
            command.env_remove(name);
        }
    }
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn detection_in_child_processes() {
    let run = |env: &[(&str, &str)]| child(&env.iter().map(|(k, v)| (*k, OsStr::new(v))).collect::<Vec<_>>());
    let plain = run(&[]);
    assert!(plain.contains("DETECTED[no NVTX tool attached]") && plain.contains("level: \"off\""), "{plain}");
    let profiled = run(&[("NVTX_INJECTION64_PATH", "/nonexistent/libToolsInjection64.so")]);
    assert!(
        profiled.contains("DETECTED[NVTX_INJECTION64_PATH=/nonexistent") && profiled.contains("level: \"ops\""),
        "{profiled}"
    );
    let overridden = run(&[("NVTX_INJECTION64_PATH", "/nonexistent/lib.so"), ("BOUNDSCOPE_NVTX", "0")]);
    assert!(overridden.contains("level: \"off\""), "{overridden}");
    let bad = run(&[("BOUNDSCOPE_NVTX", "maybe")]);
    assert!(bad.contains("InvalidEnvironment"), "{bad}");
}

/// Bytes that are not UTF-8: `\xff`, then `1`.
#[cfg(unix)]
fn not_unicode() -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(b"\xff1".to_vec())
}

#[cfg(unix)]
#[test]
fn a_value_that_is_not_unicode_is_an_error_not_unset() {
    let bad = not_unicode();
    for variable in ["BOUNDSCOPE_NVTX", "BOUNDSCOPE_FUSION", "BOUNDSCOPE_PROFILING"] {
        let out = child(&[(variable, &bad)]);
        let session = out.split("SESSION[").nth(1).unwrap_or_else(|| panic!("{variable}: {out}"));
        assert!(session.starts_with("Err(InvalidEnvironment") && session.contains(variable), "{variable}: {out}");
        assert!(session.contains("UTF-8"), "{variable}: {out}");
    }
    // A profiler's injection path is a path, not text: any bytes mean a tool is attached.
    let out = child(&[("NVTX_INJECTION64_PATH", &bad)]);
    assert!(out.contains("DETECTED[NVTX_INJECTION64_PATH=") && out.contains("level: \"ops\""), "{out}");
}

#[test]
fn boundscope_nvtx_is_checked_whatever_decides_profiling() {
    let bad_nvtx = Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "yes")]);
    let mut in_code = Options::new();
    in_code.set_str("runtime.profiling", "regions").unwrap();
    let err = ProfilingDecision::decide(&in_code, &bad_nvtx).unwrap_err();
    assert!(matches!(&err, Error::InvalidEnvironment { variable, .. } if variable == "BOUNDSCOPE_NVTX"), "{err}");
    assert!(ProfiledSession::new(in_code, &bad_nvtx).is_err());
    let err = session(&[("BOUNDSCOPE_PROFILING", "ops"), ("BOUNDSCOPE_NVTX", "maybe")]).err().expect("an error");
    assert!(matches!(&err, Error::InvalidEnvironment { variable, .. } if variable == "BOUNDSCOPE_NVTX"), "{err}");
    // So is every option's variable, also when the option is set in code (which still wins).
    let mut in_code = Options::new();
    in_code.set("runtime.fusion", false).unwrap();
    let err = ProfiledSession::new(in_code.clone(), &Environment::from_pairs(&[("BOUNDSCOPE_FUSION", "maybe")]))
        .err()
        .expect("an error");
    assert!(matches!(&err, Error::InvalidEnvironment { variable, .. } if variable == "BOUNDSCOPE_FUSION"), "{err}");
    let wins = ProfiledSession::new(in_code, &Environment::from_pairs(&[("BOUNDSCOPE_FUSION", "1")])).unwrap();
    assert_eq!(wins.options().get("runtime.fusion").unwrap(), OptionValue::Bool(false));
}

#[test]
fn the_trace_directory_variable_is_known_and_a_typo_of_it_is_not() {
    session(&[("BOUNDSCOPE_TRACE_DIR", "/tmp/traces")]).unwrap();
    // One rule for an empty value: the session refuses it as `Environment::trace_dir` does.
    let empty = Environment::from_pairs(&[("BOUNDSCOPE_TRACE_DIR", "")]);
    assert!(matches!(empty.trace_dir(), Err(Error::InvalidEnvironment { .. })));
    let err = session(&[("BOUNDSCOPE_TRACE_DIR", "")]).err().expect("an empty trace directory is refused");
    assert!(matches!(&err, Error::InvalidEnvironment { variable, .. } if variable == "BOUNDSCOPE_TRACE_DIR"), "{err}");
    let err = session(&[("BOUNDSCOPE_TRACE_DRI", "/tmp/traces")]).err().expect("an error");
    assert!(err.to_string().contains("did you mean BOUNDSCOPE_TRACE_DIR?"), "{err}");
}

#[test]
fn an_unknown_boundscope_variable_is_an_error_with_a_suggestion() {
    let err = session(&[("BOUNDSCOPE_PROFILNG", "ops")]).err().expect("an error");
    assert!(
        matches!(&err, Error::UnknownEnvironmentVariable { variable, suggestion: Some(s), .. }
            if variable == "BOUNDSCOPE_PROFILNG" && s == "BOUNDSCOPE_PROFILING"),
        "{err:?}"
    );
    assert!(err.to_string().contains("did you mean BOUNDSCOPE_PROFILING?"), "{err}");
    let err = session(&[("BOUNDSCOPE_FUSION_STRATGY", "dataflow")]).err().expect("an error");
    assert!(err.to_string().contains("did you mean BOUNDSCOPE_FUSION_STRATEGY?"), "{err}");
    // Sharing the prefix does not make a name close.
    let err = session(&[("BOUNDSCOPE_FOO", "1")]).err().expect("an error");
    assert!(matches!(&err, Error::UnknownEnvironmentVariable { suggestion: None, .. }), "{err:?}");
    let err = session(&[("BOUNDSCOPE_COLOUR_SCHEME", "dark")]).err().expect("an error");
    assert!(matches!(&err, Error::UnknownEnvironmentVariable { suggestion: None, .. }), "{err:?}");
    assert!(err.to_string().contains("BOUNDSCOPE_NVTX") && err.to_string().contains("BOUNDSCOPE_FUSION"), "{err}");
    // Other variables are none of boundscope's business.
    session(&[("HOME", "elsewhere"), ("BOUNDSCOPE", "x"), ("NVTX_PROFILING", "1")]).unwrap();
    // The process environment too.
    let out = child(&[("BOUNDSCOPE_NVXT", OsStr::new("1"))]);
    assert!(out.contains("SESSION[Err(UnknownEnvironmentVariable") && out.contains("BOUNDSCOPE_NVTX"), "{out}");
}

/// `Environment`'s table of variables (its rustdoc) names exactly the variables the front end
/// reads: every user option's, the profiler override's and the trace directory's.
#[test]
fn the_environment_table_lists_every_variable_the_front_end_reads() {
    let source = include_str!("environment.rs");
    let mut listed: Vec<&str> = source
        .lines()
        .filter_map(|l| l.strip_prefix("/// | `BOUNDSCOPE_"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    let options = Options::new();
    let user = options.specs().iter().filter(|s| s.audience == crate::options::Audience::User);
    let mut read: Vec<&str> = user
        .filter_map(|s| s.env)
        .chain([NVTX_OVERRIDE, TRACE_DIR])
        .filter_map(|var| var.strip_prefix("BOUNDSCOPE_"))
        .collect();
    listed.sort_unstable();
    read.sort_unstable();
    assert_eq!(listed, read, "`Environment`'s table against the variables the front end reads");
}

#[test]
fn a_required_gpu_is_a_typed_error_where_there_is_none() {
    if crate::executors::cuda::availability() == crate::Availability::Available {
        println!("SKIPPED: this machine has a GPU; the error path needs one without");
        return;
    }
    let err = session(&[("BOUNDSCOPE_DEVICE", "cuda")]).err().expect("no GPU here");
    assert!(matches!(err, Error::ExecutorUnavailable { .. }), "{err}");
    assert!(err.to_string().contains("fall back to the CPU executors"), "{err}");
    // auto falls back to the CPU executors,
    let auto = ProfiledSession::new(Options::new(), &Environment::from_pairs(&[])).unwrap();
    assert_eq!(auto.executors().iter().map(|e| e.name()).collect::<Vec<_>>(), ["cpu_fusion", "cpu_reference"]);
    // and says why on stderr: not the error meant for `cuda`, which nothing required here.
    #[cfg(feature = "cuda")]
    {
        let crate::Availability::Unavailable(reason) = crate::executors::cuda::availability() else {
            unreachable!("checked above")
        };
        let note = super::session::auto_fallback_note(crate::executors::cuda::CudaDevice::new().err().expect("no GPU"));
        assert!(note.contains("running on the CPU") && note.contains(&reason), "{note}");
        assert!(!note.contains("required") && !note.contains("requirement"), "{note}");
    }
}

#[test]
fn a_session_compiles_a_trace_once_and_grows_no_arena_on_later_runs() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4, 8]).unwrap();
    let w = b.input(&[8, 8]).unwrap();
    let h = b.linear(x, w, None).unwrap();
    let y = b.gelu(h).unwrap();
    b.output(y).unwrap();
    let mut trace = b.finish().unwrap();
    let session = ProfiledSession::new(Options::new(), &Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "1")])).unwrap();
    let inputs = [Tensor::from_fn(&[4, 8], |i| i as f32 / 32.0), Tensor::zeros(&[8, 8])];
    let first = session.run(&trace, &arena, &[&inputs[0], &inputs[1]]).unwrap();
    let grown = arena.allocated_bytes();
    let plan = session.plan(&trace, &arena).unwrap();
    for _ in 0..2000 {
        assert_eq!(session.run(&trace, &arena, &[&inputs[0], &inputs[1]]).unwrap(), first);
    }
    assert_eq!(arena.allocated_bytes(), grown, "later runs must not run the passes again");
    assert!(Arc::ptr_eq(&plan, &session.plan(&trace, &arena).unwrap()));
    assert_eq!(session.plans.len(), 1);
    // A trace that changes gets its own plan: a new guard is part of what a plan runs.
    let recorder = crate::guards::Recorder::new();
    trace.attach_guard(crate::guards::Selection::All, recorder.clone()).unwrap();
    let guarded = session.plan(&trace, &arena).unwrap();
    assert!(!Arc::ptr_eq(&plan, &guarded));
    session.run(&trace, &arena, &[&inputs[0], &inputs[1]]).unwrap();
    assert!(!recorder.is_empty());
    // The cache keeps the most recently used plans only.
    for k in 0..2 * crate::frontend::CACHED_PLANS {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[k + 1]).unwrap();
        let y = b.exp(x).unwrap();
        b.output(y).unwrap();
        session.plan(&b.finish().unwrap(), &arena).unwrap();
    }
    assert_eq!(session.plans.len(), crate::frontend::CACHED_PLANS);
}

#[test]
fn a_cached_plan_is_never_taken_for_a_trace_of_another_registry() {
    use crate::core::ir::{Category, ParamKind, Symbol};
    let scale = |factor: f32| {
        Symbol::new("scale", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first().cpu_kernel(
            move |_| {
                Ok(crate::kernel_fn(move |inputs, outputs| {
                    for (o, x) in outputs[0].values_mut::<f32>()?.iter_mut().zip(inputs[0].values::<f32>()?) {
                        *o = factor * x;
                    }
                    Ok(())
                }))
            },
        )
    };
    let session = ProfiledSession::new(Options::new(), &Environment::from_pairs(&[])).unwrap();
    let arena = Arena::new();
    let input = Tensor::from_fn(&[2], |_| 1.0);
    let mut results = Vec::new();
    for factor in [2.0, 3.0] {
        let mut registry = Registry::with_builtins();
        registry.register(scale(factor)).unwrap();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2]).unwrap();
        let y = b.call("scale", &[x.into()]).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        results.push(session.run(&trace, &arena, &[&input]).unwrap()[0].to_f32_vec().to_vec());
    }
    assert_eq!(results, [vec![2.0, 2.0], vec![3.0, 3.0]]);
}

#[test]
fn nvtx_levels_from_the_environment_remove_ranges_from_the_plan() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8, 8]).unwrap();
    let e = b.exp(x).unwrap();
    let t = b.tanh(e).unwrap();
    let y = b.matmul(t, x).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let levels = |value: &str| {
        let mut pairs = vec![("BOUNDSCOPE_NVTX", "1")];
        if !value.is_empty() {
            pairs.push(("BOUNDSCOPE_NVTX_LEVELS", value));
        }
        let plan = session(&pairs).unwrap().compile(&trace, &arena).unwrap();
        let mut levels: Vec<&str> = plan.range_map().ranges().iter().map(|r| r.level.name()).collect();
        levels.dedup();
        (levels, plan.notes().to_vec())
    };
    assert_eq!(levels("").0, ["trace", "region", "op"]);
    assert_eq!(levels("trace").0, ["trace"]);
    assert_eq!(levels("region,op").0, ["region", "op"]);
    let (none, notes) = levels("subsymbol");
    assert!(none.is_empty());
    assert!(notes.iter().any(|n| n.contains("level `subsymbol` matches no range")), "{notes:?}");
}

/// `exp` of an input of `[n]`: a trace per `n`.
fn exp_trace<'a>(arena: &'a Arena, registry: &'a Registry, n: usize) -> crate::Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[n]).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    b.finish().unwrap()
}

#[test]
fn the_plan_cache_evicts_the_least_recently_used_plan() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let session = session(&[]).unwrap();
    let traces: Vec<_> = (1..=crate::frontend::CACHED_PLANS + 1).map(|n| exp_trace(&arena, &registry, n)).collect();
    let first = session.plan(&traces[0], &arena).unwrap();
    for trace in &traces[1..crate::frontend::CACHED_PLANS] {
        session.plan(trace, &arena).unwrap();
    }
    // The first is used again, then one more plan comes: the second (used longest ago) goes.
    assert!(Arc::ptr_eq(&first, &session.plan(&traces[0], &arena).unwrap()));
    session.plan(&traces[crate::frontend::CACHED_PLANS], &arena).unwrap();
    assert_eq!(session.plans.len(), crate::frontend::CACHED_PLANS);
    assert!(session.plans.contains(&traces[0]), "the plan used last must stay");
    assert!(!session.plans.contains(&traces[1]), "the plan used longest ago must go");
    for trace in &traces[2..] {
        assert!(session.plans.contains(trace));
    }
    let grown = arena.allocated_bytes();
    assert!(Arc::ptr_eq(&first, &session.plan(&traces[0], &arena).unwrap()));
    assert_eq!(arena.allocated_bytes(), grown);
}

#[test]
fn concurrent_first_calls_compile_a_trace_once() {
    let registry = Registry::with_builtins();
    let session = session(&[]).unwrap();
    let threads = 16;
    let barrier = std::sync::Barrier::new(threads);
    // Every thread builds the same trace in an arena of its own, then asks for its plan at once.
    let plans: Vec<(Arc<crate::Plan>, usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let arena = Arena::new();
                    let mut b = TraceBuilder::new(&arena, &registry);
                    let x = b.input(&[64, 64]).unwrap();
                    let y = b.softmax(x).unwrap();
                    let z = b.layer_norm(y, 1e-5, None, None).unwrap();
                    b.output(z).unwrap();
                    let trace = b.finish().unwrap();
                    let before = arena.allocated_bytes();
                    barrier.wait();
                    let plan = session.plan(&trace, &arena).unwrap();
                    (plan, before, arena.allocated_bytes())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(session.plans.len(), 1, "one entry for one trace");
    assert!(plans.iter().all(|(p, _, _)| Arc::ptr_eq(p, &plans[0].0)), "every caller shares one plan");
    let grew = plans.iter().filter(|(_, before, after)| after > before).count();
    assert_eq!(grew, 1, "exactly one caller ran the passes (in its arena)");
}

/// A two-layer trace in scopes `layer.{i}.norm` and `layer.{i}.mlp`, on `[rows, width]`.
fn scoped_layers_of<'a>(arena: &'a Arena, registry: &'a Registry, rows: usize, width: usize) -> crate::Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let mut x = b.input(&[rows, width]).unwrap();
    let w = b.input(&[width, width]).unwrap();
    b.scope("layer", |b| {
        for i in 0..2 {
            x = b.scope(&i.to_string(), |b| {
                let n = b.scope("norm", |b| b.layer_norm(x, 1e-5, None, None))?;
                b.scope("mlp", |b| {
                    let h = b.linear(n, w, None)?;
                    let g = b.gelu(h)?;
                    b.add(g, x)
                })
            })?;
        }
        Ok(())
    })
    .unwrap();
    b.output(x).unwrap();
    b.finish().unwrap()
}

fn scoped_layers<'a>(arena: &'a Arena, registry: &'a Registry) -> crate::Trace<'a> {
    scoped_layers_of(arena, registry, 4, 8)
}

#[test]
fn every_profiling_level_gives_scope_ranges_and_scopes_mode_only_those() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = scoped_layers(&arena, &registry);
    let ranges = |pairs: &[(&str, &str)]| {
        let plan = session(pairs).unwrap().compile(&trace, &arena).unwrap();
        plan.range_map().ranges().iter().map(|r| (r.level, r.label.clone())).collect::<Vec<_>>()
    };
    use crate::guards::Level;
    let scopes_only = ranges(&[("BOUNDSCOPE_PROFILING", "scopes")]);
    let labels: Vec<&str> = scopes_only.iter().map(|(_, l)| l.as_str()).collect();
    assert!(scopes_only.iter().all(|(level, _)| matches!(level, Level::Trace | Level::Scope)), "{scopes_only:?}");
    for path in ["layer", "layer.0", "layer.0.norm", "layer.1.mlp"] {
        assert!(labels.contains(&path), "{path} in {labels:?}");
    }
    let ops = ranges(&[("BOUNDSCOPE_PROFILING", "ops")]);
    assert!(ops.iter().any(|(l, _)| *l == Level::Scope) && ops.iter().any(|(l, _)| *l == Level::Region));
    // The level filter takes `scope` like the other levels.
    let filtered = ranges(&[("BOUNDSCOPE_PROFILING", "ops"), ("BOUNDSCOPE_NVTX_LEVELS", "trace,scope")]);
    assert!(!filtered.is_empty() && filtered.iter().all(|(l, _)| matches!(l, Level::Trace | Level::Scope)));
    // Fusion is the same whether profiling is on or off, scopes or not.
    let steps = |pairs: &[(&str, &str)]| session(pairs).unwrap().compile(&trace, &arena).unwrap().to_string();
    let listing = |s: String| s.lines().filter(|l| l.contains("# step")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(listing(steps(&[("BOUNDSCOPE_PROFILING", "ops")])), listing(steps(&[("BOUNDSCOPE_PROFILING", "off")])));
}

#[test]
fn a_timeline_on_scopes_groups_the_flame_graph_by_module() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    // Large enough that every op takes a measurable time (folded stacks leave out empty ones).
    let mut trace = scoped_layers_of(&arena, &registry, 128, 256);
    let timeline = crate::guards::Timeline::new();
    trace.attach_guard(crate::guards::Selection::Scope("**"), timeline.clone()).unwrap();
    trace.attach_guard(crate::guards::Selection::All, timeline.clone()).unwrap();
    let plan = crate::Plan::compile(&trace, &[crate::executors::CpuReference::shared()]).unwrap();
    plan.run(&[&Tensor::zeros(&[128, 256]), &Tensor::zeros(&[256, 256])]).unwrap();
    let folded = crate::guards::folded_stacks(&timeline.to_chrome_trace());
    assert!(folded.lines().any(|l| l.contains(";layer;layer.1;layer.1.mlp;linear ")), "{folded}");
    assert!(folded.lines().any(|l| l.contains(";layer;layer.0;layer.0.norm;layer_norm ")), "{folded}");
    // Every op's stack goes through its module's scopes.
    for op in [";linear ", ";gelu ", ";add ", ";layer_norm "] {
        assert!(folded.lines().filter(|l| l.contains(op)).all(|l| l.contains(";layer;layer.")), "{op}: {folded}");
    }
}

#[test]
fn scope_names_and_balance_are_checked_and_dead_code_removes_empty_scopes_with_a_note() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    // (A newline would let a name print a line of its own in the listing: a forged op.)
    for bad in ["", "a.b", "nul\0", "star*", "evil\n  t9 = fake(t0)", "tab\t", "bell\u{7}"] {
        assert!(matches!(b.enter_scope(bad), Err(Error::InvalidScopeName { .. })), "{bad:?}");
        assert!(matches!(b.scope(bad, |b| b.exp(x)), Err(Error::InvalidScopeName { .. })), "{bad:?}");
    }
    assert!(matches!(b.exit_scope(), Err(Error::UnbalancedScope { .. })));
    // An `exit_scope` too many inside `scope` is an error there, not a scope dropped (the op
    // after it was outside every scope), nor an error at a later `exit_scope`.
    let err = b.scope("a", |b| b.exit_scope().and_then(|_| b.exp(x))).unwrap_err();
    assert!(matches!(&err, Error::UnbalancedScope { detail } if detail.contains("scope(\"a\"")), "{err}");
    b.enter_scope("outer").unwrap();
    let err = b.scope("inner", |b| b.exit_scope().and_then(|_| b.exit_scope()).and_then(|_| b.exp(x))).unwrap_err();
    assert!(matches!(&err, Error::UnbalancedScope { detail } if detail.contains("outside it")), "{err}");
    // `build`'s own error comes first; scopes `build` opens and leaves open are closed.
    let err = b.scope("a", |b| b.exit_scope().and_then(|_| b.reshape(x, &[3]))).unwrap_err();
    assert!(!matches!(err, Error::UnbalancedScope { .. }), "{err}");
    b.scope("c", |b| b.enter_scope("left_open").and_then(|_| b.exp(x))).unwrap();
    assert!(matches!(b.exit_scope(), Err(Error::UnbalancedScope { .. })));
    // Closed, then another opened in its place: still not this scope's ops.
    let err = b.scope("a", |b| b.exit_scope().and_then(|_| b.enter_scope("z")).and_then(|_| b.exp(x))).unwrap_err();
    assert!(matches!(&err, Error::UnbalancedScope { detail } if detail.contains("scope(\"a\"")), "{err}");
    b.exit_scope().unwrap(); // `z`, which the closure opened
    b.scope("dead", |b| b.exp(x)).unwrap();
    let y = b.scope("live", |b| b.neg(x)).unwrap();
    b.output(y).unwrap();
    b.enter_scope("open").unwrap();
    let err = b.finish().unwrap_err();
    assert!(matches!(&err, Error::UnbalancedScope { detail } if detail.contains("`open`")), "{err}");

    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    b.scope("dead", |b| b.exp(x)).unwrap();
    let y = b.scope("live", |b| b.neg(x)).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let cleaned = crate::passes::Pass::run(&crate::passes::DeadCodeElimination, &trace, &arena).unwrap();
    let paths: Vec<&str> = cleaned.scopes().iter().map(|s| s.path()).collect();
    assert_eq!(paths, ["live"]);
    assert!(
        cleaned.scope_notes().iter().any(|n| n.contains("scope `dead` disappeared")),
        "{:?}",
        cleaned.scope_notes()
    );
    // Scopes change neither the bound symbols nor the listing without them.
    let plain = {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[4]).unwrap();
        b.exp(x).unwrap();
        let y = b.neg(x).unwrap();
        b.output(y).unwrap();
        b.finish().unwrap()
    };
    let hidden = crate::ListingOptions { scopes: false, ..Default::default() };
    assert_eq!(trace.listing(hidden).to_string(), plain.listing(hidden).to_string());
    assert!(trace.to_string().contains("  # scope dead (1 op)\n  t1 = exp(t0)"), "{trace}");
}

#[test]
fn a_trace_that_differs_only_in_its_scopes_gets_its_own_cached_plan() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let session = session(&[]).unwrap();
    let mut scoped = scoped_layers(&arena, &registry);
    let plain = session.plan(&scoped, &arena).unwrap();
    scoped.attach_guard(crate::guards::Selection::Scope("**"), crate::guards::NvtxRange::new()).unwrap();
    let ranged = session.plan(&scoped, &arena).unwrap();
    assert!(!Arc::ptr_eq(&plain, &ranged), "a guard on a scope is part of what a plan runs");
    assert!(ranged.range_map().ranges().iter().any(|r| r.level == crate::guards::Level::Scope));
}

#[test]
fn scopes_survive_only_rewrites_that_carry_them_and_their_guards_are_dropped_with_a_reason() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let e = b.scope("a", |b| b.exp(x)).unwrap();
    let n = b.scope("b", |b| b.neg(x)).unwrap();
    b.output(e).unwrap();
    b.output(n).unwrap();
    let mut trace = b.finish().unwrap();
    trace.attach_guard(crate::guards::Selection::Scope("a"), crate::guards::NvtxRange::new()).unwrap();
    // A rewrite of the same length that reorders the bound symbols without carrying anything.
    let mut reordered = TraceBuilder::rewrite(&trace, &arena);
    for bsym in trace.bound_symbols().iter().rev() {
        reordered.push_copy(bsym);
    }
    let reordered = reordered.finish().unwrap();
    assert!(reordered.scopes().is_empty());
    assert!(
        reordered.scope_notes().iter().any(|n| n.contains("without carrying its scopes")),
        "{:?}",
        reordered.scope_notes()
    );
    // One that copies them one for one keeps them.
    let mut copied = TraceBuilder::rewrite(&trace, &arena);
    for bsym in trace.bound_symbols() {
        copied.push_copy(bsym);
    }
    assert_eq!(copied.finish().unwrap().scopes().len(), 2);
    // A guard on a scope that disappears is listed among the dropped guards, with why.
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    b.scope("dead", |b| b.exp(x)).unwrap();
    let y = b.neg(x).unwrap();
    b.output(y).unwrap();
    let mut trace = b.finish().unwrap();
    trace.attach_guard(crate::guards::Selection::Scope("dead"), crate::guards::NvtxRange::new()).unwrap();
    let cleaned = crate::passes::Pass::run(&crate::passes::DeadCodeElimination, &trace, &arena).unwrap();
    let dropped = cleaned.dropped_guards();
    assert!(dropped.iter().any(|d| d.label == "dead" && d.reason.contains("scope `dead` disappeared")), "{dropped:?}");
}

#[test]
fn scope_closes_what_its_closure_left_open_and_profile_ops_labels_scopes_by_path() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let y = b
        .scope("a", |b| {
            b.enter_scope("b")?; // left open: `scope` closes it with `a`
            b.exp(x)
        })
        .unwrap();
    let z = b.scope("c", |b| b.neg(y)).unwrap();
    b.output(z).unwrap();
    let trace = b.finish().unwrap();
    let paths: Vec<&str> = trace.scopes().iter().map(|s| s.path()).collect();
    assert_eq!(paths, ["a", "a.b", "c"]);
    // A labelled range for the ops: the scopes keep their paths.
    let labelled = crate::guards::NvtxRange::new().label("op").unwrap();
    let profiled =
        crate::passes::Pass::run(&crate::passes::ProfileOps::new().with_range(labelled), &trace, &arena).unwrap();
    let plan = crate::Plan::compile(&profiled, &[crate::executors::CpuReference::shared()]).unwrap();
    let labels: Vec<&str> = plan.range_map().ranges().iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["a", "a.b", "op", "c", "op"]);
}

#[test]
fn a_users_position_map_that_makes_a_scope_cross_a_guard_span_is_a_typed_error() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4, 4]).unwrap();
    let w = b.input(&[4, 4]).unwrap();
    // Scope `s` holds a `neg` and a `linear`, which decomposes into two prims under one guard.
    let y = b
        .scope("s", |b| {
            let a = b.neg(x)?;
            b.linear(a, w, None)
        })
        .unwrap();
    let z = b.neg(y).unwrap();
    b.output(z).unwrap();
    let mut trace = b.finish().unwrap();
    trace.attach_guard(crate::guards::Selection::Named("linear"), crate::guards::Recorder::new()).unwrap();
    let prims = crate::passes::Pass::run(&crate::passes::Decompose, &trace, &arena).unwrap();
    assert_eq!((prims.len(), prims.scopes()[0].positions()), (4, 0..3));
    // Swapping the last prim of `linear` with the op after the scope splits `s` into 0..2 and
    // 3..4 and stretches the guard over 1..4: the first piece would cross it.
    let mut rewritten = TraceBuilder::rewrite(&prims, &arena);
    for bsym in prims.bound_symbols() {
        rewritten.push_copy(bsym);
    }
    let err = rewritten.carry_guards(&prims, &[Some(0), Some(1), Some(3), Some(2)], "my_pass", |_| String::new());
    assert!(matches!(err, Err(Error::OverlappingGuards { .. })), "{err:?}");
}
