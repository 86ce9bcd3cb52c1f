//! [`GradientBuckets`]: gradients reduced in buckets as the backward completes them (data
//! parallelism's `all_reduce`, overlapped with the rest of the backward, as PyTorch's DDP does).

use std::fmt;
use std::sync::Arc;

use crate::core::ir::{DType, TraceBuilder, ValueId};
use crate::error::{Error, Result};

/// Binds the start of one bucket's reduction: the bucket (the flat gradients, one after the
/// other) in, a value that stands for the reduction out.
pub type StartReduction = dyn for<'a> Fn(&mut TraceBuilder<'a>, ValueId) -> Result<ValueId> + Send + Sync;

/// Binds the end of one bucket's reduction, for one gradient in it: the value the start gave,
/// the bucket, the gradient's first value in the bucket and its shape in; the reduced gradient
/// (that part of the reduced bucket, in that shape) out.
pub type FinishReduction =
    dyn for<'a> Fn(&mut TraceBuilder<'a>, ValueId, ValueId, usize, &[usize]) -> Result<ValueId> + Send + Sync;

/// How [`Grad`](super::Grad) reduces gradients in buckets
/// ([`Grad::in_buckets`](super::Grad::in_buckets)): as the backward completes the gradients
/// (each once the backward of its parameter's first use has run, so in about the reverse order
/// of the forward), it flattens them into buckets of about `bytes` bytes per dtype and binds
/// `start` on each bucket as soon as it is full, right there in the backward, so the
/// reduction runs while the backward goes on; after the backward it binds `finish` for each
/// gradient of each bucket, in the order the buckets started, which gives the reduced gradient
/// (its part of the reduced bucket, in its parameter's shape). The ops sit in scopes
/// `backward.grad_sync`.
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
/// // Halve every gradient, a bucket at a time: start scales, finish adds nothing.
/// let halve = GradientBuckets::new(
///     1 << 20,
///     |b, bucket| b.mul_scalar(bucket, 0.5),
///     |b, started, _bucket, offset, shape| {
///         let part = b.narrow(started, 0, offset, shape.iter().product())?;
///         b.reshape(part, shape)
///     },
/// );
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
        finish: impl for<'a> Fn(&mut TraceBuilder<'a>, ValueId, ValueId, usize, &[usize]) -> Result<ValueId>
            + Send
            + Sync
            + 'static,
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

/// One bucket that was started: its gradients (their index among the parameters, and shape),
/// the bucket and what its start gave.
struct Started {
    members: Vec<(usize, Vec<usize>)>,
    bucket: ValueId,
    started: ValueId,
}

/// The gradients of one dtype waiting for their bucket to fill: the dtype, each gradient (its
/// parameter's index and value), and their bytes.
type Waiting = (DType, Vec<(usize, ValueId)>, usize);

/// The buckets of one backward as it is built: the gradients waiting per dtype, and the
/// buckets started.
pub(super) struct Bucketing<'g> {
    buckets: &'g GradientBuckets,
    waiting: Vec<Waiting>,
    started: Vec<Started>,
}

impl<'g> Bucketing<'g> {
    pub(super) fn new(buckets: &'g GradientBuckets) -> Self {
        Self { buckets, waiting: Vec::new(), started: Vec::new() }
    }

    /// Adds parameter `index`'s final gradient `grad`; a bucket that reaches the size is
    /// started (in the builder's current scope: the caller opens the sync scope).
    pub(super) fn add(&mut self, b: &mut TraceBuilder<'_>, index: usize, grad: ValueId) -> Result<bool> {
        let dtype = b.dtype(grad)?;
        let bytes = b.shape(grad)?.iter().product::<usize>() * dtype.size_bytes();
        let slot = match self.waiting.iter().position(|(d, ..)| *d == dtype) {
            Some(slot) => slot,
            None => {
                self.waiting.push((dtype, Vec::new(), 0));
                self.waiting.len() - 1
            }
        };
        let (_, grads, size) = &mut self.waiting[slot];
        grads.push((index, grad));
        *size += bytes;
        if *size < self.buckets.bytes {
            return Ok(false);
        }
        let full = std::mem::take(grads);
        *size = 0;
        self.start(b, full)?;
        Ok(true)
    }

    /// Starts the buckets not yet full.
    pub(super) fn flush(&mut self, b: &mut TraceBuilder<'_>) -> Result<()> {
        for slot in 0..self.waiting.len() {
            let grads = std::mem::take(&mut self.waiting[slot].1);
            self.waiting[slot].2 = 0;
            if !grads.is_empty() {
                self.start(b, grads)?;
            }
        }
        Ok(())
    }

    fn start(&mut self, b: &mut TraceBuilder<'_>, grads: Vec<(usize, ValueId)>) -> Result<()> {
        let mut flat = Vec::with_capacity(grads.len());
        let mut members = Vec::with_capacity(grads.len());
        for &(index, grad) in &grads {
            let shape = b.shape(grad)?.to_vec();
            let len = shape.iter().product::<usize>();
            flat.push(if shape.len() == 1 { grad } else { b.reshape(grad, &[len])? });
            members.push((index, shape));
        }
        let bucket = if flat.len() == 1 { flat[0] } else { b.concat(&flat, 0)? };
        let started = (self.buckets.start)(b, bucket)?;
        if b.shape(started)? != b.shape(bucket)? || b.dtype(started)? != b.dtype(bucket)? {
            return Err(Error::InvalidGradient {
                detail: "a gradient bucket's start gave a value of another shape or dtype than the bucket: \
                         return a value of the bucket's"
                    .into(),
            });
        }
        self.started.push(Started { members, bucket, started });
        Ok(())
    }

    /// Finishes every bucket, in the order they started, a gradient at a time: each parameter's
    /// reduced gradient, by its index (`None` for those never added).
    pub(super) fn finish(self, b: &mut TraceBuilder<'_>, parameters: usize) -> Result<Vec<Option<ValueId>>> {
        let mut grads = vec![None; parameters];
        for s in &self.started {
            let mut offset = 0;
            for (index, shape) in &s.members {
                let grad = (self.buckets.finish)(b, s.started, s.bucket, offset, shape)?;
                if b.shape(grad)? != shape.as_slice() {
                    return Err(Error::InvalidGradient {
                        detail: format!(
                            "a gradient bucket's finish gave a value of shape {:?} for a gradient of shape {shape:?}: \
                             return the reduced gradient in its shape",
                            b.shape(grad)?
                        ),
                    });
                }
                offset += shape.iter().product::<usize>();
                grads[*index] = Some(grad);
            }
        }
        Ok(grads)
    }
}
