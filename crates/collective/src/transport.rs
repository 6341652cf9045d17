//! Moving frames along one directed link of the ring: a TCP stream between processes, or an
//! in-memory pipe between two logical ranks hosted by the same process (same frames, same
//! arithmetic, no sockets). Also the [`Filter`] hook that lets tests drop or delay the traffic to
//! one member, a partition without root.

use crate::error::Error;
use crate::plan::RecvKind;
use crate::queue::{Interrupted, Queue};
use crate::reduce::Elem;
use crate::wire::{Cause, FrameHeader, FrameKind, HEADER_LEN};
use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One directed link of the ring, as a [`Filter`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// The sending logical rank (hosted by this process).
    pub from_rank: usize,
    /// The receiving logical rank.
    pub to_rank: usize,
    /// The member hosting `to_rank`.
    pub to_member: usize,
    /// That member's listener address.
    pub to_addr: SocketAddr,
}

/// What to do with one frame (or one connection attempt while forming a group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it.
    Pass,
    /// Send it after this long.
    Delay(Duration),
    /// Discard it silently, as a partitioned network would. Dropping a data frame and passing a
    /// later one breaks the stream, which the receiver reports as a protocol error.
    Drop,
}

/// A hook on every frame this process sends to another process and on every connection attempt
/// while forming a group. In-memory links between co-located ranks are not filtered.
pub trait Filter: Send + Sync {
    /// Decides the fate of the next frame on `link`.
    fn on_send(&self, link: &Link) -> Verdict;
}

/// A [`Filter`] with per-member rules: partition a member (drop everything to it) or slow it
/// down, and heal it again.
#[derive(Debug, Default)]
pub struct FaultFilter {
    rules: Mutex<HashMap<usize, Verdict>>,
}

impl FaultFilter {
    /// A filter that passes everything.
    pub fn new() -> FaultFilter {
        FaultFilter::default()
    }

    /// Drops every frame to `member` from now on.
    pub fn partition(&self, member: usize) {
        self.set(member, Verdict::Drop);
    }

    /// Delays every frame to `member` by `delay` from now on.
    pub fn delay(&self, member: usize, delay: Duration) {
        self.set(member, Verdict::Delay(delay));
    }

    /// Passes frames to `member` again.
    pub fn heal(&self, member: usize) {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).remove(&member);
    }

    fn set(&self, member: usize, verdict: Verdict) {
        self.rules.lock().unwrap_or_else(|p| p.into_inner()).insert(member, verdict);
    }
}

impl Filter for FaultFilter {
    fn on_send(&self, link: &Link) -> Verdict {
        let rules = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        rules.get(&link.to_member).copied().unwrap_or(Verdict::Pass)
    }
}

/// The rank at the other end of a link, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerRef {
    pub rank: usize,
    pub member: usize,
    pub addr: SocketAddr,
}

impl PeerRef {
    pub fn timeout(&self, awaited: String, after: Duration) -> Error {
        Error::Timeout { rank: self.rank, member: self.member, addr: self.addr, awaited, after }
    }

    pub fn lost(&self, detail: String) -> Error {
        Error::PeerLost { rank: self.rank, member: self.member, addr: self.addr, detail }
    }

    pub fn protocol(&self, detail: String) -> Error {
        Error::Protocol { rank: self.rank, member: self.member, addr: self.addr, detail }
    }

    fn io(&self, e: &io::Error, awaited: String, timeout: Duration) -> Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timeout(awaited, timeout),
            io::ErrorKind::UnexpectedEof => {
                self.lost(format!("connection closed while waiting for {awaited}"))
            }
            _ => self.lost(format!("{e} while transferring {awaited}")),
        }
    }
}

/// Incoming chunks are read and added in blocks of this size, so the block is still in cache
/// when it is added.
const ADD_BLOCK: usize = 256 * 1024;

/// Frames an in-memory link holds before its sender waits: enough to keep both threads busy.
const PIPE_FRAMES: usize = 4;

/// The in-memory link between two co-located ranks.
pub(crate) struct Pipe {
    frames: Queue<LocalFrame>,
    /// Payload vectors handed back by the receiver, so steady state allocates nothing.
    spare: Mutex<Vec<Vec<u8>>>,
}

struct LocalFrame {
    header: FrameHeader,
    payload: Vec<u8>,
}

impl Pipe {
    pub fn new() -> Arc<Pipe> {
        Arc::new(Pipe { frames: Queue::new(PIPE_FRAMES), spare: Mutex::new(Vec::new()) })
    }

    /// Wakes both ends for good.
    pub fn close(&self) {
        self.frames.close();
    }
}

/// The sending end of a link.
pub(crate) enum TxLink {
    /// To another process.
    Tcp(TcpTx),
    /// To a co-located rank.
    Local { pipe: Arc<Pipe>, peer: PeerRef, io_timeout: Duration },
}

