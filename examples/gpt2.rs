//! GPT-2, end to end: Hugging Face weights (or GPT-2's initialisation), the loss and logits,
//! gradients, AdamW training steps and a benchmark, on the CPU or the GPU, profiled by module.
//!
//! ```text
//! cargo run --release --example gpt2                                   # tiny config, forward
//! cargo run --release --example gpt2 -- --train-steps 10               # and 10 AdamW steps
//! gpt2 --weights model.safetensors --ids ids.safetensors --write-logits out.safetensors
//! gpt2 --config 124m --batch 8 --tokens 1024 --device cuda --dtype bf16 --bench
//! gpt2 --ranks 2 --config 124m --batch 8 --tokens 1024 --device cuda --train-steps 5 --bench
//! scripts/nsys-check target/release/examples/gpt2 --train-steps 2      # ranges by module
//! ```
//! The model ([`shared/gpt2.rs`]) names every module as Hugging Face does (`h.3.attn.c_attn`),
//! so a profile (Nsight Systems, or `BOUNDSCOPE_NVTX=1`) shows a step as forward, then
//! `backward`, grouped by those names, then `optimizer`. Attention is written as Hugging Face
//! writes it (split, views, `scaled_dot_product_attention`) and packed by
//! `passes::PackAttention` into one `qkv_attention` before `passes::Grad`. Runs through the front
//! end (`ProfiledSession`): profiling switches on by itself under a profiler.
//!
//! Flags: `--config tiny|124m`, `--weights FILE` (safetensors, `GPT2Model`'s or
//! `GPT2LMHeadModel`'s names), `--heads N`, `--ids FILE` (an integer tensor `ids`
//! `[batch, tokens]`) or `--batch B --tokens T` random ids (`--seed S`), `--device
//! cpu|cuda|auto`, `--dtype f32|bf16`, `--write-logits FILE` (`logits`, `loss`),
//! `--write-grads FILE` (each parameter's gradient under its name), `--check-grads K`
//! (K parameters against central differences), `--train-steps N` (`--lr`, `--weight-decay`),
//! `--bench` (forward and training steps timed, tokens per second), `--profile` (on the GPU:
//! the device time of a training step by op), `--print-plans` (each plan on stderr: its steps,
//! executors and notes), `--ranks N` (data parallelism: N processes, one per GPU, each on its
//! own batch, gradients averaged by `all_reduce` in buckets during the backward; NCCL on GPUs,
//! TCP on the CPU; the ranks check that their parameters stay equal), `--dev NAME=VALUE` (a
//! developer option, `Options::set_developer`: `--dev cuda.int32_row_columns=true` times a
//! variant of the generated kernels; repeatable).
//! Prints its results on stdout; exits non-zero if a check fails (a gradient off its finite
//! difference, a training loss that does not fall).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use boundscope::checkpoint::{self, Checkpoint};
use boundscope::distributed::{
    Collective, CollectiveExecutor, Collectives, Communicator, DataParallel, RankEnv, TcpGroup,
};
use boundscope::frontend::{Environment, ProfiledSession};
use boundscope::optim::AdamW;
use boundscope::options::Options;
use boundscope::passes::{Grad, Pass};
use boundscope::{
    Arena, DType, Device, DeviceTensor, Error, Plan, Registry, Result, RunInputMut, Tensor, TensorRef, Trace,
};

#[path = "shared/gpt2.rs"]
mod gpt2;
#[path = "shared/launcher.rs"]
mod launcher;
#[path = "shared/nsys_check.rs"]
mod nsys_check;
use gpt2::Config;

