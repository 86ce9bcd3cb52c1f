//! [`TcpGroup`]: a communicator whose ranks are processes, each connected to rank 0 over TCP.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::communicator::{Collective, Communicator, ReduceOp};
use super::in_process::{combine_in_rank_order, disagreement, local_refusal, world_size_refused, MAX_TIMEOUT};
use super::rank_env::RankEnv;
use crate::error::{Error, Result};

/// The first bytes a joining rank sends ("bsc1").
const MAGIC: u32 = 0x6273_6331;

/// The longest message (an error's text) a rank sends or reads; longer ones are cut.
const MAX_MESSAGE: usize = 1 << 16;

/// A communicator for ranks that are processes (one per GPU, as `torchrun` starts them, or CPU
/// processes): every rank connects to rank 0, which combines the ranks' values in rank order
/// (the same bits as [`InProcessGroup`](super::InProcessGroup)) and sends each its result. It
/// is the rendezvous and the CPU transport; an NCCL communicator would take its unique id
/// through it.
///
/// A rank that does not answer within the timeout aborts the group: rank 0 closes the
/// connections, so every rank waiting in that collective gets [`Error::Collective`] at once,
/// and a rank that had already received its result gets it at its next collective (rank 0
/// sends results rank by rank). Ranks that disagree on a collective, or cannot run it, all get
/// an error naming what each asked for, and the group goes on. Buffers are kept: once warm,
/// collectives allocate nothing.
///
/// ```
/// use std::net::TcpListener;
/// use std::time::Duration;
/// use boundscope::distributed::{Collective, Communicator, ReduceOp, TcpGroup};
/// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// let address = listener.local_addr().unwrap().to_string();
/// let timeout = Duration::from_secs(10);
/// let joiner = std::thread::spawn(move || {
///     let rank1 = TcpGroup::join("pair", &address, 1, 2, timeout).unwrap();
///     let mut out = [0.0; 2];
///     rank1.run(Collective::AllReduce(ReduceOp::Max), &[5.0, -1.0], &mut out).unwrap();
///     out
/// });
/// let rank0 = TcpGroup::serve("pair", listener, 2, timeout).unwrap();
/// let mut out = [0.0; 2];
/// rank0.run(Collective::AllReduce(ReduceOp::Max), &[1.0, 3.0], &mut out).unwrap();
/// assert_eq!(out, [5.0, 3.0]);
/// assert_eq!(joiner.join().unwrap(), [5.0, 3.0]);
/// ```
pub struct TcpGroup {
    name: String,
    rank: usize,
    world: usize,
    timeout: Duration,
    state: Mutex<Links>,
}

struct Links {
    /// Rank 0: the stream of rank `r` at `r - 1`; another rank: its stream to rank 0.
    peers: Vec<TcpStream>,
    /// One message's bytes, kept.
    bytes: Vec<u8>,
    /// Rank 0: each rank's input and what it asked for, kept.
    inputs: Vec<Vec<f32>>,
    asked: Vec<Option<(Collective, usize)>>,
    /// Rank 0: why each rank could not run this collective, if it could not.
    refusals: Vec<Option<String>>,
    result: Vec<f32>,
    aborted: Option<String>,
}

