//! Peer catch-up at the wire's speed: a replacement pulls the train state from a live peer over
//! one TCP connection, straight into the memory its devices take over.
//!
//! Both sides compute the same [`Layout`] from their bundle and mesh: the pieces of the state
//! in order (per array in state order, each device whose region differs from the previous
//! device's, which is what [`Slice::upload_each`] asks for) and a digest of everything they
//! must agree on. A survivor told that members will pull from it opens a serve window
//! ([`StateServer::open`]) at the step boundary where the generation starts and sends each
//! piece from its device buffers: on the CPU plugin from the buffers' own memory
//! (`pjrt::Buffer::host_view`), elsewhere through one shard's host copy at a time. The puller
//! reads each piece into a [`pjrt::HostBuffer`] its device takes over without a copy. So
//! neither side holds more than the state plus one shard (none on the CPU plugin) and the
//! socket buffers, and the bytes are copied only by the kernel, once each way.
//!
//! Wire format (little-endian). Request: `"PODS" u8 version u16 job_len job u64 step u16
//! worker_len worker [u8; 32] layout_digest`. Answer: `u8 status`: 0 (ok) followed by the
//! pieces, 1 (refused, worth retrying) or 2 (incompatible, not worth it) followed by `u32 len`
//! and a UTF-8 reason. Each piece: `u32 array u32 device u64 len`, `len` bytes, `u32 crc32c` of
//! them. Last, the puller answers `u8 0` once every piece arrived whole, so the survivor knows
//! its state was taken.
//!
//! Why its own framing rather than tonic's streaming or tokio-util's codec: both hand the
//! payload over in buffers of their own, from which it must be copied into the memory the
//! device takes over; that copy costs as much as the kernel's and cuts the rate on a 2-core
//! machine by a third (`benches/heal.rs` measures the three side by side).

use crate::error::WorkerError;
use crate::slice::{DeviceArray, Slice};
use bundle::TensorSpec;
use mesh::IciMesh;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"PODS";
const VERSION: u8 = 2;
const MAX_NAME_LEN: usize = 512;
const MAX_REASON_LEN: usize = 4096;
/// Bound on one read or write while a transfer is in progress.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes copied and checksummed at a time: small enough that the CRC reads them from cache.
const SEGMENT: usize = 1 << 20;

const OK: u8 = 0;
const REFUSED: u8 = 1;
const INCOMPATIBLE: u8 = 2;

impl fault::Classify for PeerError {
    fn fault(&self) -> fault::Fault {
        match self {
            PeerError::Io { .. } | PeerError::Refused { .. } | PeerError::NotPulled { .. } => {
                fault::Fault::Unreachable
            }
            PeerError::Incompatible { .. } | PeerError::Invalid { .. } | PeerError::Read(_) => {
                fault::Fault::Failed
            }
            PeerError::Place { source, .. } => fault::Classify::fault(&**source),
            PeerError::Cancelled { .. } | PeerError::Interrupted => fault::Fault::Interrupted,
        }
    }
}

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The network failed or timed out.
    #[error("state transfer with {peer}: {source}")]
    Io {
        /// The peer.
        peer: SocketAddr,
        /// The failure.
        source: io::Error,
    },
    /// The peer does not offer the state asked for (yet).
    #[error("peer {peer} refused the state transfer: {reason}")]
    Refused {
        /// The peer.
        peer: SocketAddr,
        /// Its reason.
        reason: String,
    },
    /// The two sides do not hold the same kind of state: another bundle or mesh.
    #[error("peer {peer} holds another state: {reason}")]
    Incompatible {
        /// The peer.
        peer: SocketAddr,
        /// What differs.
        reason: String,
    },
    /// The stream does not match the layout both sides agreed on, or a piece arrived corrupt.
    #[error("state transfer from {peer}: {reason}")]
    Invalid {
        /// The peer.
        peer: SocketAddr,
        /// What did not match.
        reason: String,
    },
    /// Placing a piece on the devices failed.
    #[error("placing the state pulled from {peer}: {source}")]
    Place {
        /// The peer.
        peer: SocketAddr,
        /// The device's error.
        source: Box<WorkerError>,
    },
    /// Reading the state off the devices to send it failed.
    #[error("reading the state to send: {0}")]
    Read(#[source] pjrt::Error),
    /// The transfer was cancelled: a newer generation made it moot.
    #[error("state transfer with {peer} cancelled")]
    Cancelled {
        /// The peer.
        peer: SocketAddr,
    },
    /// The members expected to pull did not, in time.
    #[error("{} did not pull the state within {waited:?}", missing.join(", "))]
    NotPulled {
        /// Who did not.
        missing: Vec<String>,
        /// How long the survivor waited.
        waited: Duration,
    },
    /// The serve window ended early: a newer generation made it moot.
    #[error("serving the state stopped: the generation was interrupted")]
    Interrupted,
}

