//! [`InProcessGroup`]: a communicator whose ranks are threads of one process.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::communicator::{Collective, Communicator, ReduceOp};
use crate::error::{Error, Result};

/// How long a rank waits for the others by default before it reports them as failed or hung.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest a communicator waits (longer timeouts are taken as this).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The most ranks a group takes (2^20, past the largest clusters): a world size beyond it (a
/// typo in `WORLD_SIZE`) is refused with a typed error rather than allocated for.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// The error for a group of `world` ranks, 0 or past [`MAX_WORLD_SIZE`]; `None` for a size in
/// between.
pub(crate) fn world_size_refused(world: usize) -> Option<String> {
    if world == 0 {
        Some("a group of 0 ranks runs nothing: give it at least one".into())
    } else if world > MAX_WORLD_SIZE {
        Some(format!(
            "a group of {world} ranks is past the most a group takes ({MAX_WORLD_SIZE}): check the world size"
        ))
    } else {
        None
    }
}

/// A communicator for ranks that are threads of one process: the same semantics as NCCL's
/// collectives (every rank gets the same bits, combined in rank order), for tests of sharded
/// programs on a machine without several GPUs and for CPU-only data parallelism.
///
/// [`new`](Self::new) gives one handle per rank; give each to its thread. A collective that
/// the ranks disagree on (another op, another length, another root) fails on every rank with
/// [`Error::Collective`] naming what each rank asked for; a rank that does not arrive within the
/// timeout makes the ranks waiting for it fail, and the group stays aborted (every later
/// collective fails at once), as NCCL's abort does. Nothing hangs.
///
/// Buffers are kept and reused: once the largest collective has run, collectives allocate
/// nothing.
///
/// ```
/// use std::thread;
/// use boundscope::distributed::{Collective, Communicator, InProcessGroup, ReduceOp};
/// let ranks = InProcessGroup::new("pair", 2).unwrap();
/// let sums: Vec<Vec<f32>> = thread::scope(|s| {
///     let handles: Vec<_> = ranks
///         .iter()
///         .map(|comm| {
///             s.spawn(move || {
///                 let mine = [comm.rank() as f32 + 1.0; 3];
///                 let mut out = [0.0; 3];
///                 comm.run(Collective::AllReduce(ReduceOp::Sum), &mine, &mut out).unwrap();
///                 out.to_vec()
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]);
/// ```
pub struct InProcessGroup {
    shared: Arc<Shared>,
    rank: usize,
}

struct Shared {
    name: String,
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

/// One collective at a time: ranks deposit their inputs (`Collecting`), the last to arrive
/// combines them into `result` (`Distributing`), each copies its part out, and the last to
/// leave opens the next collective.
struct State {
    collecting: bool,
    /// Collectives completed; a rank waits on the one it joined.
    generation: u64,
    arrived: usize,
    departed: usize,
    inputs: Vec<Vec<f32>>,
    /// What each rank asked for, in this collective.
    asked: Vec<Option<(Collective, usize)>>,
    result: Vec<f32>,
    /// Why a rank could not run this collective (its output's length, a length the world
    /// does not divide), per rank.
    refused: Vec<Option<String>>,
    /// Set when the ranks disagreed in this collective (every rank returns it).
    mismatch: Option<String>,
    /// Set for good when a rank timed out: the group is aborted.
    aborted: Option<String>,
}

impl InProcessGroup {
    /// `world` handles of a new group named `name`, rank 0 first, with the default timeout
    /// ([`DEFAULT_TIMEOUT`]).
    ///
    /// # Errors
    /// [`Error::Collective`] for a world of 0 ranks or past [`MAX_WORLD_SIZE`].
    pub fn new(name: impl Into<String>, world: usize) -> Result<Vec<InProcessGroup>> {
        Self::with_timeout(name, world, DEFAULT_TIMEOUT)
    }

    /// [`new`](Self::new), with a rank waiting at most `timeout` for the others in a collective
    /// (1 ms to [`MAX_TIMEOUT`]: `Duration::MAX` waits a year).
    ///
    /// # Errors
    /// [`Error::Collective`] for a world of 0 ranks or past [`MAX_WORLD_SIZE`].
    pub fn with_timeout(name: impl Into<String>, world: usize, timeout: Duration) -> Result<Vec<InProcessGroup>> {
        let name = name.into();
        if let Some(detail) = world_size_refused(world) {
            return Err(Error::Collective { communicator: name, rank: 0, detail });
        }
        let state = State {
            collecting: true,
            generation: 0,
            arrived: 0,
            departed: 0,
            inputs: vec![Vec::new(); world],
            asked: vec![None; world],
            refused: vec![None; world],
            result: Vec::new(),
            mismatch: None,
            aborted: None,
        };
        let timeout = timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT);
        let shared = Arc::new(Shared { name, world, timeout, state: Mutex::new(state), changed: Condvar::new() });
        Ok((0..world).map(|rank| InProcessGroup { shared: shared.clone(), rank }).collect())
    }

