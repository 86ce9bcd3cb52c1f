//! Optimizer steps as ops of a trace: [`Sgd`] and [`AdamW`], with PyTorch's semantics and
//! defaults. Each binds the elementwise update of a parameter (and its state) from its gradient
//! and declares it an in-place update ([`TraceBuilder::update`]), so that a plan runs the whole
//! training step, and fusion makes each parameter's update one kernel. The learning rate and the
//! step's bias corrections are inputs of each run (a schedule changes them without a recompile).

use super::builder::TraceBuilder;
use super::ids::ValueId;
use super::meta::{DType, TensorMeta};
use crate::core::tensor::Tensor;
use crate::error::{Error, Result};

/// An optimizer whose step is ops of a trace: what
/// [`Grad::training_step`](crate::passes::Grad::training_step) appends after the backward.
pub trait Optimizer {
    /// Its per-run inputs (the learning rate, ...).
    type Inputs: Copy;

    /// Adds its per-run inputs to the trace.
    ///
    /// # Errors
    /// What [`TraceBuilder::input_with`] returns.
    fn step_inputs(&self, b: &mut TraceBuilder<'_>) -> Result<Self::Inputs>;

    /// Binds the update of `param` from `grad` (and of its state), declared in place; returns
    /// the state's inputs (zeros at the start), in the order they were added.
    ///
    /// # Errors
    /// [`Error::InvalidUpdate`] for a gradient that does not fit the parameter.
    fn update(
        &self,
        b: &mut TraceBuilder<'_>,
        inputs: &Self::Inputs,
        param: ValueId,
        grad: ValueId,
    ) -> Result<Vec<ValueId>>;
}

impl Optimizer for Sgd {
    type Inputs = SgdInputs;

    fn step_inputs(&self, b: &mut TraceBuilder<'_>) -> Result<SgdInputs> {
        Sgd::step_inputs(self, b)
    }

    fn update(
        &self,
        b: &mut TraceBuilder<'_>,
        inputs: &SgdInputs,
        param: ValueId,
        grad: ValueId,
    ) -> Result<Vec<ValueId>> {
        Ok(Sgd::update(self, b, inputs, param, grad)?.into_iter().collect())
    }
}

impl Optimizer for AdamW {
    type Inputs = AdamWInputs;

    fn step_inputs(&self, b: &mut TraceBuilder<'_>) -> Result<AdamWInputs> {
        AdamW::step_inputs(self, b)
    }

