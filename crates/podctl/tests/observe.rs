//! What an operator sees of a local job of two slices: Prometheus series of the coordinator and
//! of a worker that move, `podctl status --watch` in a real terminal (tmux) with the step
//! advancing, and `--json` that parses. The job is long and is stopped once everything was seen, so
//! no observation races its end.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{endless_two_slice_job, podctl, wait_for};

/// `GET /metrics` over a plain TCP connection.
fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").ok()?;
    let mut page = String::new();
    stream.read_to_string(&mut page).ok()?;
    Some(page)
}

/// The value of the first sample of `name` (any labels).
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().filter(|s| !s.is_empty())
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().unwrap();
    assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `step N/M` the screen shows.
fn screen_step(screen: &str) -> Option<u64> {
    screen.split("step ").skip(1).find_map(|rest| rest.split('/').next()?.trim().parse().ok())
}

#[test]
fn metrics_move_and_status_watches_the_step_advance() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let spec = dir.path().join("observed.yaml");
    std::fs::write(&spec, endless_two_slice_job("observed", &run)).unwrap();
    let launch_log = dir.path().join("launch.log");
    let mut launch = podctl()
        .arg("launch")
        .arg(&spec)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&launch_log).unwrap())
        .spawn()
        .unwrap();
    let limit = Duration::from_secs(300);

    let worker =
        wait_for("a worker's metrics address", limit, || read(&run.join("workers/slice-0.metrics-addr")));
    let coordinator = read(&run.join("coordinator.metrics-addr")).expect("the coordinator's metrics address");
    let address = read(&run.join("coordinator.addr")).unwrap();
    let token = run.join("job-token");

    let first = wait_for("a step on the worker", limit, || {
        scrape(&worker).and_then(|p| sample(&p, "podctl_worker_steps_total")).filter(|&s| s >= 1.0)
    });
    let (saved, later) = wait_for("a save and more steps on the worker", limit, || {
        let page = scrape(&worker)?;
        let saved = sample(&page, "podctl_worker_checkpoint_bytes_total")?;
        let steps = sample(&page, "podctl_worker_steps_total")?;
        (saved > 0.0 && steps > first).then_some((saved, steps))
    });
    println!("worker: steps {first} -> {later}, checkpoint bytes {saved}");
    let committed = |page: &str| sample(page, "podctl_job_step");
    let before = wait_for("a committed step", limit, || scrape(&coordinator).as_deref().and_then(committed));
    let (after, bytes) = wait_for("the coordinator's series to move", limit, || {
        let page = scrape(&coordinator)?;
        let step = committed(&page)?;
        let bytes = sample(&page, "podctl_checkpoint_bytes_total")?;
        (step > before && bytes > 0.0).then_some((step, bytes))
    });
    println!("coordinator: step {before} -> {after}, checkpoint bytes {bytes}");

    // `podctl status --watch` in a real terminal.
    let session = format!("podctl-status-{}", std::process::id());
    let command = format!(
        "{} status observed-1 --watch --coordinator {address} --insecure-plaintext --token-file {}",
        env!("CARGO_BIN_EXE_podctl"),
        token.display()
    );
    tmux(&["new-session", "-d", "-s", &session, "-x", "160", "-y", "40", &command]);
    let shown = wait_for("a step on the screen", limit, || {
        screen_step(&tmux(&["capture-pane", "-p", "-t", &session]))
    });
    let advanced = wait_for("the step on the screen to advance", limit, || {
        screen_step(&tmux(&["capture-pane", "-p", "-t", &session])).filter(|&s| s > shown)
    });
    println!("status --watch showed step {shown}, then {advanced}");
    let screen = tmux(&["capture-pane", "-p", "-t", &session]);
    let _ = Command::new("tmux").args(["kill-session", "-t", &session]).status();
    assert!(screen.contains("observed"), "the job's name is on the screen:\n{screen}");

    let out = podctl()
        .args([
            "status",
            "observed-1",
            "--json",
            "--coordinator",
            &address,
            "--insecure-plaintext",
            "--token-file",
        ])
        .arg(&token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("status --json: {json}");

    assert_eq!(json["state"], "running", "{json}");

    let out = podctl()
        .args(["stop", "observed-1", "--coordinator", &address, "--insecure-plaintext", "--token-file"])
        .arg(&token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "observed-1: stopped");
    let ended = wait_for("launch to end", Duration::from_secs(60), || launch.try_wait().unwrap());
    let log = std::fs::read_to_string(&launch_log).unwrap();
    assert!(
        ended.code() == Some(1) && log.contains("the job ended stopped: stopped by a user"),
        "{ended}:\n{log}"
    );
}
