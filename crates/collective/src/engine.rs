//! The two threads of one local logical rank: the sender walks the schedule's sends, the
//! receiver its receives, and each chunk of the rank's buffer passes between them as the
//! schedule alternates ([`crate::plan`]). Their only shared state is the group's [`Shared`].

use crate::error::{Error, Result};
use crate::group::Shared;
use crate::plan::{self, Layout};
use crate::queue::{Interrupted, Queue};
use crate::reduce::Elem;
use crate::transport::{Expect, PeerRef, Received, RxLink, TxLink};
use crate::wire::{Cause, FrameHeader};
use bytes::BytesMut;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One bucket as the rank threads see it.
pub(crate) struct Job {
    pub round: u64,
    pub bucket: u32,
    pub elem: Elem,
    pub layout: Layout,
}

/// A chunk of a rank's buffer, with its position for stitching the buffer back.
pub(crate) struct Piece {
    /// Chunk index in buffer order.
    pub index: usize,
    pub bytes: BytesMut,
}

/// What flows into a rank thread's queue.
pub(crate) enum Msg {
    /// A bucket to work on; buckets arrive in the order they must run.
    Start(Arc<Job>),
    /// A chunk to send or receive into at `step`.
    Piece { round: u64, bucket: u32, step: u32, chunk: u32, piece: Piece },
}

/// Who a rank thread is, and its neighbours for error messages.
struct Ctx {
    shared: Arc<Shared>,
    /// Local index.
    li: usize,
    rank: usize,
    d: usize,
    pred: PeerRef,
    succ: PeerRef,
}

/// Starts the sender and receiver threads of local rank `li`.
pub(crate) fn spawn_rank(
    shared: &Arc<Shared>,
    li: usize,
    tx: TxLink,
    rx: RxLink,
) -> Result<[JoinHandle<()>; 2]> {
    let spec = &shared.spec;
    let d = spec.ranks();
    let rank = shared.local[li];
    let peer =
        |r: usize| PeerRef { rank: r, member: spec.placement[r], addr: spec.members[spec.placement[r]] };
    let ctx = || Ctx {
        shared: Arc::clone(shared),
        li,
        rank,
        d,
        pred: peer((rank + d - 1) % d),
        succ: peer((rank + 1) % d),
    };
    let spawn = |name: String, body: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new().name(name).spawn(body).map_err(|e| Error::Spawn { detail: e.to_string() })
    };
    let (send_ctx, recv_ctx) = (ctx(), ctx());
    let sender = spawn(format!("ring-send-{rank}"), Box::new(move || run_sender(send_ctx, tx)))?;
    let receiver = spawn(format!("ring-recv-{rank}"), Box::new(move || run_receiver(recv_ctx, rx)));
    match receiver {
        Ok(receiver) => Ok([sender, receiver]),
        Err(e) => {
            shared.fail(e.clone());
            let _ = sender.join();
            Err(e)
        }
    }
}

/// Fails the group if a rank thread unwinds, so nothing waits on chunks it held.
struct FailOnPanic<'a>(&'a Ctx);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let me = self.0.shared.spec.me;
            self.0.shared.fail(Error::PeerFailed {
                rank: self.0.rank,
                member: me,
                detail: "internal error: a ring thread panicked".into(),
            });
        }
    }
}

fn run_sender(ctx: Ctx, mut tx: TxLink) {
    let _guard = FailOnPanic(&ctx);
    if let Err(e) = sender_loop(&ctx, &mut tx) {
        ctx.shared.fail(e);
    }
    // The loop only ends once the group has failed: tell the next member why.
    let failure = ctx.shared.failure_or_aborted();
    tx.send_abort(&cause_of(&failure, ctx.rank, ctx.shared.spec.me), ctx.shared.abort_grace());
}

fn run_receiver(ctx: Ctx, mut rx: RxLink) {
    let _guard = FailOnPanic(&ctx);
    if let Err(e) = receiver_loop(&ctx, &mut rx) {
        ctx.shared.fail(e);
    }
    // The loop only ends once the group has failed; the sockets close after the abort grace.
    rx.drain(ctx.shared.abort_grace());
}

