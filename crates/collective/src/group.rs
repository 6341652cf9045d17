//! [`Group`] (a formed ring) and [`Round`] (one step's buckets streaming through it).
//!
//! Each logical rank hosted here has a sender thread and a receiver thread. A bucket's buffer is
//! cut into chunks ([`crate::plan`]); each chunk is owned by exactly one of the two threads at a
//! time and moves between them through their queues as the schedule alternates sends and
//! receives, so no chunk is ever aliased and no lock is held while bytes move. When a chunk's
//! last operation is done it is delivered here, and once every chunk of a bucket is back the
//! buffer is stitched together (no copy) and handed to whoever waits on it.

use crate::abort::AbortHandle;
use crate::buffer::Buffer;
use crate::engine::{self, Job, Msg, Piece};
use crate::error::{Error, Result};
use crate::plan::{self, Layout, Next};
use crate::queue::Queue;
use crate::reduce::Elem;
use crate::spec::{Config, GroupSpec};
use crate::transport::{Pipe, RxLink, TxLink};
use bytes::BytesMut;
use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Most buckets in one round; it bounds the per-round tables and fits the frame header.
pub const MAX_BUCKETS: usize = 1 << 20;

/// How long a failing member keeps its links open so its abort frames can go out before it shuts
/// every socket: long enough for the cause to travel the ring, short enough to count as prompt.
const ABORT_GRACE: Duration = Duration::from_millis(250);

/// The two queues feeding one local rank's threads.
pub(crate) struct RankQueues {
    pub sender: Arc<Queue<Msg>>,
    pub receiver: Arc<Queue<Msg>>,
}

/// State shared by a group's threads, its [`Round`]s and its [`AbortHandle`].
pub(crate) struct Shared {
    pub spec: GroupSpec,
    pub config: Config,
    /// Logical ranks hosted here, ascending; `local[i]` is "local index" `i`.
    pub local: Vec<usize>,
    pub queues: Vec<RankQueues>,
    pipes: Vec<Arc<Pipe>>,
    /// Every socket: fully shut [`ABORT_GRACE`] after a failure.
    sockets: Arc<Vec<TcpStream>>,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The first error; every later call returns a clone of it.
    failure: Option<Error>,
    /// Buckets in flight or finished but not yet collected, by (round, bucket).
    buckets: HashMap<(u64, u32), Collecting>,
}

struct Collecting {
    elem: Elem,
    /// Chunks of all local ranks not yet delivered.
    remaining: usize,
    /// Delivered chunks, `[local index][chunk index]`.
    pieces: Vec<Vec<Option<BytesMut>>>,
    /// The reduced buffers, one per local rank, once every chunk is back.
    done: Option<Vec<Buffer>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The error that ended the group, if any.
    pub fn failure(&self) -> Option<Error> {
        self.lock().failure.clone()
    }

    /// The error to report when a queue closed under a thread: the group's failure.
    pub fn failure_or_aborted(&self) -> Error {
        self.failure().unwrap_or(Error::Aborted)
    }