    fn update(
        &self,
        b: &mut TraceBuilder<'_>,
        inputs: &AdamWInputs,
        param: ValueId,
        grad: ValueId,
    ) -> Result<Vec<ValueId>> {
        let (m, v) = AdamW::update(self, b, inputs, param, grad)?;
        Ok(vec![m, v])
    }
}

/// [`Error::InvalidUpdate`] naming `optimizer`'s setting `name` (`value`, set by `setter`) unless
/// `valid`, with the range it takes (`range`, as `torch.optim` checks it).
fn setting(optimizer: &str, name: &str, setter: &str, value: f32, valid: bool, range: &str) -> Result<()> {
    if valid {
        return Ok(());
    }
    Err(Error::InvalidUpdate {
        detail: format!(
            "{optimizer}'s {name} is {value}; it must be {range} (torch.optim.{optimizer}'s range, and finite: NaN or infinite settings make the weights NaN); set it with `.{setter}(..)`"
        ),
    })
}

/// A zero-dimensional `f32` run input.
fn scalar_input(b: &mut TraceBuilder<'_>) -> Result<ValueId> {
    b.input_with(&TensorMeta::new(DType::F32, &[]))
}

fn scalar_tensor(value: f32) -> Tensor {
    Tensor::from_fn(&[], |_| value)
}

/// `grad` in `param`'s dtype (a bf16 gradient of f32 master weights, say).
fn in_dtype_of(b: &mut TraceBuilder<'_>, grad: ValueId, param: ValueId) -> Result<ValueId> {
    let dtype = b.dtype(param)?;
    if b.dtype(grad)? == dtype {
        Ok(grad)
    } else {
        b.cast(grad, dtype)
    }
}

fn check_pair(b: &TraceBuilder<'_>, param: ValueId, grad: ValueId) -> Result<()> {
    let (p, g) = (b.shape(param)?, b.shape(grad)?);
    if p != g {
        return Err(Error::InvalidUpdate {
            detail: format!("the gradient {grad} is {g:?} but the parameter {param} is {p:?}"),
        });
    }
    if b.dtype(param)?.is_integer() {
        return Err(Error::InvalidUpdate { detail: format!("{param} is an integer tensor, not a parameter") });
    }
    if !b.is_input(param) {
        return Err(Error::InvalidUpdate {
            detail: format!("{param} is not an input of the trace; parameters are inputs"),
        });
    }
    if b.is_updated(param) {
        return Err(Error::InvalidUpdate { detail: format!("{param} is updated already; update each parameter once") });
    }
    Ok(())
}

/// Stochastic gradient descent, as `torch.optim.SGD`: weight decay added to the gradient,
/// momentum (with dampening, and Nesterov's form) kept in a buffer per parameter.
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::optim::Sgd;
/// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
/// let (registry, arena) = (Registry::with_builtins(), Arena::new());
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let w = b.input(&[2]).unwrap();
/// let g = b.input(&[2]).unwrap(); // a gradient (from `passes::Grad` in a real step)
/// let sgd = Sgd::new().momentum(0.9);
/// let lr = sgd.step_inputs(&mut b).unwrap();
/// sgd.update(&mut b, &lr, w, g).unwrap(); // adds the momentum buffer as an input
/// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
/// let mut workspace = plan.workspace().unwrap();
/// let (mut w, mut buf) = (Tensor::new(&[2], vec![1.0, 1.0]).unwrap(), Tensor::new(&[2], vec![0.0; 2]).unwrap());
/// let mut g = Tensor::new(&[2], vec![1.0, -1.0]).unwrap();
/// for step in 1..=2 {
///     let [mut lr, mut keep] = sgd.step_values(step, 0.1);
///     plan.run_updating(&mut workspace, &mut [&mut w, &mut g, &mut lr, &mut keep, &mut buf]).unwrap();
/// }
/// // Step 1: buf = g, w = 1 -+ 0.1; step 2: buf = 0.9 buf + g = 1.9 g, w -= 0.19 g.
/// assert!((w.to_f32_vec()[0] - 0.71).abs() < 1e-6 && (w.to_f32_vec()[1] - 1.29).abs() < 1e-6);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    momentum: f32,
    dampening: f32,
    weight_decay: f32,
    nesterov: bool,
}

impl Default for Sgd {
    fn default() -> Self {
        Self::new()
    }
}

/// The per-run inputs of an [`Sgd`] step: the learning rate, and (with momentum) the factor of
/// the gradient in the momentum buffer, `1` at the first step and `1 - dampening` after it.
#[derive(Clone, Copy, Debug)]
pub struct SgdInputs {
    /// The learning rate (`f32[]`).
    pub lr: ValueId,
    /// The gradient's factor in the momentum buffer (`f32[]`).
    pub gradient_factor: ValueId,
}

impl Sgd {
    /// PyTorch's defaults: no momentum, dampening or weight decay.
    pub fn new() -> Self {
        Self { momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false }
    }

    /// Momentum factor.
    pub fn momentum(self, momentum: f32) -> Self {
        Self { momentum, ..self }
    }

    /// Dampening of the momentum.
    pub fn dampening(self, dampening: f32) -> Self {
        Self { dampening, ..self }
    }

    /// Weight decay (L2 penalty added to the gradient).
    pub fn weight_decay(self, weight_decay: f32) -> Self {
        Self { weight_decay, ..self }
    }

    /// Nesterov momentum.
    pub fn nesterov(self, nesterov: bool) -> Self {
        Self { nesterov, ..self }
    }

