//! boundscope's GPT-2 (`examples/shared/gpt2.rs`, the model `examples/gpt2.rs` runs) against
//! Hugging Face's `GPT2LMHeadModel`, as llm.c's `test_gpt2` checks its model against PyTorch:
//! `scripts/gpt2_reference.py` wrote a small model's weights (under `save_pretrained`'s
//! `transformer.` names), a batch of ids, the logits, the loss, every parameter's gradient and
//! the losses of 10 AdamW steps to `proptests/fixtures/gpt2_reference.safetensors`; this loads
//! the weights through `checkpoint::Checkpoint` and compares everything, through the front end
//! (`ProfiledSession`), on the CPU and, where one can be used, on the GPU (elsewhere the GPU case
//! prints `SKIPPED` with the reason: run this test binary on a GPU machine). Measured: loss,
//! logits, gradients and AdamW losses within 1e-7 to 7e-7 of PyTorch's on the CPU and the H200
//! (the tolerance is 1e-4); bf16 logits within 7e-3 of PyTorch's f32 (the tolerance is 2e-2).

use boundscope::checkpoint::Checkpoint;
use boundscope::frontend::{Environment, ProfiledSession};
use boundscope::optim::AdamW;
use boundscope::options::Options;
use boundscope::passes::{Grad, Pass};
use boundscope::{Arena, DType, DeviceTensor, Plan, Registry, RunInputMut, Tensor, TensorRef};

#[path = "../examples/shared/gpt2.rs"]
#[allow(dead_code)]
mod gpt2;

/// Relative to the package root, where `cargo test` runs a test (and where a test binary copied
/// to another machine runs from).
const FIXTURE: &str = "proptests/fixtures/gpt2_reference.safetensors";
/// As in `scripts/gpt2_reference.py`.
const HEADS: usize = 4;
const LR: f32 = 1e-3;
const WEIGHT_DECAY: f32 = 0.01;

/// f32 against PyTorch's f32 on the CPU: the largest difference relative to the largest value.
const F32_TOLERANCE: f32 = 1e-4;
/// bf16 compute (f32 master weights, the loss in f32) against PyTorch's f32: logits and loss.
const BF16_TOLERANCE: f32 = 2e-2;

fn relative_error(ours: &Tensor, reference: &Tensor) -> f32 {
    assert_eq!(ours.shape(), reference.shape());
    let (a, b) = (ours.to_f32_vec(), reference.to_f32_vec());
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) })
        / scale
}

fn session(device: &str) -> Option<ProfiledSession> {
    let mut options = Options::new();
    options.set_str("runtime.device", device).unwrap();
    match ProfiledSession::new(options, &Environment::from_pairs(&[])) {
        Ok(s) => Some(s),
        Err(e) => {
            println!("SKIPPED ({device} case): gpt2_matches_pytorch: {e}; run this test binary on a GPU machine");
            None
        }
    }
}

/// Runs `plan` with `inputs`, updating them in place, and returns on the host the outputs that
/// are not updates (those now are the inputs they update).
fn run(plan: &Plan, ws: &mut boundscope::Workspace, inputs: &mut [Input]) -> Vec<Tensor> {
    let mut refs: Vec<RunInputMut<'_>> = inputs
        .iter_mut()
        .map(|i| match i {
            Input::Host(t) => RunInputMut::Host(t),
            Input::Device(t) => RunInputMut::Device(t),
        })
        .collect();
    let out = plan.run_updating_on_device(ws, &mut refs).unwrap();
    let updated: Vec<usize> = plan.updates().map(|(_, output)| output).collect();
    (0..out.len()).filter(|i| !updated.contains(i)).map(|i| out.to_host(i).unwrap()).collect()
}

enum Input {
    Host(Tensor),
    Device(DeviceTensor),
}