fn main() -> ExitCode {
    // `--ranks N` without `RANK` set: start the ranks (each runs this program again).
    let ranks = std::env::args().skip_while(|a| a != "--ranks").nth(1).and_then(|n| n.parse::<usize>().ok());
    if let (Some(world), None) = (ranks, std::env::var_os("RANK")) {
        return match launcher::launch(world) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command line.
struct Args {
    config: Config,
    weights: Option<String>,
    ids: Option<String>,
    batch: usize,
    tokens: Option<usize>,
    seed: u64,
    device: String,
    dtype: DType,
    write_logits: Option<String>,
    write_grads: Option<String>,
    check_grads: usize,
    train_steps: usize,
    lr: f32,
    weight_decay: f32,
    bench: bool,
    profile: bool,
    print_plans: bool,
    ranks: usize,
    /// Developer options, `name=value` (`--dev`).
    developer: Vec<String>,
}

/// An error of the command line or of boundscope.
type Failure = Box<dyn std::error::Error>;

fn usage(detail: String) -> Failure {
    format!("{detail} (the flags are listed at the top of examples/gpt2.rs)").into()
}

fn parse_args() -> std::result::Result<Args, Failure> {
    let mut args = Args {
        config: Config::TINY,
        weights: None,
        ids: None,
        batch: 4,
        tokens: None,
        seed: 0,
        device: "auto".into(),
        dtype: DType::F32,
        write_logits: None,
        write_grads: None,
        check_grads: 0,
        train_steps: 0,
        lr: 1e-3,
        weight_decay: 0.0,
        bench: false,
        profile: false,
        print_plans: false,
        ranks: 0,
        developer: Vec::new(),
    };
    let (mut heads, mut batch) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| usage(format!("{flag} needs a value")));
        fn number<T: std::str::FromStr>(flag: &str, text: String) -> std::result::Result<T, Failure> {
            text.parse().map_err(|_| usage(format!("{flag} takes a number, not `{text}`")))
        }
        match flag.as_str() {
            "--config" => {
                args.config = match value()?.as_str() {
                    "tiny" => Config::TINY,
                    "124m" => Config::GPT2_124M,
                    other => return Err(usage(format!("--config is tiny or 124m, not `{other}`"))),
                }
            }
            "--weights" => args.weights = Some(value()?),
            "--heads" => heads = Some(number(&flag, value()?)?),
            "--ids" => args.ids = Some(value()?),
            "--batch" => batch = Some(number(&flag, value()?)?),
            "--tokens" => args.tokens = Some(number(&flag, value()?)?),
            "--seed" => args.seed = number(&flag, value()?)?,
            "--device" => args.device = value()?,
            "--dtype" => {
                args.dtype = match value()?.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    other => return Err(usage(format!("--dtype is f32 or bf16, not `{other}`"))),
                }
            }
            "--write-logits" => args.write_logits = Some(value()?),
            "--write-grads" => args.write_grads = Some(value()?),
            "--check-grads" => args.check_grads = number(&flag, value()?)?,
            "--train-steps" => args.train_steps = number(&flag, value()?)?,
            "--lr" => args.lr = number(&flag, value()?)?,
            "--weight-decay" => args.weight_decay = number(&flag, value()?)?,
            "--bench" => args.bench = true,
            "--profile" => args.profile = true,
            "--print-plans" => args.print_plans = true,
            "--ranks" => args.ranks = number(&flag, value()?)?,
            "--dev" => args.developer.push(value()?),
            other => return Err(usage(format!("unknown flag `{other}`"))),
        }
    }
    if args.ids.is_some() && (batch.is_some() || args.tokens.is_some()) {
        return Err(usage("--ids gives the batch and its length; drop --batch and --tokens".into()));
    }
    args.batch = batch.unwrap_or(4);
    if let Some(h) = heads {
        args.config.heads = h;
    } else if args.weights.is_some() {
        args.config.heads = 12;
    }
    Ok(args)
}

/// A run's input, where it lives.
enum Stored {
    Host(Tensor),
    Device(DeviceTensor),
}

impl Stored {
    fn new(device: &Option<Arc<dyn Device>>, tensor: TensorRef<'_>) -> Result<Stored> {
        match device {
            Some(d) => Ok(Stored::Device(DeviceTensor::upload(d, tensor)?)),
            None => Ok(Stored::Host(tensor.to_tensor())),
        }
    }

    fn as_input(&mut self) -> RunInputMut<'_> {
        match self {
            Stored::Host(t) => RunInputMut::Host(t),
            Stored::Device(t) => RunInputMut::Device(t),
        }
    }

    fn to_host(&self) -> Result<Tensor> {
        match self {
            Stored::Host(t) => Ok(t.clone()),
            Stored::Device(t) => t.to_host(),
        }
    }

    fn set(&mut self, tensor: TensorRef<'_>) -> Result<()> {
        match self {
            Stored::Host(t) => {
                *t = tensor.to_tensor();
                Ok(())
            }
            Stored::Device(t) => t.copy_from_host(tensor),
        }
    }
}

