//! Ctrl-C as a user presses it, as a real SIGINT to the real binary: a launch that follows a
//! cluster's job detaches and leaves the job running (a second `podctl status` sees it go on),
//! `--detach` returns as soon as the job is accepted, and a local run stops after saving a
//! checkpoint and exits with status 130.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{podctl, root, wait_for};

const ADMIN: &str = "interrupt-test-admin-token-0123456789";

fn plugin() -> PathBuf {
    root().join(".venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

/// A one-device tiny job that runs until stopped, with its run record in `dir/<name>`.
fn spec(dir: &Path, name: &str, checkpoint: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text = format!(
        "name: {name}\nmodel: tiny\nmesh: {{ ici: {{ fsdp: 1, tp: 1 }} }}\nbatch: {{ global: 4, micro: 4 }}\n\
         seq_len: 128\nsteps: 100000\ndata: {{ kind: arithmetic }}\n{checkpoint}output: {}\n",
        dir.join(name).display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn sigint(child: &Child) {
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Waits for `child` to exit, failing after `limit`.
fn exits_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < limit, "the process did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Coordinator(Child);

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `podctl` against the coordinator at `addr` with the admin token.
fn against(addr: &str, dir: &Path, args: &[&str]) -> Output {
    podctl()
        .args(args)
        .args(["--coordinator", addr, "--insecure-plaintext", "--token-file"])
        .arg(dir.join("admin-token"))
        .env("PODCTL_CONFIG", dir.join("no-config.yaml"))
        .output()
        .unwrap()
}

fn status(addr: &str, dir: &Path, job: &str) -> Value {
    let out = against(addr, dir, &["status", job, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_cluster_launch_detaches_on_ctrl_c_and_with_detach() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("admin-token"), ADMIN).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut node = Command::new(env!("CARGO_BIN_EXE_podctl"))
        .args(["coordinator", "--id", "1", "--listen", &addr, "--peers", &format!("1={addr}")])
        .arg("--data-dir")
        .arg(dir.join("raft"))
        .arg("--insecure-plaintext")
        .env("PODCTL_ADMIN_TOKEN", ADMIN)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("node.log")).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(node.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on "), "{line}");
    let _node = Coordinator(node);

    // The bundle is exported (and cached) first: `--detach` is timed from a warm cache, as a
    // relaunch is.
    let detached = spec(dir, "detached", "");
    let out = podctl().arg("launch").arg(&detached).arg("--dry-run").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // --detach: back once the job is accepted, saying how to follow and stop it.
    let started = Instant::now();
    let out = against(&addr, dir, &["launch", detached.to_str().unwrap(), "--detach"]);
    let took = started.elapsed();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}{}", String::from_utf8_lossy(&out.stderr));
    println!("podctl launch --detach returned in {:.2} s:\n{printed}", took.as_secs_f64());
    assert!(took < Duration::from_secs(2), "--detach took {took:?}");
    let submitted = printed.lines().find(|l| l.starts_with("job ") && l.contains(" submitted")).unwrap();
    let job = submitted.split_whitespace().nth(1).unwrap().to_string();
    assert!(
        printed.contains(&format!("podctl stop {job} --coordinator {addr} --insecure-plaintext")),
        "{printed}"
    );
    assert_eq!(status(&addr, dir, &job)["state"], "pending");
    assert!(against(&addr, dir, &["stop", &job]).status.success());

    // Following: Ctrl-C detaches, the job runs on.
    let followed = spec(dir, "followed", "");
    let mut launch = podctl()
        .arg("launch")
        .arg(&followed)
        .args(["--coordinator", &addr, "--insecure-plaintext", "--token-file"])
        .arg(dir.join("admin-token"))
        .env("PODCTL_CONFIG", dir.join("no-config.yaml"))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("launch.log")).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(launch.stdout.take().unwrap());
    let mut first = String::new();
    while !(first.starts_with("job ") && first.contains(" submitted")) {
        first.clear();
        assert!(stdout.read_line(&mut first).unwrap() > 0, "launch printed no job line");
    }
    let job = first.split_whitespace().nth(1).unwrap().to_string();
    let mut worker = podctl()
        .args(["--log", "info", "worker", "--coordinator", &addr, "--insecure-plaintext", "--job", &job])
        .args(["--slice", "0", "--plugin"])
        .arg(plugin())
        .arg("--token-file")
        .arg(dir.join("followed/job-token"))
        .stdout(std::fs::File::create(dir.join("worker.log")).unwrap())
        .stderr(std::fs::File::create(dir.join("worker.err")).unwrap())
        .spawn()
        .unwrap();
    let step = |at_least: u64| status(&addr, dir, &job)["step"].as_u64().filter(|&s| s >= at_least);
    wait_for("step 3", Duration::from_secs(300), || step(3));
    sigint(&launch);
    let exited = exits_within(&mut launch, Duration::from_secs(20));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(exited.code(), Some(0), "a detached launch succeeded: {rest}");
    assert!(rest.contains(&format!("detached from job {job}: it runs on")), "{rest}");
    assert!(rest.contains(&format!("podctl logs {job} -f --coordinator {addr}")), "{rest}");
    // A second `podctl status` sees the job go on without the launch.
    let before = status(&addr, dir, &job);
    assert_eq!(before["state"], "running");
    let from = before["step"].as_u64().unwrap();
    let after = wait_for("the job to go on", Duration::from_secs(120), || step(from + 2));
    println!("after the launch detached, the job went on: step {from} -> {after}");

    assert!(against(&addr, dir, &["stop", &job]).status.success());
    let left = exits_within(&mut worker, Duration::from_secs(60));
    assert!(left.success(), "the worker leaves once the job is stopped: {left}");
}

#[test]
fn a_local_run_saves_a_checkpoint_on_ctrl_c_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let job = spec(dir, "local", "checkpoint: { every: 100000 }\n");
    let run = dir.join("local");
    let mut launch = podctl()
        .arg("launch")
        .arg(&job)
        .env("PODCTL_CONFIG", dir.join("no-config.yaml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let steps = || std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |m| m.lines().count());
    wait_for("3 steps", Duration::from_secs(300), || {
        let exited = launch.try_wait().unwrap();
        assert!(exited.is_none(), "the launch ended before Ctrl-C: {exited:?}");
        (steps() >= 3).then_some(())
    });
    sigint(&launch);
    let out = launch.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let done = steps() as u64;
    assert!(
        stderr
            .contains(&format!("error: interrupted (Ctrl-C) after step {done}; its checkpoint is committed")),
        "{stderr}"
    );
    // The checkpoint of the last step done, committed (no schedule would have saved it).
    let listed = podctl().args(["ckpt", "list", "--json"]).arg(run.join("checkpoints")).output().unwrap();
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let committed: Vec<u64> = listed["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["committed"] == true)
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(committed, [done], "{listed}");
}
