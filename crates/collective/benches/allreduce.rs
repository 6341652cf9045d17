//! All-reduce bus bandwidth of the ring between separate processes on loopback, next to the raw
//! single-stream TCP throughput of the same machine.
//!
//! `cargo bench -p podctl-collective --bench allreduce [-- OPTIONS]`
//!
//! - `--ranks 2,4`: group sizes (one `collective-peer` process per rank).
//! - `--mib 1,16,64,256`: buffer sizes in MiB of float32.
//! - `--chunk-kib N[,M...]`: chunk sizes to compare (default: the crate's default).
//! - `--json PATH`: also write the results as JSON (read by `benches/gloo.py`).
//!
//! Bus bandwidth is algbw x 2(n-1)/n, where algbw = bytes / time of one all-reduce (the slowest
//! rank's time, median over iterations): it is what each link carries, comparable to one TCP
//! stream. Two baselines are printed: one TCP stream between two processes ("vs TCP"), and a ring
//! of n plain TCP streams all running at once ("vs ring"), which is the most an all-reduce's links
//! can carry on this machine: on loopback every byte costs a kernel copy on each side, so n
//! concurrent links share the same cores one stream had to itself.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

struct Options {
    ranks: Vec<usize>,
    mib: Vec<usize>,
    chunk_kib: Vec<usize>,
    json: Option<String>,
}

fn parse_list(value: &str) -> Vec<usize> {
    value.split(',').map(|v| v.trim().parse().unwrap_or_else(|_| panic!("not a number: {v}"))).collect()
}

fn options() -> Options {
    let mut o = Options {
        ranks: vec![2, 4],
        mib: vec![1, 16, 64, 256],
        chunk_kib: vec![podctl_collective::DEFAULT_CHUNK_BYTES / 1024],
        json: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--ranks" => o.ranks = parse_list(&value()),
            "--mib" => o.mib = parse_list(&value()),
            "--chunk-kib" => o.chunk_kib = parse_list(&value()),
            "--json" => o.json = Some(value()),
            // `cargo bench` passes `--bench`; anything else is a mistake worth stopping on.
            "--bench" => {}
            other => panic!("unknown option {other}; see the top of benches/allreduce.rs"),
        }
    }
    o
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: String,
}

impl Peer {
    fn spawn(args: &[&str]) -> Peer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_collective-peer"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn collective-peer");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let hello = read(&mut stdout);
        let addr = hello["addr"].as_str().expect("peer prints its address").to_string();
        Peer { child, stdin, stdout, addr }
    }

    fn send(&mut self, v: &Value) {
        writeln!(self.stdin, "{v}").expect("write task");
        self.stdin.flush().expect("flush task");
    }

    fn next(&mut self) -> Value {
        read(&mut self.stdout)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read(r: &mut impl BufRead) -> Value {
    let mut line = String::new();
    r.read_line(&mut line).expect("read from peer");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("peer printed {line:?}: {e}"))
}

/// Single-stream TCP throughput to another process, in bytes/s, measured over `bytes`.
fn raw_tcp(bytes: usize) -> f64 {
    let mut sink = Peer::spawn(&["raw-sink"]);
    let mut stream = TcpStream::connect(&sink.addr).expect("connect to sink");
    stream.set_nodelay(true).expect("nodelay");
    let block = vec![1u8; 4 * MIB];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len());
        stream.write_all(&block[..n]).expect("write to sink");
        left -= n;
    }
    drop(stream);
    let report = sink.next();
    report["bytes"].as_f64().expect("bytes") / report["secs"].as_f64().expect("secs")
}

/// Per-link throughput of a ring of `n` plain TCP streams between `n` processes (each sends to
/// the next while receiving from the previous, no arithmetic), in bytes/s: what the all-reduce's
/// links can carry at most when they all run at once on this machine.
fn raw_ring(n: usize, bytes: usize) -> f64 {
    let mut peers: Vec<Peer> = (0..n).map(|_| Peer::spawn(&["raw-ring"])).collect();
    let addrs: Vec<String> = peers.iter().map(|p| p.addr.clone()).collect();
    for (i, peer) in peers.iter_mut().enumerate() {
        peer.send(&json!({ "next": addrs[(i + 1) % n], "bytes": bytes }));
    }
    let slowest = peers.iter_mut().map(|p| p.next()["secs"].as_f64().expect("secs")).fold(0.0, f64::max);
    bytes as f64 / slowest
}