/// Runs `plan` on `inputs` (updating those it updates) and returns on the host its outputs
/// other than the updates (which now are the inputs they update).
fn run_plan(plan: &Plan, workspace: &mut boundscope::Workspace, inputs: &mut [Stored]) -> Result<Vec<Tensor>> {
    let mut refs: Vec<RunInputMut<'_>> = inputs.iter_mut().map(Stored::as_input).collect();
    let out = plan.run_updating_on_device(workspace, &mut refs)?;
    let updated: Vec<usize> = plan.updates().map(|(_, output)| output).collect();
    (0..out.len()).filter(|i| !updated.contains(i)).map(|i| out.to_host(i)).collect()
}

fn scalar(t: &Tensor) -> f32 {
    t.to_f32_vec().first().copied().unwrap_or(f32::NAN)
}

fn run() -> std::result::Result<bool, Failure> {
    let args = parse_args()?;
    let (mut registry, arena) = (Registry::with_builtins(), Arena::new());
    let collectives = Collectives::register(&mut registry)?;
    let registry = registry;
    // A rank of a data-parallel run (`--ranks`): its place, and its group over TCP.
    let rank = match std::env::var_os("RANK") {
        Some(_) if args.ranks > 0 => {
            let env = RankEnv::from_env()?;
            nvtx::name_current_thread(std::ffi::CString::new(format!("rank {}", env.rank)).unwrap_or_default());
            let tcp = Arc::new(TcpGroup::from_rank_env("gpt2", &env, std::time::Duration::from_secs(300))?);
            Some((env, tcp))
        }
        _ => None,
    };
    let mut options = Options::new();
    options.set_str("runtime.device", &args.device)?;
    for setting in &args.developer {
        let (name, value) =
            setting.split_once('=').ok_or_else(|| usage(format!("--dev takes NAME=VALUE, not `{setting}`")))?;
        options.set_developer_str(name, value)?;
    }
    if let Some((env, _)) = &rank {
        options.set("runtime.gpu", env.local_rank as i64)?;
    }
    let mut session = ProfiledSession::new(options, &Environment::process())?;
    if let Some((env, tcp)) = &rank {
        let executor = collective_executor(&session, env, tcp, &collectives)?;
        session = session.with_executor(executor);
    }
    let session = session;
    let device = session.device();
    eprintln!("profiling: {} ({})", session.profiling().level, session.profiling().reason);

    // Weights: mapped from the file (and uploaded from the map), or GPT-2's initialisation.
    let file = args.weights.as_deref().map(Checkpoint::open).transpose()?;
    let config = match &file {
        Some(f) => Config::of_checkpoint(f, args.config.heads)?,
        None => args.config,
    };
    let initial;
    let weights: Vec<TensorRef<'_>> = match &file {
        Some(f) => gpt2::load(f, &config)?,
        None => {
            initial = config.initial_parameters(args.seed);
            initial.iter().map(Tensor::view).collect()
        }
    };
    let prefix = match &file {
        Some(f) if f.contains("transformer.wte.weight") => "transformer.",
        _ => "",
    };
    let ids = match args.ids.as_deref() {
        Some(path) => {
            let f = Checkpoint::open(path)?;
            let meta = f.meta("ids")?;
            let ids = f.tensor("ids")?;
            if meta.shape.len() != 2 || !matches!(meta.dtype, DType::I64 | DType::I32) {
                let detail =
                    format!("expected an integer tensor [batch, tokens], got {:?} {:?}", meta.dtype, meta.shape);
                return Err(Error::Checkpoint { path: path.into(), tensor: Some("ids".into()), detail }.into());
            }
            ids.to_dtype(DType::I64)
        }
        None => {
            let tokens = args.tokens.unwrap_or(config.positions.min(64));
            // Each rank its own batch.
            let mut rng =
                gpt2::Normal::new(args.seed ^ 0x1d5 ^ rank.as_ref().map_or(0, |(env, _)| 1 + env.rank as u64));
            let v = config.vocab as f64;
            let values = (0..args.batch * tokens).map(|_| ((rng.uniform() * v) as i64).min(v as i64 - 1)).collect();
            Tensor::from_vec(&[args.batch, tokens], values)?
        }
    };
    if let Some((position, &index)) =
        ids.values::<i64>()?.iter().enumerate().find(|(_, &i)| i < 0 || i as usize >= config.vocab)
    {
        let symbol = "embedding (the ids)".into();
        return Err(Error::IndexOutOfRange { symbol, index, position, bound: config.vocab }.into());
    }
    let (batch, tokens) = (ids.shape()[0], ids.shape()[1]);
    println!(
        "GPT-2: {} layers, width {}, {} heads, vocabulary {}, {} positions ({:.1}M parameters); batch {batch} x \
         {tokens} tokens, {:?} on {}",
        config.layers,
        config.width,
        config.heads,
        config.vocab,
        config.positions,
        config.parameter_count() as f64 / 1e6,
        args.dtype,
        if device.is_some() { "the GPU" } else { "the CPU" },
    );
    let names: Vec<String> = config.parameters().into_iter().map(|(n, _)| n).collect();
    let mut ok = true;
    let mut expected_ranges = String::new();
    let compile = |trace: &Trace<'_>| -> Result<Plan> {
        let plan = session.compile(trace, &arena)?;
        if args.print_plans {
            eprintln!("{plan}");
        }
        Ok(plan)
    };

    // The forward: loss and (if written) logits.
    let model = gpt2::build(&arena, &registry, &config, batch, tokens, args.dtype, args.write_logits.is_some())?;
    let mut inputs = vec![Stored::new(&device, ids.view())?];
    for w in &weights {
        inputs.push(Stored::new(&device, *w)?);
    }
    let forward = compile(&model.trace)?;
    let mut workspace = forward.workspace()?;
    let out = run_plan(&forward, &mut workspace, &mut inputs)?;
    println!("loss {:.6}", scalar(&out[0]));
    expected_ranges.push_str(&forward.range_map().counts_tsv(1));
    if let Some(path) = &args.write_logits {
        let loss = Tensor::new(&[1], vec![scalar(&out[0])])?;
        checkpoint::write(path, &[("logits", out[1].view()), ("loss", loss.view())])?;
        println!("wrote logits {:?} and loss to {path}", out[1].shape());
    }

    // Gradients: written, and checked against central differences.
    if args.check_grads > 0 && args.dtype != DType::F32 {
        return Err(usage(
            "--check-grads needs --dtype f32 (finite differences of a loss computed in bf16 are noise)".into(),
        ));
    }
    if args.write_grads.is_some() || args.check_grads > 0 {
        let plain = gpt2::build(&arena, &registry, &config, batch, tokens, args.dtype, false)?;
        let grads_trace = Grad::new(&plain.parameters).run(&plain.trace, &arena)?;
        let plan = compile(&grads_trace)?;
        let mut ws = plan.workspace()?;
        let out = run_plan(&plan, &mut ws, &mut inputs)?;
        expected_ranges.push_str(&plan.range_map().counts_tsv(1));
        let grads = &out[1..];
        if let Some(path) = &args.write_grads {
            let named: Vec<String> = names.iter().map(|n| format!("{prefix}{n}")).collect();
            let list: Vec<(&str, TensorRef<'_>)> =
                named.iter().map(String::as_str).zip(grads.iter().map(Tensor::view)).collect();
            checkpoint::write(path, &list)?;
            println!("wrote {} gradients to {path}", grads.len());
        }
        if args.check_grads > 0 {
            let loss_plan = compile(&plain.trace)?;
            let mut ws = loss_plan.workspace()?;
            ok &= check_gradients(&loss_plan, &mut ws, &mut inputs, grads, &names, args.check_grads)?;
            expected_ranges.push_str(&loss_plan.range_map().counts_tsv(4 * args.check_grads));
        }
    }

    // Training: AdamW in place, parameters and moments where the plan runs.
    if args.train_steps > 0 || args.bench || args.profile {
        let plain = gpt2::build(&arena, &registry, &config, batch, tokens, args.dtype, false)?;
        let adamw = AdamW::new().weight_decay(args.weight_decay);
        let grad = Grad::new(&plain.parameters);
        let grad = if rank.is_some() { grad.in_buckets(DataParallel::new(&collectives)) } else { grad };
        let step = grad.training_step(&plain.trace, &arena, &adamw)?;
        let plan = compile(&step.trace)?;
        let mut ws = plan.workspace()?;
        let mut inputs: Vec<Stored> = vec![Stored::new(&device, ids.view())?];
        for w in &weights {
            inputs.push(Stored::new(&device, *w)?);
        }
        let scalars = adamw.step_values(1, args.lr);
        let first_scalar = inputs.len();
        for s in &scalars {
            inputs.push(Stored::new(&device, s.view())?);
        }
        for &v in &step.trace.inputs()[inputs.len()..] {
            let meta = step.trace.value_meta(v)?;
            inputs.push(Stored::new(&device, Tensor::try_zeros_of(meta.dtype, &meta.shape)?.view())?);
        }
        let mut losses = Vec::new();
        for t in 1..=args.train_steps as u64 {
            for (k, s) in adamw.step_values(t, args.lr).iter().enumerate() {
                inputs[first_scalar + k].set(s.view())?;
            }
            let out = run_plan(&plan, &mut ws, &mut inputs)?;
            let loss = scalar(&out[0]);
            println!("step {t:>3}  loss {loss:.6}");
            losses.push(loss);
        }
        expected_ranges.push_str(&plan.range_map().counts_tsv(args.train_steps));
        if let (Some(&first), Some(&last)) = (losses.first(), losses.last()) {
            if args.train_steps >= 2 && (last >= first || last.is_nan()) {
                eprintln!("error: the training loss went from {first} to {last}; it should fall");
                ok = false;
            }
        }
        if let Some((env, tcp)) = &rank {
            ok &= parameters_agree(tcp, &inputs[1..1 + weights.len()])?;
            if args.bench {
                data_parallel_bench(env, tcp, &session, &plan, &mut ws, &mut inputs, first_scalar, batch * tokens)?;
            }
        } else if args.bench {
            bench(
                &session,
                &model.trace,
                &step.trace,
                &arena,
                &plan,
                &mut ws,
                &mut inputs,
                first_scalar,
                batch * tokens,
                &adamw,
                args.lr,
            )?;
        }
        if args.profile {
            profile(&session, &step.trace, &arena, &mut inputs, first_scalar, &adamw, args.lr)?;
        }
    }
    nsys_check::write_expected_ranges(&expected_ranges);
    Ok(ok)
}

