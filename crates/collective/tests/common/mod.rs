//! Shared by the integration tests: an independent sequential reference of the documented
//! summation order, deterministic gradients whose sums depend on that order, and helpers that run
//! members as threads (each with its own endpoint) or as `collective-peer` processes.
#![allow(dead_code)] // Each test binary uses a different subset.

use half::bf16;
use podctl_collective::{AbortHandle, Buffer, Config, Endpoint, Error, Group, GroupSpec};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::ops::Range;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

/// Segment `j` of `len` elements over `d` ranks: balanced, the first `len % d` one longer.
pub fn segment(len: usize, d: usize, j: usize) -> Range<usize> {
    let starts: Vec<usize> = (0..=d).map(|k| k * (len / d) + k.min(len % d)).collect();
    starts[j]..starts[j + 1]
}

/// The documented order: element `i` of segment `j` is `((x_j + x_{j+1}) + ...) + x_{j-1}`.
pub fn reference_f32(inputs: &[Vec<f32>]) -> Vec<f32> {
    let d = inputs.len();
    let len = inputs[0].len();
    let mut out = vec![0.0f32; len];
    for j in 0..d {
        for i in segment(len, d, j) {
            let mut acc = inputs[j][i];
            for k in 1..d {
                acc += inputs[(j + k) % d][i];
            }
            out[i] = acc;
        }
    }
    out
}

/// The documented bf16 rule: every add in f32, rounded back to bf16 (nearest, ties to even).
pub fn reference_bf16(inputs: &[Vec<bf16>]) -> Vec<bf16> {
    let d = inputs.len();
    let len = inputs[0].len();
    let mut out = vec![bf16::ZERO; len];
    for j in 0..d {
        for i in segment(len, d, j) {
            let mut acc = inputs[j][i];
            for k in 1..d {
                acc = bf16::from_f32(acc.to_f32() + inputs[(j + k) % d][i].to_f32());
            }
            out[i] = acc;
        }
    }
    out
}

/// Deterministic values spread over 40 binades with random signs, so a different summation order
/// changes many results.
pub fn gradient_f32(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut state = seed ^ (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mantissa = 1.0 + (state >> 40) as f32 / (1u64 << 24) as f32;
            let exponent = ((state >> 8) % 40) as i32 - 20;
            let sign = if state & 1 == 0 { 1.0 } else { -1.0 };
            sign * mantissa * 2f32.powi(exponent)
        })
        .collect()
}

pub fn gradient_bf16(seed: u64, rank: usize, len: usize) -> Vec<bf16> {
    gradient_f32(seed, rank, len).into_iter().map(bf16::from_f32).collect()
}

/// Element types the tests cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    F32,
    Bf16,
}

impl Ty {
    pub fn dtype(self) -> mesh::DType {
        match self {
            Ty::F32 => mesh::DType::Float32,
            Ty::Bf16 => mesh::DType::Bfloat16,
        }
    }

    /// Logical rank `rank`'s input.
    pub fn input(self, seed: u64, rank: usize, len: usize) -> Buffer {
        match self {
            Ty::F32 => Buffer::from_f32(&gradient_f32(seed, rank, len)),
            Ty::Bf16 => Buffer::from_bf16(&gradient_bf16(seed, rank, len)),
        }
    }

