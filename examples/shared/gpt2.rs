//! GPT-2 built through boundscope's public API: its configuration, its parameters under the
//! names Hugging Face's checkpoints use, their initialisation, and the forward trace with
//! every module in a scope of its Hugging Face name (`h.3.attn.c_attn`), so that a profile
//! shows the names the weights carry. Shared by `examples/gpt2.rs` and the test that checks it
//! against PyTorch.

use boundscope::checkpoint::Checkpoint;
use boundscope::passes::{PackAttention, Pass};
use boundscope::{Arena, DType, Error, Registry, Result, Tensor, TensorMeta, TensorRef, Trace, TraceBuilder, ValueId};

/// The widths of a GPT-2.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Transformer blocks.
    pub layers: usize,
    /// Width of the residual stream.
    pub width: usize,
    /// Attention heads (`width` divisible by it).
    pub heads: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Positions the position embedding holds (the longest sequence).
    pub positions: usize,
}

/// Hugging Face's layer-norm epsilon for GPT-2.
pub const LN_EPS: f32 = 1e-5;

impl Config {
    /// 2 layers of width 64, 4 heads, a vocabulary of 512, 128 positions.
    pub const TINY: Config = Config { layers: 2, width: 64, heads: 4, vocab: 512, positions: 128 };
    /// GPT-2 small (124M parameters).
    pub const GPT2_124M: Config = Config { layers: 12, width: 768, heads: 12, vocab: 50257, positions: 1024 };

    /// The configuration a checkpoint's tensors imply (the widths, depth, vocabulary and
    /// positions from its shapes; `heads` is not in a checkpoint).
    pub fn of_checkpoint(file: &Checkpoint, heads: usize) -> Result<Config> {
        let prefix = prefix_of(file);
        let table = |name: &str| -> Result<[usize; 2]> {
            let name = format!("{prefix}{name}");
            match file.meta(&name)?.shape[..] {
                [rows, width] => Ok([rows, width]),
                ref other => Err(checkpoint_error(file, &name, format!("expected [rows, width], got {other:?}"))),
            }
        };
        let ([vocab, width], [positions, _]) = (table("wte.weight")?, table("wpe.weight")?);
        let layers = (0..).take_while(|i| file.contains(&format!("{prefix}h.{i}.ln_1.weight"))).count();
        let config = Config { layers, width, heads, vocab, positions };
        config.check()?;
        Ok(config)
    }

    /// Checks that the widths make a model.
    pub fn check(&self) -> Result<()> {
        if self.heads == 0 || !self.width.is_multiple_of(self.heads) || self.layers == 0 {
            return Err(Error::InvalidShape {
                shape: vec![self.layers, self.width, self.heads],
                detail: format!(
                    "GPT-2 needs at least one layer and a width divisible by the number of heads; {} layers, width \
                     {}, {} heads (set --heads)",
                    self.layers, self.width, self.heads
                ),
            });
        }
        Ok(())
    }

    /// Every parameter, in the order the model's trace takes them: its name (as in
    /// `GPT2Model`'s state dict) and shape. Conv1D weights are `[in, out]`, as Hugging Face
    /// stores them.
    pub fn parameters(&self) -> Vec<(String, Vec<usize>)> {
        let Config { layers, width: c, vocab, positions, .. } = *self;
        let mut params =
            vec![("wte.weight".to_string(), vec![vocab, c]), ("wpe.weight".to_string(), vec![positions, c])];
        for i in 0..layers {
            let h = |name: &str| format!("h.{i}.{name}");
            params.extend([
                (h("ln_1.weight"), vec![c]),
                (h("ln_1.bias"), vec![c]),
                (h("attn.c_attn.weight"), vec![c, 3 * c]),
                (h("attn.c_attn.bias"), vec![3 * c]),
                (h("attn.c_proj.weight"), vec![c, c]),
                (h("attn.c_proj.bias"), vec![c]),
                (h("ln_2.weight"), vec![c]),
                (h("ln_2.bias"), vec![c]),
                (h("mlp.c_fc.weight"), vec![c, 4 * c]),
                (h("mlp.c_fc.bias"), vec![4 * c]),
                (h("mlp.c_proj.weight"), vec![4 * c, c]),
                (h("mlp.c_proj.bias"), vec![c]),
            ]);
        }
        params.extend([("ln_f.weight".to_string(), vec![c]), ("ln_f.bias".to_string(), vec![c])]);
        params
    }

    /// The number of parameters (the LM head is tied to `wte`).
    pub fn parameter_count(&self) -> usize {
        self.parameters().iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }

    /// GPT-2's initialisation, seeded: weights normal with standard deviation 0.02 (the
    /// residual projections `c_proj` by a further 1/sqrt(2 layers)), biases zero, layer-norm
    /// weights one.
    pub fn initial_parameters(&self, seed: u64) -> Vec<Tensor> {
        let mut rng = Normal::new(seed);
        let residual = 0.02 / (2.0 * self.layers as f32).sqrt();
        self.parameters()
            .into_iter()
            .map(|(name, shape)| {
                if name.contains(".ln_") || name.starts_with("ln_f") {
                    let one = if name.ends_with("weight") { 1.0 } else { 0.0 };
                    Tensor::from_fn(&shape, |_| one)
                } else if name.ends_with("bias") {
                    Tensor::from_fn(&shape, |_| 0.0)
                } else {
                    let std = if name.ends_with("c_proj.weight") { residual } else { 0.02 };
                    Tensor::from_fn(&shape, |_| std * rng.sample())
                }
            })
            .collect()
    }
}