/// The executor of this rank's collectives: NCCL on the session's GPU (the id passed over
/// `tcp`), else the TCP group itself.
fn collective_executor(
    session: &ProfiledSession,
    env: &RankEnv,
    tcp: &Arc<TcpGroup>,
    collectives: &Collectives,
) -> Result<Arc<dyn boundscope::Executor>> {
    #[cfg(feature = "cuda")]
    if session.device().is_some() {
        use boundscope::distributed::{NcclCommunicator, NcclExecutor};
        let gpu = boundscope::executors::cuda::CudaDevice::with_ordinal(env.local_rank)?;
        gpu.name_streams(format!("rank {}", env.rank));
        let nccl = NcclCommunicator::rendezvous(gpu, "gpt2", &**tcp)?;
        // A rank that fails or hangs aborts the others' collectives after two minutes.
        nccl.watch(std::time::Duration::from_secs(120))?;
        return Ok(NcclExecutor::new(nccl, collectives).shared());
    }
    let _ = (session, env);
    let host: Arc<dyn Communicator> = tcp.clone();
    Ok(CollectiveExecutor::of(host, collectives).shared())
}

/// Whether every rank holds the same parameters: each tensor's bits summed (wrapping, in
/// `u64`), sent as four 16-bit words (exact in `f32`) and gathered over TCP; says so on stdout.
fn parameters_agree(tcp: &TcpGroup, parameters: &[Stored]) -> Result<bool> {
    let mut words = Vec::with_capacity(parameters.len() * 4);
    for p in parameters {
        let bits = p
            .to_host()?
            .to_f32_vec()
            .iter()
            .fold(0u64, |sum, v| sum.wrapping_mul(31).wrapping_add(u64::from(v.to_bits())));
        words.extend((0..4).map(|k| ((bits >> (16 * k)) & 0xffff) as f32));
    }
    let mut all = vec![0.0f32; words.len() * tcp.world_size()];
    tcp.run(Collective::AllGather, &words, &mut all)?;
    let agree = all.chunks(words.len()).all(|other| other == words);
    println!("rank {} of {}: parameters equal on every rank: {agree}", tcp.rank(), tcp.world_size());
    Ok(agree)
}

