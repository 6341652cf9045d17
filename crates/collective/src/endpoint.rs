//! [`Endpoint`]: a member's listener, and forming a [`Group`] from a [`GroupSpec`].
//!
//! Every ring link `r -> r+1` whose ranks live in different processes is one TCP connection,
//! opened by the sender's process. The opener sends a [`Hello`] (job, generation, placement,
//! chunk size, which link), the listener checks it against its own spec and answers; a peer from
//! another job, another placement or an older generation is refused with the reason. Links
//! between co-located ranks are in-memory pipes.

use crate::abort::AbortHandle;
use crate::error::{Error, Result};
use crate::group::Group;
use crate::spec::{Config, GroupSpec};
use crate::transport::{Filter, Link, PeerRef, Pipe, RxLink, TcpRx, TcpTx, TxLink, Verdict};
use crate::wire::{Hello, PROTOCOL_VERSION, Reply};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pause between connection attempts to a peer that is not listening or not ready yet.
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Pause between polls of the non-blocking listener while forming.
const ACCEPT_POLL: Duration = Duration::from_millis(2);
/// Longest wait for a connected client's hello, so a silent client cannot stall forming.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest single attempt (connect, hello, reply): a peer that is not forming yet leaves the
/// connection unanswered in its backlog, and the next attempt starts afresh.
const ATTEMPT: Duration = Duration::from_secs(2);
/// The connector's confirmation after an accept, so the acceptor never keeps a connection the
/// connector gave up on while the reply was on its way.
const CONFIRM: u8 = 0xac;

/// A member's listener. Bind it once per process and keep it across generations: the address is
/// what the coordinator puts in every [`GroupSpec`].
pub struct Endpoint {
    listener: Mutex<TcpListener>,
    addr: SocketAddr,
    filter: Option<Arc<dyn Filter>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .field("filtered", &self.filter.is_some())
            .finish()
    }
}

/// A ring link as seen from its two ends.
type Edge = (usize, usize);