fn sender_loop(ctx: &Ctx, tx: &mut TxLink) -> Result<()> {
    let inbox = Arc::clone(&ctx.shared.queues[ctx.li].sender);
    let mut stash = Stash::default();
    while let Some(job) = stash.next_job(&inbox) {
        for step in 0..plan::steps(ctx.d) {
            let segment = plan::send_segment(ctx.rank, ctx.d, step);
            for chunk in 0..job.layout.chunks(segment) as u32 {
                // A chunk to forward was received at the previous step.
                let piece = stash.take(&inbox, &job, step, chunk, ctx.wait_limit()).map_err(|i| {
                    ctx.interrupted(i, &ctx.pred, || {
                        format!("{} to forward", describe(&job, step.saturating_sub(1), chunk))
                    })
                })?;
                let header =
                    FrameHeader::data(job.round, job.bucket, step as u16, chunk, piece.bytes.len() as u32);
                let what = || format!("{} for rank {}", describe(&job, step, chunk), ctx.succ.rank);
                tx.send(&header, &piece.bytes, &what)?;
                ctx.shared.route(ctx.li, &job, chunk, plan::after_send(ctx.d, step), piece)?;
            }
        }
    }
    Ok(())
}

fn receiver_loop(ctx: &Ctx, rx: &mut RxLink) -> Result<()> {
    let inbox = Arc::clone(&ctx.shared.queues[ctx.li].receiver);
    let mut stash = Stash::default();
    while let Some(job) = stash.next_job(&inbox) {
        for step in 0..plan::steps(ctx.d) {
            let segment = plan::recv_segment(ctx.rank, ctx.d, step);
            let kind = plan::recv_kind(ctx.d, step);
            for chunk in 0..job.layout.chunks(segment) as u32 {
                // During the all-gather the chunk comes back from this rank's own sender.
                let mut piece = stash.take(&inbox, &job, step, chunk, ctx.wait_limit()).map_err(|i| {
                    ctx.interrupted(i, &ctx.succ, || {
                        format!("{} to be sent first", describe(&job, step, chunk))
                    })
                })?;
                let header =
                    FrameHeader::data(job.round, job.bucket, step as u16, chunk, piece.bytes.len() as u32);
                let what = || format!("{} from rank {}", describe(&job, step, chunk), ctx.pred.rank);
                let expect = Expect { header, kind, elem: job.elem, what: &what };
                match rx.recv(&expect, &mut piece.bytes)? {
                    Received::Chunk => {}
                    Received::Abort(cause) => {
                        return Err(relayed(cause, &ctx.pred, &ctx.shared.spec.members));
                    }
                }
                ctx.shared.route(ctx.li, &job, chunk, plan::after_recv(ctx.d, step), piece)?;
            }
        }
    }
    Ok(())
}

impl Ctx {
    /// Bound on a wait for a chunk from this rank's other thread: twice the network timeout, so
    /// the network wait that actually stalls reports first and names the right peer.
    fn wait_limit(&self) -> Duration {
        self.shared.config.io_timeout.saturating_mul(2)
    }

    /// The error for a queue wait that ended without the chunk.
    fn interrupted(&self, why: Interrupted, peer: &PeerRef, awaited: impl Fn() -> String) -> Error {
        match why {
            Interrupted::Closed => self.shared.failure_or_aborted(),
            Interrupted::TimedOut => peer.timeout(awaited(), self.wait_limit()),
        }
    }
}

fn describe(job: &Job, step: u32, chunk: u32) -> String {
    format!("chunk {chunk} of step {step} of bucket {} in round {}", job.bucket, job.round)
}

/// Messages that arrived before the thread needed them: chunks for later steps or buckets, and
/// queued buckets. Its size is bounded by the buffers the caller submitted.
#[derive(Default)]
struct Stash {
    jobs: VecDeque<Arc<Job>>,
    pieces: HashMap<(u64, u32, u32, u32), Piece>,
}

