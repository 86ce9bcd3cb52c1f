//! Several ranks (processes or threads, one per device) running one program together: the
//! collectives `all_reduce`, `all_gather`, `reduce_scatter` and `broadcast` as bound symbols
//! ([`Collectives`]), run by an executor ([`CollectiveExecutor`]) on a rank's
//! [`Communicator`], with an op range around each in its own NVTX domain, listed in the plan's
//! range map like any executor's.
//!
//! On GPUs, [`NcclExecutor`] runs them through NCCL ([`NcclCommunicator`], one per rank and
//! GPU) on device buffers, in `f32`, bf16 and f16: on the run's stream, except a started
//! `all_reduce`, which runs on a stream of the workspace's own until its wait.
//!
//! On the host, a communicator is the transport: [`InProcessGroup`] runs ranks that are threads of one
//! process, [`TcpGroup`] ranks that are processes (each connected to rank 0, the rendezvous
//! `torchrun`'s `MASTER_ADDR` and `MASTER_PORT` name; [`RankEnv`] reads them), both with NCCL's
//! semantics: results combined in rank order, the same bits on every rank; ranks that disagree
//! or cannot run a collective, and ranks that fail or hang, are typed errors on every rank
//! (within the timeout, or for a `TcpGroup` rank that already had its result, at its next
//! collective), never a hang. Implement [`Communicator`] for another transport.
//! `examples/ranks.rs` starts N processes, as `torchrun` does, and runs a tensor-parallel block
//! on them.
//!
//! Sharding a model is building each rank's trace with the collectives where the shards meet:
//! a Megatron-style MLP block splits the first product's weight by columns and the second's by
//! rows, and sums the partial results with one `all_reduce` (the crate's tests check that
//! block against the unsharded one on 2 and 4 ranks). Data parallelism is
//! [`DataParallel`] on the training step's [`Grad`](crate::passes::Grad): gradients averaged
//! by `all_reduce`s that start during the backward
//! ([`Collectives::all_reduce_start`], [`Collectives::all_reduce_wait`]). `examples/gpt2.rs
//! --ranks N` trains GPT-2 so, one process per GPU (or on the CPU over TCP).
//!
//! # Measured, and what waits for a two-GPU machine
//! On the H200, with NCCL 2.28 on a world of one (NCCL refuses two ranks on one GPU), every
//! collective in every dtype equals the host executor with host tensors, device tensors and in
//! a graph (`proptests/nccl_collectives.rs`), and a data-parallel step equals the plain one
//! (GPT-2's bf16 step 1.01-1.02x slower on one rank: NCCL's copy of each gradient).
//! Not yet measured, for want of a machine with two GPUs: `all_reduce`'s bus bandwidth at 256 MiB against
//! `torch.distributed.all_reduce` (`ranks --world 2 --nccl --bench` beside `torchrun
//! --nproc_per_node 2 scripts/torch_all_reduce.py`), the tensor-parallel block's time on two
//! GPUs against one (the same run), GPT-2's data-parallel tokens per second on two GPUs
//! against one (`gpt2 --ranks 2 --config 124m --batch 8 --tokens 1024 --device cuda --dtype
//! bf16 --train-steps 2 --bench` against `--ranks 1`), and whether the buckets' `all_reduce`
//! overlaps the backward there (Nsight Systems on the ranks' streams, named `rank <r> ...`).
//! A rank whose peers do not join, or whose collective does not end in time
//! ([`NcclCommunicator::watch`], a watchdog thread), aborts its communicator and gets an
//! [`Error::Collective`](crate::Error::Collective) instead of hanging; both are tested on one
//! GPU (a world of two that one rank joins; a timeout shorter than a queued product). That a
//! dead peer on another GPU is found so waits for the two-GPU machine too.

mod collectives;
mod communicator;
mod data_parallel;
mod in_process;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(feature = "cuda")]
mod nccl_watchdog;
mod rank_env;
mod tcp;
#[cfg(test)]
mod tests;

pub use collectives::{CollectiveExecutor, Collectives};
pub use communicator::{Collective, Communicator, ReduceOp};
pub use data_parallel::DataParallel;
pub use in_process::{InProcessGroup, DEFAULT_TIMEOUT, MAX_TIMEOUT, MAX_WORLD_SIZE};
#[cfg(feature = "cuda")]
pub use nccl::{NcclCommunicator, NcclExecutor, NcclId};
pub use rank_env::RankEnv;
pub use tcp::TcpGroup;
