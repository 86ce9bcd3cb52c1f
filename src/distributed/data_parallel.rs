//! [`DataParallel`]: a training step's gradients averaged over the ranks, each reduction
//! started while the backward goes on.

use super::collectives::Collectives;
use super::communicator::ReduceOp;
use crate::core::passes::GradientBuckets;

/// Data parallelism, as PyTorch's `DistributedDataParallel`: each rank runs the same step on
/// its own part of the batch, and the gradients are averaged over the ranks (an `all_reduce`
/// mean) before the optimizer, so every rank makes the same update. Give it to
/// [`Grad::in_buckets`](crate::passes::Grad::in_buckets): the backward starts each gradient's
/// `all_reduce` ([`Collectives::all_reduce_start`]) as soon as the gradient is final, so that
/// on a GPU ([`NcclExecutor`](super::NcclExecutor)) the reduction runs on a stream of its own
/// (one per workspace) while the rest of the backward runs; before the optimizer the run waits
/// for them ([`Collectives::all_reduce_wait`]). Its ops sit in scopes `backward.grad_sync`, so
/// a profile shows them apart from the backward's kernels.
///
/// Unlike DDP, each gradient is its own collective: DDP's buckets exist to make fewer
/// collectives, and one NCCL launch per bucket (NCCL's grouped calls) is not built yet, so here
/// a bucket ([`bucket_bytes`](Self::bucket_bytes)) would only hold gradients back until it
/// fills. None by default.
///
/// The gradients are those of the mean of the ranks' losses; with the same initial parameters
/// on every rank, the parameters stay equal on every rank.
///
/// ```
/// use std::thread;
/// use boundscope::distributed::{CollectiveExecutor, Collectives, DataParallel, InProcessGroup};
/// use boundscope::executors::CpuReference;
/// use boundscope::optim::Sgd;
/// use boundscope::passes::Grad;
/// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
/// let mut registry = Registry::with_builtins();
/// let collectives = Collectives::register(&mut registry).unwrap();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let (w, x) = (b.input(&[1, 2]).unwrap(), b.input(&[1, 2]).unwrap());
/// let wx = b.mul(w, x).unwrap();
/// let loss = b.sum(wx).unwrap(); // w . x: its gradient is this rank's x
/// b.output(loss).unwrap();
/// let grad = Grad::new(&[w]).in_buckets(DataParallel::new(&collectives));
/// let step = grad.training_step(&b.finish().unwrap(), &arena, &Sgd::new()).unwrap();
/// let updated: Vec<Vec<f32>> = thread::scope(|s| {
///     let ranks = InProcessGroup::new("dp", 2).unwrap();
///     let (step, collectives) = (&step, &collectives);
///     let handles: Vec<_> = ranks.into_iter().enumerate().map(|(rank, comm)| {
///         s.spawn(move || {
///             let executors = [CollectiveExecutor::new(comm, collectives).shared(), CpuReference::shared()];
///             let plan = Plan::compile(&step.trace, &executors).unwrap();
///             let mut ws = plan.workspace().unwrap();
///             let mut w = Tensor::new(&[1, 2], vec![1.0, 1.0]).unwrap();
///             let mut x = Tensor::new(&[1, 2], vec![rank as f32 * 4.0, 2.0]).unwrap(); // [0, 2] and [4, 2]
///             let [mut lr, mut factor] = Sgd::new().step_values(1, 0.5);
///             plan.run_updating(&mut ws, &mut [&mut w, &mut x, &mut lr, &mut factor]).unwrap();
///             w.to_f32_vec()
///         })
///     }).collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// // Both ranks step by the mean gradient [2, 2]: w = 1 - 0.5 * 2.
/// assert_eq!(updated, vec![vec![0.0, 0.0], vec![0.0, 0.0]]);
/// ```
#[derive(Clone, Debug)]
pub struct DataParallel {
    collectives: Collectives,
    bytes: usize,
}

impl DataParallel {
    /// Averages gradients with the `all_reduce` of `collectives`, each started as soon as it
    /// is final.
    pub fn new(collectives: &Collectives) -> Self {
        Self { collectives: collectives.clone(), bytes: 0 }
    }

    /// Holds gradients back until they make `bytes` bytes, then starts their reductions
    /// together (each still its own collective; see the type's documentation). 0: none held.
    pub fn bucket_bytes(mut self, bytes: usize) -> Self {
        self.bytes = bytes;
        self
    }
}

impl From<DataParallel> for GradientBuckets {
    fn from(dp: DataParallel) -> Self {
        let (start, finish) = (dp.collectives.clone(), dp.collectives);
        GradientBuckets::new(
            dp.bytes,
            move |b, grad| start.all_reduce_start(b, grad, ReduceOp::Mean),
            move |b, started, grad| {
                let shape = b.shape(grad)?.to_vec();
                finish.all_reduce_wait(b, started, grad, 0, &shape)
            },
        )
    }
}
