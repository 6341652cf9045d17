//! Every relaunch resumes, under a coordinator too: a job of two slices (worker processes under
//! `podctl launch`'s embedded coordinator, or under three `podctl coordinator` processes) is
//! killed near its end, a byte of its newest checkpoint is flipped, and the same spec launched
//! again resumes from the checkpoint before it, says it passed over the corrupt one, and ends
//! bitwise where an uninterrupted run ends (`podctl ckpt digest`). No committed directory is
//! written twice; a root holding another job's checkpoints is refused until `--start-over`,
//! which leaves every earlier checkpoint's bits as they were; `podctl ckpt verify` passes on
//! every checkpoint left behind but the corrupted one.

use client::{Client, ClientConfig};
use std::collections::BTreeMap;
use std::io::Read;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{podctl, root};

const LIMIT: Duration = Duration::from_secs(300);

fn plugin() -> PathBuf {
    root().join(".venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

/// An SFT job of two slices of two devices.
fn sft(name: &str, steps: u64, seed: u64) -> String {
    format!(
        "name: {name}\nmodel: tiny\nmesh: {{ dcn: 2, ici: {{ fsdp: 2, tp: 1 }} }}\n\
         batch: {{ global: 16, micro: 4 }}\nseq_len: 128\nsteps: {steps}\nseed: {seed}\n\
         optimizer: {{ lr: 3.0e-3, warmup_steps: 5 }}\ndata: {{ kind: arithmetic }}\n"
    )
}

/// A GRPO job of two slices of one device, from the seed's initialization.
fn grpo(name: &str, steps: u64, seed: u64) -> String {
    format!(
        "name: {name}\nmodel: tiny\nmesh: {{ dcn: 2, ici: {{ fsdp: 1, tp: 1 }} }}\n\
         grpo: {{ prompt_len: 24, max_new_tokens: 8, generations: 4, reward: {{ length_penalty: 0.125, \
         soft_max_chars: 0 }} }}\neval: {{ problems: 0 }}\n\
         batch: {{ global: 16, micro: 8 }}\ntrain: {{ loss_chunk: 32 }}\nsteps: {steps}\nseed: {seed}\n\
         optimizer: {{ lr: 3.0e-3, schedule: constant }}\n\
         data: {{ kind: arithmetic, digits: [2, 2], ops: [add] }}\n"
    )
}

/// Writes `body` plus the checkpoint section and the run directory as `<dir>/<name>.yaml`.
fn write_spec(dir: &Path, name: &str, body: &str, every: u64) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text =
        format!("{body}checkpoint: {{ every: {every}, keep: 3 }}\noutput: {}\n", dir.join(name).display());
    std::fs::write(&path, text).unwrap();
    path
}

fn run_dir(spec: &Path) -> PathBuf {
    spec.with_extension("")
}

fn checkpoints(spec: &Path) -> PathBuf {
    run_dir(spec).join("checkpoints")
}

fn text(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < LIMIT, "timed out after {LIMIT:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Committed checkpoint directories under `root`, by name.
fn committed(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|entries| entries.map(|e| e.unwrap().path()).filter(|p| p.join("COMMITTED").exists()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// The committed checkpoints of `step` under `root`.
fn of_step(root: &Path, step: u64) -> Vec<PathBuf> {
    let prefix = format!("{step:012}-");
    committed(root)
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix))
        .collect()
}

fn digest(dir: &Path) -> String {
    let out = podctl().args(["ckpt", "digest"]).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap().lines().last().unwrap().split_whitespace().next().unwrap().into()
}

/// The digest of the one committed checkpoint of `step` under `root`.
fn digest_of_step(root: &Path, step: u64) -> String {
    let dirs = of_step(root, step);
    assert_eq!(dirs.len(), 1, "committed checkpoints of step {step}: {dirs:?}");
    digest(&dirs[0])
}

/// Flips one byte in the middle of the largest object of a checkpoint directory.
fn flip_a_byte(dir: &Path) {
    let largest = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&largest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&largest, bytes).unwrap();
}

/// `podctl ckpt verify` of a whole root: every checkpoint but `corrupt` passes.
fn verify_all_but(root: &Path, corrupt: Option<&Path>) {
    let out = podctl().args(["ckpt", "verify"]).arg(root).output().unwrap();
    let report = text(&out);
    let bad: Vec<&str> = report.lines().filter(|l| l.starts_with("CORRUPT")).collect();
    match corrupt {
        None => assert!(out.status.success() && bad.is_empty(), "{report}"),
        Some(dir) => {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            assert!(bad.len() == 1 && bad[0].contains(&name), "only {name} is corrupt:\n{report}");
        }
    }
    assert!(report.lines().any(|l| l.starts_with("ok")), "{report}");
}

/// Where a job runs: `podctl launch` alone (an embedded coordinator, worker processes it
/// starts), or a cluster of three coordinator processes with worker processes started here.
enum Place {
    Local,
    Cluster(Box<Cluster>),
}

/// A running launch (with what was already read of its stdout) and, on a cluster, its workers.
struct Run {
    launch: Child,
    stdout: BufReader<ChildStdout>,
    printed: String,
    workers: Vec<Child>,
    spec: PathBuf,
}

impl Place {
    /// Starts `podctl launch` of `spec` (and a cluster's workers once the job is submitted).
    fn start(&self, spec: &Path, flags: &[&str]) -> Run {
        match self {
            Place::Local => {
                let mut launch = podctl()
                    .arg("launch")
                    .arg(spec)
                    .args(flags)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                let stdout = BufReader::new(launch.stdout.take().unwrap());
                Run { launch, stdout, printed: String::new(), workers: Vec::new(), spec: spec.to_path_buf() }
            }
            Place::Cluster(cluster) => cluster.start(spec, flags),
        }
    }

    /// Steps the newest job of `spec` committed.
    fn step(&self, spec: &Path) -> u64 {
        match self {
            Place::Local => std::fs::read_to_string(run_dir(spec).join("metrics.jsonl"))
                .map(|t| t.lines().count() as u64)
                .unwrap_or(0),
            Place::Cluster(cluster) => cluster.step(spec),
        }
    }

    /// Runs `spec` to its end; returns what the launch printed.
    fn launch(&self, spec: &Path, flags: &[&str]) -> Result<String, String> {
        self.start(spec, flags).finish()
    }
}

impl Run {
    /// Waits for the launch (and workers) to end: what it printed, as `Err` when it failed.
    fn finish(mut self) -> Result<String, String> {
        self.stdout.read_to_string(&mut self.printed).unwrap();
        let mut stderr = String::new();
        self.launch.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = self.launch.wait().unwrap();
        for mut worker in self.workers {
            let _ = worker.wait();
        }
        let all = format!("{}\n{stderr}", self.printed);
        if status.success() { Ok(all) } else { Err(all) }
    }

    /// Stops every worker at once, then SIGKILLs them and the launch.
    fn kill(mut self) {
        let mut pids: Vec<u32> = self.workers.iter().map(|w| w.id()).collect();
        for slice in 0..2 {
            let path = run_dir(&self.spec).join(format!("workers/slice-{slice}.pid"));
            if let Ok(pid) = std::fs::read_to_string(path) {
                pids.push(pid.trim().parse().unwrap());
            }
        }
        for &pid in &pids {
            signal(pid, "STOP");
        }
        self.launch.kill().unwrap();
        self.launch.wait().unwrap();
        for &pid in &pids {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        for mut worker in self.workers {
            let _ = worker.wait();
        }
    }
}

/// The scenario of issue 20: an uninterrupted run of `steps`; the same job killed once `kill_at`
/// steps are committed (before its last save), its newest checkpoint then corrupted, and the job
/// launched again: it resumes from the checkpoint before, reports the corrupt one and ends
/// bitwise equal. Returns the interrupted job's spec and its corrupt checkpoint.
fn killed_corrupted_and_resumed(
    place: &Place,
    dir: &Path,
    body: &dyn Fn(&str, u64) -> String,
    steps: u64,
    every: u64,
    kill_at: u64,
) -> (PathBuf, PathBuf) {
    let started = Instant::now();
    let calm = write_spec(dir, "calm", &body("calm", steps), every);
    place.launch(&calm, &[]).unwrap_or_else(|e| panic!("the calm run failed:\n{e}"));
    let reference = digest_of_step(&checkpoints(&calm), steps);
    println!("calm run of {steps} steps: {:.1}s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    let spec = write_spec(dir, "killed", &body("killed", steps), every);
    let run = place.start(&spec, &[]);
    let root = checkpoints(&spec);
    let newest = kill_at / every * every;
    // A save commits in the background, a step or two after its step.
    wait_for(&format!("step {kill_at} and the checkpoint of step {newest}"), || {
        place.step(&spec) >= kill_at && !of_step(&root, newest).is_empty()
    });
    run.kill();
    assert!(of_step(&root, steps).is_empty(), "the kill came too late: step {steps} is saved");
    let corrupt = of_step(&root, newest).pop().unwrap_or_else(|| panic!("no checkpoint of step {newest}"));
    flip_a_byte(&corrupt);
    let before: Vec<PathBuf> = committed(&root);

    let out = place.launch(&spec, &[]).unwrap_or_else(|e| panic!("the relaunch failed:\n{e}"));
    println!("killed at step {kill_at} and relaunched: {:.1}s", started.elapsed().as_secs_f64());
    let resumed = newest - every;
    assert!(out.contains(&format!("resuming from step {resumed}")), "{out}");
    let corrupt_name = corrupt.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        out.lines().any(|l| l.contains("passed_over") && l.contains(&corrupt_name) && l.contains("crc32c")),
        "the corrupt checkpoint is reported:\n{out}"
    );
    assert_eq!(digest_of_step(&root, steps), reference, "the resumed run ends where the calm one does");
    // Nothing committed was written again: the corrupt directory is still there, beside the
    // relaunch's own save of that step.
    assert!(corrupt.join("COMMITTED").exists());
    assert_eq!(of_step(&root, newest).len(), 2, "{:?}", committed(&root));
    let after = committed(&root);
    assert!(after.iter().filter(|d| before.contains(d)).all(|d| d == &corrupt || d.exists()));
    verify_all_but(&root, Some(&corrupt));
    verify_all_but(&checkpoints(&calm), None);
    (spec, corrupt)
}

#[test]
fn a_relaunch_of_two_slices_resumes_from_the_newest_checkpoint_that_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let body = |name: &str, steps: u64| sft(name, steps, 3);
    let (spec, corrupt) = killed_corrupted_and_resumed(&Place::Local, dir, &body, 70, 10, 65);

    // Another seed into the same root: refused, naming the flag.
    let root = checkpoints(&spec);
    let digests: BTreeMap<PathBuf, String> =
        committed(&root).into_iter().filter(|d| d != &corrupt).map(|d| (d.clone(), digest(&d))).collect();
    let other = write_spec(dir, "killed", &sft("killed", 20, 4), 10);
    let refused =
        Place::Local.launch(&other, &[]).expect_err("another seed's launch into the root is refused");
    assert!(refused.contains("another job's checkpoints") && refused.contains("--start-over"), "{refused}");
    // Starting over trains beside them and leaves their bits alone.
    let started = Instant::now();
    let out = Place::Local.launch(&other, &["--start-over"]).unwrap_or_else(|e| panic!("--start-over:\n{e}"));
    println!("--start-over, 20 steps: {:.1}s", started.elapsed().as_secs_f64());
    assert!(out.contains("starting at step 0"), "{out}");
    for (dir, digest_before) in &digests {
        assert_eq!(&digest(dir), digest_before, "{} changed", dir.display());
    }
    verify_all_but(&root, Some(&corrupt));
}

#[test]
fn workers_that_find_their_checkpoint_corrupt_make_the_job_restore_an_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let calm = write_spec(dir, "calm", &sft("calm", 30, 9), 10);
    Place::Local.launch(&calm, &[]).unwrap_or_else(|e| panic!("the calm run failed:\n{e}"));
    // Every worker lost after step 25 (so none holds the state), and the step-20 checkpoint
    // corrupted while they are down: the launcher's replacements are told to restore it, find
    // a chunk's CRC wrong and say so; the leader passes over it and plans from step 10.
    let started = Instant::now();
    let spec = write_spec(dir, "lost", &sft("lost", 30, 9), 10);
    let run = Place::Local.start(&spec, &[]);
    wait_for("step 25 and the checkpoint of step 20", || {
        Place::Local.step(&spec) >= 25 && !of_step(&checkpoints(&spec), 20).is_empty()
    });
    let pids: Vec<u32> = (0..2)
        .map(|s| std::fs::read_to_string(run_dir(&spec).join(format!("workers/slice-{s}.pid"))).unwrap())
        .map(|p| p.trim().parse().unwrap())
        .collect();
    for &pid in &pids {
        signal(pid, "STOP");
    }
    let root = checkpoints(&spec);
    assert!(of_step(&root, 30).is_empty(), "the workers were stopped too late: step 30 is saved");
    let corrupt = of_step(&root, 20).pop().unwrap();
    flip_a_byte(&corrupt);
    for &pid in &pids {
        signal(pid, "KILL");
    }
    let out = run.finish().unwrap_or_else(|e| panic!("the run failed:\n{e}"));
    println!("all workers lost, a checkpoint corrupted, recovered: {:.1}s", started.elapsed().as_secs_f64());
    let name = corrupt.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        out.lines().any(|l| l.contains("passed_over") && l.contains(&name) && l.contains("crc32c")),
        "the corrupt checkpoint is reported:\n{out}"
    );
    assert!(out.contains("generation") && out.contains("from step 10"), "{out}");
    assert_eq!(digest_of_step(&root, 30), digest_of_step(&checkpoints(&calm), 30));
    verify_all_but(&root, Some(&corrupt));
}

