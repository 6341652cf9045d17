//! Three `podctl coordinator` processes on loopback with mutual TLS, a job submitted from
//! `podctl launch --coordinator`, and two `podctl worker` processes training it on the CPU
//! plugin. The Raft leader is SIGKILLed mid-run: a new one is elected, the job goes on, the
//! final state is bitwise that of the same job run locally, so no step was lost or repeated,
//! and both roots keep exactly `checkpoint.keep` checkpoints.

use client::{Client, ClientConfig};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const ADMIN: &str = "cluster-test-admin-token-0123456789";
const STEPS: u64 = 30;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn plugin() -> PathBuf {
    root().join(".venv/lib/python3.11/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

fn podctl() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_podctl"));
    command.env("PODCTL_HOME", root()).env("PODCTL_CACHE", root().join("target/test-cache"));
    command
}

struct Node {
    child: Child,
    args: Vec<String>,
    log: PathBuf,
}

impl Node {
    fn start(args: Vec<String>, log: PathBuf) -> Node {
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_podctl"))
            .arg("coordinator")
            .args(&args)
            .env("PODCTL_ADMIN_TOKEN", ADMIN)
            .env("RUST_LOG", "info,openraft=warn,h2=warn,hyper=warn,tower=warn")
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("listening on "), "the node printed {line:?}; see {}", log.display());
        Node { child, args, log }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spec(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text = format!(
        "name: {name}\nmodel: tiny\nmesh: {{ dcn: 2, ici: {{ fsdp: 2, tp: 1 }} }}\n\
         batch: {{ global: 16, micro: 4 }}\nseq_len: 128\nsteps: {STEPS}\nseed: 7\n\
         optimizer: {{ lr: 3.0e-3, warmup_steps: 5 }}\ndata: {{ kind: arithmetic }}\n\
         checkpoint: {{ every: 5, keep: 3 }}\noutput: {}\n",
        dir.join(name).display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn digest(dir: &Path) -> String {
    let checkpoint = std::fs::read_dir(dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{STEPS:012}-")))
        .expect("a final checkpoint");
    let out = podctl().args(["ckpt", "digest"]).arg(&checkpoint).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().last().unwrap().to_string()
}

#[test]
fn a_job_survives_the_leaders_sigkill_with_real_workers() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let tls = dir.join("tls");
    let files = coordinator::tls::create_dev_ca(&tls, &[]).unwrap();
    std::fs::write(dir.join("admin-token"), ADMIN).unwrap();

    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let peers = (1..=3).map(|i| format!("{i}={}", addrs[i - 1])).collect::<Vec<_>>().join(",");
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| {
            let args = vec![
                "--id".into(),
                i.to_string(),
                "--listen".into(),
                addrs[i - 1].clone(),
                "--peers".into(),
                peers.clone(),
                "--data-dir".into(),
                dir.join(format!("node{i}")).display().to_string(),
                "--tls-dir".into(),
                tls.display().to_string(),
            ];
            Node::start(args, dir.join(format!("node{i}.log")))
        })
        .collect();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tls_client = coordinator::tls::client_tls(&files).unwrap();
    let mut config = ClientConfig::new(addrs.clone(), ADMIN, Some(tls_client));
    config.retry_for = Duration::from_secs(30);
    let admin = runtime.block_on(async { Client::new(config) }).unwrap();

    let remote = spec(dir, "remote");
    let coordinators = addrs.join(",");
    let mut launch = podctl()
        .arg("launch")
        .arg(&remote)
        .args(["--coordinator", &coordinators, "--ca"])
        .arg(&files.ca)
        .arg("--token-file")
        .arg(dir.join("admin-token"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut stdout = BufReader::new(launch.stdout.take().unwrap());
    while !(first.starts_with("job ") && first.contains(" submitted")) {
        first.clear();
        assert!(stdout.read_line(&mut first).unwrap() > 0, "launch printed no job line");
    }
    let job_id = first.split_whitespace().nth(1).unwrap().to_string();

    let workers: Vec<Child> = (0..2)
        .map(|slice| {
            let log = std::fs::File::create(dir.join(format!("worker{slice}.log"))).unwrap();
            podctl()
                .args(["--log", "info", "worker", "--coordinator", &coordinators, "--job", &job_id])
                .args(["--slice", &slice.to_string(), "--plugin"])
                .arg(plugin())
                .arg("--ca")
                .arg(&files.ca)
                .arg("--cert")
                .arg(&files.client_cert)
                .arg("--key")
                .arg(&files.client_key)
                .arg("--token-file")
                .arg(dir.join("remote/job-token"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap()
        })
        .collect();

    let step = || runtime.block_on(admin.get_job(&job_id)).map(|s| s.step).unwrap_or(0);
    let wait = |what: &str, limit: Duration, ready: &mut dyn FnMut() -> bool| {
        let started = Instant::now();
        while !ready() {
            assert!(started.elapsed() < limit, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Mid-job: two checkpoints committed, four to come, retention expiring three of them.
    wait("step 12", Duration::from_secs(300), &mut || step() >= 12);

    let info = runtime.block_on(admin.cluster_info()).unwrap();
    let leader = info.leader_id;
    assert!((1..=3).contains(&leader), "{info:?}");
    let killed_at = Instant::now();
    let at_step = step();
    nodes[leader as usize - 1].child.kill().unwrap();
    nodes[leader as usize - 1].child.wait().unwrap();
    wait("a new leader", Duration::from_secs(30), &mut || {
        runtime.block_on(admin.cluster_info()).is_ok_and(|i| i.leader_id != 0 && i.leader_id != leader)
    });
    println!("new leader elected {:.2}s after the SIGKILL", killed_at.elapsed().as_secs_f64());
    wait("3 more steps", Duration::from_secs(120), &mut || step() >= at_step + 3);
    println!(
        "training went on: step {at_step} -> {} {:.2}s after the SIGKILL",
        step(),
        killed_at.elapsed().as_secs_f64()
    );

    // What `podctl status` shows of it, from the surviving nodes.
    let out = podctl()
        .args(["status", &job_id, "--coordinator", &coordinators, "--ca"])
        .arg(&files.ca)
        .arg("--token-file")
        .arg(dir.join("admin-token"))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "podctl status: {}", String::from_utf8_lossy(&out.stderr));
    println!("podctl status:\n{shown}");
    let new_leader = runtime.block_on(admin.cluster_info()).unwrap().leader_address;
    for expected in [job_id.as_str(), "step", &format!("{job_id}.w"), new_leader.as_str()] {
        assert!(shown.contains(expected), "podctl status shows no {expected:?}:\n{shown}");
    }

    // The killed node comes back and catches up from the log or a snapshot.
    let (args, log) = (nodes[leader as usize - 1].args.clone(), nodes[leader as usize - 1].log.clone());
    nodes[leader as usize - 1] = Node::start(args, log);

    let out = launch.wait_with_output().unwrap();
    assert!(out.status.success(), "launch failed: {}", String::from_utf8_lossy(&out.stderr));
    for mut worker in workers {
        let started = Instant::now();
        while worker.try_wait().unwrap().is_none() {
            assert!(started.elapsed() < Duration::from_secs(30), "a worker did not leave after the job");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let status = runtime.block_on(admin.get_job(&job_id)).unwrap();
    assert_eq!(status.step, STEPS);

    // The restarted node holds the whole job: ask it alone.
    let mut only = ClientConfig::new(
        vec![addrs[leader as usize - 1].clone()],
        ADMIN,
        Some(coordinator::tls::client_tls(&files).unwrap()),
    );
    only.retry_for = Duration::from_secs(30);
    let only = runtime.block_on(async { Client::new(only) }).unwrap();
    let info = runtime.block_on(only.cluster_info()).unwrap();
    println!("after the restart: {info:?}");
    assert!(info.leader_id != 0 && info.commit_index > 0, "the restarted node knows the cluster: {info:?}");

    // The same job locally: bitwise the same final state, so no step was lost or repeated.
    let local = spec(dir, "local");
    let out = podctl().arg("launch").arg(&local).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(digest(&dir.join("remote")), digest(&dir.join("local")));
    // Six saves each, `keep: 3`: the commits under the new leader and the last one included.
    for run in ["remote", "local"] {
        let listed = common::committed_listed(&dir.join(run).join("checkpoints"));
        assert_eq!(listed, vec![20, 25, 30], "{run}: `podctl ckpt list` shows {listed:?}");
    }
}