/// The data-parallel training step timed (the ranks start together), printed by rank 0.
#[allow(clippy::too_many_arguments)]
fn data_parallel_bench(
    env: &RankEnv,
    tcp: &TcpGroup,
    session: &ProfiledSession,
    plan: &Plan,
    ws: &mut boundscope::Workspace,
    inputs: &mut [Stored],
    first_scalar: usize,
    tokens: usize,
) -> Result<()> {
    let device = session.device();
    let sync = || device.as_ref().map_or(Ok(()), |d| d.synchronize());
    let adamw = AdamW::new();
    let mut step = |t: u64| -> Result<()> {
        for (k, s) in adamw.step_values(1000 + t, 1e-4).iter().enumerate() {
            inputs[first_scalar + k].set(s.view())?;
        }
        let mut refs: Vec<RunInputMut<'_>> = inputs.iter_mut().map(Stored::as_input).collect();
        plan.run_updating_on_device(ws, &mut refs).map(drop)
    };
    for t in 0..3 {
        step(t)?;
    }
    sync()?;
    tcp.run(Collective::AllReduce(boundscope::distributed::ReduceOp::Sum), &[0.0], &mut [0.0])?;
    let runs = 10;
    let start = Instant::now();
    for t in 0..runs {
        step(3 + t)?;
    }
    sync()?;
    let ms = start.elapsed().as_secs_f64() * 1e3 / runs as f64;
    if env.rank == 0 {
        let world = env.world_size;
        println!(
            "bench: data-parallel training step on {world} ranks {ms:.3} ms ({:.0} tokens/s in all, {:.0} per rank)",
            (tokens * world) as f64 / ms * 1e3,
            tokens as f64 / ms * 1e3
        );
    }
    Ok(())
}