impl TcpGroup {
    /// Rank 0 of a group of `world` ranks: accepts the other ranks on `listener`, each saying
    /// its rank and the world size it expects, within `timeout` (also each collective's limit;
    /// 1 ms to [`MAX_TIMEOUT`]).
    ///
    /// # Errors
    /// [`Error::Collective`]: a rank did not connect in time, a connection that is not a rank
    /// of this group (another world size, a rank twice), or the listener failed.
    pub fn serve(name: impl Into<String>, listener: TcpListener, world: usize, timeout: Duration) -> Result<Self> {
        let name = name.into();
        let timeout = timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT);
        let fail = |detail: String| Error::Collective { communicator: name.clone(), rank: 0, detail };
        if let Some(detail) = world_size_refused(world) {
            return Err(fail(detail));
        }
        let deadline = Instant::now() + timeout;
        listener.set_nonblocking(true).map_err(|e| fail(format!("the listener: {e}")))?;
        let mut joined: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        while joined.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false).map_err(|e| fail(format!("a connection: {e}")))?;
                    configure(&stream, timeout).map_err(|e| fail(format!("a connection: {e}")))?;
                    // A connection that does not greet as a rank in time (a stray client, another
                    // job on the same port) is dropped; the ranks may still come.
                    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                    let mut hello = [0u8; 12];
                    if stream.set_read_timeout(Some(left)).and_then(|()| stream.read_exact(&mut hello)).is_err() {
                        continue;
                    }
                    let word = |i: usize| u32::from_le_bytes(hello[4 * i..4 * i + 4].try_into().unwrap_or([0; 4]));
                    let (magic, rank, their_world) = (word(0), word(1) as usize, word(2) as usize);
                    let refuse = |stream: &mut TcpStream, why: String| {
                        let _ = stream.write_all(&[1]);
                        fail(why)
                    };
                    if magic != MAGIC {
                        continue;
                    }
                    stream.set_read_timeout(Some(timeout)).map_err(|e| fail(format!("a connection: {e}")))?;
                    if their_world != world || rank == 0 || rank >= world || joined[rank - 1].is_some() {
                        return Err(refuse(
                            &mut stream,
                            format!(
                                "rank {rank} joined expecting {their_world} ranks, but this group has {world} (ranks \
                                 1 to {} join rank 0, each once): start every rank with the same WORLD_SIZE",
                                world - 1
                            ),
                        ));
                    }
                    stream.write_all(&[0]).map_err(|e| fail(format!("rank {rank}: {e}")))?;
                    joined[rank - 1] = Some(stream);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> = (1..world).filter(|r| joined[r - 1].is_none()).collect();
                        return Err(fail(format!(
                            "ranks {missing:?} did not connect within {timeout:?}: start them, with this address \
                             as MASTER_ADDR and MASTER_PORT"
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(fail(format!("the listener: {e}"))),
            }
        }
        let peers = joined.into_iter().flatten().collect();
        Ok(Self::with_links(name, 0, world, timeout, peers))
    }

    /// Rank `rank` (1 or more) of a group of `world` ranks: connects to rank 0 at `address`,
    /// trying again until `timeout` (rank 0 may start later).
    ///
    /// # Errors
    /// [`Error::Collective`]: rank 0 was not reached in time, or refused this rank.
    pub fn join(name: impl Into<String>, address: &str, rank: usize, world: usize, timeout: Duration) -> Result<Self> {
        let name = name.into();
        let timeout = timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT);
        let fail = |detail: String| Error::Collective { communicator: name.clone(), rank, detail };
        if let Some(detail) = world_size_refused(world) {
            return Err(fail(detail));
        }
        if rank == 0 || rank >= world {
            return Err(fail(format!("joining ranks are 1 to {}, not {rank}", world.saturating_sub(1))));
        }
        let deadline = Instant::now() + timeout;
        let mut stream = loop {
            let addresses =
                address.to_socket_addrs().map_err(|e| fail(format!("rank 0's address `{address}`: {e}")))?;
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let tried = addresses.into_iter().find_map(|a| TcpStream::connect_timeout(&a, left).ok());
            match tried {
                Some(stream) => break stream,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                None => return Err(fail(format!("rank 0 at `{address}` did not accept within {timeout:?}"))),
            }
        };
        configure(&stream, timeout).map_err(|e| fail(format!("the connection: {e}")))?;
        let mut hello = Vec::with_capacity(12);
        for word in [MAGIC, rank as u32, world as u32] {
            hello.extend_from_slice(&word.to_le_bytes());
        }
        stream.write_all(&hello).map_err(|e| fail(format!("greeting rank 0: {e}")))?;
        let mut answer = [1u8];
        stream.read_exact(&mut answer).map_err(|e| fail(format!("rank 0's answer: {e}")))?;
        if answer[0] != 0 {
            return Err(fail(
                "rank 0 refused this rank (see rank 0's error: another world size, or this rank twice)".into(),
            ));
        }
        Ok(Self::with_links(name, rank, world, timeout, vec![stream]))
    }

    /// The rank `env` describes: rank 0 listens on `env.master` and serves, the others join it.
    ///
    /// # Errors
    /// As [`serve`](Self::serve) and [`join`](Self::join), and an address rank 0 cannot bind.
    pub fn from_rank_env(name: impl Into<String>, env: &RankEnv, timeout: Duration) -> Result<Self> {
        let name = name.into();
        if env.rank > 0 {
            return Self::join(name, &env.master, env.rank, env.world_size, timeout);
        }
        let listener = TcpListener::bind(&env.master).map_err(|e| Error::Collective {
            communicator: name.clone(),
            rank: 0,
            detail: format!("binding `{}`: {e}; set MASTER_PORT to a free port", env.master),
        })?;
        Self::serve(name, listener, env.world_size, timeout)
    }

    fn with_links(name: String, rank: usize, world: usize, timeout: Duration, peers: Vec<TcpStream>) -> Self {
        let timeout = timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT);
        let links = Links {
            peers,
            bytes: Vec::new(),
            inputs: vec![Vec::new(); if rank == 0 { world } else { 0 }],
            asked: Vec::with_capacity(world),
            refusals: vec![None; if rank == 0 { world } else { 0 }],
            result: Vec::new(),
            aborted: None,
        };
        Self { name, rank, world, timeout, state: Mutex::new(links) }
    }

    fn error(&self, detail: String) -> Error {
        Error::Collective { communicator: self.name.clone(), rank: self.rank, detail }
    }

    /// Marks the group aborted and closes its connections (the other ranks' reads fail at once).
    fn abort(&self, links: &mut Links, detail: String) -> Error {
        let reason = format!("{detail}; the group is aborted, make a new one");
        for peer in &links.peers {
            let _ = peer.shutdown(Shutdown::Both);
        }
        links.aborted = Some(reason.clone());
        self.error(reason)
    }

    fn run_as_root(
        &self,
        links: &mut Links,
        collective: Collective,
        input: &[f32],
        output: &mut [f32],
        refused: Option<String>,
    ) -> Result<()> {
        match self.exchange_as_root(links, collective, input, output, refused) {
            Ok(outcome) => outcome,
            Err(detail) => Err(self.abort(links, detail)),
        }
    }

    /// Rank 0's part of a collective: its outcome, or why the group must be aborted.
    fn exchange_as_root(
        &self,
        links: &mut Links,
        collective: Collective,
        input: &[f32],
        output: &mut [f32],
        refused: Option<String>,
    ) -> std::result::Result<Result<()>, String> {
        let deadline = Instant::now() + self.timeout;
        let Links { peers, bytes, inputs, asked, refusals, result, .. } = links;
        inputs[0].clear();
        inputs[0].extend_from_slice(input);
        asked.clear();
        asked.push(Some((collective, input.len())));
        refusals.iter_mut().for_each(|r| *r = None);
        refusals[0] = refused;
        for (r, peer) in peers.iter_mut().enumerate() {
            let rank = r + 1;
            match receive(peer, bytes, &mut inputs[rank], deadline) {
                Ok((header, refusal)) => {
                    asked.push(Some(header));
                    refusals[rank] = refusal;
                }
                Err(e) => {
                    return Err(format!(
                        "rank {rank} did not send its part of {collective} within {:?}: {e}",
                        self.timeout
                    ))
                }
            }
        }
        let disagreement = disagreement(asked, refusals);
        if disagreement.is_none() {
            combine_in_rank_order(collective, inputs, result);
        }
        let part = output.len();
        for (r, peer) in peers.iter_mut().enumerate() {
            let rank = r + 1;
            bytes.clear();
            if let Some(message) = &disagreement {
                let message = capped(message);
                bytes.push(1);
                bytes.extend_from_slice(&(message.len() as u64).to_le_bytes());
                bytes.extend_from_slice(message);
            } else {
                let from = if matches!(collective, Collective::ReduceScatter(_)) { rank * part } else { 0 };
                bytes.push(0);
                bytes.extend_from_slice(&(part as u64).to_le_bytes());
                result[from..from + part].iter().for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
            }
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            if let Err(e) = peer.set_write_timeout(Some(left)).and_then(|()| peer.write_all(bytes)) {
                return Err(format!("sending rank {rank} its result within {:?}: {e}", self.timeout));
            }
        }
        if let Some(message) = disagreement {
            return Ok(Err(self.error(message)));
        }
        output.copy_from_slice(&result[..part]);
        Ok(Ok(()))
    }

    fn run_as_member(
        &self,
        links: &mut Links,
        collective: Collective,
        input: &[f32],
        output: &mut [f32],
        refused: Option<String>,
    ) -> Result<()> {
        let Links { peers, bytes, .. } = links;
        let root = &mut peers[0];
        bytes.clear();
        match &refused {
            // Refused: the reason's bytes instead of the values.
            Some(reason) => {
                let reason = capped(reason);
                let mut h = header(collective, reason.len());
                h[2] = 1;
                bytes.extend_from_slice(&h);
                bytes.extend_from_slice(reason);
            }
            None => {
                bytes.extend_from_slice(&header(collective, input.len()));
                input.iter().for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
            }
        }
        // The outcome, or (outside) why the group must be aborted: a failed connection, or a
        // reply that would leave the stream out of step.
        let io = |e: std::io::Error| {
            format!("the connection to rank 0 failed in {collective} ({e}): a rank failed or hangs, or the group was aborted")
        };
        let exchanged = (|| -> std::result::Result<std::result::Result<(), String>, String> {
            root.write_all(bytes).map_err(io)?;
            let mut status = [0u8; 9];
            root.read_exact(&mut status).map_err(io)?;
            let len = u64::from_le_bytes(status[1..9].try_into().unwrap_or([0; 8])) as usize;
            if status[0] != 0 {
                if len > MAX_MESSAGE {
                    return Err(format!("rank 0 sent a message of {len} bytes, more than any it writes"));
                }
                bytes.resize(len, 0);
                root.read_exact(bytes).map_err(io)?;
                return Ok(Err(String::from_utf8_lossy(bytes).into_owned()));
            }
            if refused.is_some() || len != output.len() {
                return Err(format!(
                    "rank 0 sent {len} values of {collective}, but this rank's output holds {} (the ranks' builds \
                     differ)",
                    output.len()
                ));
            }
            bytes.resize(4 * len, 0);
            root.read_exact(bytes).map_err(io)?;
            for (o, b) in output.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes(b.try_into().unwrap_or([0; 4]));
            }
            Ok(Ok(()))
        })();
        match exchanged {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(self.error(message)),
            Err(detail) => Err(self.abort(links, detail)),
        }
    }
}