    /// Checks the settings in `torch.optim.SGD`'s ranges, and finite (NaN or infinite settings
    /// make the weights NaN): momentum and weight decay at least 0, and Nesterov momentum with a
    /// momentum above 0 and no dampening.
    ///
    /// ```
    /// use boundscope::optim::Sgd;
    /// assert!(Sgd::new().momentum(0.9).nesterov(true).check().is_ok());
    /// let err = Sgd::new().momentum(-0.9).check().unwrap_err();
    /// assert!(err.to_string().contains("SGD's momentum is -0.9"), "{err}");
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUpdate`] naming the setting out of its range, and the range.
    pub fn check(&self) -> Result<()> {
        let at_least_0 = |v: f32| v.is_finite() && v >= 0.0;
        setting("SGD", "momentum", "momentum", self.momentum, at_least_0(self.momentum), "finite and at least 0")?;
        setting("SGD", "dampening", "dampening", self.dampening, self.dampening.is_finite(), "finite")?;
        setting(
            "SGD",
            "weight_decay",
            "weight_decay",
            self.weight_decay,
            at_least_0(self.weight_decay),
            "finite and at least 0",
        )?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::InvalidUpdate {
                detail: "Nesterov momentum needs a momentum above 0 and no dampening (as torch.optim.SGD)".into(),
            });
        }
        Ok(())
    }

    /// Adds the per-run inputs (learning rate, gradient factor: two `f32[]`, in that order).
    ///
    /// # Errors
    /// What [`check`](Self::check) and [`TraceBuilder::input_with`] return.
    pub fn step_inputs(&self, b: &mut TraceBuilder<'_>) -> Result<SgdInputs> {
        self.check()?;
        Ok(SgdInputs { lr: scalar_input(b)?, gradient_factor: scalar_input(b)? })
    }

    /// The values of the per-run inputs for step `step` (counted from 1) at learning rate `lr`.
    pub fn step_values(&self, step: u64, lr: f32) -> [Tensor; 2] {
        self.step_scalars(step, lr).map(scalar_tensor)
    }

    /// [`step_values`](Self::step_values) as numbers, to write into tensors a training loop
    /// keeps (no allocation).
    pub fn step_scalars(&self, step: u64, lr: f32) -> [f32; 2] {
        [lr, if step <= 1 { 1.0 } else { 1.0 - self.dampening }]
    }

    /// Binds the update of `param` from `grad` and declares it in place; with momentum, adds
    /// its buffer (an input of `param`'s shape and dtype, zeros at the start) and returns it.
    ///
    /// # Errors
    /// [`Error::InvalidUpdate`] for settings out of range ([`check`](Self::check)), a gradient
    /// of another shape, a parameter that is not a float input or is updated already.
    pub fn update(
        &self,
        b: &mut TraceBuilder<'_>,
        inputs: &SgdInputs,
        param: ValueId,
        grad: ValueId,
    ) -> Result<Option<ValueId>> {
        self.check()?;
        check_pair(b, param, grad)?;
        let mut g = in_dtype_of(b, grad, param)?;
        if self.weight_decay != 0.0 {
            let decay = b.mul_scalar(param, self.weight_decay)?;
            g = b.add(g, decay)?;
        }
        let mut buffer = None;
        if self.momentum != 0.0 {
            let meta = TensorMeta::new(b.dtype(param)?, b.shape(param)?);
            let buf = b.input_with(&meta)?;
            let kept = b.mul_scalar(buf, self.momentum)?;
            let fresh = b.mul(g, inputs.gradient_factor)?;
            let next = b.add(kept, fresh)?;
            b.update(buf, next)?;
            g = if self.nesterov {
                let ahead = b.mul_scalar(next, self.momentum)?;
                b.add(g, ahead)?
            } else {
                next
            };
            buffer = Some(buf);
        }
        let step = b.mul(g, inputs.lr)?;
        let next = b.sub(param, step)?;
        b.update(param, next)?;
        Ok(buffer)
    }
}

/// Adam with decoupled weight decay, as `torch.optim.AdamW` (and its fused form): `p -= lr wd
/// p`, then the moments `m`, `v` and `p -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)`.
/// Each parameter's update is one elementwise chain (one fused kernel on the fusing
/// executors). `sqrt` is `exp(0.5 log(.))` here (the prims have no `sqrt`): within 8 ulps of
/// `f32::sqrt` over the second moments Adam keeps (1e-12 to 1, the CPU executors' `exp` and
/// `log`), a relative error under 1e-6.
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::optim::AdamW;
/// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
/// let (registry, arena) = (Registry::with_builtins(), Arena::new());
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let w = b.input(&[1]).unwrap();
/// let g = b.input(&[1]).unwrap();
/// let adamw = AdamW::new();
/// let step = adamw.step_inputs(&mut b).unwrap();
/// let (m, v) = adamw.update(&mut b, &step, w, g).unwrap();
/// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
/// let mut ws = plan.workspace().unwrap();
/// let mut w = Tensor::new(&[1], vec![1.0]).unwrap();
/// let (mut m, mut v) = (Tensor::new(&[1], vec![0.0]).unwrap(), Tensor::new(&[1], vec![0.0]).unwrap());
/// let mut g = Tensor::new(&[1], vec![0.5]).unwrap();
/// let [mut a, mut c, mut d] = adamw.step_values(1, 1e-3);
/// plan.run_updating(&mut ws, &mut [&mut w, &mut g, &mut a, &mut c, &mut d, &mut m, &mut v]).unwrap();
/// // The first step moves by about lr (sign of the gradient), after the decay lr * 0.01 * w.
/// assert!((w.to_f32_vec()[0] - (1.0 - 1e-5 - 1e-3)).abs() < 1e-6);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        Self::new()
    }
}