/// Compares `grads` with central differences of the loss (Richardson-extrapolated, in f64 from
/// f32 losses) for `count` parameters spread over the model.
fn check_gradients(
    plan: &Plan,
    workspace: &mut boundscope::Workspace,
    inputs: &mut [Stored],
    grads: &[Tensor],
    names: &[String],
    count: usize,
) -> Result<bool> {
    // Parameters spread over the model (the tied `wte` first), each at its largest gradient.
    let count = count.min(grads.len());
    let picked: Vec<(usize, usize, f32)> = (0..count)
        .map(|k| if count > 1 { k * (grads.len() - 1) / (count - 1) } else { 0 })
        .map(|p| {
            let v = grads[p].to_f32_vec();
            let (i, x) =
                v.iter().enumerate().fold((0, 0.0f32), |m, (i, &x)| if x.abs() > m.1.abs() { (i, x) } else { m });
            (p, i, x)
        })
        .collect();
    let mut ok = true;
    for &(p, i, g) in &picked {
        let original = inputs[1 + p].to_host()?;
        let mut loss_at = |delta: f32| -> Result<f64> {
            let mut moved = original.clone();
            moved.values_mut::<f32>()?[i] += delta;
            inputs[1 + p].set(moved.view())?;
            let out = run_plan(plan, workspace, inputs)?;
            Ok(scalar(&out[0]) as f64)
        };
        let h = 4e-2f32;
        // Richardson: (4 D(h/2) - D(h)) / 3 cancels the h^2 term of the central difference.
        let d = |a: f64, b: f64, h: f32| (a - b) / (2.0 * h as f64);
        let (p1, m1) = (loss_at(h)?, loss_at(-h)?);
        let (p2, m2) = (loss_at(h / 2.0)?, loss_at(-h / 2.0)?);
        let fd = (4.0 * d(p2, m2, h / 2.0) - d(p1, m1, h)) / 3.0;
        inputs[1 + p].set(original.view())?;
        let error = (fd - g as f64).abs();
        let good = error <= 1e-4 + 0.02 * (g as f64).abs();
        ok &= good;
        println!(
            "gradient {}[{i}]: {g:+.6} against {fd:+.6} by finite differences ({})",
            names[p],
            if good { "ok" } else { "OFF" }
        );
    }
    Ok(ok)
}