impl Endpoint {
    /// Binds the listener (port 0 picks a free port; see [`local_addr`](Self::local_addr)).
    pub fn bind(addr: SocketAddr) -> Result<Endpoint> {
        let bind_error = |e: io::Error| Error::Bind { addr, detail: e.to_string() };
        let listener = TcpListener::bind(addr).map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        Ok(Endpoint { listener: Mutex::new(listener), addr, filter: None })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Installs a filter on every frame and connection attempt of groups formed from now on.
    pub fn set_filter(&mut self, filter: Arc<dyn Filter>) {
        self.filter = Some(filter);
    }

    /// Forms this member's part of `spec`'s group: connects to the peers it sends to, accepts
    /// the peers that send to it, and starts the ring threads. Fails within
    /// `config.connect_timeout`, at once on a refusal that retrying cannot fix (another job, a
    /// stale generation), or when `abort` trips.
    pub fn form(&self, spec: &GroupSpec, config: &Config, abort: &AbortHandle) -> Result<Group> {
        spec.validate()?;
        config.validate()?;
        if abort.is_aborted() {
            return Err(Error::Aborted);
        }
        let listener = self.listener.lock().unwrap_or_else(|p| p.into_inner());
        let d = spec.ranks();
        let local = spec.local_ranks();
        let remote = |r: usize| spec.placement[r] != spec.me;
        let outgoing: Vec<Edge> =
            local.iter().map(|&r| (r, (r + 1) % d)).filter(|&(_, to)| remote(to)).collect();
        let incoming: Vec<Edge> =
            local.iter().map(|&r| ((r + d - 1) % d, r)).filter(|&(from, _)| remote(from)).collect();
        let deadline = Instant::now() + config.connect_timeout;
        let stop = AtomicBool::new(false);
        let forming = Forming { spec, config, abort, stop: &stop, deadline, filter: self.filter.as_deref() };

        let (accepted, connected) = std::thread::scope(|scope| {
            let connectors: Vec<_> = outgoing
                .iter()
                .map(|&edge| {
                    let forming = &forming;
                    scope.spawn(move || {
                        let result = forming.connect(edge);
                        if result.is_err() {
                            forming.stop.store(true, Ordering::SeqCst);
                        }
                        result
                    })
                })
                .collect();
            let accepted = forming.accept(&listener, &incoming);
            if accepted.is_err() {
                stop.store(true, Ordering::SeqCst);
            }
            let connected: Vec<Result<TcpStream>> =
                connectors.into_iter().map(|c| c.join().unwrap_or(Err(Error::Aborted))).collect();
            (accepted, connected)
        });
        drop(listener);
        if abort.is_aborted() {
            return Err(Error::Aborted);
        }
        // A side that stopped because another failed reports `Aborted`; report the real cause.
        let mut out_streams = HashMap::new();
        let mut errors = Vec::new();
        for (edge, result) in outgoing.iter().zip(connected) {
            match result {
                Ok(stream) => {
                    out_streams.insert(*edge, stream);
                }
                Err(e) => errors.push(e),
            }
        }
        let in_streams = match accepted {
            Ok(streams) => streams,
            Err(e) => {
                errors.push(e);
                HashMap::new()
            }
        };
        if let Some(first) = errors.iter().find(|e| **e != Error::Aborted).or(errors.first()) {
            return Err(first.clone());
        }
        self.assemble(spec, config, abort, out_streams, in_streams)
    }

    /// Turns the established streams into per-rank links and starts the group.
    fn assemble(
        &self,
        spec: &GroupSpec,
        config: &Config,
        abort: &AbortHandle,
        mut out_streams: HashMap<Edge, TcpStream>,
        mut in_streams: HashMap<Edge, TcpStream>,
    ) -> Result<Group> {
        let d = spec.ranks();
        let peer =
            |r: usize| PeerRef { rank: r, member: spec.placement[r], addr: spec.members[spec.placement[r]] };
        let mut pipes: HashMap<Edge, Arc<Pipe>> = HashMap::new();
        let mut sockets = Vec::new();
        let mut links = Vec::new();
        let io_timeout = config.io_timeout;
        // Options and clones of a fresh socket only fail when the connection or the process is
        // already in trouble; report it against the peer at the other end.
        let ready = |stream: &TcpStream, p: &PeerRef, sockets: &mut Vec<TcpStream>| {
            let lost = |e: io::Error| p.lost(format!("setting up the connection failed: {e}"));
            configure(stream, io_timeout).map_err(lost)?;
            sockets.push(stream.try_clone().map_err(lost)?);
            Ok::<(), Error>(())
        };
        for r in spec.local_ranks() {
            let (succ, pred) = ((r + 1) % d, (r + d - 1) % d);
            let tx = match out_streams.remove(&(r, succ)) {
                Some(stream) => {
                    let p = peer(succ);
                    ready(&stream, &p, &mut sockets)?;
                    TxLink::Tcp(TcpTx {
                        stream,
                        link: Link { from_rank: r, to_rank: succ, to_member: p.member, to_addr: p.addr },
                        peer: p,
                        filter: self.filter.clone(),
                        io_timeout,
                        clean: true,
                    })
                }
                None => TxLink::Local {
                    pipe: Arc::clone(pipes.entry((r, succ)).or_insert_with(Pipe::new)),
                    peer: peer(succ),
                    io_timeout,
                },
            };
            let rx = match in_streams.remove(&(pred, r)) {
                Some(stream) => {
                    let p = peer(pred);
                    ready(&stream, &p, &mut sockets)?;
                    RxLink::Tcp(TcpRx { stream, peer: p, io_timeout, scratch: Vec::new() })
                }
                None => RxLink::Local {
                    pipe: Arc::clone(pipes.entry((pred, r)).or_insert_with(Pipe::new)),
                    peer: peer(pred),
                    io_timeout,
                },
            };
            links.push((tx, rx));
        }
        let pipes = pipes.into_values().collect();
        Group::start(spec.clone(), config.clone(), abort.clone(), links, pipes, sockets)
    }
}

/// Timeouts on every read and write of a ring socket, and no Nagle delay on the small headers.
fn configure(stream: &TcpStream, io_timeout: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))
}