impl Communicator for TcpGroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn run(&self, collective: Collective, input: &[f32], output: &mut [f32]) -> Result<()> {
        // What this rank cannot run still takes part, so that the others learn it at once.
        let refused = local_refusal(collective, input.len(), output.len(), self.world);
        let mut links = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(reason) = &links.aborted {
            return Err(self.error(reason.clone()));
        }
        if self.rank == 0 {
            self.run_as_root(&mut links, collective, input, output, refused)
        } else {
            self.run_as_member(&mut links, collective, input, output, refused)
        }
    }
}

fn configure(stream: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))
}

/// A collective's header: its kind, reduction, root and length, 16 bytes.
fn header(collective: Collective, len: usize) -> [u8; 16] {
    let op_code = |op: ReduceOp| match op {
        ReduceOp::Sum => 0,
        ReduceOp::Mean => 1,
        ReduceOp::Max => 2,
    };
    let (kind, op, root) = match collective {
        Collective::AllReduce(op) => (0u8, op_code(op), 0u32),
        Collective::AllGather => (1, 0, 0),
        Collective::ReduceScatter(op) => (2, op_code(op), 0),
        Collective::Broadcast { root } => (3, 0, root as u32),
    };
    let mut h = [0u8; 16];
    h[0] = kind;
    h[1] = op;
    h[4..8].copy_from_slice(&root.to_le_bytes());
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    h
}