/// `transformer.` if the checkpoint holds `GPT2LMHeadModel`'s names, else nothing.
fn prefix_of(file: &Checkpoint) -> &'static str {
    if file.contains("transformer.wte.weight") {
        "transformer."
    } else {
        ""
    }
}

fn checkpoint_error(file: &Checkpoint, tensor: &str, detail: String) -> Error {
    Error::Checkpoint { path: file.path().to_string(), tensor: Some(tensor.to_string()), detail }
}

/// Every parameter of `config` from `file` (f32, under either naming), borrowed from its map;
/// `lm_head.weight`, if present, must equal the tied `wte.weight` (GPT-2 ties them).
pub fn load<'f>(file: &'f Checkpoint, config: &Config) -> Result<Vec<TensorRef<'f>>> {
    let prefix = prefix_of(file);
    let weights = config
        .parameters()
        .iter()
        .map(|(name, shape)| file.expect(&format!("{prefix}{name}"), &TensorMeta::new(DType::F32, shape)))
        .collect::<Result<Vec<_>>>()?;
    if file.contains("lm_head.weight") && file.tensor("lm_head.weight")?.view() != weights[0] {
        let detail = "the LM head differs from the token embedding; GPT-2 ties them (`lm_head.weight` = \
                      `wte.weight`), and this model reads only the embedding";
        return Err(checkpoint_error(file, "lm_head.weight", detail.into()));
    }
    Ok(weights)
}

/// Normal samples from a seeded SplitMix64 stream (Box-Muller), so that the example needs no
/// random-number crate.
pub struct Normal {
    state: u64,
    spare: Option<f32>,
}

impl Normal {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Normal { state: seed ^ 0x853c_49e6_748f_ea9b, spare: None }
    }

    /// A uniform sample in (0, 1].
    pub fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// A standard normal sample.
    pub fn sample(&mut self) -> f32 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let (u, v) = (self.uniform(), self.uniform());
        let r = (-2.0 * u.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * v).sin_cos();
        self.spare = Some((r * s) as f32);
        (r * c) as f32
    }
}

/// The forward trace of GPT-2 over `[batch, tokens]` ids.
pub struct Model<'a> {
    /// Inputs: the ids (`i64 [batch, tokens]`), then the parameters in
    /// [`Config::parameters`]' order (f32 master weights); outputs: the loss (f32 `[]`: the mean
    /// cross-entropy of token t+1 given tokens up to t), then, if asked for, the logits (f32
    /// `[batch, tokens, vocab]`).
    pub trace: Trace<'a>,
    /// The parameter inputs, in [`Config::parameters`]' order.
    pub parameters: Vec<ValueId>,
}