    /// The reference sum of `d` ranks' inputs, as bytes.
    pub fn reference(self, seed: u64, d: usize, len: usize) -> Vec<u8> {
        match self {
            Ty::F32 => {
                let inputs: Vec<_> = (0..d).map(|r| gradient_f32(seed, r, len)).collect();
                reference_f32(&inputs).iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            Ty::Bf16 => {
                let inputs: Vec<_> = (0..d).map(|r| gradient_bf16(seed, r, len)).collect();
                reference_bf16(&inputs).iter().flat_map(|v| v.to_bits().to_le_bytes()).collect()
            }
        }
    }
}

/// A config with short timeouts for tests and a small chunk so buffers span many chunks.
pub fn test_config() -> Config {
    Config {
        connect_timeout: Duration::from_secs(20),
        io_timeout: Duration::from_secs(20),
        chunk_bytes: 4096,
    }
}

/// `n` endpoints on loopback, each on its own port.
pub fn endpoints(n: usize) -> Vec<Endpoint> {
    (0..n).map(|_| Endpoint::bind("127.0.0.1:0".parse().unwrap()).unwrap()).collect()
}

pub fn spec(endpoints: &[Endpoint], placement: &[usize], generation: u64, me: usize) -> GroupSpec {
    GroupSpec {
        job: "test-job".into(),
        generation,
        members: endpoints.iter().map(Endpoint::local_addr).collect(),
        placement: placement.to_vec(),
        me,
    }
}

/// Forms the group on every endpoint at once (forming waits for the peers).
pub fn form_all(endpoints: &[Endpoint], placement: &[usize], config: &Config) -> Vec<Group> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..endpoints.len())
            .map(|me| {
                let spec = spec(endpoints, placement, 1, me);
                let endpoint = &endpoints[me];
                s.spawn(move || endpoint.form(&spec, config, &AbortHandle::new()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    })
}

/// Runs `work` for every group on its own thread; results in member order.
pub fn on_every_member<T: Send>(groups: &[Group], work: impl Fn(&Group) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = groups.iter().map(|g| s.spawn(|| work(g))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// All-reduces one bucket on every member; returns the sums by logical rank.
pub fn all_reduce_by_rank(groups: &[Group], ty: Ty, seed: u64, len: usize) -> Vec<Vec<u8>> {
    let d = groups[0].spec().ranks();
    let per_member = on_every_member(groups, |g| {
        let inputs = g.local_ranks().iter().map(|&r| ty.input(seed, r, len)).collect();
        g.all_reduce(inputs).unwrap()
    });
    let mut by_rank = vec![Vec::new(); d];
    for (g, sums) in groups.iter().zip(per_member) {
        for (&r, sum) in g.local_ranks().iter().zip(sums) {
            by_rank[r] = sum.as_bytes().to_vec();
        }
    }
    by_rank
}

/// A `collective-peer` child process.
pub struct Peer {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub addr: SocketAddr,
}

impl Peer {
    /// Starts a member process and reads its address.
    pub fn spawn() -> Peer {
        Peer::spawn_with(&[])
    }

    pub fn spawn_with(args: &[&str]) -> Peer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_collective-peer"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn collective-peer");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let hello = read_line(&mut stdout).expect("peer printed its address");
        let addr = hello["addr"].as_str().expect("addr").parse().unwrap();
        Peer { child, stdin, stdout, addr }
    }

    pub fn send(&mut self, task: &Value) {
        writeln!(self.stdin, "{task}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next line the peer prints, or `None` at EOF.
    pub fn next(&mut self) -> Option<Value> {
        read_line(&mut self.stdout)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_line(r: &mut impl BufRead) -> Option<Value> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(serde_json::from_str(&line).expect("peer prints JSON lines")),
    }
}

/// The spec JSON for member `me` of processes `peers`.
pub fn peer_spec(peers: &[Peer], placement: &[usize], me: usize) -> Value {
    json!({
        "job": "test-job",
        "generation": 1,
        "members": peers.iter().map(|p| p.addr.to_string()).collect::<Vec<_>>(),
        "placement": placement,
        "me": me,
    })
}

pub fn config_json(config: &Config) -> Value {
    serde_json::to_value(config).unwrap()
}

/// Whether an error says a peer is gone or failed (as opposed to a local misuse).
pub fn is_peer_failure(e: &Error) -> bool {
    matches!(
        e,
        Error::PeerLost { .. } | Error::PeerAborted { .. } | Error::PeerFailed { .. } | Error::Timeout { .. }
    )
}
