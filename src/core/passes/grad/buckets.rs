//! [`GradientBuckets`]: gradients reduced in buckets as the backward completes them (data
//! parallelism's `all_reduce`, overlapped with the rest of the backward, as PyTorch's DDP does).

use std::fmt;
use std::sync::Arc;

use crate::core::ir::{TraceBuilder, ValueId};
use crate::error::{Error, Result};

/// Binds the start of one gradient's reduction: the gradient in, a value of its shape and
/// dtype that stands for the reduction out.
pub type StartReduction = dyn for<'a> Fn(&mut TraceBuilder<'a>, ValueId) -> Result<ValueId> + Send + Sync;

/// Binds the end of one gradient's reduction: the value the start gave and the gradient in,
/// the reduced gradient (of the gradient's shape) out.
pub type FinishReduction = dyn for<'a> Fn(&mut TraceBuilder<'a>, ValueId, ValueId) -> Result<ValueId> + Send + Sync;

/// How [`Grad`](super::Grad) reduces gradients in buckets
/// ([`Grad::in_buckets`](super::Grad::in_buckets)), as PyTorch's DDP does: as the backward
/// completes the gradients (each once the backward of its parameter's first use has run, so in
/// about the reverse order of the forward), it gathers them into a bucket until it holds about
/// `bytes` bytes, and then binds `start` on each of them, right there in the backward, so their
/// reductions run while the backward goes on; after the backward it binds `finish` on each, in
/// the order they started, which gives the reduced gradient the optimizer takes. The ops sit in
/// scopes `backward.grad_sync`. A bucket's gradients are not copied into one buffer: each is
/// reduced where the backward left it (a bucket only says when their reductions start; with
/// `bytes` 0 each starts as soon as it is final).
///
/// `distributed::DataParallel` makes the buckets of an `all_reduce` mean over the ranks (the
/// gradients of the mean of the ranks' losses); any pair of ops of yours will do:
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::passes::{Grad, GradientBuckets, Pass};
/// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
/// let (registry, arena) = (Registry::with_builtins(), Arena::new());
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let (w1, w2) = (b.input(&[3]).unwrap(), b.input(&[2, 2]).unwrap());
/// let (s1, s2) = (b.mul(w1, w1).unwrap(), b.mul(w2, w2).unwrap());
/// let (l1, l2) = (b.sum(s1).unwrap(), b.sum(s2).unwrap());
/// let l2 = b.reshape(l2, &[1, 2]).unwrap();
/// let l2 = b.sum(l2).unwrap();
/// let loss = b.add(l1, l2).unwrap(); // |w1|^2 + |w2|^2
/// b.output(loss).unwrap();
/// let trace = b.finish().unwrap();
/// // Halve every gradient: the start scales, the finish adds nothing.
/// let halve = GradientBuckets::new(1 << 20, |b, g| b.mul_scalar(g, 0.5), |b, started, _g| b.add_scalar(started, 0.0));
/// let grads = Grad::new(&[w1, w2]).in_buckets(halve).run(&trace, &arena).unwrap();
/// assert!(grads.scopes().iter().any(|s| s.path() == "backward.grad_sync"));
/// let plan = Plan::compile(&grads, &[CpuReference::shared()]).unwrap();
/// let (w1, w2) = (Tensor::new(&[3], vec![1.0, 2.0, 3.0]).unwrap(), Tensor::new(&[2, 2], vec![1.0; 4]).unwrap());
/// let out = plan.run(&[&w1, &w2]).unwrap();
/// assert_eq!(out[1].to_f32_vec(), [1.0, 2.0, 3.0]); // half of 2 w1
/// assert_eq!((out[2].shape(), out[2].to_f32_vec()), (&[2, 2][..], vec![1.0; 4]));
/// ```
#[derive(Clone)]
pub struct GradientBuckets {
    bytes: usize,
    start: Arc<StartReduction>,
    finish: Arc<FinishReduction>,
}