/// Median over iterations of the slowest rank's all-reduce time, in seconds.
fn ring(ranks: usize, mib: usize, chunk_bytes: usize) -> f64 {
    let (warmup, iters) = match mib {
        0..=4 => (5, 40),
        5..=32 => (2, 10),
        33..=128 => (1, 5),
        _ => (1, 3),
    };
    let mut peers: Vec<Peer> = (0..ranks).map(|_| Peer::spawn(&[])).collect();
    let members: Vec<String> = peers.iter().map(|p| p.addr.clone()).collect();
    for (me, peer) in peers.iter_mut().enumerate() {
        peer.send(&json!({
            "spec": { "job": "bench", "generation": 1, "members": members, "placement": (0..ranks).collect::<Vec<_>>(), "me": me },
            "config": { "connect_timeout": Duration::from_secs(30), "io_timeout": Duration::from_secs(120), "chunk_bytes": chunk_bytes },
            "work": { "bench": { "elems": mib * MIB / 4, "warmup": warmup, "iters": iters } },
        }));
    }
    let times: Vec<Vec<f64>> = peers
        .iter_mut()
        .map(|p| {
            let report = p.next();
            let times = report.get("times").unwrap_or_else(|| panic!("peer failed: {report}"));
            times.as_array().expect("times").iter().map(|t| t.as_f64().expect("time")).collect()
        })
        .collect();
    let mut slowest: Vec<f64> = (0..iters).map(|i| times.iter().map(|t| t[i]).fold(0.0, f64::max)).collect();
    slowest.sort_by(f64::total_cmp);
    slowest[iters / 2]
}

fn main() {
    let o = options();
    let started = Instant::now();
    let raw = raw_tcp(2048 * MIB);
    println!("raw single-stream TCP loopback (2 GiB in 4 MiB writes): {:.2} GB/s", raw / 1e9);
    let rings: Vec<(usize, f64)> = o.ranks.iter().map(|&n| (n, raw_ring(n, 1024 * MIB))).collect();
    for (n, bw) in &rings {
        println!(
            "raw TCP ring of {n} processes (1 GiB per link, all links at once): {:.2} GB/s per link",
            bw / 1e9
        );
    }
    println!();
    println!(
        "{:>5} {:>8} {:>10} {:>10} {:>11} {:>11} {:>7} {:>9}",
        "ranks", "MiB", "chunk KiB", "time ms", "algbw GB/s", "busbw GB/s", "vs TCP", "vs ring"
    );
    let mut rows = Vec::new();
    for &chunk_kib in &o.chunk_kib {
        for &(n, ring_bw) in &rings {
            for &mib in &o.mib {
                let secs = ring(n, mib, chunk_kib * 1024);
                let algbw = (mib * MIB) as f64 / secs;
                let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
                println!(
                    "{n:>5} {mib:>8} {chunk_kib:>10} {:>10.2} {:>11.2} {:>11.2} {:>6.0}% {:>8.0}%",
                    secs * 1e3,
                    algbw / 1e9,
                    busbw / 1e9,
                    100.0 * busbw / raw,
                    100.0 * busbw / ring_bw
                );
                rows.push(json!({
                    "ranks": n, "mib": mib, "chunk_kib": chunk_kib, "seconds": secs,
                    "algbw_gbps": algbw / 1e9, "busbw_gbps": busbw / 1e9,
                    "raw_tcp_gbps": raw / 1e9, "raw_ring_gbps": ring_bw / 1e9,
                }));
            }
        }
    }
    println!("\n(took {:.0} s)", started.elapsed().as_secs_f64());
    if let Some(path) = o.json {
        let doc = json!({ "raw_tcp_gbps": raw / 1e9, "rows": rows });
        std::fs::write(&path, serde_json::to_string_pretty(&doc).expect("json")).expect("write --json file");
    }
}
