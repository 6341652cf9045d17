//! A real Prometheus (Debian's `prometheus`, which scripts/install-test-tools.sh installs) scrapes a
//! local job of two slices: the coordinator and both workers, found through file service discovery,
//! so a preempted worker's replacement is scraped too. Its HTTP API answers `podctl_job_step` with the
//! run's step, and every panel of the Grafana dashboard (deploy/grafana/podctl.json) returns data
//! over the run: a series renamed without the dashboard, or a panel asking for a series nobody
//! exports, fails here.

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{endless_two_slice_job, podctl, root, wait_for};

/// Prometheus scrapes every target this often; the dashboard's `$__rate_interval` becomes
/// [`RATE_WINDOW`], ten scrapes.
const SCRAPE_INTERVAL: &str = "500ms";
const RATE_WINDOW: &str = "5s";

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn signal(pid: &str, signal: &str) {
    let status = Command::new("kill").args([&format!("-{signal}"), pid]).status().unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Percent-encodes a query parameter (everything but RFC 3986's unreserved characters).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Prometheus server the test starts, on loopback, killed when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus scraping the targets listed in `<dir>/targets.json`.
    fn start(dir: &Path) -> Self {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                // honor_labels: the series' own `job` label (the podctl job) wins over the
                // scrape job's name, as docs/METRICS.md asks of every scrape config.
                "global: {{ scrape_interval: {SCRAPE_INTERVAL}, scrape_timeout: {SCRAPE_INTERVAL} }}\n\
                 scrape_configs:\n  - job_name: podctl\n    honor_labels: true\n    file_sd_configs:\n      \
                 - files: [\"{}\"]\n        refresh_interval: 1s\n",
                dir.join("targets.json").display()
            ),
        )
        .unwrap();
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `prometheus` ({e}); sudo scripts/install-test-tools.sh installs it")
            });
        let prometheus = Prometheus { child, addr, log };
        wait_for("Prometheus to be ready", Duration::from_secs(60), || {
            prometheus.get("/-/ready").filter(|(status, _)| *status == 200)
        });
        prometheus
    }

    /// `GET path` (HTTP/1.0, so the answer is never chunked): the status and the body.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    }

    /// An API call's `data`.
    fn api(&self, path: &str) -> Value {
        let (status, body) = self.get(path).unwrap_or_else(|| panic!("no answer from Prometheus to {path}"));
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(status == 200 && answer["status"] == "success", "{path}: {status} {body}");
        answer["data"].clone()
    }

    /// The samples of an instant query, as (labels, value).
    fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(promql)));
        let samples = data["result"].as_array().cloned().unwrap_or_default();
        samples
            .into_iter()
            .map(|s| (s["metric"].clone(), s["value"][1].as_str().unwrap().parse().unwrap()))
            .collect()
    }

    /// The single value of an instant query, if it has one.
    fn value(&self, promql: &str) -> Option<f64> {
        match self.query(promql).as_slice() {
            [(_, value)] => Some(*value),
            _ => None,
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!(
                "the end of Prometheus's log:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// The local job, killed with its workers if the test fails half way.
struct Launch {
    child: Child,
    run: PathBuf,
}

impl Drop for Launch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.child.kill();
            for slice in 0..2 {
                if let Some(pid) = read(&self.run.join(format!("workers/slice-{slice}.pid"))) {
                    let _ = Command::new("kill").args(["-KILL", &pid]).status();
                }
            }
        }
        let _ = self.child.wait();
    }
}

/// What Prometheus should scrape: the coordinator and the workers as they are now.
fn write_targets(dir: &Path, run: &Path) -> Vec<String> {
    let mut targets =
        vec![read(&run.join("coordinator.metrics-addr")).expect("the coordinator's metrics address")];
    for slice in 0..2 {
        targets.extend(read(&run.join(format!("workers/slice-{slice}.metrics-addr"))));
    }
    // Renamed into place, so Prometheus never reads half a file.
    let partial = dir.join("targets.json.partial");
    std::fs::write(&partial, serde_json::json!([{ "targets": targets }]).to_string()).unwrap();
    std::fs::rename(&partial, dir.join("targets.json")).unwrap();
    targets
}