/// Times forward steps and training steps in the steady state (the device synchronised
/// before the clock stops) and prints tokens per second.
#[allow(clippy::too_many_arguments)]
fn bench(
    session: &ProfiledSession,
    forward: &Trace<'_>,
    step_trace: &Trace<'_>,
    arena: &Arena,
    step: &Plan,
    ws: &mut boundscope::Workspace,
    inputs: &mut [Stored],
    first_scalar: usize,
    tokens: usize,
    adamw: &AdamW,
    lr: f32,
) -> Result<()> {
    let device = session.device();
    let sync = || device.as_ref().map_or(Ok(()), |d| d.synchronize());
    let (warmup, runs) = (3, 10);
    let forward_plan = session.compile(forward, arena)?;
    let mut fws = forward_plan.workspace()?;
    let time = |f: &mut dyn FnMut(u64) -> Result<()>| -> Result<f64> {
        for t in 0..warmup {
            f(t)?;
        }
        sync()?;
        let start = Instant::now();
        for t in 0..runs {
            f(warmup + t)?;
        }
        sync()?;
        Ok(start.elapsed().as_secs_f64() * 1e3 / runs as f64)
    };
    let n = forward.inputs().len();
    let forward_ms = time(&mut |_| {
        let mut refs: Vec<RunInputMut<'_>> = inputs[..n].iter_mut().map(Stored::as_input).collect();
        forward_plan.run_updating_on_device(&mut fws, &mut refs).map(drop)
    })?;
    let forward_bytes = fws.device_bytes();
    drop(fws);
    let mut step_ms = |plan: &Plan, ws: &mut boundscope::Workspace| {
        time(&mut |t| {
            for (k, s) in adamw.step_values(1000 + t, lr).iter().enumerate() {
                inputs[first_scalar + k].set(s.view())?;
            }
            let mut refs: Vec<RunInputMut<'_>> = inputs.iter_mut().map(Stored::as_input).collect();
            plan.run_updating_on_device(ws, &mut refs).map(drop)
        })
    };
    let off = step_ms(step, ws)?;
    // The same step with a range on every op and module (`runtime.profiling=ops`), no tool
    // attached unless the process runs under one; then profiling off again.
    // (The session's options, developer options among them.)
    let mut options = session.options().clone();
    options.set_str("runtime.profiling", "ops")?;
    let profiled = ProfiledSession::new(options, &Environment::process())?.compile(step_trace, arena)?;
    let mut profiled_ws = profiled.workspace()?;
    // Each side twice, interleaved, the faster kept: one sample of ten steps read 10-12% slow
    // in two of six runs on an H100, where the others read within 0.7%.
    let on = step_ms(&profiled, &mut profiled_ws)?;
    let off = off.min(step_ms(step, ws)?);
    let on = on.min(step_ms(&profiled, &mut profiled_ws)?);
    // What a step holds: its workspace's device buffers and its inputs (ids, parameters,
    // AdamW's moments), which it reads where they are.
    let held: usize = step_trace
        .inputs()
        .iter()
        .map(|&v| step_trace.value_meta(v).map_or(0, |m| m.numel() * m.dtype.size_bytes()))
        .sum();
    let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
    println!(
        "bench: forward {forward_ms:.3} ms ({:.0} tokens/s), training step {off:.3} ms ({:.0} tokens/s); \
         device memory: forward {:.0} MiB (workspace), training step {:.0} MiB (workspace {:.0}, inputs {:.0})",
        tokens as f64 / forward_ms * 1e3,
        tokens as f64 / off * 1e3,
        mib(forward_bytes),
        mib(ws.device_bytes() + held),
        mib(ws.device_bytes()),
        mib(held),
    );
    println!(
        "bench: training step with a range on every op and module: {on:.3} ms ({:+.2}% over profiling off; {} ranges \
         per step)",
        (on / off - 1.0) * 100.0,
        profiled.range_map().ranges().len()
    );
    Ok(())
}