impl Stash {
    /// The next bucket; waits without a deadline, since an idle group waits for its caller, not
    /// for the network. `None` once the group has failed or is dropped.
    fn next_job(&mut self, inbox: &Queue<Msg>) -> Option<Arc<Job>> {
        loop {
            if let Some(job) = self.jobs.pop_front() {
                return Some(job);
            }
            self.absorb(inbox.pop(None).ok()?);
        }
    }

    /// The chunk for `(step, chunk)` of `job`.
    fn take(
        &mut self,
        inbox: &Queue<Msg>,
        job: &Job,
        step: u32,
        chunk: u32,
        timeout: Duration,
    ) -> Result<Piece, Interrupted> {
        let key = (job.round, job.bucket, step, chunk);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(piece) = self.pieces.remove(&key) {
                return Ok(piece);
            }
            self.absorb(inbox.pop(Some(deadline))?);
        }
    }

    fn absorb(&mut self, msg: Msg) {
        match msg {
            Msg::Start(job) => self.jobs.push_back(job),
            Msg::Piece { round, bucket, step, chunk, piece } => {
                self.pieces.insert((round, bucket, step, chunk), piece);
            }
        }
    }
}

/// What to tell the next member about this group's failure.
pub(crate) fn cause_of(failure: &Error, rank: usize, member: usize) -> Cause {
    let (rank32, member32) = (rank as u32, member as u32);
    match failure {
        Error::PeerLost { rank, member, detail, .. } => {
            Cause::Lost { rank: *rank as u32, member: *member as u32, detail: detail.clone() }
        }
        Error::PeerAborted { rank, member, detail } => {
            Cause::Aborted { rank: *rank as u32, member: *member as u32, detail: detail.clone() }
        }
        Error::PeerFailed { rank, member, detail } => {
            Cause::Failed { rank: *rank as u32, member: *member as u32, detail: detail.clone() }
        }
        Error::Aborted => Cause::Aborted {
            rank: rank32,
            member: member32,
            detail: "its group was aborted or dropped (generation change or shutdown)".into(),
        },
        other => Cause::Failed { rank: rank32, member: member32, detail: other.to_string() },
    }
}

/// The error a member reports for a cause relayed by its predecessor `reporter`.
pub(crate) fn relayed(cause: Cause, reporter: &PeerRef, members: &[SocketAddr]) -> Error {
    match cause {
        Cause::Lost { rank, member, detail } => Error::PeerLost {
            rank: rank as usize,
            member: member as usize,
            addr: members.get(member as usize).copied().unwrap_or(reporter.addr),
            detail: format!("reported by rank {}: {detail}", reporter.rank),
        },
        Cause::Aborted { rank, member, detail } => {
            Error::PeerAborted { rank: rank as usize, member: member as usize, detail }
        }
        Cause::Failed { rank, member, detail } => {
            Error::PeerFailed { rank: rank as usize, member: member as usize, detail }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_peer_is_relayed_as_lost() {
        let members: Vec<SocketAddr> = vec!["127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap()];
        let reporter = PeerRef { rank: 3, member: 1, addr: members[1] };
        let lost = Error::PeerLost { rank: 2, member: 0, addr: members[0], detail: "reset".into() };
        let err = relayed(cause_of(&lost, 3, 1), &reporter, &members);
        assert_eq!(
            err,
            Error::PeerLost {
                rank: 2,
                member: 0,
                addr: members[0],
                detail: "reported by rank 3: reset".into()
            }
        );
        let err = relayed(cause_of(&Error::Aborted, 1, 0), &reporter, &members);
        assert!(matches!(err, Error::PeerAborted { rank: 1, member: 0, .. }), "{err:?}");
        let timeout = Error::Timeout {
            rank: 0,
            member: 0,
            addr: members[0],
            awaited: "x".into(),
            after: Duration::from_secs(1),
        };
        let err = relayed(cause_of(&timeout, 1, 1), &reporter, &members);
        assert!(
            matches!(&err, Error::PeerFailed { rank: 1, member: 1, detail } if detail.contains("timed out"))
        );
    }
}
