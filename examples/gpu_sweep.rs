//! A sweep of the GPU's memory-bound ops over the shapes users meet, not only the benchmarked
//! ones: `softmax`, `layer_norm` (with weight and bias), `sum` and `max` over the last axis, at
//! 10 row lengths from 32 to 65,536 (768, 3,072 and GPT-2's 50,257 among them) over 2^24 values,
//! and at totals from 2^22 to 2^28 values; and the broadcast chain `gelu(x * scale + bias)` with
//! `scale` and `bias` along the last axis (`[D]`), along the first (`[N, 1]`) and along a
//! middle one (`[N / G, 1, D]` over `[N / G, G, D]`, G the largest divisor of N up to 64: a
//! per-sample modulation over a sequence), at six row lengths from 256 to 50,257. In f32, bf16
//! and f16, each through `Plan` with device inputs, as a user's program runs them (on a machine
//! without a GPU it prints a SKIPPED line and exits 0).
//!
//! Each case is first checked against the CPU reference at a smaller row count, then timed, with
//! a device-to-device copy of the same bytes (half read, half written) beside it, the best of
//! three: the bandwidth ceiling. Bytes are the useful ones: every input read once, the output
//! written once. Lines starting `RESULT ` are JSON; `scripts/torch_gpu_sweep.py` reads them,
//! times PyTorch (eager and `torch.compile`) on the same cases and passes everything on to
//! `scripts/gpu_sweep_report.py`, which prints one table with the ratios and their minimum and
//! median:
//!
//! ```text
//! cargo build --release --example gpu_sweep   # here; then on the GPU machine:
//! target/release/examples/gpu_sweep | python3 scripts/torch_gpu_sweep.py | python3 scripts/gpu_sweep_report.py
//! ```
//!
//! An optional first argument keeps the dtypes (`f32,bf16`), a second the ops
//! (`softmax,max`) and a third the shapes (`333x50257,4096x65536`) it names (a shape the sweep
//! lacks, such as `16x1048576`, is added for each op kept): with
//! `ncu --kernel-name regex:boundscope --launch-skip 10 --launch-count 1`, one case's kernel under
//! Nsight Compute.
//!
//! With `--variants`, each case is also checked and timed with every variant of the generated
//! kernels flipped from the defaults (`KernelVariants::EACH`, one at a time: `boundscope+<name>`
//! turned on, `boundscope-<name>` off), then with none of them (`boundscope-all`), and with the
//! defaults again as a plan of their own (`boundscope=defaults`: how far two plans of the same
//! kernels read apart), interleaved with the defaults in three rounds, each round starting a
//! plan further on (the best of each kept; the inputs uploaded once, each plan's workspace kept
//! for all three), as RESULT lines;
//! `scripts/gpu_variants_report.py` prints each variant's speed against the defaults, case by
//! case (the default kernels' lines are the sweep's, but each the best of three rounds, the
//! copy's too, where a sweep without the flag times once):
//!
//! ```text
//! target/release/examples/gpu_sweep --variants | tee sweep.txt | python3 scripts/gpu_variants_report.py
//! ```
//!
//! `--variant=NAME` (repeatable) adds one variant flipped from the defaults rather than all of
//! them (`--variant=A,B`: one plan with both flipped; `gpu_variants_report.py` reads a label's
//! first sign only, so flip both the same way there), `--only` leaves the defaults out (to tell
//! which kernel faults), and `--reps=N` times N runs a round rather than about 30 ms of them:
//! together, one variant's case under `compute-sanitizer`, which runs kernels tens of times
//! slower. `--check-full` checks each case
//! at its full shape rather than at 2^18 values: what only large shapes take (row kernels whose
//! blocks loop over rows, tensors past half of L2 that take the streaming hints, rows split
//! over clusters) is then checked too, at the CPU reference's speed (seconds a case of 2^24
//! values).

use std::process::ExitCode;
use std::sync::Arc;

use boundscope::executors::cuda::{self, CudaDevice, KernelVariants};
use boundscope::{Arena, DType, Device, Registry, Tensor, TensorMeta, TraceBuilder};

#[path = "shared/gpu_bench.rs"]
mod gpu_bench;

use boundscope::RunInput;
use gpu_bench::{check_against_reference, gpu_plan_with, ms_per_run_in, upload_all, useful_bytes};

