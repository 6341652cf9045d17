//! `collective-peer`: one member process, driven by a parent over stdin/stdout (one JSON value
//! per line). The integration tests and the benchmark spawn it to run members as real processes.
//!
//! 1. It binds port 0 of `127.0.0.1` (or of `$COLLECTIVE_PEER_BIND`: the pod-network benchmark
//!    runs members in network namespaces of their own) and prints `{"addr": "..."}`.
//! 2. It reads a [`Task`] (the group spec, the config and the work) and forms the group.
//! 3. It does the work, printing progress and results; an error is printed as
//!    `{"error": {...}}` and exits with status 3.
//!
//! Two modes measure plain TCP for the benchmark's baselines:
//! - `collective-peer raw-sink` prints its address, accepts one connection, reads until EOF and
//!   prints how many bytes arrived in how long;
//! - `collective-peer raw-ring` prints its address, reads `{"next": ADDR, "bytes": N}`, then sends
//!   N bytes to `next` while receiving N bytes from whoever connects to it, and prints how long
//!   both took: a ring of plain streams, the ceiling for an all-reduce's links on this machine.
#![forbid(unsafe_code)]

use podctl_collective::{AbortHandle, Buffer, Config, Endpoint, Error, GroupSpec};
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What the parent asks for.
#[derive(Deserialize)]
struct Task {
    spec: GroupSpec,
    config: Config,
    work: Work,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Work {
    /// Reduce the buffers in `inputs` (one file per local rank, raw little-endian bytes) and
    /// write the sums to `outputs`.
    AllReduce { dtype: mesh::DType, inputs: Vec<PathBuf>, outputs: Vec<PathBuf> },
    /// Reduce `elems`-element buffers `iterations` times, printing `{"iteration": k}` after each.
    Loop { elems: usize, iterations: usize },
    /// Time `iters` all-reduces of `elems` float32 elements after `warmup` untimed ones.
    Bench { elems: usize, warmup: usize, iters: usize },
}

fn main() -> ExitCode {
    let result = match std::env::args().nth(1).as_deref() {
        Some("raw-sink") => raw_sink(),
        Some("raw-ring") => raw_ring(),
        _ => member(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(report) => {
            say(&json!({ "error": report }));
            ExitCode::from(3)
        }
    }
}

/// Prints one line to the parent.
fn say(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

/// An error as the parent reads it.
fn report(e: &Error) -> Value {
    let (kind, rank) = match e {
        Error::PeerLost { rank, .. } => ("PeerLost", Some(*rank)),
        Error::PeerAborted { rank, .. } => ("PeerAborted", Some(*rank)),
        Error::PeerFailed { rank, .. } => ("PeerFailed", Some(*rank)),
        Error::Timeout { rank, .. } => ("Timeout", Some(*rank)),
        Error::Protocol { rank, .. } => ("Protocol", Some(*rank)),
        Error::Aborted => ("Aborted", None),
        _ => ("Other", None),
    };
    json!({ "kind": kind, "rank": rank, "message": e.to_string() })
}

fn other(message: String) -> Value {
    json!({ "kind": "Other", "rank": null, "message": message })
}

/// Where to listen: `$COLLECTIVE_PEER_BIND`, port 0; `127.0.0.1:0` by default.
fn bind_addr() -> Result<SocketAddr, Value> {
    let ip = std::env::var("COLLECTIVE_PEER_BIND").unwrap_or_else(|_| "127.0.0.1".into());
    let ip: IpAddr = ip.parse().map_err(|e| other(format!("COLLECTIVE_PEER_BIND={ip}: {e}")))?;
    Ok(SocketAddr::new(ip, 0))
}

fn member() -> Result<(), Value> {
    let endpoint = Endpoint::bind(bind_addr()?).map_err(|e| report(&e))?;
    say(&json!({ "addr": endpoint.local_addr().to_string() }));
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| other(format!("reading the task: {e}")))?;
    let task: Task = serde_json::from_str(&line).map_err(|e| other(format!("parsing the task: {e}")))?;
    let group = endpoint.form(&task.spec, &task.config, &AbortHandle::new()).map_err(|e| report(&e))?;
    match task.work {
        Work::AllReduce { dtype, inputs, outputs } => {
            let buffers = inputs
                .iter()
                .map(|path| {
                    let bytes =
                        std::fs::read(path).map_err(|e| other(format!("reading {}: {e}", path.display())))?;
                    Buffer::from_vec(dtype, bytes).map_err(|e| report(&e))
                })
                .collect::<Result<Vec<_>, Value>>()?;
            let sums = group.all_reduce(buffers).map_err(|e| report(&e))?;
            for (path, sum) in outputs.iter().zip(&sums) {
                std::fs::write(path, sum.as_bytes())
                    .map_err(|e| other(format!("writing {}: {e}", path.display())))?;
            }
            say(&json!({ "done": true }));
        }
        Work::Loop { elems, iterations } => {
            let mut buffers: Vec<Buffer> =
                group.local_ranks().iter().map(|_| Buffer::from_f32(&vec![0.0; elems])).collect();
            for iteration in 0..iterations {
                buffers = group.all_reduce(buffers).map_err(|e| report(&e))?;
                say(&json!({ "iteration": iteration }));
            }
            say(&json!({ "done": true }));
        }
        Work::Bench { elems, warmup, iters } => {
            let mut buffers: Vec<Buffer> =
                group.local_ranks().iter().map(|_| Buffer::from_f32(&vec![0.0; elems])).collect();
            let mut times = Vec::with_capacity(iters);
            for i in 0..warmup + iters {
                let start = Instant::now();
                buffers = group.all_reduce(buffers).map_err(|e| report(&e))?;
                if i >= warmup {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
            say(&json!({ "times": times }));
        }
    }
    Ok(())
}

/// Reads from `stream` until EOF or `limit` bytes; returns the byte count.
fn drain(stream: &mut TcpStream, limit: u64) -> Result<u64, Value> {
    stream.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| other(format!("{e}")))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    while total < limit {
        let n = stream.read(&mut buf).map_err(|e| other(format!("read: {e}")))?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    Ok(total)
}

fn raw_ring() -> Result<(), Value> {
    #[derive(Deserialize)]
    struct RingTask {
        next: String,
        bytes: u64,
    }
    let listener = TcpListener::bind(bind_addr()?).map_err(|e| other(format!("bind: {e}")))?;
    let addr = listener.local_addr().map_err(|e| other(format!("local_addr: {e}")))?;
    say(&json!({ "addr": addr.to_string() }));
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| other(format!("reading the task: {e}")))?;
    let task: RingTask = serde_json::from_str(&line).map_err(|e| other(format!("parsing the task: {e}")))?;
    let receiver = std::thread::spawn(move || -> Result<u64, Value> {
        let (mut stream, _) = listener.accept().map_err(|e| other(format!("accept: {e}")))?;
        drain(&mut stream, task.bytes)
    });
    let mut next =
        TcpStream::connect(&task.next).map_err(|e| other(format!("connect {}: {e}", task.next)))?;
    let start = Instant::now();
    let block = vec![1u8; 4 << 20];
    let mut left = task.bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        next.write_all(&block[..n]).map_err(|e| other(format!("write: {e}")))?;
        left -= n as u64;
    }
    let received = receiver.join().map_err(|_| other("receiver thread panicked".into()))??;
    say(&json!({ "bytes": received, "secs": start.elapsed().as_secs_f64() }));
    Ok(())
}

fn raw_sink() -> Result<(), Value> {
    let listener = TcpListener::bind(bind_addr()?).map_err(|e| other(format!("bind: {e}")))?;
    let addr = listener.local_addr().map_err(|e| other(format!("local_addr: {e}")))?;
    say(&json!({ "addr": addr.to_string() }));
    let (mut stream, _) = listener.accept().map_err(|e| other(format!("accept: {e}")))?;
    let start = Instant::now();
    let total = drain(&mut stream, u64::MAX)?;
    say(&json!({ "bytes": total, "secs": start.elapsed().as_secs_f64() }));
    Ok(())
}