/// The per-run inputs of an [`AdamW`] step (each `f32[]`).
#[derive(Clone, Copy, Debug)]
pub struct AdamWInputs {
    /// The learning rate.
    pub lr: ValueId,
    /// `lr / (1 - beta1^t)`: the step size.
    pub step_size: ValueId,
    /// `1 / sqrt(1 - beta2^t)`.
    pub inverse_root_correction: ValueId,
    /// `lr * weight_decay` and the weight decay it was computed for, once per step for every
    /// parameter's decay (`None` without weight decay, or to have each update compute it). An
    /// update with another weight decay computes its own.
    pub decay: Option<(ValueId, f32)>,
}

impl AdamW {
    /// PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    pub fn new() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }

    /// The moments' decay rates.
    pub fn betas(self, beta1: f32, beta2: f32) -> Self {
        Self { beta1, beta2, ..self }
    }

    /// The term added to the denominator.
    pub fn eps(self, eps: f32) -> Self {
        Self { eps, ..self }
    }

    /// Decoupled weight decay.
    pub fn weight_decay(self, weight_decay: f32) -> Self {
        Self { weight_decay, ..self }
    }

    /// Checks the settings in `torch.optim.AdamW`'s ranges, and finite: each beta at least 0
    /// and below 1 (a beta of 1 makes the bias correction `1 - beta^t` zero, and the step
    /// infinite), eps and weight decay at least 0.
    ///
    /// ```
    /// use boundscope::optim::AdamW;
    /// assert!(AdamW::new().betas(0.0, 0.99).check().is_ok());
    /// let err = AdamW::new().betas(1.0, 0.999).check().unwrap_err();
    /// assert!(err.to_string().contains("AdamW's beta1 is 1"), "{err}");
    /// assert!(AdamW::new().eps(-1e-8).check().is_err() && AdamW::new().weight_decay(f32::NAN).check().is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidUpdate`] naming the setting out of its range, and the range.
    pub fn check(&self) -> Result<()> {
        let at_least_0 = |v: f32| v.is_finite() && v >= 0.0;
        let fraction = |v: f32| (0.0..1.0).contains(&v);
        setting("AdamW", "beta1", "betas", self.beta1, fraction(self.beta1), "at least 0 and below 1")?;
        setting("AdamW", "beta2", "betas", self.beta2, fraction(self.beta2), "at least 0 and below 1")?;
        setting("AdamW", "eps", "eps", self.eps, at_least_0(self.eps), "finite and at least 0")?;
        setting(
            "AdamW",
            "weight_decay",
            "weight_decay",
            self.weight_decay,
            at_least_0(self.weight_decay),
            "finite and at least 0",
        )
    }