/// Reads one rank's header and values into `values`, by `deadline`: what it asked for, and
/// why it could not run it, if it could not.
fn receive(
    peer: &mut TcpStream,
    bytes: &mut Vec<u8>,
    values: &mut Vec<f32>,
    deadline: Instant,
) -> std::io::Result<((Collective, usize), Option<String>)> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    peer.set_read_timeout(Some(left))?;
    let mut h = [0u8; 16];
    peer.read_exact(&mut h)?;
    let op = match h[1] {
        1 => ReduceOp::Mean,
        2 => ReduceOp::Max,
        _ => ReduceOp::Sum,
    };
    let root = u32::from_le_bytes(h[4..8].try_into().unwrap_or([0; 4])) as usize;
    let collective = match h[0] {
        0 => Collective::AllReduce(op),
        1 => Collective::AllGather,
        2 => Collective::ReduceScatter(op),
        _ => Collective::Broadcast { root },
    };
    let len = u64::from_le_bytes(h[8..16].try_into().unwrap_or([0; 8])) as usize;
    values.clear();
    let malformed = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    if h[2] == 1 {
        if len > MAX_MESSAGE {
            return Err(malformed(format!("a reason of {len} bytes, more than any rank writes")));
        }
        read_announced(peer, bytes, len)?;
        return Ok(((collective, 0), Some(String::from_utf8_lossy(bytes).into_owned())));
    }
    let size = len.checked_mul(4).filter(|&b| b <= isize::MAX as usize / 2);
    let size = size.ok_or_else(|| malformed(format!("a collective of {len} values")))?;
    read_announced(peer, bytes, size)?;
    values.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap_or([0; 4]))));
    Ok(((collective, len), None))
}

/// Reads the `len` bytes a header announced into `bytes`, which grow with the bytes that
/// arrive (as far as a rank already sent) rather than by `len` at once: a header from a stray
/// client or another build cannot make rank 0 allocate what it announces.
fn read_announced(peer: &mut TcpStream, bytes: &mut Vec<u8>, len: usize) -> std::io::Result<()> {
    bytes.clear();
    let reserve = len.min(bytes.capacity().max(1 << 20));
    bytes.reserve(reserve);
    let read = (&mut *peer).take(len as u64).read_to_end(bytes)?;
    if read < len {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("{read} of {len} bytes came")));
    }
    Ok(())
}

/// `message`'s bytes, cut to [`MAX_MESSAGE`].
fn capped(message: &str) -> &[u8] {
    &message.as_bytes()[..message.len().min(MAX_MESSAGE)]
}