/// Everything the connect and accept sides of one formation share.
struct Forming<'a> {
    spec: &'a GroupSpec,
    config: &'a Config,
    abort: &'a AbortHandle,
    /// Set when one side failed, so the others stop early.
    stop: &'a AtomicBool,
    deadline: Instant,
    filter: Option<&'a dyn Filter>,
}

impl Forming<'_> {
    fn hello(&self, (from, to): Edge) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            job: self.spec.job.clone(),
            generation: self.spec.generation,
            chunk_bytes: self.config.chunk_bytes as u32,
            placement: self.spec.placement.iter().map(|&m| m as u32).collect(),
            from_rank: from as u32,
            to_rank: to as u32,
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.abort.is_aborted()
    }

    /// Opens link `from -> to`, retrying until the peer listens, is at our generation, and
    /// accepts.
    fn connect(&self, edge: Edge) -> Result<TcpStream> {
        let (from, to) = edge;
        let member = self.spec.placement[to];
        let addr = self.spec.members[member];
        let link = Link { from_rank: from, to_rank: to, to_member: member, to_addr: addr };
        let mut last = String::from("no attempt finished");
        loop {
            if self.stopped() {
                return Err(Error::Aborted);
            }
            let now = Instant::now();
            if now >= self.deadline {
                return Err(Error::Timeout {
                    rank: to,
                    member,
                    addr,
                    awaited: format!("a handshake for the link from rank {from} (last attempt: {last})"),
                    after: self.config.connect_timeout,
                });
            }
            let verdict = self.filter.map_or(Verdict::Pass, |f| f.on_send(&link));
            match verdict {
                Verdict::Drop => {
                    last = "dropped by the transport filter".into();
                    std::thread::sleep(RETRY_PAUSE);
                    continue;
                }
                Verdict::Delay(delay) => std::thread::sleep(delay),
                Verdict::Pass => {}
            }
            let attempt = (self.deadline - now).min(ATTEMPT);
            match self.handshake(addr, attempt, edge) {
                Ok((stream, Reply::Accept)) => return Ok(stream),
                Ok((_, Reply::Stale(current))) => {
                    return Err(Error::StaleGeneration { ours: self.spec.generation, current, member, addr });
                }
                Ok((_, Reply::Mismatch(reason))) => return Err(Error::Refused { member, addr, reason }),
                Ok((_, Reply::Behind(theirs))) => {
                    last = format!("member {member} is still at generation {theirs}");
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    last = format!(
                        "no handshake reply within {attempt:?}: member {member} is not forming this group"
                    );
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    fn handshake(&self, addr: SocketAddr, attempt: Duration, edge: Edge) -> io::Result<(TcpStream, Reply)> {
        let mut stream = TcpStream::connect_timeout(&addr, attempt)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(attempt))?;
        stream.set_write_timeout(Some(attempt))?;
        self.hello(edge).write_to(&mut stream)?;
        let reply = Reply::read_from(&mut stream)?;
        if reply == Reply::Accept {
            stream.write_all(&[CONFIRM])?;
        }
        Ok((stream, reply))
    }

    /// Accepts until every link in `expected` is open. Refused connections are answered and
    /// forgotten; a peer at a newer generation means this member is stale and ends forming.
    fn accept(&self, listener: &TcpListener, expected: &[Edge]) -> Result<HashMap<Edge, TcpStream>> {
        let mut open = HashMap::new();
        let mut last_refusal: Option<String> = None;
        if expected.is_empty() {
            return Ok(open);
        }
        let set_mode = |nonblocking: bool| {
            listener
                .set_nonblocking(nonblocking)
                .map_err(|e| Error::Bind { addr: self.spec.members[self.spec.me], detail: e.to_string() })
        };
        set_mode(true)?;
        let result = loop {
            if open.len() == expected.len() {
                break Ok(open);
            }
            if self.stopped() {
                break Err(Error::Aborted);
            }
            if Instant::now() >= self.deadline {
                let (from, to) =
                    expected.iter().copied().find(|e| !open.contains_key(e)).unwrap_or(expected[0]);
                let member = self.spec.placement[from];
                let refusal = last_refusal.map(|r| format!("; last refused: {r}")).unwrap_or_default();
                break Err(Error::Timeout {
                    rank: from,
                    member,
                    addr: self.spec.members[member],
                    awaited: format!("rank {from} to connect for the link to rank {to}{refusal}"),
                    after: self.config.connect_timeout,
                });
            }
            match listener.accept() {
                Ok((stream, client)) => match self.answer(stream, expected) {
                    Ok(Answer::Joined(edge, stream)) => {
                        open.insert(edge, stream);
                    }
                    Ok(Answer::Refused(reason)) => {
                        tracing::warn!(%client, %reason, "refused a collective handshake");
                        last_refusal = Some(reason);
                    }
                    Ok(Answer::WeAreStale(e)) => break Err(e),
                    Err(e) => {
                        tracing::warn!(%client, error = %e, "dropped a connection that sent no valid handshake");
                        last_refusal = Some(format!("{client} sent no valid handshake: {e}"));
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(ACCEPT_POLL);
                }
            }
        };
        set_mode(false)?;
        result
    }

    /// Reads a hello and answers it.
    fn answer(&self, mut stream: TcpStream, expected: &[Edge]) -> io::Result<Answer> {
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
        stream.set_write_timeout(Some(HELLO_TIMEOUT))?;
        let hello = Hello::read_from(&mut stream)?;
        let ours = self.hello((0, 0));
        let edge = (hello.from_rank as usize, hello.to_rank as usize);
        let reply = if hello.version != ours.version {
            Reply::Mismatch(format!(
                "protocol version {} is not ours ({}); run the same podctl build on every host",
                hello.version, ours.version
            ))
        } else if hello.job != ours.job {
            Reply::Mismatch(format!("job {:?} is not this member's job {:?}", hello.job, ours.job))
        } else if hello.generation < ours.generation {
            Reply::Stale(ours.generation)
        } else if hello.generation > ours.generation {
            Reply::Behind(ours.generation)
        } else if hello.chunk_bytes != ours.chunk_bytes {
            Reply::Mismatch(format!(
                "chunk_bytes {} differs from this member's {}; every member must use the same",
                hello.chunk_bytes, ours.chunk_bytes
            ))
        } else if hello.placement != ours.placement {
            Reply::Mismatch(format!(
                "placement {:?} differs from this member's {:?} in generation {}",
                hello.placement, ours.placement, ours.generation
            ))
        } else if !expected.contains(&edge) {
            Reply::Mismatch(format!(
                "this member expects no link from rank {} to rank {}",
                hello.from_rank, hello.to_rank
            ))
        } else {
            Reply::Accept
        };
        reply.write_to(&mut stream)?;
        Ok(match reply {
            Reply::Accept => {
                let mut confirm = [0u8; 1];
                stream.read_exact(&mut confirm)?;
                if confirm[0] != CONFIRM {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "bad handshake confirmation"));
                }
                Answer::Joined(edge, stream)
            }
            Reply::Behind(_) => {
                let member = self.spec.placement.get(edge.0).copied().unwrap_or(self.spec.me);
                Answer::WeAreStale(Error::StaleGeneration {
                    ours: self.spec.generation,
                    current: hello.generation,
                    member,
                    addr: self.spec.members[member],
                })
            }
            Reply::Stale(_) => Answer::Refused(format!(
                "rank {} came from stale generation {} (this member is at {})",
                hello.from_rank, hello.generation, ours.generation
            )),
            Reply::Mismatch(reason) => Answer::Refused(reason),
        })
    }
}

/// The outcome of one incoming handshake.
enum Answer {
    Joined(Edge, TcpStream),
    Refused(String),
    WeAreStale(Error),
}