/// One piece of the state on the wire: a device's region of an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The array, in state order.
    pub array: usize,
    /// The device whose region it is.
    pub device: usize,
    /// Its length.
    pub bytes: usize,
}

/// What both sides of a transfer must agree on: the pieces in order and a digest of the arrays
/// (names, dtypes, shapes, shardings) and the mesh they are laid out on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The pieces, in wire order.
    pub pieces: Vec<Piece>,
    /// The digest.
    pub digest: [u8; 32],
}

impl Layout {
    /// The layout of a state of `specs` on `mesh`.
    pub fn new(specs: &[TensorSpec], mesh: &IciMesh) -> Layout {
        let mut digest = Sha256::new();
        digest.update(format!("{mesh}\n"));
        let mut pieces = Vec::new();
        for (array, spec) in specs.iter().enumerate() {
            digest.update(format!("{} {} {:?} {:?}\n", spec.name, spec.dtype, spec.shape, spec.sharding));
            let mut last = None;
            for device in 0..mesh.num_devices() {
                let region = spec.sharding.shard_region(&spec.shape, mesh, device);
                if last.as_ref() != Some(&region) {
                    let bytes = region.num_elements() as usize * spec.dtype.size();
                    pieces.push(Piece { array, device, bytes });
                }
                last = Some(region);
            }
        }
        Layout { pieces, digest: digest.finalize().into() }
    }

    /// Bytes on the wire.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.bytes as u64).sum()
    }
}

/// What a puller asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The job.
    pub job: String,
    /// The state after this many steps.
    pub step: u64,
    /// Who asks (the survivor serves the members it was told of).
    pub worker: String,
}

/// Ends a pull early, from another thread: the agent cancels a catch-up that a newer
/// generation made moot (its source may be the worker that was just lost), so the worker is
/// free to answer the quiesce instead of waiting out the transfer's timeouts.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<CancelInner>);

#[derive(Debug, Default)]
struct CancelInner {
    cancelled: AtomicBool,
    stream: Mutex<Option<TcpStream>>,
}

impl Cancel {
    /// Cancels the pull: a transfer in progress fails at once, none starts after.
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::SeqCst);
        if let Some(stream) = self.0.stream.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::SeqCst)
    }

    /// Keeps a handle on the transfer's socket, so that a cancel ends it; false when already
    /// cancelled.
    fn watch(&self, stream: &TcpStream) -> bool {
        let mut slot = self.0.stream.lock().unwrap_or_else(|e| e.into_inner());
        *slot = stream.try_clone().ok();
        !self.is_cancelled()
    }
}

/// Accepts pulls for the life of the worker and hands those that the open serve window
/// expects to whoever opened it; answers the others with the reason.
#[derive(Clone)]
pub struct StateServer {
    addr: SocketAddr,
    window: Arc<Mutex<Option<Window>>>,
}

struct Window {
    job: String,
    step: u64,
    digest: [u8; 32],
    pullers: BTreeSet<String>,
    incoming: mpsc::Sender<Pull>,
}

/// A pull the open window expects: who asks, and the connection, its request read.
type Pull = (String, TcpStream);

impl StateServer {
    /// Listens on `addr` (port 0: any free port).
    pub fn bind(addr: SocketAddr) -> io::Result<StateServer> {
        let listener = TcpListener::bind(addr)?;
        let server = StateServer { addr: listener.local_addr()?, window: Arc::new(Mutex::new(None)) };
        let window = server.window.clone();
        std::thread::Builder::new().name("state-server".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                let window = window.clone();
                // A thread per connection: reading a request waits on the peer.
                let _ = std::thread::Builder::new().name("state-request".into()).spawn(move || {
                    if let Err(e) = route(stream, &window) {
                        tracing::debug!("a state request failed: {e}");
                    }
                });
            }
        })?;
        Ok(server)
    }

    /// Where pullers connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Opens the window in which `pullers` may pull the job's state after `step` steps, laid
    /// out as `layout`; it closes when the returned value is dropped.
    pub fn open(&self, job: &str, step: u64, layout: &Layout, pullers: &[String]) -> ServeWindow {
        let (incoming, rx) = mpsc::channel();
        *self.window.lock().unwrap_or_else(|e| e.into_inner()) = Some(Window {
            job: job.into(),
            step,
            digest: layout.digest,
            pullers: pullers.iter().cloned().collect(),
            incoming,
        });
        ServeWindow { window: self.window.clone(), incoming: Mutex::new(rx) }
    }
}

