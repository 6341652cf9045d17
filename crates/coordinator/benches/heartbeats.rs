//! Heartbeat round trips against a 3-node cluster of `podctl-coordinator` processes.
//!
//! For N = 100 and 1,000 simulated workers (registered through Raft, each with its own session
//! over mutual TLS, 50 sessions per connection), every worker heartbeats at 1 Hz; the bench
//! prints the p50/p99/max of the round trip `Heartbeat.seq -> HeartbeatAck.seq` and the leader
//! process's CPU over the measured window (from /proc/<pid>/stat).
//!
//! `cargo bench -p podctl-coordinator --bench heartbeats` (about a minute and a half).
//! `HEARTBEAT_BENCH_SECONDS` changes the measured window (default 15).

extern crate podctl_coordinator as coordinator;

use client::ClientTls;
use client::{Client, ClientConfig};
use proto::v1::{Heartbeat, RegisterRequest, WorkerEvent, directive, worker_event};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ADMIN: &str = "admin-token-for-the-heartbeat-bench";
const SESSIONS_PER_CONNECTION: usize = 50;

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(id: u64, peers: &str, port: u16, dir: &Path) -> Node {
    let mut child = Command::new(env!("CARGO_BIN_EXE_podctl-coordinator"))
        .args(["--id", &id.to_string(), "--listen", &format!("127.0.0.1:{port}"), "--peers", peers])
        .arg("--data-dir")
        .arg(dir.join(format!("node{id}")))
        .arg("--tls-dir")
        .arg(dir.join("tls"))
        .env("PODCTL_ADMIN_TOKEN", ADMIN)
        .env("RUST_LOG", "info,openraft=warn,h2=warn,hyper=warn,tower=warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join(format!("node{id}.log"))).expect("a log file"))
        .spawn()
        .expect("the podctl-coordinator binary runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).expect("a first line");
    assert!(line.starts_with("listening on"), "node {id} printed {line:?}");
    Node(child)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc is readable");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("a stat line").1.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

fn clock_ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().ok();
    out.and_then(|o| String::from_utf8(o.stdout).ok()).and_then(|s| s.trim().parse().ok()).unwrap_or(100.0)
}

fn client(addrs: &[String], token: &str, tls: ClientTls) -> Client {
    let mut config = ClientConfig::new(addrs.to_vec(), token, Some(tls));
    config.retry_for = Duration::from_secs(30);
    Client::new(config).expect("a client")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run(n: usize, window: Duration, dir: &Path, addrs: &[String], nodes: &[Node], tls: &ClientTls) {
    let admin = client(addrs, ADMIN, ClientTls { identity: None, ..tls.clone() });
    let spec = format!(
        "name: bench{n}\nmodel: tiny\nmesh: {{ dcn: 1, ici: {{ fsdp: 1, tp: 1 }} }}\n\
         batch: {{ global: 1, micro: 1 }}\nseq_len: 16\nsteps: 1000000\ndata: {{ kind: arithmetic }}\n\
         output: {}\n",
        dir.join("run").display()
    );
    let job = admin
        .submit(&client::Submission {
            spec_yaml: spec,
            bundle_uri: String::new(),
            bundle_id: "00".into(),
            start_over: false,
        })
        .await
        .expect("submits");
    let clients: Vec<Client> = (0..n.div_ceil(SESSIONS_PER_CONNECTION))
        .map(|_| client(addrs, &job.job_token, tls.clone()))
        .collect();

    let started = Instant::now();
    let rtts: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let measuring = Arc::new(AtomicBool::new(false));
    let reconnects = Arc::new(AtomicU64::new(0));
    let opened = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(tokio::sync::Notify::new());
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    let mut workers = tokio::task::JoinSet::new();
    for i in 0..n {
        let c = clients[i / SESSIONS_PER_CONNECTION].clone();
        let job_id = job.job_id.clone();
        let (rtts, measuring, stop) = (rtts.clone(), measuring.clone(), stop.clone());
        let (reconnects, opened, limit) = (reconnects.clone(), opened.clone(), limit.clone());
        workers.spawn(async move {
            // Each worker registers and opens its session at once, as a starting worker does.
            let worker_id = {
                let _permit = limit.acquire().await.expect("open");
                let request = RegisterRequest {
                    job_id,
                    host: format!("sim{i}"),
                    data_addr: format!("127.0.0.1:{}", 30000 + i),
                    devices: 1,
                    platform: "cpu".into(),
                    slice: None,
                    instance_id: format!("bench-{i}"),
                };
                c.register(request).await.expect("registers").worker_id
            };
            let beat = |seq| WorkerEvent {
                event: Some(worker_event::Event::Heartbeat(Heartbeat {
                    worker_id: worker_id.clone(),
                    phase: "ready".into(),
                    seq,
                    ..Default::default()
                })),
            };
            // Workers start at different times: spread the beats over the second.
            tokio::time::sleep(Duration::from_micros((i as u64 * 1_000_000) / n as u64)).await;
            let mut seq = 0;
            let mut session = c.session(beat(seq), Duration::from_secs(10)).await.expect("a session");
            opened.fetch_add(1, Ordering::Relaxed);
            let mut sent: HashMap<u64, Instant> = HashMap::from([(0, Instant::now())]);
            let mut ticker = tokio::time::interval(Duration::from_secs(1));
            ticker.tick().await;
            loop {
                tokio::select! {
                    () = stop.notified() => return,
                    _ = ticker.tick() => {
                        seq += 1;
                        sent.insert(seq, Instant::now());
                        sent.retain(|s, _| *s + 10 > seq);
                        // A closed session shows up on the directive stream below.
                        let _ = session.events.send(beat(seq)).await;
                    }
                    d = session.directives.message() => match d {
                        Ok(Some(d)) => {
                            if let Some(directive::Directive::Ack(ack)) = d.directive
                                && let Some(at) = sent.remove(&ack.seq)
                                && measuring.load(Ordering::Relaxed)
                            {
                                rtts.lock().expect("not poisoned").push(at.elapsed());
                            }
                        }
                        // The leader changed or the stream broke: reconnect, as a worker does.
                        _ => {
                            reconnects.fetch_add(1, Ordering::Relaxed);
                            seq += 1;
                            sent.insert(seq, Instant::now());
                            session = c.session(beat(seq), Duration::from_secs(10)).await.expect("a new session");
                        }
                    }
                }
            }
        });
    }
    while opened.load(Ordering::Relaxed) < n as u64 {
        assert!(started.elapsed() < Duration::from_secs(120), "sessions did not all open in 120 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "N = {n}: {n} workers registered through Raft and in session after {:.2} s",
        started.elapsed().as_secs_f64()
    );
    // Let every session open and settle, then measure.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reconnects_before = reconnects.load(Ordering::Relaxed);
    let info = admin.cluster_info().await.expect("cluster info");
    let leader_pid = nodes[info.leader_id as usize - 1].0.id();
    let ticks = cpu_ticks(leader_pid);
    let window_start = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(window).await;
    measuring.store(false, Ordering::Relaxed);
    let reconnected = reconnects.load(Ordering::Relaxed) - reconnects_before;
    let cpu = (cpu_ticks(leader_pid) - ticks) as f64
        / clock_ticks_per_second()
        / window_start.elapsed().as_secs_f64();
    stop.notify_waiters();
    workers.shutdown().await;

    let mut rtts = std::mem::take(&mut *rtts.lock().expect("not poisoned"));
    rtts.sort();
    assert!(!rtts.is_empty(), "no heartbeat was acknowledged");
    let expected = n as f64 * window.as_secs_f64();
    println!(
        "N = {n}: {} round trips in {:.0} s ({:.0}% of 1 Hz): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; \
         leader (node {}) CPU {:.1}% of one core; {reconnected} sessions reconnected",
        rtts.len(),
        window.as_secs_f64(),
        100.0 * rtts.len() as f64 / expected,
        percentile(&rtts, 0.50).as_secs_f64() * 1e3,
        percentile(&rtts, 0.99).as_secs_f64() * 1e3,
        rtts.last().expect("non-empty").as_secs_f64() * 1e3,
        info.leader_id,
        cpu * 100.0,
    );
    let stopped = admin.stop_job(&job.job_id).await.expect("stops");
    assert_eq!(stopped, Some(client::JobState::Stopped));
}

fn main() {
    let window = Duration::from_secs(
        std::env::var("HEARTBEAT_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15),
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let files = coordinator::tls::create_dev_ca(&dir.path().join("tls"), &[]).expect("certificates");
    let tls = coordinator::tls::client_tls(&files).expect("client certificate");
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port()
        })
        .collect();
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let nodes: Vec<Node> =
        ports.iter().enumerate().map(|(i, p)| start(i as u64 + 1, &peers, *p, dir.path())).collect();
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        for n in [100, 1000] {
            run(n, window, dir.path(), &addrs, &nodes, &tls).await;
        }
    });
    if std::env::var_os("HEARTBEAT_BENCH_KEEP_LOGS").is_some() {
        let kept = dir.keep();
        println!("node logs kept in {}", kept.display());
    }
}