#[test]
fn a_grpo_relaunch_resumes_from_the_newest_checkpoint_that_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let body = |name: &str, steps: u64| grpo(name, steps, 5);
    killed_corrupted_and_resumed(&Place::Local, dir.path(), &body, 10, 2, 7);
}

const ADMIN: &str = "resume-test-admin-token-0123456789";

/// Three `podctl coordinator` processes on loopback with mutual TLS.
struct Cluster {
    nodes: Vec<Child>,
    addrs: Vec<String>,
    /// The CA, and the client certificate and key workers present.
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    dir: PathBuf,
    admin: Client,
    runtime: tokio::runtime::Runtime,
    jobs: std::sync::Mutex<BTreeMap<PathBuf, String>>,
}

impl Cluster {
    fn new(dir: &Path) -> Cluster {
        let files = coordinator::tls::create_dev_ca(&dir.join("tls"), &[]).unwrap();
        std::fs::write(dir.join("admin-token"), ADMIN).unwrap();
        let ports: Vec<u16> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port())
            .collect();
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let peers = (1..=3).map(|i| format!("{i}={}", addrs[i - 1])).collect::<Vec<_>>().join(",");
        let nodes = (1..=3)
            .map(|i| {
                let log = std::fs::File::create(dir.join(format!("node{i}.log"))).unwrap();
                let mut child = podctl()
                    .args([
                        "coordinator",
                        "--id",
                        &i.to_string(),
                        "--listen",
                        &addrs[i - 1],
                        "--peers",
                        &peers,
                    ])
                    .arg("--data-dir")
                    .arg(dir.join(format!("node{i}")))
                    .arg("--tls-dir")
                    .arg(dir.join("tls"))
                    .env("PODCTL_ADMIN_TOKEN", ADMIN)
                    .stdout(Stdio::piped())
                    .stderr(log)
                    .spawn()
                    .unwrap();
                let mut line = String::new();
                BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
                assert!(line.starts_with("listening on "), "node {i} printed {line:?}");
                child
            })
            .collect();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let tls = coordinator::tls::client_tls(&files).unwrap();
        let mut config = ClientConfig::new(addrs.clone(), ADMIN, Some(tls));
        config.retry_for = Duration::from_secs(30);
        let admin = runtime.block_on(async { Client::new(config) }).unwrap();
        let (ca, cert, key) = (files.ca.clone(), files.client_cert.clone(), files.client_key.clone());
        Cluster {
            nodes,
            addrs,
            ca,
            cert,
            key,
            dir: dir.to_path_buf(),
            admin,
            runtime,
            jobs: Default::default(),
        }
    }

    fn start(&self, spec: &Path, flags: &[&str]) -> Run {
        let coordinators = self.addrs.join(",");
        let mut launch = podctl()
            .arg("launch")
            .arg(spec)
            .args(flags)
            .args(["--coordinator", &coordinators, "--ca"])
            .arg(&self.ca)
            .arg("--token-file")
            .arg(self.dir.join("admin-token"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The job line, then the worker command: the launch says what each host runs.
        let mut stdout = BufReader::new(launch.stdout.take().unwrap());
        let mut printed = String::new();
        let mut line = String::new();
        while !line.trim_start().starts_with("podctl worker") {
            line.clear();
            if stdout.read_line(&mut line).unwrap() == 0 {
                // Refused: no worker to start.
                return Run { launch, stdout, printed, workers: vec![], spec: spec.into() };
            }
            printed.push_str(&line);
        }
        let job_id = printed
            .lines()
            .find(|l| l.starts_with("job ") && l.contains(" submitted"))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap();
        assert!(line.contains(&format!("--job {job_id}")) && line.contains(&coordinators), "{line}");
        self.jobs.lock().unwrap().insert(spec.to_path_buf(), job_id.to_string());
        let workers = (0..2)
            .map(|slice| {
                let log =
                    std::fs::File::create(self.dir.join(format!("{job_id}-worker{slice}.log"))).unwrap();
                podctl()
                    .args(["--log", "info", "worker", "--coordinator", &coordinators, "--job", job_id])
                    .args(["--slice", &slice.to_string(), "--plugin"])
                    .arg(plugin())
                    .arg("--ca")
                    .arg(&self.ca)
                    .arg("--cert")
                    .arg(&self.cert)
                    .arg("--key")
                    .arg(&self.key)
                    .arg("--token-file")
                    .arg(run_dir(spec).join("job-token"))
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .unwrap()
            })
            .collect();
        Run { launch, stdout, printed, workers, spec: spec.into() }
    }

    fn step(&self, spec: &Path) -> u64 {
        let Some(job) = self.jobs.lock().unwrap().get(spec).cloned() else { return 0 };
        self.runtime.block_on(self.admin.get_job(&job)).map(|s| s.step).unwrap_or(0)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}

#[test]
fn a_cluster_resubmission_resumes_from_the_newest_checkpoint_that_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Place::Cluster(Box::new(Cluster::new(dir.path())));
    let body = |name: &str, steps: u64| sft(name, steps, 7);
    killed_corrupted_and_resumed(&cluster, dir.path(), &body, 30, 10, 25);
}