/// An open serve window; see [`StateServer::open`] and [`serve`].
pub struct ServeWindow {
    window: Arc<Mutex<Option<Window>>>,
    /// Behind a lock so that whichever thread serves may hold the window.
    incoming: Mutex<mpsc::Receiver<Pull>>,
}

impl Drop for ServeWindow {
    fn drop(&mut self) {
        *self.window.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Reads a request and hands the connection to the open window, or refuses it.
fn route(stream: TcpStream, window: &Mutex<Option<Window>>) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.set_nodelay(true)?;
    let (request, digest) = read_request(&mut &stream)?;
    let verdict = {
        let window = window.lock().unwrap_or_else(|e| e.into_inner());
        match window.as_ref() {
            None => Err((REFUSED, format!("it offers no state now (asked for step {})", request.step))),
            Some(w) if w.job != request.job => {
                Err((REFUSED, format!("it serves another job, not {}", request.job)))
            }
            Some(w) if w.step != request.step => {
                Err((REFUSED, format!("it holds step {}, not {}", w.step, request.step)))
            }
            Some(w) if w.digest != digest => Err((
                INCOMPATIBLE,
                "its arrays or mesh differ from the puller's (the peers run different bundles)".to_string(),
            )),
            Some(w) if !w.pullers.contains(&request.worker) => {
                Err((REFUSED, format!("it does not expect {} to pull from it", request.worker)))
            }
            Some(w) => Ok(w.incoming.clone()),
        }
    };
    match verdict {
        Ok(incoming) => {
            if let Err(mpsc::SendError((_, stream))) = incoming.send((request.worker, stream)) {
                refuse(&stream, REFUSED, "its serve window just closed")?;
            }
            Ok(())
        }
        Err((status, reason)) => refuse(&stream, status, &reason),
    }
}

fn refuse(mut stream: &TcpStream, status: u8, reason: &str) -> io::Result<()> {
    let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON_LEN)];
    let mut answer = vec![status];
    answer.extend_from_slice(&(reason.len() as u32).to_le_bytes());
    answer.extend_from_slice(reason);
    stream.write_all(&answer)
}

fn read_request(r: &mut impl Read) -> io::Result<(Request, [u8; 32])> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let mut magic = [0u8; 5];
    r.read_exact(&mut magic)?;
    if &magic[..4] != MAGIC || magic[4] != VERSION {
        return Err(bad("not a state request of this version"));
    }
    let job = read_name(r)?;
    let step = u64::from_le_bytes(read_le(r)?);
    let worker = read_name(r)?;
    let digest = read_le::<32>(r)?;
    Ok((Request { job, step, worker }, digest))
}

fn read_name(r: &mut impl Read) -> io::Result<String> {
    let len = u16::from_le_bytes(read_le(r)?) as usize;
    if len > MAX_NAME_LEN {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "a name too long"));
    }
    let mut name = vec![0u8; len];
    r.read_exact(&mut name)?;
    String::from_utf8(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a name not UTF-8"))
}

fn write_request(request: &Request, layout: &Layout) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + request.job.len() + request.worker.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    for (i, name) in [&request.job, &request.worker].into_iter().enumerate() {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        if i == 0 {
            out.extend_from_slice(&request.step.to_le_bytes());
        }
    }
    out.extend_from_slice(&layout.digest);
    out
}

/// What a survivor's serve window did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Served {
    /// Per member that pulled: who, bytes and seconds from its request to its answer.
    pub pulls: Vec<(String, u64, f64)>,
}