#[test]
fn prometheus_scrapes_a_two_slice_run_and_every_dashboard_panel_has_data() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let spec = dir.path().join("scraped.yaml");
    std::fs::write(&spec, endless_two_slice_job("scraped", &run)).unwrap();
    let launch_log = dir.path().join("launch.log");
    let child = podctl()
        .arg("launch")
        .arg(&spec)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&launch_log).unwrap())
        .spawn()
        .unwrap();
    let mut launch = Launch { child, run: run.clone() };
    let t0 = Instant::now();
    let phase = |what: &str| println!("{:6.1}s {what}", t0.elapsed().as_secs_f64());
    let limit = Duration::from_secs(300);
    let job = "scraped-1";
    let j = format!("job=\"{job}\"");

    wait_for("both workers' metrics addresses", limit, || {
        (0..2).all(|s| read(&run.join(format!("workers/slice-{s}.metrics-addr"))).is_some()).then_some(())
    });
    let first_targets = write_targets(dir.path(), &run);
    let prometheus = Prometheus::start(dir.path());
    let started = unix_now();
    phase("Prometheus started");

    // The coordinator and both workers are scraped, and the job has saved a checkpoint.
    wait_for("3 targets up", limit, || (prometheus.value("sum(up)")? == 3.0).then_some(()));
    wait_for("a checkpoint and steps on both workers", limit, || {
        let saved = prometheus.value(&format!("podctl_job_last_checkpoint_step{{{j}}}"))? >= 5.0;
        let working = prometheus.value(&format!("count(podctl_worker_steps_total{{{j}}} > 0)"))? == 2.0;
        (saved && working).then_some(())
    });

    phase("a checkpoint and steps on both workers scraped");

    // A spot preemption of slice 1: its replacement is found through the targets file.
    let preempted = read(&run.join("workers/slice-1.pid")).unwrap();
    signal(&preempted, "TERM");
    wait_for("the replacement's metrics address", limit, || {
        let pid = read(&run.join("workers/slice-1.pid"))?;
        let addr = read(&run.join("workers/slice-1.metrics-addr"))?;
        (pid != preempted && !first_targets.contains(&addr)).then_some(())
    });
    write_targets(dir.path(), &run);
    phase("slice 1 preempted and replaced");
    let step_then = wait_for("a recovery from the preemption", limit, || {
        let recovered = prometheus.value(&format!("podctl_recovery_seconds_count{{{j}}}"))? >= 1.0
            && prometheus.value(&format!("podctl_recoveries_total{{{j},cause=\"preemption\"}}"))? >= 1.0;
        recovered.then(|| prometheus.value(&format!("podctl_job_step{{{j}}}")))?
    });
    wait_for("the replacement's state and steps after the recovery", limit, || {
        let took_over = prometheus.value(&format!(
            "sum(podctl_worker_peer_catchups_total{{{j}}}) + sum(podctl_worker_restores_total{{{j}}})"
        ))? >= 1.0;
        let stepping = prometheus.value(&format!("podctl_job_step{{{j}}}"))? >= step_then + 5.0;
        (took_over && stepping).then_some(())
    });

    phase("the recovery and steps after it scraped");

    // The run's last step, held still: the workers are paused (so they cannot leave, and the
    // launcher keeps the coordinator up while it waits for them), then the job is stopped.
    let workers: Vec<String> =
        (0..2).map(|s| read(&run.join(format!("workers/slice-{s}.pid"))).unwrap()).collect();
    workers.iter().for_each(|pid| signal(pid, "STOP"));
    let address = read(&run.join("coordinator.addr")).unwrap();
    let connect = ["--coordinator", &address, "--insecure-plaintext", "--token-file"];
    let out = podctl().args(["stop", job]).args(connect).arg(run.join("job-token")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out =
        podctl().args(["status", job, "--json"]).args(connect).arg(run.join("job-token")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["state"], "stopped", "{status}");
    let last_step = status["step"].as_u64().unwrap();
    let scraped = wait_for("a scrape of the stopped job", Duration::from_secs(15), || {
        let stopped = prometheus.value(&format!("podctl_job_state{{{j},state=\"stopped\"}}"))? == 1.0;
        stopped.then(|| prometheus.value(&format!("podctl_job_step{{{j}}}")))?
    });
    workers.iter().for_each(|pid| signal(pid, "CONT"));
    phase("the stopped job scraped");
    println!("Prometheus: podctl_job_step {scraped}; the run stopped at step {last_step}");
    assert_eq!(scraped, last_step as f64, "Prometheus's podctl_job_step against `podctl status`");
    let ended = wait_for("launch to end", Duration::from_secs(60), || launch.child.try_wait().unwrap());
    let log = std::fs::read_to_string(&launch_log).unwrap();
    assert!(
        ended.code() == Some(1) && log.contains("the job ended stopped: stopped by a user"),
        "{ended}:\n{log}"
    );
    let recorded = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let recorded: Value = serde_json::from_str(recorded.lines().last().unwrap()).unwrap();
    assert_eq!(recorded["step"].as_u64(), Some(last_step), "the run record's last step");
    phase("the launch ended");

    // Every panel of the dashboard, over the whole run, with the job filled in.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("deploy/grafana/podctl.json")).unwrap())
            .unwrap();
    let jobs =
        prometheus.api(&format!("/api/v1/label/job/values?{}", encode_pair("match[]", "podctl_job_step")));
    assert!(jobs.as_array().unwrap().iter().any(|v| v == job), "the $job variable's values: {jobs}");
    let (start, end) = (started, unix_now());
    let mut checked = 0;
    let mut empty = Vec::new();
    // Rows hold their panels inside when collapsed.
    let panels = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| std::iter::once(p).chain(p["panels"].as_array().into_iter().flatten()));
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let promql = expr.replace("$__rate_interval", RATE_WINDOW).replace("$job", job);
            assert!(!promql.contains('$'), "a variable the test does not fill in: {expr}");
            let data = prometheus.api(&format!(
                "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
                encode(&promql)
            ));
            let finite =
                data["result"].as_array().unwrap().iter().any(|series| {
                    series["values"].as_array().unwrap().iter().any(|v| {
                        v[1].as_str().and_then(|s| s.parse::<f64>().ok()).is_some_and(f64::is_finite)
                    })
                });
            if !finite {
                empty.push(format!("panel \"{}\": {promql}", panel["title"].as_str().unwrap_or_default()));
            }
            checked += 1;
        }
    }
    phase(&format!("{checked} panel expressions queried over the run"));
    assert!(empty.is_empty(), "panels without data:\n{}", empty.join("\n"));
    assert!(checked > 0, "no panel expressions found in the dashboard");
}

fn encode_pair(key: &str, value: &str) -> String {
    format!("{}={}", encode(key), encode(value))
}