fn inputs(session: &ProfiledSession, tensors: &[TensorRef<'_>]) -> Vec<Input> {
    tensors
        .iter()
        .map(|t| match session.device() {
            Some(d) => Input::Device(DeviceTensor::upload(&d, *t).unwrap()),
            None => Input::Host(t.to_tensor()),
        })
        .collect()
}

fn check(device: &str) {
    let Some(session) = session(device) else { return };
    let file = Checkpoint::open(FIXTURE).unwrap();
    let config = gpt2::Config::of_checkpoint(&file, HEADS).unwrap();
    assert_eq!((config.layers, config.width, config.vocab, config.positions), (2, 32, 128, 32));
    let weights = gpt2::load(&file, &config).unwrap();
    let ids = file.view("ids").unwrap();
    let (batch, tokens) = (ids.shape[0], ids.shape[1]);
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let all: Vec<TensorRef<'_>> = std::iter::once(ids).chain(weights.iter().copied()).collect();

    // Logits and loss.
    let model = gpt2::build(&arena, &registry, &config, batch, tokens, DType::F32, true).unwrap();
    // Attention as Hugging Face writes it, packed by `passes::PackAttention`: one op a layer.
    let packed = model.trace.bound_symbols().iter().filter(|b| b.symbol() == boundscope::prims::QKV_ATTENTION);
    assert_eq!(packed.count(), config.layers, "every layer's attention is one qkv_attention");
    let plan = session.compile(&model.trace, &arena).unwrap();
    let out = run(&plan, &mut plan.workspace().unwrap(), &mut inputs(&session, &all));
    let (loss, logits) = (file.tensor("loss").unwrap(), file.tensor("logits").unwrap());
    let loss_error = (out[0].to_f32_vec()[0] - loss.to_f32_vec()[0]).abs() / loss.to_f32_vec()[0];
    let logits_error = relative_error(&out[1], &logits);
    println!(
        "{device}: loss {} against {} (relative {loss_error:.1e}); logits {logits_error:.1e}",
        out[0].to_f32_vec()[0],
        loss.to_f32_vec()[0]
    );
    assert!(
        loss_error <= F32_TOLERANCE && logits_error <= F32_TOLERANCE,
        "{device}: logits or loss differ from PyTorch's"
    );

    // Every parameter's gradient (the tied `wte` gets the embedding's and the LM head's).
    let plain = gpt2::build(&arena, &registry, &config, batch, tokens, DType::F32, false).unwrap();
    let grads = Grad::new(&plain.parameters).run(&plain.trace, &arena).unwrap();
    let plan = session.compile(&grads, &arena).unwrap();
    let out = run(&plan, &mut plan.workspace().unwrap(), &mut inputs(&session, &all));
    let mut worst = (0.0f32, String::new());
    for ((name, _), ours) in config.parameters().iter().zip(&out[1..]) {
        let reference = file.tensor(&format!("grad.transformer.{name}")).unwrap();
        let error = relative_error(ours, &reference);
        assert!(error <= F32_TOLERANCE, "{device}: the gradient of {name} is off by {error:.1e} of its largest value");
        if error > worst.0 {
            worst = (error, name.clone());
        }
    }
    println!("{device}: {} gradients, the worst {} ({:.1e})", out.len() - 1, worst.1, worst.0);

    // 10 AdamW steps, in place.
    let adamw = AdamW::new().weight_decay(WEIGHT_DECAY);
    let step = Grad::new(&plain.parameters).training_step(&plain.trace, &arena, &adamw).unwrap();
    let plan = session.compile(&step.trace, &arena).unwrap();
    let mut ws = plan.workspace().unwrap();
    let mut step_inputs: Vec<Tensor> = all.iter().map(|t| t.to_tensor()).collect();
    let first_scalar = step_inputs.len();
    step_inputs.extend(adamw.step_values(1, LR));
    for &v in &step.trace.inputs()[step_inputs.len()..] {
        let meta = step.trace.value_meta(v).unwrap();
        step_inputs.push(Tensor::try_zeros_of(meta.dtype, &meta.shape).unwrap());
    }
    let views: Vec<TensorRef<'_>> = step_inputs.iter().map(Tensor::view).collect();
    let mut step_inputs = inputs(&session, &views);
    let expected = file.tensor("train_losses").unwrap().to_f32_vec();
    for (t, &want) in expected.iter().enumerate() {
        for (k, s) in adamw.step_values(t as u64 + 1, LR).iter().enumerate() {
            step_inputs[first_scalar + k] = inputs(&session, &[s.view()]).pop().unwrap();
        }
        let got = run(&plan, &mut ws, &mut step_inputs)[0].to_f32_vec()[0];
        let error = (got - want).abs() / want;
        assert!(error <= F32_TOLERANCE, "{device}: AdamW step {}: loss {got} against PyTorch's {want}", t + 1);
    }
    println!("{device}: 10 AdamW steps: losses {:.6} .. {:.6} as PyTorch's", expected[0], expected[9]);

    // bf16 compute with f32 master weights, against PyTorch's f32.
    let model = gpt2::build(&arena, &registry, &config, batch, tokens, DType::BF16, true).unwrap();
    let plan = session.compile(&model.trace, &arena).unwrap();
    let out = run(&plan, &mut plan.workspace().unwrap(), &mut inputs(&session, &all));
    let loss_error = (out[0].to_f32_vec()[0] - loss.to_f32_vec()[0]).abs() / loss.to_f32_vec()[0];
    let logits_error = relative_error(&out[1], &logits);
    println!("{device}: bf16: loss relative {loss_error:.1e}; logits {logits_error:.1e}");
    assert!(loss_error <= BF16_TOLERANCE && logits_error <= BF16_TOLERANCE, "{device}: bf16 is off PyTorch's f32");
}

#[test]
fn gpt2_on_the_cpu_matches_pytorch() {
    check("cpu");
}

#[test]
fn gpt2_on_the_gpu_matches_pytorch() {
    check("cuda");
}

/// A checkpoint of another model, one lacking a tensor and a truncated one are typed errors
/// naming the file and the tensor, before anything runs.
#[test]
fn wrong_checkpoints_are_errors_naming_the_tensor() {
    use boundscope::checkpoint;
    let file = Checkpoint::open(FIXTURE).unwrap();
    let config = gpt2::Config::of_checkpoint(&file, HEADS).unwrap();
    let dir = std::env::temp_dir();
    let path = dir.join(format!("boundscope-gpt2-{}.safetensors", std::process::id()));
    let names: Vec<String> = file.names().map(str::to_string).collect();
    let tensors: Vec<Tensor> = names.iter().map(|n| file.tensor(n).unwrap()).collect();
    let detail = |e: boundscope::Error| match e {
        boundscope::Error::Checkpoint { tensor, detail, .. } => (tensor, detail),
        other => panic!("expected Error::Checkpoint, got {other}"),
    };

    // `c_attn`'s weight as `nn.Linear` stores it ([out, in]) rather than Conv1D's [in, out].
    let wrong = "transformer.h.1.attn.c_attn.weight";
    let transposed = Tensor::zeros(&[96, 32]);
    let list: Vec<(&str, TensorRef<'_>)> = names
        .iter()
        .zip(&tensors)
        .map(|(n, t)| (n.as_str(), if n == wrong { transposed.view() } else { t.view() }))
        .collect();
    checkpoint::write(&path, &list).unwrap();
    let (tensor, text) = detail(gpt2::load(&Checkpoint::open(&path).unwrap(), &config).unwrap_err());
    assert_eq!(tensor.as_deref(), Some(wrong));
    assert!(text.contains("[96, 32]") && text.contains("[32, 96]"), "{text}");

    // A missing tensor.
    let missing = "transformer.h.0.mlp.c_fc.bias";
    let list: Vec<(&str, TensorRef<'_>)> =
        names.iter().zip(&tensors).filter(|(n, _)| *n != missing).map(|(n, t)| (n.as_str(), t.view())).collect();
    checkpoint::write(&path, &list).unwrap();
    let (tensor, _) = detail(gpt2::load(&Checkpoint::open(&path).unwrap(), &config).unwrap_err());
    assert_eq!(tensor.as_deref(), Some(missing));

    // An LM head that is not the token embedding (GPT-2 ties them; this model reads only wte).
    let head = Tensor::zeros(file.meta("transformer.wte.weight").unwrap().shape.as_slice());
    let mut list: Vec<(&str, TensorRef<'_>)> =
        names.iter().map(String::as_str).zip(tensors.iter().map(Tensor::view)).collect();
    list.push(("lm_head.weight", head.view()));
    checkpoint::write(&path, &list).unwrap();
    let (tensor, _) = detail(gpt2::load(&Checkpoint::open(&path).unwrap(), &config).unwrap_err());
    assert_eq!(tensor.as_deref(), Some("lm_head.weight"));

    // A truncated file.
    let bytes = std::fs::read(FIXTURE).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let (tensor, text) = detail(Checkpoint::open(&path).unwrap_err());
    assert_eq!(tensor, None);
    assert!(text.contains("truncated"), "{text}");
    std::fs::remove_file(&path).unwrap();
}