    fn error(&self, detail: String) -> Error {
        Error::Collective { communicator: self.shared.name.clone(), rank: self.rank, detail }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left the state as consistent as each
        // step leaves it; the others go on (and time out if it never comes back).
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits while `blocked` holds, at most until `deadline`; on timeout aborts the group with
    /// a message saying which ranks it was waiting for.
    fn wait<'g>(
        &self,
        mut state: MutexGuard<'g, State>,
        deadline: Instant,
        what: Collective,
        blocked: impl Fn(&State) -> bool,
    ) -> Result<MutexGuard<'g, State>> {
        while blocked(&state) {
            if let Some(reason) = &state.aborted {
                return Err(self.error(reason.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..self.shared.world).filter(|&r| state.asked[r].is_none()).collect();
                let whom = if state.collecting {
                    format!("for ranks {missing:?}, which did not arrive")
                } else {
                    "for the ranks of the collective before to take their results, which they did not".to_string()
                };
                let reason = format!(
                    "rank {} waited {:?} in {what} (collective #{}) {whom}: they failed or hang; the group is \
                     aborted, make a new one (every rank must run the same collectives in the same order)",
                    self.rank, self.shared.timeout, state.generation
                );
                state.aborted = Some(reason.clone());
                self.shared.changed.notify_all();
                return Err(self.error(reason));
            }
            state = self.shared.changed.wait_timeout(state, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        Ok(state)
    }
}

impl Communicator for InProcessGroup {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn run(&self, collective: Collective, input: &[f32], output: &mut [f32]) -> Result<()> {
        let world = self.shared.world;
        // What this rank cannot run still takes part, so that the others learn it at once.
        let refused = local_refusal(collective, input.len(), output.len(), world);
        let expected = output.len();
        let deadline = Instant::now() + self.shared.timeout;
        // Wait for the previous collective to be drained, then deposit.
        let state = self.lock();
        if let Some(reason) = &state.aborted {
            return Err(self.error(reason.clone()));
        }
        let mut state = self.wait(state, deadline, collective, |s| !s.collecting)?;
        let generation = state.generation;
        let slot = &mut state.inputs[self.rank];
        slot.clear();
        if refused.is_none() {
            slot.extend_from_slice(input);
        }
        state.asked[self.rank] = Some((collective, input.len()));
        state.refused[self.rank] = refused;
        state.arrived += 1;
        if state.arrived == world {
            combine(&mut state, world);
            state.collecting = false;
            self.shared.changed.notify_all();
        }
        let mut state = self.wait(state, deadline, collective, |s| s.collecting && s.generation == generation)?;
        let outcome = match &state.mismatch {
            Some(m) => Err(self.error(m.clone())),
            None => {
                let from = match collective {
                    Collective::ReduceScatter(_) => self.rank * expected,
                    _ => 0,
                };
                output.copy_from_slice(&state.result[from..from + expected]);
                Ok(())
            }
        };
        state.departed += 1;
        if state.departed == world {
            state.arrived = 0;
            state.departed = 0;
            state.asked.iter_mut().for_each(|a| *a = None);
            state.refused.iter_mut().for_each(|r| *r = None);
            state.mismatch = None;
            state.generation += 1;
            state.collecting = true;
            self.shared.changed.notify_all();
        }
        outcome
    }
}

/// Combines the deposited inputs into `state.result`, in rank order, or records why the ranks
/// disagree.
fn combine(state: &mut State, world: usize) {
    state.mismatch = disagreement(&state.asked, &state.refused);
    if state.mismatch.is_some() {
        return;
    }
    let first = state.asked[0];
    let Some((collective, _)) = first else { return };
    let State { inputs, result, .. } = state;
    combine_in_rank_order(collective, &inputs[..world], result);
}

/// `collective` of the ranks' `inputs` (rank 0 first) into `result` (cleared first; for
/// `reduce_scatter`, every rank's part, rank 0's first): combined in rank order, so every
/// transport gives the same bits.
pub(super) fn combine_in_rank_order(collective: Collective, inputs: &[Vec<f32>], result: &mut Vec<f32>) {
    result.clear();
    match collective {
        Collective::AllReduce(op) | Collective::ReduceScatter(op) => {
            result.extend_from_slice(&inputs[0]);
            for other in &inputs[1..] {
                for (r, &v) in result.iter_mut().zip(other) {
                    *r = match op {
                        ReduceOp::Sum | ReduceOp::Mean => *r + v,
                        ReduceOp::Max if r.is_nan() || *r > v => *r,
                        ReduceOp::Max => v,
                    };
                }
            }
            if op == ReduceOp::Mean {
                let ranks = inputs.len() as f32;
                result.iter_mut().for_each(|r| *r /= ranks);
            }
        }
        Collective::AllGather => inputs.iter().for_each(|i| result.extend_from_slice(i)),
        Collective::Broadcast { root } => result.extend_from_slice(&inputs[root]),
    }
}

/// Why this rank cannot run `collective` of `input` values into `output` values on `world`
/// ranks, if it cannot.
pub(super) fn local_refusal(collective: Collective, input: usize, output: usize, world: usize) -> Option<String> {
    match collective.output_len(input, world) {
        Err(e) => Some(e),
        Ok(expected) if expected != output => {
            Some(format!("{collective} of {input} values writes {expected}, but the output holds {output}"))
        }
        Ok(_) => None,
    }
}

/// Why the ranks cannot combine what they asked for (`asked`, per rank, with what each could
/// not run, `refused`), if they cannot: every transport reports it alike. Allocates only when
/// they cannot.
pub(super) fn disagreement(asked: &[Option<(Collective, usize)>], refused: &[Option<String>]) -> Option<String> {
    if refused.iter().any(Option::is_some) {
        let each: Vec<String> =
            refused.iter().enumerate().filter_map(|(r, e)| e.as_ref().map(|e| format!("rank {r}: {e}"))).collect();
        return Some(format!("a rank could not run this collective ({})", each.join("; ")));
    }
    if asked.iter().all(|a| *a == asked[0]) {
        return None;
    }
    let each: Vec<String> = asked
        .iter()
        .enumerate()
        .map(|(r, a)| match a {
            Some((c, n)) => format!("rank {r}: {c} of {n} values"),
            None => format!("rank {r}: nothing"),
        })
        .collect();
    Some(format!(
        "the ranks ran different collectives ({}): every rank must run the same collectives, of the same shapes, \
         in the same order",
        each.join(", ")
    ))
}
