//! Peer catch-up: a replacement worker fetches the train state from a live peer over TCP.
//!
//! A survivor publishes its state (parameters and optimizer state, as host bytes) at the step
//! boundary where a new generation starts; a newcomer told `FromPeer { step }` asks for exactly
//! that job and step and gets every array with a SHA-256 over the stream. The receiver knows
//! each array's name and byte length from its own bundle, so it checks the claims before it
//! allocates and refuses a state of another shape. Object storage is never involved.
//!
//! Wire format (little-endian): request `"PODS" u16 job_len job u64 step`; answer `u8 status`
//! (0: ok, 1: refused, followed by `u32 len` and a UTF-8 reason), then `u32 count`, per array
//! `u16 name_len name u64 byte_len bytes`, then the 32-byte SHA-256 of all array bytes in order.

use sha2::{Digest, Sha256};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"PODS";
const MAX_JOB_LEN: usize = 512;
const MAX_REASON_LEN: usize = 4096;
/// Bound on one read or write while a transfer is in progress.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A state snapshot: arrays in the bundle's state order.
pub type State = Vec<(String, Vec<u8>)>;

impl fault::Classify for PeerError {
    fn fault(&self) -> fault::Fault {
        match self {
            PeerError::Io { .. } | PeerError::Refused { .. } => fault::Fault::Unreachable,
            PeerError::Invalid { .. } => fault::Fault::Failed,
            PeerError::Cancelled { .. } => fault::Fault::Interrupted,
        }
    }
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The network failed or timed out.
    #[error("state transfer from {peer}: {source}")]
    Io {
        /// The peer.
        peer: SocketAddr,
        /// The failure.
        source: io::Error,
    },
    /// The peer does not hold the state asked for (yet).
    #[error("peer {peer} refused the state transfer: {reason}")]
    Refused {
        /// The peer.
        peer: SocketAddr,
        /// Its reason.
        reason: String,
    },
    /// The stream does not match what this worker's bundle says the state is.
    #[error("state transfer from {peer}: {reason}")]
    Invalid {
        /// The peer.
        peer: SocketAddr,
        /// What did not match.
        reason: String,
    },
    /// The fetch was cancelled: a newer generation made it moot.
    #[error("state transfer from {peer} cancelled")]
    Cancelled {
        /// The peer.
        peer: SocketAddr,
    },
}

/// Ends a fetch early, from another thread: the agent cancels a catch-up that a newer
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
    /// Cancels the fetch: a transfer in progress fails at once, none starts after.
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

/// Serves the published state to peers; runs on its own thread for the life of the worker.
#[derive(Clone)]
pub struct StateServer {
    addr: SocketAddr,
    published: Arc<Mutex<Option<Published>>>,
}

struct Published {
    job: String,
    step: u64,
    state: Arc<State>,
}

impl StateServer {
    /// Listens on `addr` (port 0: any free port).
    pub fn bind(addr: SocketAddr) -> io::Result<StateServer> {
        let listener = TcpListener::bind(addr)?;
        let server = StateServer { addr: listener.local_addr()?, published: Arc::new(Mutex::new(None)) };
        let published = server.published.clone();
        std::thread::Builder::new().name("state-server".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                let published = published.clone();
                // One thread per transfer: transfers are rare (recoveries) and few at once.
                let _ = std::thread::Builder::new().name("state-send".into()).spawn(move || {
                    if let Err(e) = serve(stream, &published) {
                        tracing::warn!("state transfer to a peer failed: {e}");
                    }
                });
            }
        })?;
        Ok(server)
    }

    /// Where peers connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Offers `state`, the job's state after `step` steps, replacing what was offered before.
    pub fn publish(&self, job: &str, step: u64, state: State) {
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Published { job: job.into(), step, state: Arc::new(state) });
    }

    /// Stops offering a state (the worker moved past it).
    pub fn withdraw(&self) {
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn serve(stream: TcpStream, published: &Mutex<Option<Published>>) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut magic = [0u8; 4];
    reader.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a state request"));
    }
    let job_len = u16::from_le_bytes(read_le(&mut reader)?) as usize;
    if job_len > MAX_JOB_LEN {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "job name too long"));
    }
    let mut job = vec![0u8; job_len];
    reader.read_exact(&mut job)?;
    let step = u64::from_le_bytes(read_le(&mut reader)?);
    let job = String::from_utf8_lossy(&job).into_owned();

    let offer = {
        let published = published.lock().unwrap_or_else(|e| e.into_inner());
        match published.as_ref() {
            Some(p) if p.job == job && p.step == step => Ok(p.state.clone()),
            Some(p) if p.job == job => Err(format!("it holds step {}, not {step}", p.step)),
            Some(_) => Err(format!("it serves another job, not {job}")),
            None => Err(format!("it has no state to offer yet (asked for step {step})")),
        }
    };
    let mut out = BufWriter::with_capacity(1 << 20, stream);
    match offer {
        Err(reason) => {
            out.write_all(&[1])?;
            out.write_all(&(reason.len() as u32).to_le_bytes())?;
            out.write_all(reason.as_bytes())?;
        }
        Ok(state) => {
            out.write_all(&[0])?;
            out.write_all(&(state.len() as u32).to_le_bytes())?;
            let mut digest = Sha256::new();
            for (name, bytes) in state.iter() {
                out.write_all(&(name.len() as u16).to_le_bytes())?;
                out.write_all(name.as_bytes())?;
                out.write_all(&(bytes.len() as u64).to_le_bytes())?;
                out.write_all(bytes)?;
                digest.update(bytes);
            }
            out.write_all(&digest.finalize())?;
        }
    }
    out.flush()
}