/// The scope (under [`BACKWARD_SCOPE`](super::BACKWARD_SCOPE)) that holds the buckets' ops.
pub const GRAD_SYNC_SCOPE: &str = "grad_sync";

impl GradientBuckets {
    /// Buckets of about `bytes` bytes (at least one gradient each), reduced by `start` and
    /// `finish`.
    pub fn new(
        bytes: usize,
        start: impl for<'a> Fn(&mut TraceBuilder<'a>, ValueId) -> Result<ValueId> + Send + Sync + 'static,
        finish: impl for<'a> Fn(&mut TraceBuilder<'a>, ValueId, ValueId) -> Result<ValueId> + Send + Sync + 'static,
    ) -> Self {
        Self { bytes, start: Arc::new(start), finish: Arc::new(finish) }
    }

    /// The size it fills buckets to, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl fmt::Debug for GradientBuckets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GradientBuckets").field("bytes", &self.bytes).finish_non_exhaustive()
    }
}

/// One gradient whose reduction started: its parameter's index, the gradient and what its
/// start gave.
struct Started {
    index: usize,
    grad: ValueId,
    started: ValueId,
}

/// The buckets of one backward as it is built: the gradients waiting for their bucket to
/// fill (each with its parameter's index), their bytes, and the reductions started.
pub(super) struct Bucketing<'g> {
    buckets: &'g GradientBuckets,
    waiting: Vec<(usize, ValueId)>,
    bytes: usize,
    started: Vec<Started>,
}

impl<'g> Bucketing<'g> {
    pub(super) fn new(buckets: &'g GradientBuckets) -> Self {
        Self { buckets, waiting: Vec::new(), bytes: 0, started: Vec::new() }
    }

    /// Adds parameter `index`'s final gradient `grad`; a bucket that reaches the size is
    /// started (in the builder's current scope: the caller opens the sync scope).
    pub(super) fn add(&mut self, b: &mut TraceBuilder<'_>, index: usize, grad: ValueId) -> Result<()> {
        self.bytes += b.shape(grad)?.iter().product::<usize>() * b.dtype(grad)?.size_bytes();
        self.waiting.push((index, grad));
        if self.bytes >= self.buckets.bytes {
            self.flush(b)?;
        }
        Ok(())
    }

    /// Starts the bucket, full or not.
    pub(super) fn flush(&mut self, b: &mut TraceBuilder<'_>) -> Result<()> {
        self.bytes = 0;
        for (index, grad) in std::mem::take(&mut self.waiting) {
            let started = (self.buckets.start)(b, grad)?;
            if b.shape(started)? != b.shape(grad)? || b.dtype(started)? != b.dtype(grad)? {
                return Err(Error::InvalidGradient {
                    detail: "a gradient bucket's start gave a value of another shape or dtype than the gradient: \
                             return a value of the gradient's"
                        .into(),
                });
            }
            self.started.push(Started { index, grad, started });
        }
        Ok(())
    }

    /// Finishes every reduction, in the order they started: each parameter's reduced gradient,
    /// by its index (`None` for those never added).
    pub(super) fn finish(self, b: &mut TraceBuilder<'_>, parameters: usize) -> Result<Vec<Option<ValueId>>> {
        let mut grads = vec![None; parameters];
        for s in &self.started {
            let reduced = (self.buckets.finish)(b, s.started, s.grad)?;
            if b.shape(reduced)? != b.shape(s.grad)? || b.dtype(reduced)? != b.dtype(s.grad)? {
                return Err(Error::InvalidGradient {
                    detail: format!(
                        "a gradient bucket's finish gave a value of shape {:?} for a gradient of shape {:?}: return \
                         the reduced gradient in its shape",
                        b.shape(reduced)?,
                        b.shape(s.grad)?
                    ),
                });
            }
            grads[s.index] = Some(reduced);
        }
        Ok(grads)
    }
}