/// Serves the state in `window` until every one of `pullers` has pulled it whole, sending each
/// piece of `layout` from `sources` (one device buffer per piece, in the layout's order). Ends
/// with [`PeerError::Interrupted`] as soon as `interrupted` says so (a newer generation), and
/// with [`PeerError::NotPulled`] after `wait`. Pullers are served at once, each on a thread of
/// its own.
pub fn serve(
    window: &ServeWindow,
    layout: &Layout,
    sources: &[&pjrt::Buffer],
    pullers: &[String],
    wait: Duration,
    interrupted: &dyn Fn() -> bool,
) -> Result<Served, PeerError> {
    let started = Instant::now();
    let mut missing: BTreeSet<String> = pullers.iter().cloned().collect();
    let mut served = Served::default();
    let stop = AtomicBool::new(false);
    let open: Mutex<Vec<TcpStream>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = mpsc::channel();
        let mut running = 0usize;
        let outcome = loop {
            while let Ok((worker, result)) = done_rx.try_recv() {
                running -= 1;
                match result {
                    Ok((bytes, seconds)) => {
                        missing.remove(&worker);
                        served.pulls.push((worker, bytes, seconds));
                    }
                    Err(e) => tracing::warn!("sending the state to {worker} failed: {e}"),
                }
            }
            if missing.is_empty() {
                break Ok(());
            }
            if interrupted() {
                break Err(PeerError::Interrupted);
            }
            if started.elapsed() >= wait {
                break Err(PeerError::NotPulled { missing: missing.iter().cloned().collect(), waited: wait });
            }
            let next = window
                .incoming
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .recv_timeout(Duration::from_millis(50));
            let Ok((worker, stream)) = next else {
                continue;
            };
            let Ok(peer) = stream.peer_addr() else { continue };
            if let Ok(clone) = stream.try_clone() {
                open.lock().unwrap_or_else(|e| e.into_inner()).push(clone);
            }
            running += 1;
            let (done_tx, stop) = (done_tx.clone(), &stop);
            scope.spawn(move || {
                let started = Instant::now();
                let result = send(&stream, peer, layout, sources, stop);
                let _ = done_tx.send((worker, result.map(|bytes| (bytes, started.elapsed().as_secs_f64()))));
            });
        };
        // Transfers still running end now: their pullers retry or are moot.
        stop.store(true, Ordering::SeqCst);
        for stream in open.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
        drop(done_tx);
        while running > 0 && done_rx.recv().is_ok() {
            running -= 1;
        }
        outcome
    })?;
    Ok(served)
}

/// Sends every piece to one puller, then waits for its answer; returns the bytes sent.
fn send(
    stream: &TcpStream,
    peer: SocketAddr,
    layout: &Layout,
    sources: &[&pjrt::Buffer],
    stop: &AtomicBool,
) -> Result<u64, PeerError> {
    let io = |source| PeerError::Io { peer, source };
    let mut out = stream;
    out.write_all(&[OK]).map_err(io)?;
    let mut sent = 0u64;
    for (piece, source) in layout.pieces.iter().zip(sources) {
        if stop.load(Ordering::Relaxed) {
            return Err(PeerError::Cancelled { peer });
        }
        let copy;
        let bytes: &[u8] = match source.host_view().map_err(PeerError::Read)? {
            Some(view) => view,
            None => {
                copy = source.to_host().map_err(PeerError::Read)?;
                &copy
            }
        };
        if bytes.len() != piece.bytes {
            return Err(PeerError::Invalid {
                peer,
                reason: format!(
                    "device {} holds {} bytes of array {}, the layout says {}",
                    piece.device,
                    bytes.len(),
                    piece.array,
                    piece.bytes
                ),
            });
        }
        let mut header = [0u8; 16];
        header[..4].copy_from_slice(&(piece.array as u32).to_le_bytes());
        header[4..8].copy_from_slice(&(piece.device as u32).to_le_bytes());
        header[8..].copy_from_slice(&(piece.bytes as u64).to_le_bytes());
        out.write_all(&header).map_err(io)?;
        let mut crc = 0u32;
        for segment in bytes.chunks(SEGMENT) {
            crc = crc32c::crc32c_append(crc, segment);
            out.write_all(segment).map_err(io)?;
        }
        out.write_all(&crc.to_le_bytes()).map_err(io)?;
        sent += piece.bytes as u64;
    }
    let mut answer = [0u8; 1];
    out.read_exact(&mut answer).map_err(io)?;
    if answer[0] != OK {
        return Err(PeerError::Invalid { peer, reason: "the puller did not take the state".into() });
    }
    Ok(sent)
}

