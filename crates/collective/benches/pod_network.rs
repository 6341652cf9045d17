//! What the pod network costs the gradient ring: the same all-reduce, side by side, over the
//! host path and over pod networking as a CNI builds it (each member in a network namespace of
//! its own, joined by a veth pair to a bridge), at the same MTU, in one run.
//!
//! `cargo bench -p podctl-collective --bench pod_network [-- --ranks 2,4 --mib 16,64 --rounds 3 --mtu 1460]`
//!
//! Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and `ip` from iproute2; it makes its namespaces
//! (`podctl-bench-<pid>-*`) and deletes them when done. Three paths, each member one
//! `collective-peer` process:
//! - **host, loopback**: the members on this machine's loopback, as it is (MTU 65536);
//! - **host, MTU N**: the members in one namespace whose loopback has the pods' MTU: what two
//!   host-network workers on two VMs exchange, one NIC apart, minus the wire;
//! - **pod network, MTU N**: each member in its own namespace, reaching the others through its
//!   veth, the bridge and their veths, as pods do on a node (GKE's default MTU is 1460).
//!
//! Bus bandwidth is computed as `allreduce.rs` does (the slowest rank's time, median over
//! iterations); each configuration runs `--rounds` times, the paths interleaved so that load on
//! a shared machine falls on all of them alike, and the median round is printed. A raw ring of
//! plain TCP streams over each path is the ceiling beside it.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const PEER: &str = env!("CARGO_BIN_EXE_collective-peer");

struct Options {
    ranks: Vec<usize>,
    mib: Vec<usize>,
    rounds: usize,
    mtu: u32,
}

fn parse_list(value: &str) -> Vec<usize> {
    value.split(',').map(|v| v.trim().parse().unwrap_or_else(|_| panic!("not a number: {v}"))).collect()
}