/// One case: an op over `[rows, cols]`.
#[derive(Clone, Copy)]
struct Case {
    op: &'static str,
    rows: usize,
    cols: usize,
}

/// Copies of each case's bytes timed, the best kept (the bandwidth ceiling each case is held to).
const COPIES: usize = 3;

/// Row lengths swept at 2^24 values.
const LENGTHS: [usize; 10] = [32, 128, 512, 768, 1024, 3072, 4096, 16384, 50257, 65536];
/// Row ops.
const ROW_OPS: [&str; 4] = ["softmax", "layer_norm", "sum", "max"];
/// Broadcast chains, `gelu(x * scale + bias)`: along the last axis, the first, a middle one.
const BROADCAST_OPS: [&str; 3] = ["bcast_last", "bcast_first", "bcast_mid"];

fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    for op in ROW_OPS {
        let at = |cols: usize, total: usize| Case { op, rows: (total / cols).max(1), cols };
        all.extend(LENGTHS.iter().map(|&cols| at(cols, 1 << 24)));
        // Totals from 2^22 (in L2) to 2^28 (1 GiB in f32), at short, middle and long rows.
        all.extend([at(32, 1 << 22), at(1024, 1 << 22), at(1024, 1 << 28), at(65536, 1 << 28)]);
    }
    // Broadcast chains at row lengths from 256 to GPT-2's 50,257 words, 2^22 to 2^26 values.
    for op in BROADCAST_OPS {
        all.extend(
            [(8192, 8192), (16384, 768), (4096, 3072), (65536, 256), (1024, 4096), (1335, 50257)]
                .map(|(rows, cols)| Case { op, rows, cols }),
        );
    }
    all
}

/// `cases`, with each shape of the comma-separated `shapes` (`ROWSxCOLS`) that an op lacks
/// added for it.
fn with_shapes(mut cases: Vec<Case>, shapes: Option<&str>) -> Result<Vec<Case>, String> {
    let ops: Vec<&'static str> = ROW_OPS.into_iter().chain(BROADCAST_OPS).collect();
    for shape in shapes.into_iter().flat_map(|s| s.split(',')) {
        let parsed = shape.split_once('x').and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)));
        let Some((rows, cols)) = parsed.filter(|&(r, c): &(usize, usize)| r > 0 && c > 0) else {
            return Err(format!("the shape `{shape}` is not ROWSxCOLS (such as 333x50257)"));
        };
        for &op in &ops {
            if !cases.iter().any(|c| c.op == op && c.rows == rows && c.cols == cols) {
                cases.push(Case { op, rows, cols });
            }
        }
    }
    Ok(cases)
}

/// The middle axis of a `bcast_mid` case: the largest divisor of its rows up to 64 (1 where
/// there is none: no broadcast).
fn group(case: &Case) -> usize {
    (1..=64.min(case.rows)).rev().find(|g| case.rows.is_multiple_of(*g)).unwrap_or(1)
}

/// The rows a case is checked at: those of at most 2^18 values, or all of them with
/// `--check-full`; for `bcast_mid`, a multiple of its group, at least two groups where it has
/// them, so that the check broadcasts along the middle axis as the timed case does.
fn checked_rows(case: &Case, check_full: bool) -> usize {
    let rows = if check_full { case.rows } else { (case.rows * case.cols).min(1 << 18).div_ceil(case.cols) };
    if case.op != "bcast_mid" {
        return rows;
    }
    let g = group(case);
    (rows.div_ceil(g).max(2) * g).min(case.rows)
}

/// The inputs' shapes of a case with `rows` rows.
fn input_shapes(case: &Case, rows: usize) -> Vec<Vec<usize>> {
    let x = vec![rows, case.cols];
    match case.op {
        "layer_norm" | "bcast_last" => vec![x, vec![case.cols], vec![case.cols]],
        "bcast_first" => vec![x, vec![rows, 1], vec![rows, 1]],
        "bcast_mid" => {
            // `rows` is a multiple of the case's group (see `checked_rows`).
            let g = group(case);
            let operand = vec![rows / g, 1, case.cols];
            vec![vec![rows / g, g, case.cols], operand.clone(), operand]
        }
        _ => vec![x],
    }
}