/// The device time of a training step by op (fused regions together), from CUDA events around
/// every step of the session's prepared trace.
#[cfg(feature = "cuda")]
fn profile(
    session: &ProfiledSession,
    step: &Trace<'_>,
    arena: &Arena,
    inputs: &mut [Stored],
    first_scalar: usize,
    adamw: &AdamW,
    lr: f32,
) -> Result<()> {
    use boundscope::executors::cuda::{CudaDevice, CudaEventTimer};
    if session.device().is_none() {
        println!("profile: on the GPU only");
        return Ok(());
    }
    use boundscope::guards::Selection;
    let device = CudaDevice::new()?;
    let timer = CudaEventTimer::new(device.clone());
    let mut prepared = session.prepare(step, arena)?;
    prepared.attach_guard(Selection::All, timer.clone())?;
    // One more timer per kind of innermost module (`h.*.attn.sdpa`, `backward.h.*.mlp.c_fc`):
    // the layers' numbers become `*`, so each kind sums over the layers.
    let mut kinds: Vec<String> = Vec::new();
    for scope in prepared.scopes() {
        let path = scope.path();
        let inner = format!("{path}.");
        let innermost = !prepared.scopes().iter().any(|s| s.path().starts_with(&inner));
        let kind: Vec<&str> =
            path.split('.').map(|c| if c.bytes().all(|b| b.is_ascii_digit()) { "*" } else { c }).collect();
        let kind = kind.join(".");
        if innermost && !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    let mut module_timers = Vec::new();
    for kind in &kinds {
        let t = CudaEventTimer::new(device.clone());
        prepared.attach_guard(Selection::InScope(kind), t.clone())?;
        module_timers.push((kind.clone(), t));
    }
    let plan = Plan::compile(&prepared, session.executors())?;
    let mut ws = plan.workspace()?;
    let runs = 3;
    for t in 0..runs {
        for (k, s) in adamw.step_values(2000 + t, lr).iter().enumerate() {
            inputs[first_scalar + k].set(s.view())?;
        }
        run_plan(&plan, &mut ws, inputs)?;
    }
    let mut by_op: Vec<(String, f64, u64)> = Vec::new();
    for s in timer.stats() {
        let key = if s.label.starts_with("CudaFusion") { "fused regions".to_string() } else { s.label.clone() };
        let ms = s.total.as_secs_f64() * 1e3 / runs as f64;
        match by_op.iter_mut().find(|(k, _, _)| *k == key) {
            Some(entry) => {
                entry.1 += ms;
                entry.2 += s.count / runs;
            }
            None => by_op.push((key, ms, s.count / runs)),
        }
    }
    by_op.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = by_op.iter().map(|e| e.1).sum();
    println!("profile: {total:.3} ms of device time per training step, by op:");
    for (op, ms, count) in by_op.iter().take(25) {
        println!("  {ms:>9.3} ms  {count:>5} x  {op}");
    }
    println!("profile: by module (innermost scopes, summed over layers), and its three costliest ops:");
    let mut by_module: Vec<(String, f64, String)> = module_timers
        .iter()
        .map(|(kind, t)| {
            let mut stats = t.stats();
            stats.sort_by_key(|s| std::cmp::Reverse(s.total));
            let ms = |s: &boundscope::guards::TimerStats| s.total.as_secs_f64() * 1e3 / runs as f64;
            let total: f64 = stats.iter().map(ms).sum();
            let top: Vec<String> =
                stats.iter().take(3).map(|s| format!("{} {:.3} ({}x)", s.label, ms(s), s.count / runs)).collect();
            (kind.clone(), total, top.join(", "))
        })
        .collect();
    by_module.sort_by(|a, b| b.1.total_cmp(&a.1));
    let in_modules: f64 = by_module.iter().map(|m| m.1).sum();
    for (kind, ms, top) in &by_module {
        println!("  {ms:>9.3} ms  {kind:<32} {top}");
    }
    println!("  {:>9.3} ms  (outside innermost modules: residual adds and the like)", total - in_modules);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn profile(_: &ProfiledSession, _: &Trace<'_>, _: &Arena, _: &mut [Stored], _: usize, _: &AdamW, _: f32) -> Result<()> {
    println!("profile: on the GPU only (built without the `cuda` feature)");
    Ok(())
}