    /// Adds the per-run inputs (learning rate, step size, inverse root correction: three
    /// `f32[]`, in that order), and with weight decay the op computing `lr * weight_decay`
    /// once for every parameter.
    ///
    /// # Errors
    /// What [`check`](Self::check) and [`TraceBuilder::input_with`] return.
    pub fn step_inputs(&self, b: &mut TraceBuilder<'_>) -> Result<AdamWInputs> {
        self.check()?;
        let (lr, step_size, inverse_root_correction) = (scalar_input(b)?, scalar_input(b)?, scalar_input(b)?);
        // Once per step, not per parameter: the updates then read only their own tensors and
        // these scalars, and an executor can run all of them in one launch (`Executor::joins`).
        let decay = if self.weight_decay == 0.0 {
            None
        } else {
            Some((b.mul_scalar(lr, self.weight_decay)?, self.weight_decay))
        };
        Ok(AdamWInputs { lr, step_size, inverse_root_correction, decay })
    }

    /// The values of the per-run inputs for step `step` (counted from 1) at learning rate `lr`,
    /// computed in `f64` as PyTorch computes them on the host.
    pub fn step_values(&self, step: u64, lr: f32) -> [Tensor; 3] {
        self.step_scalars(step, lr).map(scalar_tensor)
    }

    /// [`step_values`](Self::step_values) as numbers, to write into tensors a training loop
    /// keeps (no allocation).
    pub fn step_scalars(&self, step: u64, lr: f32) -> [f32; 3] {
        let t = step.max(1).min(i32::MAX as u64) as i32;
        let c1 = 1.0 - (self.beta1 as f64).powi(t);
        let c2 = 1.0 - (self.beta2 as f64).powi(t);
        [lr, (lr as f64 / c1) as f32, (1.0 / c2.sqrt()) as f32]
    }

