//! What a collective does ([`Collective`], [`ReduceOp`]) and who runs it ([`Communicator`]).

use std::fmt;

use crate::error::Result;

/// How [`Collective::AllReduce`] and [`Collective::ReduceScatter`] combine the ranks' values,
/// element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum, added in rank order (so every rank gets the same bits).
    Sum,
    /// The sum divided by the world size (PyTorch's `ReduceOp.AVG`).
    Mean,
    /// The maximum (a NaN on any rank gives NaN).
    Max,
}

impl ReduceOp {
    /// Its name, as in the symbols' names (`sum`, `mean`, `max`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
        }
    }
}

/// One collective operation over the ranks of a communicator, on `f32` values. Shapes are the
/// bound symbols' (see [`Collectives`](super::Collectives)); a communicator sees flat buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank gets the combination of every rank's input (output as long as the input).
    AllReduce(ReduceOp),
    /// Every rank gets the ranks' inputs one after the other, rank 0 first (output `world`
    /// times as long as the input).
    AllGather,
    /// The combination of every rank's input, cut in `world` equal parts: rank `r` gets part
    /// `r` (output a `world`-th as long as the input).
    ReduceScatter(ReduceOp),
    /// Every rank gets rank `root`'s input.
    Broadcast {
        /// The rank whose input every rank gets.
        root: usize,
    },
}

impl Collective {
    /// The number of output values for `input` input values on `world` ranks, or why there is
    /// none.
    ///
    /// # Errors
    /// A `reduce_scatter` of a length `world` does not divide, or a broadcast root outside the
    /// world: a message naming the lengths (the caller wraps it in its error).
    pub fn output_len(self, input: usize, world: usize) -> std::result::Result<usize, String> {
        match self {
            Collective::AllReduce(_) => Ok(input),
            Collective::AllGather => Ok(input * world),
            Collective::ReduceScatter(_) if input.is_multiple_of(world.max(1)) => Ok(input / world.max(1)),
            Collective::ReduceScatter(_) => Err(format!(
                "reduce_scatter splits its input in {world} equal parts, one per rank, but {input} values do not \
                 divide by {world}: make the first axis a multiple of the world size"
            )),
            Collective::Broadcast { root } if root < world => Ok(input),
            Collective::Broadcast { root } => Err(format!(
                "broadcast from rank {root}, but the world has ranks 0 to {}: pass a root inside it",
                world.saturating_sub(1)
            )),
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Collective::AllReduce(op) => write!(f, "all_reduce({})", op.name()),
            Collective::AllGather => f.write_str("all_gather"),
            Collective::ReduceScatter(op) => write!(f, "reduce_scatter({})", op.name()),
            Collective::Broadcast { root } => write!(f, "broadcast(root {root})"),
        }
    }
}

/// A group of ranks that run collectives together: one object per rank, each used by that
/// rank's plans ([`CollectiveExecutor`](super::CollectiveExecutor)). Every rank must call
/// [`run`](Self::run) with the same collectives in the same order, as with NCCL and
/// `torch.distributed`.
///
/// [`InProcessGroup`](super::InProcessGroup) is one, for ranks that are threads of one process
/// (tests, and machines without several GPUs). Implement it for another transport (NCCL, MPI,
/// sockets); a failure must reach every rank as an error within a bounded time, never a hang.
pub trait Communicator: Send + Sync {
    /// Its name, for ranges and errors.
    fn name(&self) -> &str;

    /// This object's rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// Runs `collective` with this rank's `input`, writing this rank's `output`
    /// ([`Collective::output_len`] values). Blocks until the ranks it needs have taken part.
    ///
    /// # Errors
    /// [`Error::Collective`](crate::Error::Collective): the ranks disagree (the collective or
    /// the lengths), a rank did not arrive in time, or the group was aborted.
    fn run(&self, collective: Collective, input: &[f32], output: &mut [f32]) -> Result<()>;
}