/// Fetches the job's state after `step` steps from `peer`. `expected` is this worker's own idea
/// of the state: (name, byte length) per array, in order. Retries a refusal (the peer may not
/// have reached the step boundary yet) until `wait` has passed or `cancel` fires.
pub fn fetch(
    peer: SocketAddr,
    job: &str,
    step: u64,
    expected: &[(String, usize)],
    wait: Duration,
    cancel: &Cancel,
) -> Result<State, PeerError> {
    let deadline = Instant::now() + wait;
    loop {
        if cancel.is_cancelled() {
            return Err(PeerError::Cancelled { peer });
        }
        match fetch_once(peer, job, step, expected, cancel) {
            Ok(state) => return Ok(state),
            Err(_) if cancel.is_cancelled() => return Err(PeerError::Cancelled { peer }),
            Err(e @ PeerError::Invalid { .. }) => return Err(e),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(e) => {
                tracing::debug!("{e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn fetch_once(
    peer: SocketAddr,
    job: &str,
    step: u64,
    expected: &[(String, usize)],
    cancel: &Cancel,
) -> Result<State, PeerError> {
    let io = |source| PeerError::Io { peer, source };
    let invalid = |reason: String| PeerError::Invalid { peer, reason };
    let stream = TcpStream::connect_timeout(&peer, IO_TIMEOUT).map_err(io)?;
    if !cancel.watch(&stream) {
        return Err(PeerError::Cancelled { peer });
    }
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    let mut request = Vec::with_capacity(14 + job.len());
    request.extend_from_slice(MAGIC);
    request.extend_from_slice(&(job.len() as u16).to_le_bytes());
    request.extend_from_slice(job.as_bytes());
    request.extend_from_slice(&step.to_le_bytes());
    (&stream).write_all(&request).map_err(io)?;

    let mut reader = BufReader::with_capacity(1 << 20, stream);
    let mut status = [0u8; 1];
    reader.read_exact(&mut status).map_err(io)?;
    if status[0] != 0 {
        let len = u32::from_le_bytes(read_le(&mut reader).map_err(io)?) as usize;
        if len > MAX_REASON_LEN {
            return Err(invalid(format!("refusal of {len} bytes")));
        }
        let mut reason = vec![0u8; len];
        reader.read_exact(&mut reason).map_err(io)?;
        return Err(PeerError::Refused { peer, reason: String::from_utf8_lossy(&reason).into_owned() });
    }
    let count = u32::from_le_bytes(read_le(&mut reader).map_err(io)?) as usize;
    if count != expected.len() {
        return Err(invalid(format!("{count} arrays, but this worker's bundle has {}", expected.len())));
    }
    let mut digest = Sha256::new();
    let mut state = Vec::with_capacity(count);
    for (want_name, want_len) in expected {
        let name_len = u16::from_le_bytes(read_le(&mut reader).map_err(io)?) as usize;
        let mut name = vec![0u8; name_len];
        reader.read_exact(&mut name).map_err(io)?;
        let name = String::from_utf8_lossy(&name).into_owned();
        let len = u64::from_le_bytes(read_le(&mut reader).map_err(io)?);
        if &name != want_name || len != *want_len as u64 {
            return Err(invalid(format!(
                "array {name} of {len} bytes where this worker expects {want_name} of {want_len} bytes \
                 (the peers run different bundles)"
            )));
        }
        let mut bytes = vec![0u8; *want_len];
        reader.read_exact(&mut bytes).map_err(io)?;
        digest.update(&bytes);
        state.push((name, bytes));
    }
    let mut sum = [0u8; 32];
    reader.read_exact(&mut sum).map_err(io)?;
    if sum[..] != digest.finalize()[..] {
        return Err(invalid("the SHA-256 of the arrays does not match; the stream was corrupted".into()));
    }
    Ok(state)
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

    fn state() -> State {
        vec![("w".into(), vec![1, 2, 3, 4]), ("m/w".into(), (0..=255).collect())]
    }

    fn expected(state: &State) -> Vec<(String, usize)> {
        state.iter().map(|(n, b)| (n.clone(), b.len())).collect()
    }

    #[test]
    fn a_published_state_arrives_whole() {
        let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        server.publish("job", 7, state());
        let got =
            fetch(server.local_addr(), "job", 7, &expected(&state()), Duration::ZERO, &Cancel::default())
                .unwrap();
        assert_eq!(got, state());
    }

    #[test]
    fn a_wrong_step_or_job_is_refused_with_the_reason() {
        let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let e = fetch(server.local_addr(), "job", 7, &expected(&state()), Duration::ZERO, &Cancel::default())
            .unwrap_err();
        assert!(e.to_string().contains("no state to offer yet"), "{e}");
        server.publish("job", 6, state());
        let e = fetch(server.local_addr(), "job", 7, &expected(&state()), Duration::ZERO, &Cancel::default())
            .unwrap_err();
        assert!(e.to_string().contains("holds step 6, not 7"), "{e}");
        let e =
            fetch(server.local_addr(), "other", 6, &expected(&state()), Duration::ZERO, &Cancel::default())
                .unwrap_err();
        assert!(e.to_string().contains("another job"), "{e}");
    }

    #[test]
    fn a_state_of_another_shape_is_refused_before_allocating_it() {
        let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        server.publish("job", 1, state());
        let mut want = expected(&state());
        want[1].1 = 1 << 40;
        let e = fetch(server.local_addr(), "job", 1, &want, Duration::from_secs(5), &Cancel::default())
            .unwrap_err();
        assert!(matches!(e, PeerError::Invalid { .. }), "{e}");
        assert!(e.to_string().contains("different bundles"), "{e}");
    }

    #[test]
    fn a_refusal_is_retried_until_the_state_is_published() {
        let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let later = server.clone();
        let publisher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            later.publish("job", 3, state());
        });
        let got = fetch(
            server.local_addr(),
            "job",
            3,
            &expected(&state()),
            Duration::from_secs(10),
            &Cancel::default(),
        )
        .unwrap();
        publisher.join().unwrap();
        assert_eq!(got, state());
    }

    #[test]
    fn a_cancel_ends_a_fetch_that_waits_for_a_state() {
        let server = StateServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let cancel = Cancel::default();
        let canceller = {
            let cancel = cancel.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                cancel.cancel();
            })
        };
        let started = Instant::now();
        let e = fetch(server.local_addr(), "job", 3, &expected(&state()), Duration::from_secs(60), &cancel)
            .unwrap_err();
        canceller.join().unwrap();
        assert!(matches!(e, PeerError::Cancelled { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10), "the cancel took {:?}", started.elapsed());
    }

    #[test]
    fn a_cancel_ends_a_transfer_that_stalls() {
        // A peer that accepts and then says nothing: the read would wait out its timeout.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let cancel = Cancel::default();
        let canceller = {
            let cancel = cancel.clone();
            std::thread::spawn(move || {
                let _held = silent.accept().unwrap();
                std::thread::sleep(Duration::from_millis(300));
                cancel.cancel();
                std::thread::sleep(Duration::from_millis(500));
            })
        };
        let started = Instant::now();
        let e = fetch(addr, "job", 3, &expected(&state()), Duration::from_secs(60), &cancel).unwrap_err();
        canceller.join().unwrap();
        assert!(matches!(e, PeerError::Cancelled { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10), "the cancel took {:?}", started.elapsed());
    }
}