/// What a pull did.
#[derive(Debug, Clone, PartialEq)]
pub struct Pulled {
    /// Bytes received.
    pub bytes: u64,
    /// Seconds from the connection the survivor served to the last byte placed.
    pub seconds: f64,
    /// Attempts refused or failed before the one that succeeded.
    pub retries: u32,
}

/// Pulls the job's state after `request.step` steps from `peer` onto `slice`, one array of
/// `specs` (the state's, in order) at a time, each piece read into memory its device takes
/// over. Retries a refusal or a broken connection (the survivor may not have opened its window
/// yet) until `wait` has passed or `cancel` fires; a peer of another layout, or a piece that
/// arrives corrupt, fails at once.
pub fn pull(
    peer: SocketAddr,
    request: &Request,
    slice: &Slice,
    specs: &[TensorSpec],
    wait: Duration,
    cancel: &Cancel,
) -> Result<(Vec<DeviceArray>, Pulled), PeerError> {
    let layout = Layout::new(specs, slice.mesh());
    let deadline = Instant::now() + wait;
    let mut retries = 0;
    loop {
        if cancel.is_cancelled() {
            return Err(PeerError::Cancelled { peer });
        }
        match pull_once(peer, request, &layout, slice, specs, cancel) {
            Ok((arrays, bytes, seconds)) => return Ok((arrays, Pulled { bytes, seconds, retries })),
            Err(_) if cancel.is_cancelled() => return Err(PeerError::Cancelled { peer }),
            Err(
                e @ (PeerError::Invalid { .. } | PeerError::Incompatible { .. } | PeerError::Place { .. }),
            ) => {
                return Err(e);
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(e) => {
                tracing::debug!("{e}; retrying");
                retries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn pull_once(
    peer: SocketAddr,
    request: &Request,
    layout: &Layout,
    slice: &Slice,
    specs: &[TensorSpec],
    cancel: &Cancel,
) -> Result<(Vec<DeviceArray>, u64, f64), PeerError> {
    let io = |source| PeerError::Io { peer, source };
    let invalid = |reason: String| PeerError::Invalid { peer, reason };
    let stream = TcpStream::connect_timeout(&peer, IO_TIMEOUT).map_err(io)?;
    if !cancel.watch(&stream) {
        return Err(PeerError::Cancelled { peer });
    }
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    (&stream).write_all(&write_request(request, layout)).map_err(io)?;
    // Small reads (status, headers) come through the buffer; a piece larger than it is read
    // straight into its destination.
    let mut reader = BufReader::with_capacity(64 << 10, &stream);
    let status = read_le::<1>(&mut reader).map_err(io)?[0];
    if status != OK {
        let len = u32::from_le_bytes(read_le(&mut reader).map_err(io)?) as usize;
        if len > MAX_REASON_LEN {
            return Err(invalid(format!("a refusal of {len} bytes")));
        }
        let mut reason = vec![0u8; len];
        reader.read_exact(&mut reason).map_err(io)?;
        let reason = String::from_utf8_lossy(&reason).into_owned();
        return Err(match status {
            INCOMPATIBLE => PeerError::Incompatible { peer, reason },
            _ => PeerError::Refused { peer, reason },
        });
    }
    let started = Instant::now();
    let mut pieces = layout.pieces.iter().peekable();
    let mut arrays = Vec::with_capacity(specs.len());
    for (index, spec) in specs.iter().enumerate() {
        // The wire's own failure, kept aside: `upload_each` only carries the devices' errors.
        let mut wire = None;
        let placed = slice.upload_each(spec, |device, _| {
            let read = match pieces.next().filter(|p| p.array == index && p.device == device) {
                Some(piece) => read_piece(&mut reader, *piece, peer),
                None => Err(invalid(format!("the layout has no piece for array {index} on device {device}"))),
            };
            read.map_err(|e| {
                wire = Some(e);
                WorkerError::Interrupted
            })
        });
        match (placed, wire) {
            (_, Some(e)) => return Err(e),
            (Ok(array), None) => arrays.push(array),
            (Err(source), None) => return Err(PeerError::Place { peer, source: Box::new(source) }),
        }
    }
    if pieces.next().is_some() {
        return Err(invalid("the layout has pieces the devices did not ask for".into()));
    }
    (&stream).write_all(&[OK]).map_err(io)?;
    Ok((arrays, layout.bytes(), started.elapsed().as_secs_f64()))
}

/// Reads one piece (header, bytes, CRC) into memory a device can take over.
fn read_piece(r: &mut impl Read, piece: Piece, peer: SocketAddr) -> Result<pjrt::HostBuffer, PeerError> {
    let io = |source| PeerError::Io { peer, source };
    let header = read_le::<16>(r).map_err(io)?;
    let array = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let device = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
    let len = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
    if (array, device, len) != (piece.array, piece.device, piece.bytes as u64) {
        return Err(PeerError::Invalid {
            peer,
            reason: format!(
                "array {array} device {device} of {len} bytes where array {} device {} of {} bytes belongs",
                piece.array, piece.device, piece.bytes
            ),
        });
    }
    let mut buffer = pjrt::HostBuffer::zeroed(piece.bytes)
        .map_err(|e| PeerError::Io { peer, source: io::Error::other(e) })?;
    let mut crc = 0u32;
    for segment in buffer.chunks_mut(SEGMENT) {
        r.read_exact(segment).map_err(io)?;
        crc = crc32c::crc32c_append(crc, segment);
    }
    let sent = u32::from_le_bytes(read_le(r).map_err(io)?);
    if sent != crc {
        return Err(PeerError::Invalid {
            peer,
            reason: format!(
                "array {array} on device {device} arrived with crc32c {crc:#010x}, sent with {sent:#010x}: the stream was corrupted"
            ),
        });
    }
    Ok(buffer)
}

/// `N` bytes off the stream, for a little-endian integer's `from_le_bytes`.
fn read_le<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    r.read_exact(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::{DType, Sharding};

    fn spec(name: &str, sharding: Vec<Vec<String>>) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            shape: vec![8, 6],
            dtype: DType::Float32,
            sharding: Sharding::new(sharding),
            donated: false,
            memory_kind: None,
        }
    }

    fn axis(name: &str) -> Vec<String> {
        vec![name.to_string()]
    }

    #[test]
    fn the_layout_has_each_region_the_devices_ask_for_in_their_order() {
        // Devices in row-major order of (fsdp, tp): d = 2 * fsdp + tp.
        let mesh = IciMesh::new([("fsdp", 2), ("tp", 2)]).unwrap();
        let specs = [
            spec("rows", vec![axis("fsdp"), vec![]]),
            spec("whole", vec![vec![], vec![]]),
            spec("columns", vec![vec![], axis("tp")]),
        ];
        let layout = Layout::new(&specs, &mesh);
        let pieces: Vec<(usize, usize, usize)> =
            layout.pieces.iter().map(|p| (p.array, p.device, p.bytes)).collect();
        // A replica next to its twin is copied on the device side, one that is not is sent.
        assert_eq!(
            pieces,
            [(0, 0, 96), (0, 2, 96), (1, 0, 192), (2, 0, 96), (2, 1, 96), (2, 2, 96), (2, 3, 96)]
        );
        assert_eq!(layout.bytes(), 768);
    }

    #[test]
    fn layouts_of_other_arrays_or_meshes_differ() {
        let mesh = IciMesh::new([("fsdp", 2)]).unwrap();
        let base = Layout::new(&[spec("w", vec![axis("fsdp"), vec![]])], &mesh);
        assert_eq!(base, Layout::new(&[spec("w", vec![axis("fsdp"), vec![]])], &mesh));
        let others = [
            Layout::new(&[spec("v", vec![axis("fsdp"), vec![]])], &mesh),
            Layout::new(&[spec("w", vec![vec![], axis("fsdp")])], &mesh),
            Layout::new(&[TensorSpec { shape: vec![8, 7], ..spec("w", vec![axis("fsdp"), vec![]]) }], &mesh),
            Layout::new(&[spec("w", vec![axis("fsdp"), vec![]])], &IciMesh::new([("fsdp", 4)]).unwrap()),
        ];
        for other in others {
            assert_ne!(other.digest, base.digest);
        }
    }

    #[test]
    fn a_request_reads_back_as_written() {
        let layout = Layout::new(&[], &IciMesh::new([("fsdp", 1)]).unwrap());
        let request = Request { job: "job-1".into(), step: 1234, worker: "job-1.w7".into() };
        let (read, digest) = read_request(&mut &write_request(&request, &layout)[..]).unwrap();
        assert_eq!((read, digest), (request, layout.digest));
        let mut old = write_request(&Request { job: "j".into(), step: 1, worker: "w".into() }, &layout);
        old[4] = 1;
        assert!(read_request(&mut &old[..]).is_err(), "another version is refused");
    }
}