/// Builds GPT-2's forward: `compute` is the dtype of its activations and products (`BF16`:
/// the f32 parameters are cast to bf16 where each module uses them, as `torch.autocast` does
/// for products; the embeddings are gathered in f32 and the loss computed in f32, as autocast
/// does, but unlike autocast the residual stream and the layer norms' inputs and weights are
/// bf16 too). With `logits`, they are the second output.
pub fn build<'a>(
    arena: &'a Arena,
    registry: &'a Registry,
    config: &Config,
    batch: usize,
    tokens: usize,
    compute: DType,
    logits: bool,
) -> Result<Model<'a>> {
    config.check()?;
    if tokens < 2 || tokens > config.positions || batch == 0 {
        return Err(Error::InvalidShape {
            shape: vec![batch, tokens],
            detail: format!(
                "GPT-2 takes batches of 2 to {} tokens (its positions) and at least one sequence",
                config.positions
            ),
        });
    }
    let Config { layers, width: c, heads, vocab, .. } = *config;
    let bt = batch * tokens;
    let mut b = TraceBuilder::new(arena, registry);
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[batch, tokens]))?;
    let parameters = config.parameters().iter().map(|(_, shape)| b.input(shape)).collect::<Result<Vec<ValueId>>>()?;
    // The embeddings' tables come first; the other parameters, in order, through `param`.
    let (f32_wte, wpe) = (parameters[0], parameters[1]);
    let mut next = parameters[2..].iter().copied();
    // The next parameter, in the compute dtype.
    let mut param = |b: &mut TraceBuilder<'a>| -> Result<ValueId> {
        let p = next.next().expect("as many parameters as Config::parameters lists");
        if compute == DType::F32 {
            Ok(p)
        } else {
            b.cast(p, compute)
        }
    };
    // Hugging Face's Conv1D: x @ w + bias, with w `[in, out]`.
    fn conv1d(b: &mut TraceBuilder<'_>, x: ValueId, w: ValueId, bias: ValueId) -> Result<ValueId> {
        let y = b.matmul(x, w)?;
        b.add(y, bias)
    }
    // The embeddings gather rows of the f32 tables (as autocast leaves `embedding` in f32), and
    // their sum is cast once; the LM head uses `wte` cast to the compute dtype.
    let x = b.scope("wte", |b| b.embedding(f32_wte, ids))?;
    let x = b.scope("wpe", |b| {
        let positions = b.slice(wpe, 0, 0, tokens)?;
        let x = b.add(x, positions)?;
        let x = b.reshape(x, &[bt, c])?;
        if compute == DType::F32 {
            Ok(x)
        } else {
            b.cast(x, compute)
        }
    })?;
    let mut x = x;
    for i in 0..layers {
        x = b.scope("h", |b| {
            b.scope(&i.to_string(), |b| {
                let h = b.scope("ln_1", |b| {
                    let (w, bias) = (param(b)?, param(b)?);
                    b.layer_norm(x, LN_EPS, Some(w), Some(bias))
                })?;
                let a = b.scope("attn", |b| {
                    let qkv = b.scope("c_attn", |b| {
                        let (w, bias) = (param(b)?, param(b)?);
                        conv1d(b, h, w, bias)
                    })?;
                    // As Hugging Face writes it: c_attn's result split into q, k and v, each
                    // viewed as [batch, heads, tokens, head]. `PackAttention` (below) makes the
                    // split, views and attention one `qkv_attention`, which reads them in place.
                    let y = b.scope("sdpa", |b| {
                        let qkv = b.reshape(qkv, &[batch, tokens, 3 * c])?;
                        let parts = b.split(qkv, 2, &[c, c, c])?;
                        let mut heads_of = |v: ValueId| -> Result<ValueId> {
                            let v = b.reshape(v, &[batch, tokens, heads, c / heads])?;
                            b.permute(v, &[0, 2, 1, 3])
                        };
                        let (q, k, v) = (heads_of(parts[0])?, heads_of(parts[1])?, heads_of(parts[2])?);
                        let y = b.scaled_dot_product_attention(q, k, v, true, None)?;
                        let y = b.permute(y, &[0, 2, 1, 3])?;
                        let y = b.reshape(y, &[batch, tokens, c])?;
                        b.reshape(y, &[bt, c])
                    })?;
                    b.scope("c_proj", |b| {
                        let (w, bias) = (param(b)?, param(b)?);
                        conv1d(b, y, w, bias)
                    })
                })?;
                let x = b.add(x, a)?;
                let h = b.scope("ln_2", |b| {
                    let (w, bias) = (param(b)?, param(b)?);
                    b.layer_norm(x, LN_EPS, Some(w), Some(bias))
                })?;
                let m = b.scope("mlp", |b| {
                    let h = b.scope("c_fc", |b| {
                        let (w, bias) = (param(b)?, param(b)?);
                        conv1d(b, h, w, bias)
                    })?;
                    let h = b.scope("act", |b| b.gelu(h))?;
                    b.scope("c_proj", |b| {
                        let (w, bias) = (param(b)?, param(b)?);
                        conv1d(b, h, w, bias)
                    })
                })?;
                b.add(x, m)
            })
        })?;
    }
    let x = b.scope("ln_f", |b| {
        let (w, bias) = (param(b)?, param(b)?);
        b.layer_norm(x, LN_EPS, Some(w), Some(bias))
    })?;
    // The LM head is tied to the token embedding: logits = x @ wte^T.
    let (wte, shifted_logits) = b.scope("lm_head", |b| {
        let wte = if compute == DType::F32 { f32_wte } else { b.cast(f32_wte, compute)? };
        // Token t predicts token t+1: the rows of positions 0..T-1 against the ids 1..T. The
        // hidden rows are sliced before the head (a slice of [B, T, width], not of the
        // logits' [B, T, vocab]); the loss is the same.
        let x = b.reshape(x, &[batch, tokens, c])?;
        let x = b.slice(x, 1, 0, tokens - 1)?;
        let x = b.reshape(x, &[batch * (tokens - 1), c])?;
        Ok((wte, b.linear(x, wte, None)?))
    })?;
    let loss = b.scope("loss", |b| {
        // The loss is f32 whatever the compute dtype (as autocast runs `cross_entropy`), computed
        // from the 16-bit logits (CudaOps reads them as they are; a decomposition widens them).
        let l = shifted_logits;
        let targets = b.slice(ids, 1, 1, tokens)?;
        let targets = b.reshape(targets, &[batch * (tokens - 1)])?;
        b.cross_entropy(l, targets)
    })?;
    b.output(loss)?;
    if logits {
        // Every position's logits, for the caller (a second product: the loss's head stops
        // one position short).
        let l = b.scope("lm_head", |b| b.linear(x, wte, None))?;
        let l = b.reshape(l, &[batch, tokens, vocab])?;
        let l = if compute == DType::F32 { l } else { b.cast(l, DType::F32)? };
        b.output(l)?;
    }
    // Before `passes::Grad`, so that attention's backward is packed too.
    Ok(Model { trace: PackAttention.run(&b.finish()?, arena)?, parameters })
}