fn options() -> Options {
    let mut o = Options { ranks: vec![2, 4], mib: vec![16, 64], rounds: 3, mtu: 1460 };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--ranks" => o.ranks = parse_list(&value()),
            "--mib" => o.mib = parse_list(&value()),
            "--rounds" => o.rounds = value().parse().expect("--rounds N"),
            "--mtu" => o.mtu = value().parse().expect("--mtu BYTES"),
            "--bench" => {}
            other => panic!("unknown option {other}; see the top of benches/pod_network.rs"),
        }
    }
    o
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running `ip` (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

/// Where members run: a namespace and an address for each rank.
#[derive(Clone)]
struct Path {
    name: &'static str,
    /// Per rank: the namespace to run in (none: this one) and the address to bind.
    members: Vec<(Option<String>, String)>,
}

/// The namespaces the benchmark made; deleted when dropped (a panic included).
struct Namespaces {
    names: Vec<String>,
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in self.names.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

impl Namespaces {
    /// The host path at `mtu` (one namespace, its loopback) and the pod network (a hub with a
    /// bridge, one namespace per member with a veth pair to it), for up to `members` members.
    fn create(members: usize, mtu: u32) -> (Namespaces, Path, Path) {
        let prefix = format!("podctl-bench-{}", std::process::id());
        let mut ns = Namespaces { names: Vec::new() };
        let mtu = mtu.to_string();

        let host = format!("{prefix}-host");
        ip(&["netns", "add", &host]);
        ns.names.push(host.clone());
        ip(&["-n", &host, "link", "set", "lo", "mtu", &mtu, "up"]);
        let host_path = Path {
            name: "host, MTU",
            members: (0..members).map(|_| (Some(host.clone()), "127.0.0.1".to_string())).collect(),
        };

        let hub = format!("{prefix}-hub");
        ip(&["netns", "add", &hub]);
        ns.names.push(hub.clone());
        ip(&["-n", &hub, "link", "add", "br0", "mtu", &mtu, "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        let mut pods = Vec::new();
        for k in 0..members {
            let pod = format!("{prefix}-pod{k}");
            ip(&["netns", "add", &pod]);
            ns.names.push(pod.clone());
            let port = format!("p{k}");
            ip(&[
                "-n", &hub, "link", "add", &port, "mtu", &mtu, "type", "veth", "peer", "name", "eth0",
                "netns", &pod,
            ]);
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"]);
            let addr = format!("10.78.0.{}", 10 + k);
            ip(&["-n", &pod, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ip(&["-n", &pod, "link", "set", "eth0", "mtu", &mtu, "up"]);
            ip(&["-n", &pod, "link", "set", "lo", "up"]);
            pods.push((Some(pod), addr));
        }
        (ns, host_path, Path { name: "pod network, MTU", members: pods })
    }
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: String,
}

impl Peer {
    fn spawn(namespace: &Option<String>, bind: &str, mode: Option<&str>) -> Peer {
        let mut command = match namespace {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, PEER]);
                c
            }
            None => Command::new(PEER),
        };
        command.args(mode).env("COLLECTIVE_PEER_BIND", bind).stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = command.spawn().expect("spawn collective-peer");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let addr = read(&mut stdout)["addr"].as_str().expect("the peer prints its address").to_string();
        Peer { child, stdin, stdout, addr }
    }

    fn send(&mut self, v: &Value) {
        writeln!(self.stdin, "{v}").expect("write task");
        self.stdin.flush().expect("flush task");
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

/// Bus bandwidth of the ring all-reduce of `mib` MiB of float32 over the first `ranks` members
/// of `path`, in bytes/s.
fn allreduce(path: &Path, ranks: usize, mib: usize) -> f64 {
    let (warmup, iters) = if mib <= 32 { (2, 10) } else { (1, 5) };
    let mut peers: Vec<Peer> =
        path.members[..ranks].iter().map(|(ns, bind)| Peer::spawn(ns, bind, None)).collect();
    let members: Vec<String> = peers.iter().map(|p| p.addr.clone()).collect();
    for (me, peer) in peers.iter_mut().enumerate() {
        peer.send(&json!({
            "spec": { "job": "bench", "generation": 1, "members": members, "placement": (0..ranks).collect::<Vec<_>>(), "me": me },
            "config": { "connect_timeout": Duration::from_secs(30), "io_timeout": Duration::from_secs(120), "chunk_bytes": podctl_collective::DEFAULT_CHUNK_BYTES },
            "work": { "bench": { "elems": mib * MIB / 4, "warmup": warmup, "iters": iters } },
        }));
    }
    let times: Vec<Vec<f64>> = peers
        .iter_mut()
        .map(|p| {
            let report = read(&mut p.stdout);
            let times = report.get("times").unwrap_or_else(|| panic!("peer failed: {report}"));
            times.as_array().expect("times").iter().map(|t| t.as_f64().expect("time")).collect()
        })
        .collect();
    let mut slowest: Vec<f64> = (0..iters).map(|i| times.iter().map(|t| t[i]).fold(0.0, f64::max)).collect();
    slowest.sort_by(f64::total_cmp);
    let algbw = (mib * MIB) as f64 / slowest[iters / 2];
    algbw * 2.0 * (ranks - 1) as f64 / ranks as f64
}

/// Per-link throughput of a ring of `ranks` plain TCP streams over `path` (256 MiB a link).
fn raw_ring(path: &Path, ranks: usize) -> f64 {
    let bytes = 256 * MIB;
    let mut peers: Vec<Peer> =
        path.members[..ranks].iter().map(|(ns, bind)| Peer::spawn(ns, bind, Some("raw-ring"))).collect();
    let addrs: Vec<String> = peers.iter().map(|p| p.addr.clone()).collect();
    for (i, peer) in peers.iter_mut().enumerate() {
        peer.send(&json!({ "next": addrs[(i + 1) % ranks], "bytes": bytes }));
    }
    let slowest =
        peers.iter_mut().map(|p| read(&mut p.stdout)["secs"].as_f64().expect("secs")).fold(0.0, f64::max);
    bytes as f64 / slowest
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let o = options();
    if !is_root() {
        eprintln!(
            "pod_network needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) to make network namespaces and veth pairs; \
             run it as root (`sudo -E cargo bench -p podctl-collective --bench pod_network`)"
        );
        std::process::exit(2);
    }
    let started = Instant::now();
    let most = o.ranks.iter().copied().max().unwrap_or(2);
    let (_namespaces, host_mtu, pods) = Namespaces::create(most, o.mtu);
    let loopback =
        Path { name: "host, loopback", members: (0..most).map(|_| (None, "127.0.0.1".into())).collect() };
    let paths = [loopback, host_mtu, pods];
    println!(
        "the gradient ring's all-reduce over the host path and the pod network (MTU {} on both), median of {} rounds",
        o.mtu, o.rounds
    );
    println!();
    println!(
        "{:>5} {:>6}  {:>20} {:>20} {:>20}  {:>9}",
        "ranks",
        "MiB",
        "host loopback GB/s",
        format!("host MTU {} GB/s", o.mtu),
        format!("pod net MTU {} GB/s", o.mtu),
        "pod/host"
    );
    for &ranks in &o.ranks {
        let mut rows: Vec<(String, [f64; 3])> = Vec::new();
        let raw: Vec<f64> = paths.iter().map(|p| raw_ring(p, ranks)).collect();
        rows.push(("raw TCP".into(), [raw[0], raw[1], raw[2]]));
        for &mib in &o.mib {
            let mut samples: [Vec<f64>; 3] = Default::default();
            for _ in 0..o.rounds {
                for (i, path) in paths.iter().enumerate() {
                    samples[i].push(allreduce(path, ranks, mib));
                }
            }
            let [a, b, c] = samples.map(median);
            rows.push((mib.to_string(), [a, b, c]));
        }
        for (size, [loopback, host, pod]) in rows {
            println!(
                "{ranks:>5} {size:>6}  {:>20.3} {:>20.3} {:>20.3}  {:>8.0}%",
                loopback / 1e9,
                host / 1e9,
                pod / 1e9,
                100.0 * pod / host
            );
        }
    }
    println!(
        "\n(paths: {}; took {:.0} s)",
        paths.iter().map(|p| p.name).collect::<Vec<_>>().join(" / "),
        started.elapsed().as_secs_f64()
    );
}

/// Whether this process may make network namespaces (effective uid 0).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}