    /// Ends the group with `err` (the first error wins): wakes every waiter and thread at once and
    /// shuts every socket after [`ABORT_GRACE`]. Meanwhile the senders tell the next member why,
    /// and the receivers keep draining what their predecessors send, so a predecessor blocked on a
    /// full socket moves on and learns of its own lost peers instead of blaming this member.
    pub fn fail(&self, err: Error) {
        {
            let mut state = self.lock();
            if state.failure.is_some() {
                return;
            }
            match &err {
                Error::Aborted => tracing::debug!(job = %self.spec.job, "collective group aborted"),
                other => tracing::warn!(job = %self.spec.job, error = %other, "collective group failed"),
            }
            state.failure = Some(err);
            self.changed.notify_all();
        }
        for q in &self.queues {
            q.sender.close();
            q.receiver.close();
        }
        for pipe in &self.pipes {
            pipe.close();
        }
        if !self.sockets.is_empty() {
            let sockets = Arc::clone(&self.sockets);
            let shut_all = move || {
                std::thread::sleep(ABORT_GRACE);
                for s in sockets.iter() {
                    let _ = s.shutdown(Shutdown::Both);
                }
            };
            if std::thread::Builder::new().name("collective-close".into()).spawn(shut_all).is_err() {
                for s in self.sockets.iter() {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
    }

    /// How long a sender may spend telling the next member why the group failed.
    pub fn abort_grace(&self) -> Duration {
        ABORT_GRACE.min(self.config.io_timeout)
    }

    /// Sends a chunk where the schedule says it goes next.
    pub fn route(&self, li: usize, job: &Arc<Job>, chunk: u32, next: Next, piece: Piece) -> Result<()> {
        let (queue, step) = match next {
            Next::Send(step) => (&self.queues[li].sender, step),
            Next::Recv(step) => (&self.queues[li].receiver, step),
            Next::Done => return self.deliver(li, job, piece),
        };
        queue
            .push(Msg::Piece { round: job.round, bucket: job.bucket, step, chunk, piece }, None)
            .map_err(|_| self.failure_or_aborted())
    }

    /// Takes back a finished chunk; completes the bucket when it was the last.
    fn deliver(&self, li: usize, job: &Job, piece: Piece) -> Result<()> {
        let mut state = self.lock();
        if let Some(failure) = &state.failure {
            return Err(failure.clone());
        }
        let Some(collecting) = state.buckets.get_mut(&(job.round, job.bucket)) else {
            return Ok(());
        };
        collecting.pieces[li][piece.index] = Some(piece.bytes);
        collecting.remaining -= 1;
        if collecting.remaining == 0 {
            let elem = collecting.elem;
            let buffers = collecting
                .pieces
                .iter_mut()
                .map(|pieces| {
                    let mut chunks = pieces.iter_mut().filter_map(Option::take);
                    let mut whole = chunks.next().unwrap_or_default();
                    // The chunks were split off one allocation in order, so this is O(1) each.
                    for chunk in chunks {
                        whole.unsplit(chunk);
                    }
                    Buffer::from_parts(elem, whole)
                })
                .collect();
            collecting.done = Some(buffers);
            self.changed.notify_all();
        }
        Ok(())
    }

    /// Cuts one bucket's buffers (one per local rank, in local order) into chunks and hands
    /// them to the rank threads.
    fn start(&self, round: u64, bucket: u32, buffers: Vec<Buffer>) -> Result<()> {
        let d = self.spec.ranks();
        let elem = buffers[0].elem();
        let layout = Layout::new(buffers[0].len(), d, self.config.chunk_bytes / elem.size());
        let count = if d == 1 { 0 } else { layout.piece_count() };
        let mut state = self.lock();
        if let Some(failure) = &state.failure {
            return Err(failure.clone());
        }
        if count == 0 {
            // One rank, or nothing to sum: the input is the result.
            let collecting = Collecting { elem, remaining: 0, pieces: Vec::new(), done: Some(buffers) };
            state.buckets.insert((round, bucket), collecting);
            self.changed.notify_all();
            return Ok(());
        }
        let collecting = Collecting {
            elem,
            remaining: count * self.local.len(),
            pieces: vec![vec![None; count]; self.local.len()],
            done: None,
        };
        state.buckets.insert((round, bucket), collecting);
        drop(state);
        let job = Arc::new(Job { round, bucket, elem, layout });
        for (li, buffer) in buffers.into_iter().enumerate() {
            let rank = self.local[li];
            for queue in [&self.queues[li].sender, &self.queues[li].receiver] {
                queue.push(Msg::Start(Arc::clone(&job)), None).map_err(|_| self.failure_or_aborted())?;
            }
            let mut rest = buffer.into_bytes();
            for (index, (segment, chunk, elems)) in job.layout.pieces().enumerate() {
                let piece = Piece { index, bytes: rest.split_to(elems.len() * elem.size()) };
                self.route(li, &job, chunk as u32, plan::first_op(rank, d, segment), piece)?;
            }
        }
        Ok(())
    }

    /// Waits for a started bucket's result, or the group's failure.
    fn wait(&self, round: u64, bucket: u32) -> Result<Vec<Buffer>> {
        let mut state = self.lock();
        loop {
            if let Some(failure) = &state.failure {
                return Err(failure.clone());
            }
            if let Some(done) = state.buckets.get_mut(&(round, bucket)).and_then(|c| c.done.take()) {
                state.buckets.remove(&(round, bucket));
                return Ok(done);
            }
            // Not a network wait: every thread that can complete or fail this bucket has its
            // own timeout and wakes this condvar either way.
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A formed all-reduce group: one generation of the ring, as seen by one member process.
///
/// Dropping it aborts anything in flight, tells the peers, closes the sockets and joins its
/// threads. After any error the group is finished: every later call returns that first error, and
/// recovery is forming the next generation's group.
pub struct Group {
    inner: Arc<GroupInner>,
}

struct GroupInner {
    shared: Arc<Shared>,
    abort: AbortHandle,
    threads: Vec<JoinHandle<()>>,
    /// The next round's number.
    next_round: AtomicU64,
    /// Whether a [`Round`] is open; one at a time keeps every member's bucket sequence aligned.
    round_open: AtomicBool,
}

impl Drop for GroupInner {
    fn drop(&mut self) {
        self.shared.fail(Error::Aborted);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("spec", self.spec())
            .field("local_ranks", &self.local_ranks())
            .field("failure", &self.failure())
            .finish()
    }
}

impl Group {
    /// Starts the rank threads over established links (one pair per local rank, in local order).
    pub(crate) fn start(
        spec: GroupSpec,
        config: Config,
        abort: AbortHandle,
        links: Vec<(TxLink, RxLink)>,
        pipes: Vec<Arc<Pipe>>,
        sockets: Vec<TcpStream>,
    ) -> Result<Group> {
        let local = spec.local_ranks();
        let queues = local
            .iter()
            .map(|_| RankQueues {
                sender: Arc::new(Queue::new(usize::MAX)),
                receiver: Arc::new(Queue::new(usize::MAX)),
            })
            .collect();
        let shared = Arc::new(Shared {
            spec,
            config,
            local,
            queues,
            pipes,
            sockets: Arc::new(sockets),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let mut threads = Vec::new();
        let mut spawn_error = None;
        for (li, (tx, rx)) in links.into_iter().enumerate() {
            match engine::spawn_rank(&shared, li, tx, rx) {
                Ok(pair) => threads.extend(pair),
                Err(e) => {
                    spawn_error = Some(e);
                    break;
                }
            }
        }
        let inner = Arc::new(GroupInner {
            shared: Arc::clone(&shared),
            abort: abort.clone(),
            threads,
            next_round: AtomicU64::new(0),
            round_open: AtomicBool::new(false),
        });
        if let Some(e) = spawn_error {
            return Err(e);
        }
        abort.attach(&shared);
        Ok(Group { inner })
    }

    /// The spec this group was formed from.
    pub fn spec(&self) -> &GroupSpec {
        &self.inner.shared.spec
    }

    /// The logical ranks this process hosts, ascending: the order of the buffers
    /// [`Round::wait`] returns.
    pub fn local_ranks(&self) -> &[usize] {
        &self.inner.shared.local
    }

    /// The handle that aborts this group.
    pub fn abort_handle(&self) -> AbortHandle {
        self.inner.abort.clone()
    }

    /// The error that ended this group, if it has failed.
    pub fn failure(&self) -> Option<Error> {
        self.inner.shared.failure()
    }

    /// Opens a round of `buckets` buckets, numbered `0..buckets`. Every member must open its rounds
    /// with the same bucket counts and submit the same sizes; buckets are reduced in bucket order
    /// whatever the order of submission.
    pub fn round(&self, buckets: usize) -> Result<Round> {
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        if buckets == 0 || buckets > MAX_BUCKETS {
            return Err(Error::InvalidSubmission {
                reason: format!("a round of {buckets} buckets; use 1 to {MAX_BUCKETS}"),
            });
        }
        if self.inner.round_open.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidSubmission {
                reason: "a round is still open; finish or drop it before opening the next".into(),
            });
        }
        let locals = self.local_ranks().len();
        Ok(Round {
            group: Arc::clone(&self.inner),
            id: self.inner.next_round.fetch_add(1, Ordering::AcqRel),
            slots: (0..buckets).map(|_| Slot { buffers: vec![None; locals], collected: false }).collect(),
            next_start: 0,
        })
    }

    /// All-reduces one buffer per local rank (in [`local_ranks`](Self::local_ranks) order) as a
    /// round of one bucket; returns the sums in the same order.
    pub fn all_reduce(&self, buffers: Vec<Buffer>) -> Result<Vec<Buffer>> {
        let local = self.local_ranks().to_vec();
        if buffers.len() != local.len() {
            return Err(Error::InvalidSubmission {
                reason: format!(
                    "{} buffers for {} local ranks {local:?}; pass one per local rank",
                    buffers.len(),
                    local.len()
                ),
            });
        }
        let mut round = self.round(1)?;
        for (rank, buffer) in local.into_iter().zip(buffers) {
            round.submit(0, rank, buffer)?;
        }
        round.wait(0)
    }
}

/// One round of buckets (typically one training step's gradients).
///
/// Submit each local rank's buffer for each bucket as it becomes ready, in any order; a bucket
/// starts moving once every local rank has submitted it and every earlier bucket has started,
/// so later buckets are still being produced while earlier ones are reduced, and the sums never
/// depend on timing. Collect with [`wait`](Self::wait) per bucket or [`finish`](Self::finish).
/// Dropping a round before every bucket was collected aborts the group (the members' bucket
/// sequences would no longer line up).
pub struct Round {
    group: Arc<GroupInner>,
    id: u64,
    slots: Vec<Slot>,
    /// The first bucket not yet handed to the ring.
    next_start: usize,
}

struct Slot {
    /// Submitted buffers by local index, until the bucket starts.
    buffers: Vec<Option<Buffer>>,
    collected: bool,
}

impl std::fmt::Debug for Round {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Round").field("id", &self.id).field("buckets", &self.slots.len()).finish()
    }
}

impl Round {
    /// This round's number since the group formed.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Submits logical rank `rank`'s buffer for `bucket`. All local ranks' buffers of one bucket
    /// must have the same type and length (and so must every member's).
    pub fn submit(&mut self, bucket: usize, rank: usize, data: Buffer) -> Result<()> {
        let shared = &self.group.shared;
        if let Some(failure) = shared.failure() {
            return Err(failure);
        }
        let buckets = self.slots.len();
        let li = shared.local.binary_search(&rank).map_err(|_| Error::InvalidSubmission {
            reason: format!("rank {rank} is not hosted by this member, which hosts ranks {:?}", shared.local),
        })?;
        let started = bucket < self.next_start;
        let slot = self.slots.get_mut(bucket).ok_or_else(|| Error::InvalidSubmission {
            reason: format!("bucket {bucket} is out of range: this round has {buckets} buckets"),
        })?;
        if started || slot.buffers[li].is_some() {
            return Err(Error::InvalidSubmission {
                reason: format!("rank {rank} already submitted bucket {bucket} in round {}", self.id),
            });
        }
        if let Some((other_li, other)) =
            slot.buffers.iter().enumerate().find_map(|(i, b)| b.as_ref().map(|b| (i, b)))
            && (other.dtype() != data.dtype() || other.len() != data.len())
        {
            return Err(Error::InvalidSubmission {
                reason: format!(
                    "bucket {bucket}: rank {rank} submitted {} {} values but rank {} submitted {} {} values",
                    data.len(),
                    data.dtype(),
                    shared.local[other_li],
                    other.len(),
                    other.dtype()
                ),
            });
        }
        slot.buffers[li] = Some(data);
        while self.next_start < buckets && self.slots[self.next_start].buffers.iter().all(Option::is_some) {
            let buffers = self.slots[self.next_start].buffers.iter_mut().filter_map(Option::take).collect();
            let bucket = self.next_start as u32;
            self.next_start += 1;
            shared.start(self.id, bucket, buffers)?;
        }
        Ok(())
    }

    /// Waits for `bucket`'s sums, one buffer per local rank in
    /// [`Group::local_ranks`] order. Every bucket up to `bucket` must have been submitted by every
    /// local rank.
    pub fn wait(&mut self, bucket: usize) -> Result<Vec<Buffer>> {
        let shared = &self.group.shared;
        let buckets = self.slots.len();
        let slot = self.slots.get(bucket).ok_or_else(|| Error::InvalidSubmission {
            reason: format!("bucket {bucket} is out of range: this round has {buckets} buckets"),
        })?;
        if slot.collected {
            return Err(Error::InvalidSubmission {
                reason: format!("bucket {bucket} was already collected"),
            });
        }
        if bucket >= self.next_start {
            let missing = self.slots[self.next_start..=bucket].iter().enumerate().find_map(|(i, s)| {
                s.buffers.iter().position(Option::is_none).map(|li| (self.next_start + i, shared.local[li]))
            });
            if let Some((b, rank)) = missing {
                return Err(Error::InvalidSubmission {
                    reason: format!(
                        "bucket {b} still lacks rank {rank}'s buffer; submit every bucket up to {bucket} before waiting on it"
                    ),
                });
            }
        }
        let result = shared.wait(self.id, bucket as u32)?;
        self.slots[bucket].collected = true;
        Ok(result)
    }

    /// Waits for every bucket; entry `b` holds bucket `b`'s sums, one buffer per local rank
    /// (empty for a bucket already collected with [`wait`](Self::wait)).
    pub fn finish(mut self) -> Result<Vec<Vec<Buffer>>> {
        (0..self.slots.len())
            .map(|b| if self.slots[b].collected { Ok(Vec::new()) } else { self.wait(b) })
            .collect()
    }
}

impl Drop for Round {
    fn drop(&mut self) {
        if self.slots.iter().any(|s| !s.collected) {
            self.group.shared.fail(Error::Aborted);
        }
        self.group.round_open.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three logical ranks in this one process: every link is in memory.
    fn solo() -> Group {
        let endpoint = crate::Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let spec = GroupSpec {
            job: "solo".into(),
            generation: 1,
            members: vec![endpoint.local_addr()],
            placement: vec![0, 0, 0],
            me: 0,
        };
        endpoint.form(&spec, &Config::default(), &AbortHandle::new()).unwrap()
    }

    #[test]
    fn misuse_is_reported_with_the_fix() {
        let group = solo();
        let mut round = group.round(2).unwrap();
        let err = group.round(1).err().unwrap().to_string();
        assert!(err.contains("still open"), "{err}");
        let b = || Buffer::from_f32(&[1.0, 2.0]);
        assert!(round.submit(0, 7, b()).unwrap_err().to_string().contains("not hosted"));
        assert!(round.submit(5, 0, b()).unwrap_err().to_string().contains("out of range"));
        round.submit(0, 0, b()).unwrap();
        assert!(round.submit(0, 0, b()).unwrap_err().to_string().contains("already submitted"));
        let err = round.submit(0, 1, Buffer::from_f32(&[1.0])).unwrap_err().to_string();
        assert!(err.contains("rank 1 submitted 1 float32 values but rank 0 submitted 2"), "{err}");
        let err = round.wait(1).unwrap_err().to_string();
        assert!(err.contains("bucket 0 still lacks rank 1's buffer"), "{err}");
        for rank in [1, 2] {
            round.submit(0, rank, b()).unwrap();
        }
        for rank in [0, 1, 2] {
            round.submit(1, rank, b()).unwrap();
        }
        let sums = round.finish().unwrap();
        assert_eq!(sums.len(), 2);
        assert_eq!(sums[1][2].to_f32().unwrap(), vec![3.0, 6.0]);
        assert!(group.round(1).is_ok(), "a finished round frees the group for the next");
    }

    #[test]
    fn dropping_an_unfinished_round_aborts_the_group() {
        let group = solo();
        let round = group.round(1).unwrap();
        drop(round);
        assert_eq!(group.failure(), Some(Error::Aborted));
        assert_eq!(group.round(1).err(), Some(Error::Aborted));
    }
}