fn trace<'a>(
    arena: &'a Arena,
    registry: &'a Registry,
    case: &Case,
    rows: usize,
    dtype: DType,
) -> boundscope::Result<boundscope::Trace<'a>> {
    let mut b = TraceBuilder::new(arena, registry);
    let v = input_shapes(case, rows)
        .iter()
        .map(|shape| b.input_with(&TensorMeta::new(dtype, shape)))
        .collect::<boundscope::Result<Vec<_>>>()?;
    let y = match case.op {
        "softmax" => b.softmax(v[0])?,
        "layer_norm" => b.layer_norm(v[0], 1e-5, Some(v[1]), Some(v[2]))?,
        "sum" => b.sum(v[0])?,
        "max" => b.max(v[0])?,
        _ => {
            let scaled = b.mul(v[0], v[1])?;
            let shifted = b.add(scaled, v[2])?;
            b.gelu(shifted)?
        }
    };
    b.output(y)?;
    b.finish()
}

fn inputs(case: &Case, rows: usize, dtype: DType) -> Vec<Tensor> {
    input_shapes(case, rows)
        .iter()
        .enumerate()
        .map(|(k, shape)| {
            let values = gpu_bench::random_chunk(shape.iter().product(), k as u64 + 1);
            Tensor::new(shape, values).expect("the shape's count").to_dtype(dtype)
        })
        .collect()
}