    /// Binds the update of `param` from `grad`: adds its moments `m` and `v` (inputs of its
    /// shape and dtype, zeros at the start), declares all three updated in place, and returns
    /// the moments.
    ///
    /// # Errors
    /// [`Error::InvalidUpdate`] for settings out of range ([`check`](Self::check)), a gradient
    /// of another shape, a parameter that is not a float input or is updated already.
    pub fn update(
        &self,
        b: &mut TraceBuilder<'_>,
        inputs: &AdamWInputs,
        param: ValueId,
        grad: ValueId,
    ) -> Result<(ValueId, ValueId)> {
        self.check()?;
        check_pair(b, param, grad)?;
        let g = in_dtype_of(b, grad, param)?;
        let meta = TensorMeta::new(b.dtype(param)?, b.shape(param)?);
        let (m, v) = (b.input_with(&meta)?, b.input_with(&meta)?);
        // p (1 - lr wd); without weight decay p itself, as PyTorch's product by exactly 1 (no
        // op per parameter, and an infinite parameter stays one).
        let decayed = if self.weight_decay == 0.0 {
            param
        } else {
            let lr_wd = match inputs.decay {
                Some((decay, weight_decay)) if weight_decay == self.weight_decay => decay,
                _ => b.mul_scalar(inputs.lr, self.weight_decay)?,
            };
            let decay = b.mul(param, lr_wd)?;
            b.sub(param, decay)?
        };
        // m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
        let m_kept = b.mul_scalar(m, self.beta1)?;
        let m_new = b.mul_scalar(g, 1.0 - self.beta1)?;
        let m_next = b.add(m_kept, m_new)?;
        let g2 = b.mul(g, g)?;
        let v_kept = b.mul_scalar(v, self.beta2)?;
        let v_new = b.mul_scalar(g2, 1.0 - self.beta2)?;
        let v_next = b.add(v_kept, v_new)?;
        // p -= step_size m / (sqrt(v) / sqrt(1 - b2^t) + eps)
        let log_v = b.log(v_next)?;
        let half = b.mul_scalar(log_v, 0.5)?;
        let root = b.exp(half)?;
        let corrected = b.mul(root, inputs.inverse_root_correction)?;
        let denominator = b.add_scalar(corrected, self.eps)?;
        let scaled = b.mul(m_next, inputs.step_size)?;
        let step = b.div(scaled, denominator)?;
        let next = b.sub(decayed, step)?;
        b.update(m, m_next)?;
        b.update(v, v_next)?;
        b.update(param, next)?;
        Ok((m, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executors::CpuReference;
    use crate::{Arena, Plan, Registry};

    /// Ten AdamW steps against the same update written out in f64, PyTorch's formula.
    #[test]
    fn adamw_follows_pytorch_for_ten_steps() {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let (w, g) = (b.input(&[3]).unwrap(), b.input(&[3]).unwrap());
        let adamw = AdamW::new().betas(0.8, 0.95).eps(1e-6).weight_decay(0.1);
        let step = adamw.step_inputs(&mut b).unwrap();
        adamw.update(&mut b, &step, w, g).unwrap();
        let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
        let mut ws = plan.workspace().unwrap();
        let mut w_t = Tensor::new(&[3], vec![0.5, -1.0, 2.0]).unwrap();
        let (mut p, mut m, mut v) = ([0.5f64, -1.0, 2.0], [0.0f64; 3], [0.0f64; 3]);
        let zeros = || Tensor::new(&[3], vec![0.0; 3]).unwrap();
        let (mut m_t, mut v_t) = (zeros(), zeros());
        for t in 1..=10u64 {
            let grads = [0.3 * t as f64 - 1.0, 0.7, -0.2 * t as f64];
            let mut g_t = Tensor::new(&[3], grads.iter().map(|&x| x as f32).collect()).unwrap();
            let lr = 0.01 * (1.0 + t as f32 / 10.0); // a schedule: a per-run input
            let [mut a, mut c, mut d] = adamw.step_values(t, lr);
            plan.run_updating(&mut ws, &mut [&mut w_t, &mut g_t, &mut a, &mut c, &mut d, &mut m_t, &mut v_t]).unwrap();
            let lr = lr as f64;
            for i in 0..3 {
                p[i] *= 1.0 - lr * 0.1;
                m[i] = 0.8 * m[i] + 0.2 * grads[i];
                v[i] = 0.95 * v[i] + 0.05 * grads[i] * grads[i];
                let denom = v[i].sqrt() / (1.0 - 0.95f64.powi(t as i32)).sqrt() + 1e-6;
                p[i] -= lr / (1.0 - 0.8f64.powi(t as i32)) * m[i] / denom;
            }
        }
        for (got, want) in w_t.to_f32_vec().iter().zip(p) {
            assert!((*got as f64 - want).abs() < 1e-5, "{got} vs {want}");
        }
        for (got, want) in v_t.to_f32_vec().iter().zip(v) {
            assert!((*got as f64 - want).abs() < 1e-6 * (1.0 + want), "{got} vs {want}");
        }
    }

    /// Without weight decay the update has no decay ops and leaves an infinite parameter
    /// infinite, as PyTorch's product by exactly 1 does (`p - p * 0` would make it NaN).
    /// Parameter groups with their own weight decays may share one step's inputs: each update
    /// decays by its own, the product computed once per step serving only its own decay.
    #[test]
    fn adamw_groups_sharing_step_inputs_keep_their_own_weight_decay() {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let run = |shared: bool| -> f32 {
            let mut b = TraceBuilder::new(&arena, &registry);
            let (w, g) = (b.input(&[1]).unwrap(), b.input(&[1]).unwrap());
            let (strong, weak) = (AdamW::new().weight_decay(0.5), AdamW::new().weight_decay(0.01));
            let step = if shared { strong.step_inputs(&mut b) } else { weak.step_inputs(&mut b) }.unwrap();
            weak.update(&mut b, &step, w, g).unwrap();
            let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
            let mut ws = plan.workspace().unwrap();
            let (mut w, mut g) = (Tensor::new(&[1], vec![1.0]).unwrap(), Tensor::new(&[1], vec![0.5]).unwrap());
            let (mut m, mut v) = (Tensor::new(&[1], vec![0.0]).unwrap(), Tensor::new(&[1], vec![0.0]).unwrap());
            let [mut a, mut c, mut d] = weak.step_values(1, 0.1);
            plan.run_updating(&mut ws, &mut [&mut w, &mut g, &mut a, &mut c, &mut d, &mut m, &mut v]).unwrap();
            w.to_f32_vec()[0]
        };
        assert_eq!(run(true).to_bits(), run(false).to_bits());
    }

    #[test]
    fn adamw_without_weight_decay_leaves_the_decay_out() {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let count_muls = |weight_decay: f32| {
            let mut b = TraceBuilder::new(&arena, &registry);
            let (w, g) = (b.input(&[2]).unwrap(), b.input(&[2]).unwrap());
            let adamw = AdamW::new().weight_decay(weight_decay);
            let step = adamw.step_inputs(&mut b).unwrap();
            adamw.update(&mut b, &step, w, g).unwrap();
            let trace = b.finish().unwrap();
            let muls = trace.bound_symbols().iter().filter(|s| s.symbol() == super::super::prims::MUL).count();
            (muls, trace)
        };
        let ((with, _), (without, trace)) = (count_muls(0.01), count_muls(0.0));
        assert_eq!(with, without + 2, "lr * wd and p * (lr * wd) are gone");
        let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let mut ws = plan.workspace().unwrap();
        let mut w = Tensor::new(&[2], vec![f32::INFINITY, 1.0]).unwrap();
        let mut g = Tensor::new(&[2], vec![1.0, 1.0]).unwrap();
        let zeros = || Tensor::new(&[2], vec![0.0; 2]).unwrap();
        let (mut m, mut v) = (zeros(), zeros());
        let [mut a, mut c, mut d] = AdamW::new().weight_decay(0.0).step_values(1, 0.1);
        plan.run_updating(&mut ws, &mut [&mut w, &mut g, &mut a, &mut c, &mut d, &mut m, &mut v]).unwrap();
        let w = w.to_f32_vec();
        assert_eq!(w[0], f32::INFINITY);
        // One step of AdamW moves a parameter by about the learning rate.
        assert!((w[1] - 0.9).abs() < 1e-4, "{}", w[1]);
    }

    #[test]
    fn sgd_with_weight_decay_and_nesterov_follows_pytorch() {
        // PyTorch refuses Nesterov with dampening; so does this.
        {
            let (registry, arena) = (Registry::with_builtins(), Arena::new());
            let mut b = TraceBuilder::new(&arena, &registry);
            let (w, g) = (b.input(&[2]).unwrap(), b.input(&[2]).unwrap());
            let sgd = Sgd::new().momentum(0.5).dampening(0.25).nesterov(true);
            assert!(matches!(sgd.step_inputs(&mut b), Err(Error::InvalidUpdate { .. })));
            let inputs = Sgd::new().step_inputs(&mut b).unwrap();
            assert!(matches!(sgd.update(&mut b, &inputs, w, g), Err(Error::InvalidUpdate { .. })));
        }
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let (w, g) = (b.input(&[2]).unwrap(), b.input(&[2]).unwrap());
        let sgd = Sgd::new().momentum(0.5).weight_decay(0.1).nesterov(true);
        let inputs = sgd.step_inputs(&mut b).unwrap();
        sgd.update(&mut b, &inputs, w, g).unwrap();
        let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
        let mut ws = plan.workspace().unwrap();
        let (mut w_t, mut buf_t) =
            (Tensor::new(&[2], vec![1.0, -2.0]).unwrap(), Tensor::new(&[2], vec![0.0; 2]).unwrap());
        let (mut p, mut buf) = ([1.0f64, -2.0], [0.0f64; 2]);
        for t in 1..=5u64 {
            let grads = [0.5, -0.25 * t as f64];
            let mut g_t = Tensor::new(&[2], grads.iter().map(|&x| x as f32).collect()).unwrap();
            let [mut lr, mut factor] = sgd.step_values(t, 0.1);
            plan.run_updating(&mut ws, &mut [&mut w_t, &mut g_t, &mut lr, &mut factor, &mut buf_t]).unwrap();
            for i in 0..2 {
                let g = grads[i] + 0.1 * p[i];
                buf[i] = if t == 1 { g } else { 0.5 * buf[i] + g };
                p[i] -= 0.1 * (g + 0.5 * buf[i]);
            }
        }
        for (got, want) in w_t.to_f32_vec().iter().zip(p) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn bad_updates_are_typed_errors() {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let (w, g) = (b.input(&[2]).unwrap(), b.input(&[3]).unwrap());
        let sgd = Sgd::new();
        let inputs = sgd.step_inputs(&mut b).unwrap();
        assert!(matches!(sgd.update(&mut b, &inputs, w, g), Err(Error::InvalidUpdate { .. })));
        let g = b.input(&[2]).unwrap();
        sgd.update(&mut b, &inputs, w, g).unwrap();
        let err = sgd.update(&mut b, &inputs, w, g).unwrap_err();
        assert!(err.to_string().contains("updated already"), "{err}");
        let doubled = b.add(w, w).unwrap();
        assert!(matches!(b.update(doubled, w), Err(Error::InvalidUpdate { .. })), "not an input");
    }

    /// Each of `bad` (an optimizer and what its error says) refused by `check`, `step_inputs` and
    /// `update` alike, naming `name`'s setting, the builder still working after it.
    fn refuses_each<O: Optimizer<Inputs: std::fmt::Debug> + Default>(
        bad: impl IntoIterator<Item = (O, &'static str)>,
        name: &str,
        check: impl Fn(&O) -> Result<()>,
    ) {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        for (optimizer, what) in bad {
            let mut b = TraceBuilder::new(&arena, &registry);
            let (w, g) = (b.input(&[2]).unwrap(), b.input(&[2]).unwrap());
            for err in [check(&optimizer).unwrap_err(), optimizer.step_inputs(&mut b).unwrap_err()] {
                assert!(matches!(err, Error::InvalidUpdate { .. }), "{err:?}");
                assert!(err.to_string().contains(&format!("{name}'s {what}")), "{what}: {err}");
            }
            let inputs = O::default().step_inputs(&mut b).unwrap();
            assert!(optimizer.update(&mut b, &inputs, w, g).unwrap_err().to_string().contains(what));
            O::default().update(&mut b, &inputs, w, g).unwrap();
        }
    }

    /// Settings `torch.optim` refuses are typed errors naming the setting, from `check`,
    /// `step_inputs` and `update` alike (with a beta of 1 the step was infinite and the weights
    /// NaN; with a negative eps the step went the wrong way), and the builder keeps working.
    #[test]
    fn settings_out_of_range_are_typed_errors() {
        let bad_adamw = [
            (AdamW::new().betas(1.0, 0.999), "beta1 is 1"),
            (AdamW::new().betas(1.5, 0.999), "beta1 is 1.5"),
            (AdamW::new().betas(-0.1, 0.999), "beta1 is -0.1"),
            (AdamW::new().betas(0.9, 1.0), "beta2 is 1"),
            (AdamW::new().betas(f32::NAN, 0.999), "beta1 is NaN"),
            (AdamW::new().eps(-1.0), "eps is -1"),
            (AdamW::new().eps(f32::INFINITY), "eps is inf"),
            (AdamW::new().weight_decay(-0.01), "weight_decay is -0.01"),
            (AdamW::new().weight_decay(f32::NAN), "weight_decay is NaN"),
        ];
        refuses_each(bad_adamw, "AdamW", AdamW::check);
        let bad_sgd = [
            (Sgd::new().momentum(-1.0), "momentum is -1"),
            (Sgd::new().momentum(f32::NAN), "momentum is NaN"),
            (Sgd::new().dampening(f32::INFINITY), "dampening is inf"),
            (Sgd::new().weight_decay(-1.0), "weight_decay is -1"),
        ];
        refuses_each(bad_sgd, "SGD", Sgd::check);
        // The edges torch.optim accepts: betas of 0, eps and weight decay of 0, momentum above 1.
        assert!(AdamW::new().betas(0.0, 0.0).eps(0.0).weight_decay(0.0).check().is_ok());
        assert!(Sgd::new().momentum(1.5).dampening(-0.5).check().is_ok());
        let err = Sgd::new().nesterov(true).check().unwrap_err();
        assert!(err.to_string().contains("Nesterov"), "{err}");
    }
}