/// The sending end of a TCP link.
pub(crate) struct TcpTx {
    pub stream: TcpStream,
    pub link: Link,
    pub peer: PeerRef,
    pub filter: Option<Arc<dyn Filter>>,
    pub io_timeout: Duration,
    /// False while a frame is partly written (or after a failed write): an abort frame may only
    /// follow a whole frame.
    pub clean: bool,
}

impl TxLink {
    /// Sends one data frame; `what` names it for error messages.
    pub fn send(
        &mut self,
        header: &FrameHeader,
        payload: &[u8],
        what: &dyn Fn() -> String,
    ) -> Result<(), Error> {
        match self {
            TxLink::Tcp(tcp) => tcp.send(header, payload, what),
            TxLink::Local { pipe, peer, io_timeout } => {
                let mut buf = pipe.spare.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(payload);
                let frame = LocalFrame { header: *header, payload: buf };
                match pipe.frames.push(frame, Some(Instant::now() + *io_timeout)) {
                    Ok(()) => Ok(()),
                    Err(Interrupted::Closed) => Err(Error::Aborted),
                    Err(Interrupted::TimedOut) => {
                        Err(peer.timeout(format!("room to pass {} in memory", what()), *io_timeout))
                    }
                }
            }
        }
    }

    /// Tells the next process why this group failed, if the link can still carry a frame.
    /// Waits at most `grace`; in-memory links need nothing (both ends share the failure).
    pub fn send_abort(&mut self, cause: &Cause, grace: Duration) {
        if let TxLink::Tcp(tcp) = self {
            tcp.send_abort(cause, grace);
        }
    }
}

impl TcpTx {
    fn send(&mut self, header: &FrameHeader, payload: &[u8], what: &dyn Fn() -> String) -> Result<(), Error> {
        if let Some(filter) = &self.filter {
            match filter.on_send(&self.link) {
                Verdict::Pass => {}
                Verdict::Delay(delay) => std::thread::sleep(delay),
                Verdict::Drop => return Ok(()),
            }
        }
        fault::fail_point!("collective::send_chunk", |_| {
            self.clean = false;
            let _ = self.stream.shutdown(Shutdown::Both);
            Err(self.peer.lost(format!("fail point collective::send_chunk fired before {}", what())))
        });
        self.clean = false;
        let head = header.encode();
        write_all_vectored(&mut self.stream, &mut [IoSlice::new(&head), IoSlice::new(payload)])
            .map_err(|e| self.peer.io(&e, format!("room to send {}", what()), self.io_timeout))?;
        self.clean = true;
        Ok(())
    }

    fn send_abort(&mut self, cause: &Cause, grace: Duration) {
        if !self.clean {
            return;
        }
        let pass = self.filter.as_ref().is_none_or(|f| f.on_send(&self.link) != Verdict::Drop);
        if pass {
            let payload = cause.encode();
            let header = FrameHeader {
                kind: FrameKind::Abort,
                step: 0,
                bucket: 0,
                round: 0,
                chunk: 0,
                len: payload.len() as u32,
            };
            let _ = self.stream.set_write_timeout(Some(grace));
            let head = header.encode();
            // Best effort: the peer learns the cause, or it sees the connection close.
            let _ = write_all_vectored(&mut self.stream, &mut [IoSlice::new(&head), IoSlice::new(&payload)]);
        }
        let _ = self.stream.shutdown(Shutdown::Write);
        self.clean = false;
    }
}

/// The receiving end of a link.
pub(crate) enum RxLink {
    /// From another process.
    Tcp(TcpRx),
    /// From a co-located rank.
    Local { pipe: Arc<Pipe>, peer: PeerRef, io_timeout: Duration },
}

/// The receiving end of a TCP link.
pub(crate) struct TcpRx {
    pub stream: TcpStream,
    pub peer: PeerRef,
    pub io_timeout: Duration,
    /// Where incoming partial sums land before they are added.
    pub scratch: Vec<u8>,
}

/// What a receiver expects next, and what to do with it.
pub(crate) struct Expect<'a> {
    pub header: FrameHeader,
    pub kind: RecvKind,
    pub elem: Elem,
    pub what: &'a dyn Fn() -> String,
}

/// What a receive produced besides the data: a peer's abort, relayed as its cause.
pub(crate) enum Received {
    /// The chunk is in place.
    Chunk,
    /// The peer's group failed; this is why.
    Abort(Cause),
}

impl RxLink {
    /// Receives the expected chunk into `dst`: added for a reduce-scatter step, copied for an
    /// all-gather step.
    pub fn recv(&mut self, expect: &Expect<'_>, dst: &mut [u8]) -> Result<Received, Error> {
        match self {
            RxLink::Tcp(tcp) => tcp.recv(expect, dst),
            RxLink::Local { pipe, peer, io_timeout } => {
                let frame = match pipe.frames.pop(Some(Instant::now() + *io_timeout)) {
                    Ok(frame) => frame,
                    Err(Interrupted::Closed) => return Err(Error::Aborted),
                    Err(Interrupted::TimedOut) => {
                        return Err(peer.timeout(format!("{} in memory", (expect.what)()), *io_timeout));
                    }
                };
                check_header(peer, expect, &frame.header)?;
                match expect.kind {
                    RecvKind::Copy => dst.copy_from_slice(&frame.payload),
                    RecvKind::Add => expect.elem.add_into(dst, &frame.payload),
                }
                let mut spare = pipe.spare.lock().unwrap_or_else(|p| p.into_inner());
                if spare.len() <= PIPE_FRAMES {
                    spare.push(frame.payload);
                }
                Ok(Received::Chunk)
            }
        }
    }
}