fn main() -> ExitCode {
    if let boundscope::Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: gpu_sweep: {reason}");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let e = |e: boundscope::Error| e.to_string();
    let gpu = CudaDevice::new().map_err(e)?;
    let device: Arc<dyn Device> = gpu.clone();
    println!("device: {}", device.name());
    let registry = Registry::with_builtins();
    let (flags, mut args): (Vec<String>, Vec<String>) = std::env::args().skip(1).partition(|a| a.starts_with("--"));
    let mut variants: Vec<(String, KernelVariants)> = vec![("boundscope".into(), KernelVariants::default())];
    let (mut fixed_reps, mut only, mut check_full) = (None, false, false);
    // One variant flipped from the defaults: `+name` turned on, `-name` off.
    // Several names joined by `,` flip each of them, in one plan.
    let flip = |names: &str| -> Result<(String, KernelVariants), String> {
        let defaults = KernelVariants::default();
        let (mut label, mut flipped) = ("boundscope".to_string(), defaults);
        for name in names.split(',') {
            let next = flipped.flipped(name).ok_or_else(|| {
                let names: Vec<&str> = KernelVariants::EACH.iter().map(|(n, _)| *n).collect();
                format!("unknown variant `{name}` (one of {})", names.join(", "))
            })?;
            let sign = if flipped | next != flipped { '+' } else { '-' };
            label.push(sign);
            label.push_str(name);
            flipped = next;
        }
        Ok((label, flipped))
    };
    for flag in &flags {
        if flag == "--only" {
            only = true;
            continue;
        }
        if flag == "--check-full" {
            check_full = true;
            continue;
        }
        if let Some(name) = flag.strip_prefix("--variant=") {
            variants.push(flip(name)?);
            continue;
        }
        if let Some(n) = flag.strip_prefix("--reps=") {
            let n: usize = n.parse().map_err(|_| format!("--reps takes a count of runs, not `{n}`"))?;
            fixed_reps = Some(n.max(1));
            continue;
        }
        match flag.as_str() {
            "--variants" => {
                // Each variant flipped from the defaults, then the kernels without any.
                for (name, _) in KernelVariants::EACH {
                    variants.push(flip(name)?);
                }
                variants.push(("boundscope-all".into(), KernelVariants::NONE));
                // The defaults again, as a plan of their own: how far two plans of the same
                // kernels read apart, the floor under which a variant's difference is noise.
                variants.push(("boundscope=defaults".into(), KernelVariants::default()));
            }
            _ => {
                return Err(format!(
                    "unknown flag `{flag}` (--variants, --variant=NAME, --only, --reps=N or --check-full)"
                ))
            }
        }
    }
    if only {
        if variants.len() < 2 {
            return Err("--only runs the variants --variant names without the defaults: name one".into());
        }
        variants.remove(0);
    }
    // Rounds of each variant in turn (one round with the defaults alone).
    let rounds = if variants.len() > 1 { 3 } else { 1 };
    args.resize(3, String::new());
    let named = |a: &String| (!a.is_empty()).then(|| a.clone());
    let (dtypes, ops, shapes) = (named(&args[0]), named(&args[1]), named(&args[2]));
    let keep = |list: &Option<String>, name: &str| list.as_deref().is_none_or(|l| l.split(',').any(|n| n == name));
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        if !keep(&dtypes, &dtype.to_string()) {
            continue;
        }
        let cases = with_shapes(cases(), shapes.as_deref())?.into_iter().filter(|c| keep(&ops, c.op));
        for case in cases.filter(|c| keep(&shapes, &format!("{}x{}", c.rows, c.cols))) {
            let arena = Arena::new();
            // Correctness first, on at most 2^18 values (the whole shape with `--check-full`),
            // against the CPU reference.
            let rows = checked_rows(&case, check_full);
            if case.op == "bcast_mid" && [1, case.rows].contains(&group(&case)) {
                eprintln!(
                    "note: bcast_mid {}x{}: the rows are one group or have no divisor from 2 to 64, so nothing is \
                     broadcast along a middle axis",
                    case.rows, case.cols
                );
            }
            let small = trace(&arena, &registry, &case, rows, dtype).map_err(e)?;
            let name = format!("{} {}x{}", case.op, case.rows, case.cols);
            let small_inputs = inputs(&case, rows, dtype);
            let diffs = variants
                .iter()
                .map(|(label, v)| {
                    check_against_reference(
                        &gpu,
                        &small,
                        &arena,
                        &small_inputs,
                        dtype,
                        &format!("{name} ({label})"),
                        *v,
                    )
                })
                .collect::<Result<Vec<f32>, String>>()?;
            // Then the full shape, inputs on the device, the output left there.
            let full = trace(&arena, &registry, &case, case.rows, dtype).map_err(e)?;
            let plans = variants
                .iter()
                .map(|(_, v)| gpu_plan_with(&gpu, &full, &arena, *v))
                .collect::<boundscope::Result<Vec<_>>>()
                .map_err(e)?;
            let bytes = useful_bytes(&full);
            // About 30 ms of runs at 3 TB/s, 20 to 1,000 of them.
            let reps = fixed_reps.unwrap_or((9e10 / bytes as f64).clamp(20.0, 1000.0) as usize);
            // The inputs uploaded once, and a workspace per plan for all rounds: each plan keeps
            // its memory from round to round.
            let uploaded = upload_all(&device, &inputs(&case, case.rows, dtype))?;
            let run_inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
            let mut workspaces =
                plans.iter().map(|p| p.workspace()).collect::<boundscope::Result<Vec<_>>>().map_err(e)?;
            let (mut ms, mut copy_ms) = (vec![f64::INFINITY; plans.len()], f64::INFINITY);
            // The copy of the same bytes (half of them read, half written) in each round, and the
            // best of three at least: alone, it moved by up to 2x between runs at 2^22 values.
            for round in 0..rounds.max(COPIES) {
                if round < rounds {
                    // Each round starts a plan further on, so that no plan always runs first.
                    for k in 0..plans.len() {
                        let i = (k + round) % plans.len();
                        let run = ms_per_run_in(&device, &plans[i], &mut workspaces[i], &run_inputs, reps)?;
                        ms[i] = ms[i].min(run);
                    }
                }
                copy_ms = copy_ms.min(gpu_bench::copy_ms(bytes / 8, reps)?);
            }
            let gbps = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
            for (((label, _), ms), diff) in variants.iter().zip(ms).zip(diffs) {
                println!(
                    "RESULT {{\"impl\":\"{label}\",\"op\":\"{}\",\"rows\":{},\"cols\":{},\"dtype\":\"{dtype}\",\"ms\":{ms},\"gbps\":{},\"copy_gbps\":{},\"check\":{diff}}}",
                    case.op,
                    case.rows,
                    case.cols,
                    gbps(ms),
                    gbps(copy_ms),
                );
                eprintln!("{name} {dtype} {label}: {ms:.4} ms, {:.0} GB/s (copy {:.0})", gbps(ms), gbps(copy_ms));
            }
            eprintln!("{name} {dtype}: steps {:?}", plans[0].steps_per_executor());
        }
    }
    Ok(())
}