impl RxLink {
    /// After the group failed: reads and discards whatever the predecessor still sends until it
    /// closes or the socket is shut, so it is never left blocked on a full socket. Bounded by
    /// `limit` per read.
    pub fn drain(&mut self, limit: Duration) {
        if let RxLink::Tcp(tcp) = self {
            let _ = tcp.stream.set_read_timeout(Some(limit));
            tcp.scratch.resize(ADD_BLOCK, 0);
            while matches!(tcp.stream.read(&mut tcp.scratch), Ok(n) if n > 0) {}
        }
    }
}

impl TcpRx {
    fn recv(&mut self, expect: &Expect<'_>, dst: &mut [u8]) -> Result<Received, Error> {
        let awaited = || (expect.what)();
        let mut head = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut head).map_err(|e| self.peer.io(&e, awaited(), self.io_timeout))?;
        fault::fail_point!("collective::recv_chunk", |_| {
            let _ = self.stream.shutdown(Shutdown::Both);
            Err(self
                .peer
                .lost(format!("fail point collective::recv_chunk fired while receiving {}", awaited())))
        });
        let header = FrameHeader::decode(&head).ok_or_else(|| {
            self.peer.protocol(format!("unknown frame kind {} where {} was due", head[0], awaited()))
        })?;
        if header.kind == FrameKind::Abort {
            return self.read_abort(header.len as usize).map(Received::Abort);
        }
        check_header(&self.peer, expect, &header)?;
        match expect.kind {
            RecvKind::Copy => {
                self.stream.read_exact(dst).map_err(|e| self.peer.io(&e, awaited(), self.io_timeout))?;
            }
            RecvKind::Add => {
                if self.scratch.len() < ADD_BLOCK {
                    self.scratch.resize(ADD_BLOCK, 0);
                }
                for block in dst.chunks_mut(ADD_BLOCK) {
                    let incoming = &mut self.scratch[..block.len()];
                    self.stream
                        .read_exact(incoming)
                        .map_err(|e| self.peer.io(&e, awaited(), self.io_timeout))?;
                    expect.elem.add_into(block, incoming);
                }
            }
        }
        Ok(Received::Chunk)
    }

    fn read_abort(&mut self, len: usize) -> Result<Cause, Error> {
        if len > Cause::MAX_LEN {
            return Err(self.peer.protocol(format!("abort frame of {len} bytes exceeds {}", Cause::MAX_LEN)));
        }
        let mut payload = vec![0u8; len];
        self.stream
            .read_exact(&mut payload)
            .map_err(|e| self.peer.io(&e, "the rest of an abort frame".into(), self.io_timeout))?;
        Cause::decode(&payload).ok_or_else(|| self.peer.protocol("malformed abort frame".into()))
    }
}

fn check_header(peer: &PeerRef, expect: &Expect<'_>, got: &FrameHeader) -> Result<(), Error> {
    if *got == expect.header {
        return Ok(());
    }
    let describe = |h: &FrameHeader| {
        format!("round {} bucket {} step {} chunk {} ({} bytes)", h.round, h.bucket, h.step, h.chunk, h.len)
    };
    Err(peer.protocol(format!(
        "expected {} but got {}: the members submitted different buckets or sizes this round, \
         or use different chunk_bytes",
        describe(&expect.header),
        describe(got)
    )))
}

/// `write_all` over several slices, one `writev` per call, so a header never costs its own
/// syscall.
fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_filter_rules_apply_per_member() {
        let f = FaultFilter::new();
        let link =
            |m| Link { from_rank: 0, to_rank: 1, to_member: m, to_addr: "127.0.0.1:1".parse().unwrap() };
        assert_eq!(f.on_send(&link(1)), Verdict::Pass);
        f.partition(1);
        f.delay(2, Duration::from_millis(3));
        assert_eq!(f.on_send(&link(1)), Verdict::Drop);
        assert_eq!(f.on_send(&link(2)), Verdict::Delay(Duration::from_millis(3)));
        f.heal(1);
        assert_eq!(f.on_send(&link(1)), Verdict::Pass);
    }

    #[test]
    fn vectored_write_survives_short_writes() {
        /// Accepts at most 3 bytes per call.
        struct Trickle(Vec<u8>);
        impl Write for Trickle {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                let n = b.len().min(3);
                self.0.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut w = Trickle(Vec::new());
        write_all_vectored(&mut w, &mut [IoSlice::new(b"head"), IoSlice::new(b""), IoSlice::new(b"payload")])
            .unwrap();
        assert_eq!(w.0, b"headpayload");
    }
}
