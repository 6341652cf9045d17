//! The chaos harness: a job of several slices trained by real `podctl worker` processes under a
//! real three-node `podctl-coordinator` cluster, while a seeded schedule preempts (SIGTERM) and
//! kills (SIGKILL) workers, kills the Raft leader, cuts a slice off the network and restarts a
//! worker's host; replacements join and cut-off workers rejoin when the cut heals. With
//! [`Setup::storage_faults`] it also fills and slows the checkpoint folder's disk ([`disk`]) and
//! makes the checkpoint bucket throttle, fail, drop and delay requests ([`store`]).
//!
//! Everything runs in network namespaces the harness creates ([`net`]), so a cut is a real
//! partition (packets dropped both ways) and the host's network is never touched; the disk is a
//! loop device mounted in a mount namespace of the harness's own. Per event the
//! harness measures the time from the failure to the next committed global step, the steps
//! lost, and for joins how long training paused; per job the wall time from the first to the
//! last committed step. [`verify`] then checks what must hold whatever happened: the job
//! completed, every committed checkpoint reads back whole and equals the uninterrupted run's at
//! the same step (`podctl ckpt digest`), the final state is bitwise the uninterrupted run's, and
//! nothing the cut-off worker did after its removal was committed.
//!
//! Entry points: `cargo run -p podctl-chaos --release -- --help` (the acceptance run, and with
//! `--soak` the soak), `tests/short.rs` and `tests/soak.rs` (the CI variants),
//! `benches/goodput.rs` (goodput against a restart-from-checkpoint policy on the same schedule).
#![forbid(unsafe_code)]

pub mod disk;
pub mod net;
pub mod phases;
pub mod procs;
pub mod schedule;
pub mod soak;
pub mod store;

use anyhow::{Context, Result, bail};
use client::{Client, ClientConfig, ClientTls, JobState, JobStatus};
use disk::Disk;
use net::Network;
use nix::sys::signal::Signal;
use procs::{ADMIN, Coordinators, FailedSaves, Slot, WorkerLauncher};
use schedule::{Event, Kind, Trigger};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use store::ObjectStore;

/// How often the harness looks at the job.
const POLL: Duration = Duration::from_millis(100);
/// How long workers get to leave after the job ends.
const WORKER_EXIT_WAIT: Duration = Duration::from_secs(30);
/// The checkpoint disk's size: a few of the tiny model's checkpoints (~5 MiB each) and room.
const DISK_MIB: u64 = 256;
/// How fast the slow disk writes.
const SLOW_DISK_BYTES_PER_SECOND: u64 = 1 << 20;
/// A disk or store fault ends no sooner than this many steps past a checkpoint's step after it
/// began: that checkpoint's write has started by then.
const FAULT_SPANS_STEPS: u64 = 2;
/// A full disk stays full until a save failed on it, or this long past its time: long enough for
/// the next due save after a leader's outage or a slow disk's upload.
const DISK_FULL_WAITS_FOR_A_SAVE: Duration = Duration::from_secs(60);

/// Where the harness finds its tools and keeps its files.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The project (PODCTL_HOME: `models/`, `.venv/`).
    pub home: PathBuf,
    /// The directory holding `podctl` and `podctl-coordinator`.
    pub bin_dir: PathBuf,
    /// The bundle cache (PODCTL_CACHE); compiled programs go in `executables/` under it.
    pub cache: PathBuf,
    /// Cluster data, logs and runs.
    pub dir: PathBuf,
    /// Slices of the job (its `mesh.dcn`).
    pub slices: usize,
    /// Make the checkpoint disk and the checkpoint bucket (moto behind the fault proxy), for
    /// jobs that checkpoint there ([`Store`]) and the failures of disk and object store.
    pub storage_faults: bool,
}

impl Setup {
    /// The CPU PJRT plugin of the project's Python environment.
    pub fn plugin(&self) -> PathBuf {
        self.home.join(".venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
    }
}

/// Builds `podctl` and `podctl-coordinator` (release, or the dev build the workspace's tests
/// use) and returns the directory they are in.
pub fn build_binaries(home: &Path, release: bool) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(home);
    if release {
        let binaries =
            ["-p", "podctl", "--bin", "podctl", "-p", "podctl-coordinator", "--bin", "podctl-coordinator"];
        command.args(["build", "-q", "--release"]).args(binaries);
    } else {
        // The features `cargo nextest run --workspace` resolves (dev-dependencies' included), so
        // that under it this is a no-op. `cargo build -p podctl -p podctl-coordinator` resolves
        // others and compiled every dependency again: 16 minutes on 2 cores under load, which
        // made this test time out in CI.
        command.args(["test", "-q", "--no-run", "--workspace"]);
    }
    let status = command.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build of podctl and podctl-coordinator failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| home.join("target"), PathBuf::from);
    Ok(target.join(if release { "release" } else { "debug" }))
}

/// The job every run trains: a tiny model on `slices` slices of one CPU device each.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Its name (also its run directory's).
    pub name: String,
    /// Steps.
    pub steps: u64,
    /// Seed of data and initialization.
    pub seed: u64,
    /// A checkpoint every this many steps (all kept).
    pub checkpoint_every: u64,
    /// Sequence length (longer: slower steps).
    pub seq_len: u64,
    /// How long the run may take from submission to the job's end before the harness stops it
    /// and fails; `None`: 10 minutes plus 3 s a step and 90 s a failure.
    pub time_limit: Option<Duration>,
    /// Where its checkpoints go.
    pub store: Store,
    /// Keep the last this many committed checkpoints (`checkpoint.keep`); `None`: keep every one.
    pub keep: Option<u32>,
    /// Whether failures may overlap. Without, each waits until the job is whole again after the
    /// previous one. With, each waits only for its own lane: a slice failure for its slice to be
    /// whole (at most half the slices down at once), a leader kill for every coordinator to be
    /// up, a disk or store fault for the previous such fault to be over. Elastic policy only.
    pub overlap: bool,
}

/// Where a job's checkpoints go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// Its run directory (`<output>/checkpoints`).
    RunDir,
    /// The harness's disk, which the disk failures fill and slow.
    Disk,
    /// The harness's S3 bucket, behind the proxy that injects the object store's failures.
    Bucket,
}

impl JobSpec {
    /// A job of `steps` steps with a checkpoint every 10, kept, in its run directory.
    pub fn new(name: &str, steps: u64, seq_len: u64) -> JobSpec {
        JobSpec {
            name: name.into(),
            steps,
            seed: 11,
            checkpoint_every: 10,
            seq_len,
            time_limit: None,
            store: Store::RunDir,
            keep: None,
            overlap: false,
        }
    }

    /// Its checkpoint root, `None` for its run directory's.
    pub fn checkpoint_root(&self, setup: &Setup) -> Option<String> {
        match self.store {
            Store::RunDir => None,
            Store::Disk => Some(format!("file://{}/{}", setup.dir.join("disk").display(), self.name)),
            Store::Bucket => Some(format!("s3://{}/{}", store::BUCKET, self.name)),
        }
    }

    fn yaml(&self, setup: &Setup, run_dir: &Path) -> String {
        let keep = match self.keep {
            Some(keep) => format!("keep: {keep}"),
            None => format!("keep: 2, keep_every: {}", self.checkpoint_every),
        };
        let uri = self.checkpoint_root(setup).map_or(String::new(), |root| format!(", uri: \"{root}\""));
        format!(
            "name: {name}\nmodel: tiny\nmesh: {{ dcn: {slices}, ici: {{ fsdp: 1, tp: 1 }} }}\n\
             batch: {{ global: 16, micro: 4 }}\nseq_len: {seq}\nsteps: {steps}\nseed: {seed}\n\
             optimizer: {{ lr: 3.0e-3, warmup_steps: 5 }}\ndata: {{ kind: arithmetic }}\n\
             checkpoint: {{ every: {every}, {keep}{uri} }}\noutput: {out}\n",
            name = self.name,
            slices = setup.slices,
            seq = self.seq_len,
            steps = self.steps,
            seed = self.seed,
            every = self.checkpoint_every,
            out = run_dir.display(),
        )
    }
}

/// What the harness does when a failure is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// podctl's: survivors carry the lost slice's ranks, replacements catch up from a peer.
    Elastic,
    /// What XPK and JobSet do: every failure restarts every worker, which resume from the last
    /// committed checkpoint.
    RestartAll,
}

/// What happened to one injected failure.
#[derive(Debug, Clone)]
pub struct EventRecord {
    /// Its place in the schedule.
    pub index: usize,
    /// What was injected.
    pub kind: Kind,
    /// The slice hit (none for a leader kill).
    pub slice: Option<usize>,
    /// The worker it hit, or the coordinator node (`node N`).
    pub target: String,
    /// Committed steps when it was injected.
    pub at_step: u64,
    /// Seconds since the first committed step.
    pub at_seconds: f64,
    /// The generation in force then.
    pub generation: u64,
    /// Seconds from the failure until training ran again: the first step done after the
    /// generation that recovered formed (for a leader kill: the next commit).
    pub resumed_after: Option<f64>,
    /// Seconds from the failure to the next committed global step beyond `at_step`.
    pub next_step_after: Option<f64>,
    /// Committed steps computed again: `at_step` minus the recovering generation's start.
    pub steps_lost: Option<u64>,
    /// Where the recovering generation started.
    pub resumed_from: Option<u64>,
    /// Seconds from the replacement's start (or the heal) until it was a member again.
    pub join_after: Option<f64>,
    /// Seconds training stood still while the joiner was taken in.
    pub join_pause: Option<f64>,
    /// For a disk or object-store fault: seconds from the failure to the first checkpoint
    /// committed after the fault ended.
    pub committed_after: Option<f64>,
    /// What the fault met: for an object-store fault, the requests the proxy answered with it;
    /// for a full disk, the saves that failed on it (one per host).
    pub faulted: Option<u64>,
    /// For a disk or object-store fault: when it ended, and the newest committed checkpoint's
    /// step then.
    fault_ended: Option<(Instant, u64)>,
    proxy_counts: [u64; 4],
    failed_saves_before: u64,
    /// When it was injected (Unix seconds), and when the job removed the worker it hit.
    unix: f64,
    removed_unix: Option<f64>,
    /// The slot's host label and member worker id at injection, and the ids before it.
    worker_ids_before: BTreeSet<String>,
    join_started: Option<Instant>,
    /// The committed step when the replacement started or the cut healed.
    join_step: Option<u64>,
    /// A cut that healed before the leader removed the worker (a new leader's lease had just
    /// begun, say): it trained on as a member, with nothing to fence.
    stayed: bool,
    started: Instant,
}

/// One job run, as measured.
#[derive(Debug, Clone)]
pub struct JobRun {
    /// The job's name and id.
    pub name: String,
    /// Its id on the cluster.
    pub job_id: String,
    /// The policy it ran under.
    pub policy: Policy,
    /// Its steps.
    pub steps: u64,
    /// Its run directory.
    pub run_dir: PathBuf,
    /// Per injected failure.
    pub events: Vec<EventRecord>,
    /// Seconds from the first to the last committed step.
    pub wall_seconds: f64,
    /// Committed checkpoints (step, directory), oldest first.
    pub checkpoints: Vec<(u64, String)>,
    /// Every job event the coordinator recorded (Unix seconds, kind, detail).
    pub history: Vec<(f64, String, String)>,
    /// Worker processes that exited without the harness killing them.
    pub unexpected_exits: Vec<String>,
    /// Checkpoint uploads the workers reported failed, and of those how many for a full disk.
    pub failed_saves: (usize, usize),
    /// (step, observed time) of every change of the committed step, and generation changes.
    timeline: Vec<Sample>,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    step: u64,
    generation: u64,
}

/// Things due later: a replacement, a heal, a restart, a rebooted host's worker, the end of a
/// disk or object-store fault.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sequel {
    Replace(usize),
    Heal(usize),
    Restart(u64),
    Resume(u64),
    Reboot(usize),
    EndFault(Kind),
}

impl EventRecord {
    /// `event`, the `index`th of the schedule, injected at `now` into a job in `status`.
    fn new(index: usize, event: &Event, status: &JobStatus, at_seconds: f64, now: Instant) -> Self {
        EventRecord {
            index,
            kind: event.kind,
            slice: event.kind.hits_a_slice().then_some(event.slice),
            target: String::new(),
            at_step: status.step,
            at_seconds,
            generation: status.generation,
            resumed_after: None,
            next_step_after: None,
            steps_lost: None,
            resumed_from: None,
            join_after: None,
            join_pause: None,
            committed_after: None,
            faulted: None,
            fault_ended: None,
            proxy_counts: [0; 4],
            failed_saves_before: 0,
            unix: unix_now(),
            removed_unix: None,
            worker_ids_before: BTreeSet::new(),
            join_started: None,
            join_step: None,
            stayed: false,
            started: now,
        }
    }

    /// Whether the job is over this failure: training went on, the slice it hit is a member
    /// again, a checkpoint committed after the disk or store fault ended.
    pub fn recovered(&self) -> bool {
        self.next_step_after.is_some()
            && (self.slice.is_none() || self.join_after.is_some())
            && (!self.kind.hits_storage() || self.committed_after.is_some())
    }
}

/// The cluster, the network and the workers' slots.
pub struct Harness {
    setup: Setup,
    network: Network,
    runtime: tokio::runtime::Runtime,
    coordinators: Coordinators,
    admin: Client,
    launcher: WorkerLauncher,
    disk: Option<Disk>,
    object_store: Option<ObjectStore>,
    /// The variables that point S3 clients at the bucket (empty without it).
    store_env: Vec<(String, String)>,
}

impl Harness {
    /// Enters a new network namespace, makes the slices' namespaces and starts the coordinators.
    /// Call it on the thread that drives the harness, before any other runtime.
    pub fn start(setup: Setup) -> Result<Harness> {
        let network = Network::create(setup.slices)?;
        std::fs::create_dir_all(&setup.dir)?;
        // Before any process starts, so that all of them see it.
        let disk = setup.storage_faults.then(|| Disk::create(&setup.dir, DISK_MIB)).transpose()?;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let object_store = setup
            .storage_faults
            .then(|| {
                ObjectStore::start(
                    &setup.home.join(".venv"),
                    Network::HUB,
                    &setup.dir.join("moto.log"),
                    &runtime,
                )
            })
            .transpose()?;
        let store_env = object_store.as_ref().map(ObjectStore::env).unwrap_or_default();
        let coordinators =
            Coordinators::start(&setup.bin_dir.join("podctl-coordinator"), &setup.dir, &store_env)?;
        let addrs: Vec<String> = coordinators.nodes.iter().map(|n| n.addr.clone()).collect();
        let mut config = ClientConfig::new(addrs, ADMIN, Some(ClientTls::from_dir(&coordinators.tls_dir)?));
        config.call_timeout = Duration::from_secs(2);
        config.retry_for = Duration::from_secs(3);
        let admin = {
            let _inside = runtime.enter();
            Client::new(config)?
        };
        std::fs::write(setup.dir.join("admin-token"), ADMIN)?;
        let launcher = WorkerLauncher {
            podctl: setup.bin_dir.join("podctl"),
            plugin: setup.plugin(),
            compile_cache: setup.cache.join("executables"),
            coordinators: coordinators.addresses(),
            tls_dir: coordinators.tls_dir.clone(),
            env: store_env.clone(),
        };
        Ok(Harness { setup, network, runtime, coordinators, admin, launcher, disk, object_store, store_env })
    }

    /// Where the harness finds its tools and keeps its files.
    pub fn setup(&self) -> &Setup {
        &self.setup
    }

    fn podctl(&self) -> Command {
        let mut command = Command::new(&self.launcher.podctl);
        command
            .env("PODCTL_HOME", &self.setup.home)
            .env("PODCTL_CACHE", &self.setup.cache)
            .envs(self.store_env.iter().map(|(k, v)| (k, v)));
        command
    }

    fn status(&self, job_id: &str) -> Option<JobStatus> {
        self.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(3), self.admin.get_job(job_id)).await.ok()?.ok()
        })
    }

    fn leader(&self) -> Option<u64> {
        let info = self.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(3), self.admin.cluster_info()).await.ok()?.ok()
        })?;
        (info.leader_id != 0).then_some(info.leader_id)
    }

    /// Submits `spec` with `podctl launch --coordinator` and trains it with one worker process
    /// per slice, injecting `schedule` under `policy`. Returns once the job ended.
    pub fn run_job(&mut self, spec: &JobSpec, schedule: &[Event], policy: Policy) -> Result<JobRun> {
        let run_dir = self.setup.dir.join(&spec.name);
        let spec_path = self.setup.dir.join(format!("{}.yaml", spec.name));
        if spec.store != Store::RunDir && !self.setup.storage_faults {
            bail!(
                "job {} checkpoints to the harness's {:?}: start the harness with storage_faults",
                spec.name,
                spec.store
            );
        }
        std::fs::write(&spec_path, spec.yaml(&self.setup, &run_dir))?;
        println!(
            "job {}: {} steps on {} slices, {} failures, {policy:?}",
            spec.name,
            spec.steps,
            self.setup.slices,
            schedule.len()
        );
        let limit = spec
            .time_limit
            .unwrap_or_else(|| Duration::from_secs(600 + spec.steps * 3 + 90 * schedule.len() as u64));
        let deadline = Instant::now() + limit;
        let (mut launch, job_id) = self.submit(&spec_path, &run_dir, limit)?;
        let token = run_dir.join("job-token");
        let mut slots: Vec<Slot> = (0..self.setup.slices)
            .map(|k| Slot::new(k, run_dir.join(format!("worker-{k}.log")), run_dir.join(format!("host-{k}"))))
            .collect();
        for slot in &mut slots {
            slot.spawn(&self.launcher, &self.network, &job_id, &token)?;
        }
        let outcome = self.drive(spec, schedule, policy, &job_id, &token, &mut slots, deadline);
        for kind in Kind::DISK.into_iter().chain(Kind::STORE) {
            self.end_fault(kind)?;
        }
        if outcome.is_err() {
            let _ = self.runtime.block_on(self.admin.stop_job(&job_id));
        }
        for slot in &mut slots {
            slot.reap(WORKER_EXIT_WAIT);
        }
        for k in 0..self.setup.slices {
            let _ = self.network.heal(k);
        }
        let launched = wait_with_deadline(&mut launch, Duration::from_secs(30));
        let mut run = outcome?;
        let mut failed_saves = FailedSaves::default();
        run.failed_saves = (failed_saves.count(&slots) as usize, failed_saves.no_space as usize);
        if !launched.is_some_and(|s| s.success()) {
            bail!(
                "podctl launch of {} did not succeed; see {}",
                spec.name,
                run_dir.join("launch.log").display()
            );
        }
        run.run_dir = run_dir;
        let list = self.runtime.block_on(self.admin.checkpoints(&job_id))?;
        run.checkpoints = list
            .iter()
            .map(|c| (c.step, c.uri.strip_prefix("file://").unwrap_or(&c.uri).to_string()))
            .collect();
        Ok(run)
    }

    /// `podctl launch --coordinator`: exports the bundle, submits, follows the job. Waits up to
    /// `limit` for the job's id.
    fn submit(&self, spec: &Path, run_dir: &Path, limit: Duration) -> Result<(Child, String)> {
        std::fs::create_dir_all(run_dir)?;
        let log = std::fs::File::create(run_dir.join("launch.log"))?;
        let mut launch = self
            .podctl()
            .arg("launch")
            .arg(spec)
            .args(["--coordinator", &self.coordinators.addresses(), "--ca"])
            .arg(self.coordinators.tls_dir.join(client::tls::CA_CERT))
            .arg("--token-file")
            .arg(self.setup.dir.join("admin-token"))
            .stdout(Stdio::piped())
            .stderr(log.try_clone()?)
            .spawn()
            .context("starting podctl launch")?;
        // A thread reads its output into the log and hands over the job line, so a launch that
        // hangs cannot hang the harness and the pipe never fills.
        let stdout = launch.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut log = log;
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("job ")
                    && line.contains(" submitted")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(line.clone());
                }
                let _ = writeln!(log, "{line}");
            }
        });
        let line = match rx.recv_timeout(limit) {
            Ok(line) => line,
            Err(error) => {
                let _ = launch.kill();
                let _ = launch.wait();
                let why = match error {
                    std::sync::mpsc::RecvTimeoutError::Timeout => format!("within {limit:?}"),
                    std::sync::mpsc::RecvTimeoutError::Disconnected => "before it exited".into(),
                };
                bail!(
                    "podctl launch printed no job line {why}; see {}",
                    run_dir.join("launch.log").display()
                );
            }
        };
        let job_id = line.split_whitespace().nth(1).context("a job id")?.to_string();
        Ok((launch, job_id))
    }

    #[allow(clippy::too_many_arguments)]
    fn drive(
        &mut self,
        spec: &JobSpec,
        schedule: &[Event],
        policy: Policy,
        job_id: &str,
        token: &Path,
        slots: &mut [Slot],
        deadline: Instant,
    ) -> Result<JobRun> {
        if spec.overlap && policy != Policy::Elastic {
            bail!("job {}: overlapping failures need the elastic policy", spec.name);
        }
        let mut run = JobRun {
            name: spec.name.clone(),
            job_id: job_id.to_string(),
            policy,
            steps: spec.steps,
            run_dir: PathBuf::new(),
            events: Vec::new(),
            wall_seconds: 0.0,
            checkpoints: Vec::new(),
            history: Vec::new(),
            unexpected_exits: Vec::new(),
            failed_saves: (0, 0),
            timeline: Vec::new(),
        };
        let mut sequels: Vec<(Instant, Sequel)> = Vec::new();
        let mut next = 0usize;
        let mut first_step: Option<Instant> = None;
        let mut last_commit = Instant::now();
        let mut deliberate: BTreeSet<usize> = BTreeSet::new();
        let mut failed_saves = FailedSaves::default();
        let status = loop {
            if Instant::now() > deadline {
                bail!("job {} did not end in time (next event {next} of {})", spec.name, schedule.len());
            }
            std::thread::sleep(POLL);
            let Some(status) = self.status(job_id) else { continue };
            let now = Instant::now();
            let state = status.state;
            // The timeline, the history and who is a member of which slice.
            let last = run.timeline.last().copied();
            if last.is_none_or(|l| l.step != status.step || l.generation != status.generation) {
                if last.is_some_and(|l| status.step > l.step) {
                    last_commit = now;
                }
                run.timeline.push(Sample { at: now, step: status.step, generation: status.generation });
            }
            if status.step > 0 && first_step.is_none() {
                first_step = Some(now);
            }
            let seen = run.history.last().map_or(0.0, |h| h.0);
            for e in status.events.iter().filter(|e| e.unix_seconds > seen) {
                run.history.push((e.unix_seconds, e.kind.clone(), e.detail.clone()));
            }
            let members: BTreeMap<usize, (String, String)> = status
                .slices
                .iter()
                .filter(|s| !s.virtual_ranks.is_empty())
                .filter_map(|s| Some((slice_of_host(&s.host)?, (s.host.clone(), s.worker_id.clone()))))
                .collect();

            // Processes that left: deliberately, with the job, or by themselves (a defect).
            for slot in slots.iter_mut() {
                if let Some(exit) = slot.exited() {
                    let with_the_job = || self.status(job_id).is_some_and(|s| terminal(s.state));
                    if !deliberate.remove(&slot.slice) && !terminal(state) && !with_the_job() {
                        let note =
                            format!("worker {} of slice {} exited by itself ({exit})", slot.host, slot.slice);
                        println!("  ! {note}; starting another");
                        run.unexpected_exits.push(note);
                        slot.spawn(&self.launcher, &self.network, job_id, token)?;
                    }
                }
            }
            if terminal(state) {
                break status;
            }

            // Sequels that are due.
            let mut still = Vec::new();
            for (due, sequel) in sequels.drain(..) {
                if due > now {
                    still.push((due, sequel));
                    continue;
                }
                match sequel {
                    Sequel::Replace(k) if slots[k].child.is_some() => still.push((due, sequel)),
                    Sequel::Replace(k) => {
                        slots[k].spawn(&self.launcher, &self.network, job_id, token)?;
                        join_begins(&mut run.events, k, now, status.step);
                    }
                    Sequel::Heal(k) => {
                        self.network.heal(k)?;
                        join_begins(&mut run.events, k, now, status.step);
                    }
                    Sequel::Restart(id) => self.coordinators.restart(id)?,
                    Sequel::Resume(id) => self.coordinators.nodes[id as usize - 1].signal(Signal::SIGCONT)?,
                    Sequel::Reboot(k) => {
                        slots[k].restart_host(&self.launcher, &self.network, job_id, token)?;
                        join_begins(&mut run.events, k, now, status.step);
                    }
                    Sequel::EndFault(kind)
                        if run.events.iter().rev().find(|r| r.kind == kind).is_some_and(|r| {
                            status.step < r.at_step + spec.checkpoint_every + FAULT_SPANS_STEPS
                                || kind == Kind::DiskFull
                                    && failed_saves.count(slots) == r.failed_saves_before
                                    && now < due + DISK_FULL_WAITS_FOR_A_SAVE
                        }) =>
                    {
                        // A fault spans a checkpoint write: while other failures hold training
                        // up, none may be due before the fault's time is over.
                        still.push((due, sequel));
                    }
                    Sequel::EndFault(kind) => {
                        self.end_fault(kind)?;
                        if let Some(record) = run.events.iter_mut().rev().find(|r| r.kind == kind) {
                            let committed = status.last_checkpoint.as_ref().map_or(0, |c| c.step);
                            record.fault_ended = Some((now, committed));
                            if kind == Kind::DiskFull {
                                record.faulted = Some(failed_saves.count(slots) - record.failed_saves_before);
                            }
                            if let Some(store) = &self.object_store {
                                let counts = store.counts.snapshot();
                                let faulted: u64 = counts
                                    .iter()
                                    .zip(record.proxy_counts)
                                    .map(|(now, then)| now - then)
                                    .sum();
                                if Kind::STORE.contains(&kind) {
                                    record.faulted = Some(faulted);
                                }
                            }
                        }
                    }
                }
            }
            sequels = still;

            // The open events' recoveries and joins.
            for record in run.events.iter_mut().filter(|r| !r.recovered()) {
                observe(record, &status, &members, &run.history, now);
            }

            // The next event, once the trigger is met and everything has settled.
            let Some(first) = first_step else { continue };
            let Some(event) = schedule.get(next) else { continue };
            let due = match event.trigger {
                Trigger::Step(step) => status.step >= step,
                Trigger::After(after) => now.duration_since(first) >= after,
            };
            let whole = |k: usize| {
                slots[k].child.is_some() && members.get(&k).is_some_and(|(host, _)| *host == slots[k].host)
            };
            let training =
                state == Some(JobState::Running) && now.duration_since(last_commit) < Duration::from_secs(2);
            let settled = if spec.overlap {
                let open: Vec<&EventRecord> = run.events.iter().filter(|r| !r.recovered()).collect();
                let pending = |lane: &dyn Fn(&Sequel) -> bool| sequels.iter().any(|(_, s)| lane(s));
                match event.kind {
                    kind if kind.hits_the_leader() => {
                        !open.iter().any(|r| r.kind.hits_the_leader())
                            && !pending(&|s| matches!(s, Sequel::Restart(_) | Sequel::Resume(_)))
                            && self.coordinators.all_alive()
                    }
                    kind if kind.hits_storage() => {
                        !open.iter().any(|r| r.kind.hits_storage())
                            && !pending(&|s| matches!(s, Sequel::EndFault(_)))
                    }
                    _ => {
                        let k = event.slice;
                        let slice_lane = |s: &Sequel| matches!(s, Sequel::Replace(j) | Sequel::Heal(j) | Sequel::Reboot(j) if *j == k);
                        whole(k)
                            && !pending(&slice_lane)
                            && !open.iter().any(|r| r.slice == Some(k))
                            && open.iter().filter(|r| r.slice.is_some()).count() < slots.len() / 2
                    }
                }
            } else {
                sequels.is_empty()
                    && run.events.last().is_none_or(EventRecord::recovered)
                    && (0..slots.len()).all(whole)
                    && self.coordinators.all_alive()
            };
            if !(due && training && settled) {
                continue;
            }
            let at_seconds = now.duration_since(first).as_secs_f64();
            let mut record = EventRecord::new(next, event, &status, at_seconds, now);
            record.proxy_counts = self.object_store.as_ref().map_or([0; 4], |s| s.counts.snapshot());
            record.failed_saves_before = failed_saves.count(slots);
            match event.kind {
                Kind::LeaderKill => {
                    let Some(leader) = self.leader() else { continue };
                    record.target = format!("node {leader}");
                    self.coordinators.nodes[leader as usize - 1].kill()?;
                    sequels.push((now + event.then_after, Sequel::Restart(leader)));
                }
                Kind::LeaderHang => {
                    let Some(leader) = self.leader() else { continue };
                    record.target = format!("node {leader}");
                    self.coordinators.nodes[leader as usize - 1].signal(Signal::SIGSTOP)?;
                    sequels.push((now + event.then_after, Sequel::Resume(leader)));
                }
                kind if kind.hits_storage() => {
                    record.target = self.start_fault(kind)?;
                    sequels.push((now + event.then_after, Sequel::EndFault(kind)));
                }
                kind => {
                    let k = event.slice;
                    record.target = members[&k].1.clone();
                    record.worker_ids_before = status
                        .slices
                        .iter()
                        .filter(|s| slice_of_host(&s.host) == Some(k))
                        .map(|s| s.worker_id.clone())
                        .collect();
                    match kind {
                        Kind::Preempt => {
                            slots[k].signal(Signal::SIGTERM)?;
                            deliberate.insert(k);
                            sequels.push((now + event.then_after, Sequel::Replace(k)));
                        }
                        Kind::Kill => {
                            slots[k].kill();
                            sequels.push((now + event.then_after, Sequel::Replace(k)));
                        }
                        Kind::NodeRestart => {
                            slots[k].kill();
                            slots[k].wipe_local_state()?;
                            sequels.push((now + event.then_after, Sequel::Reboot(k)));
                        }
                        _ => {
                            self.network.cut(k)?;
                            sequels.push((now + event.then_after, Sequel::Heal(k)));
                        }
                    }
                }
            }
            println!(
                "  [{at_seconds:7.1}s] step {:>4} generation {:>3}: {} of {}",
                status.step, status.generation, event.kind, record.target
            );
            if policy == Policy::RestartAll {
                // Every worker goes and new ones start (on healthy machines: the cut heals);
                // they resume from the last committed checkpoint.
                sequels.retain(|(_, s)| {
                    matches!(s, Sequel::Restart(_) | Sequel::Resume(_) | Sequel::EndFault(_))
                });
                for slot in slots.iter_mut() {
                    if slot.child.is_some() {
                        slot.kill();
                    }
                    deliberate.remove(&slot.slice);
                    let _ = self.network.heal(slot.slice);
                    slot.spawn(&self.launcher, &self.network, job_id, token)?;
                }
                record.join_started = Some(now);
            }
            run.events.push(record);
            next += 1;
        };
        if next < schedule.len() {
            bail!(
                "job {} ended ({:?}: {}) with {} of {} failures injected; give it more steps",
                spec.name,
                status.state,
                status.message,
                next,
                schedule.len()
            );
        }
        if status.state != Some(JobState::Completed) {
            bail!("job {} ended {:?}: {}", spec.name, status.state, status.message);
        }
        if let Some(open) = run.events.iter().find(|r| !r.recovered()) {
            bail!(
                "job {} ended before its slice recovered from event {} ({} at step {}); give it more steps",
                spec.name,
                open.index,
                open.kind,
                open.at_step
            );
        }
        let first = first_step.context("no step was committed")?;
        run.wall_seconds = last_commit.duration_since(first).as_secs_f64();
        let timeline = run.timeline.clone();
        for record in &mut run.events {
            record.join_pause = record.join_started.and_then(|_| pause_after(&timeline, record));
            record.removed_unix = removal_unix(&run.history, record);
        }
        Ok(run)
    }

    /// Starts a disk or object-store fault; returns what it hit.
    fn start_fault(&mut self, kind: Kind) -> Result<String> {
        if Kind::DISK.contains(&kind) {
            let disk =
                self.disk.as_mut().context("a disk fault needs the harness's disk (storage_faults)")?;
            if kind == Kind::DiskFull {
                disk.fill()?;
            } else {
                disk.slow(SLOW_DISK_BYTES_PER_SECOND)?;
            }
            return Ok("checkpoint disk".into());
        }
        let fault = match kind {
            Kind::StoreThrottle => store::Fault::Throttle,
            Kind::StoreError => store::Fault::Error,
            Kind::StoreDrop => store::Fault::Drop,
            Kind::StoreSlow => store::Fault::Slow,
            other => bail!("{other} is not a disk or object-store fault"),
        };
        self.object_store
            .as_ref()
            .context("a store fault needs the harness's bucket (storage_faults)")?
            .set(fault);
        Ok(format!("S3 bucket {}", store::BUCKET))
    }

    /// Ends a disk or object-store fault (a no-op if it is not on).
    fn end_fault(&mut self, kind: Kind) -> Result<()> {
        match kind {
            Kind::DiskFull => self.disk.as_ref().map_or(Ok(()), Disk::free),
            Kind::SlowDisk => self.disk.as_mut().map_or(Ok(()), Disk::unslow),
            _ => {
                if let Some(store) = &self.object_store {
                    store.set(store::Fault::None);
                }
                Ok(())
            }
        }
    }

    /// `podctl ckpt list ROOT`: the (step, committed) of every checkpoint directory under it.
    pub fn list(&self, root: &str) -> Result<Vec<(u64, bool)>> {
        let out = self.podctl().args(["ckpt", "list", root]).output()?;
        if !out.status.success() {
            bail!("podctl ckpt list {root}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8(out.stdout)?
            .lines()
            .filter_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                Some((words.first()?.parse().ok()?, *words.get(2)? == "committed"))
            })
            .collect())
    }

    /// Runs `podctl ckpt verify` and `podctl ckpt digest` on a checkpoint directory; returns the
    /// state's digest.
    pub fn digest(&self, dir: &str) -> Result<String> {
        let verify = self.podctl().args(["ckpt", "verify", dir]).output()?;
        if !verify.status.success() {
            bail!("podctl ckpt verify {dir}: {}", String::from_utf8_lossy(&verify.stderr));
        }
        let out = self.podctl().args(["ckpt", "digest", dir]).output()?;
        if !out.status.success() {
            bail!("podctl ckpt digest {dir}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8(out.stdout)?;
        let last = text.lines().last().context("an empty digest")?;
        Ok(last.split_whitespace().next().unwrap_or_default().to_string())
    }
}

fn terminal(state: Option<JobState>) -> bool {
    state.is_some_and(JobState::is_terminal)
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn wait_with_deadline(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The slice of a worker's host label, `slice<k>.p<n>`.
fn slice_of_host(host: &str) -> Option<usize> {
    host.strip_prefix("slice")?.split('.').next()?.parse().ok()
}

/// A generation event's number, start step and members: "generation G from step S (...): id:[r] ...".
fn parse_generation(detail: &str) -> Option<(u64, u64, Vec<String>)> {
    let rest = detail.strip_prefix("generation ")?;
    let (g, rest) = rest.split_once(" from step ")?;
    let (s, rest) = rest.split_once(' ')?;
    let members = rest
        .rsplit_once("): ")
        .map(|(_, m)| m.split(' ').filter_map(|w| w.split_once(':').map(|(id, _)| id.to_string())).collect())
        .unwrap_or_default();
    Some((g.parse().ok()?, s.parse().ok()?, members))
}

/// The start step of generation `g`, from the history.
fn start_of(history: &[(f64, String, String)], g: u64) -> Option<u64> {
    history
        .iter()
        .filter(|(_, kind, _)| kind == "generation")
        .filter_map(|(_, _, d)| parse_generation(d))
        .find(|(generation, _, _)| *generation == g)
        .map(|(_, start, _)| start)
}

/// Updates an open event from the job's status.
fn observe(
    record: &mut EventRecord,
    status: &JobStatus,
    members: &BTreeMap<usize, (String, String)>,
    history: &[(f64, String, String)],
    now: Instant,
) {
    let since = now.duration_since(record.started).as_secs_f64();
    // Only a failure of a slice must end in a new generation.
    let moved_on = record.slice.is_none() || status.generation > record.generation;
    if record.resumed_after.is_none() && moved_on && status.state == Some(JobState::Running) {
        let start = if status.generation > record.generation {
            start_of(history, status.generation)
        } else {
            Some(record.at_step)
        };
        let trained = status
            .slices
            .iter()
            .filter(|s| !s.virtual_ranks.is_empty())
            .all(|s| start.is_some_and(|start| s.step > start));
        if let Some(start) = start
            && (trained || status.step > record.at_step)
        {
            record.resumed_after = Some(since);
            record.resumed_from = Some(start);
            record.steps_lost = Some(record.at_step.saturating_sub(start));
        }
    }
    if record.next_step_after.is_none() && moved_on && status.step > record.at_step {
        record.next_step_after = Some(since);
        if record.resumed_after.is_none() {
            record.resumed_after = Some(since);
            let start = start_of(history, status.generation).unwrap_or(record.at_step);
            record.resumed_from = Some(start.min(record.at_step));
            record.steps_lost = Some(record.at_step.saturating_sub(start));
        }
    }
    if let (Some((_, committed)), None) = (record.fault_ended, record.committed_after)
        && status.last_checkpoint.as_ref().is_some_and(|c| c.step > committed)
    {
        record.committed_after = Some(since);
    }
    if let (Some(k), Some(started), None) = (record.slice, record.join_started, record.join_after)
        && let Some((_, id)) = members.get(&k)
    {
        // The cut worker itself, still a member when a step commits after the heal: it took part
        // in that step, so the leader never removed it.
        let stayed = record.kind == Kind::Cut
            && *id == record.target
            && record.join_step.is_some_and(|healed_at| status.step > healed_at);
        if stayed || !record.worker_ids_before.contains(id) {
            record.stayed = stayed;
            record.join_after = Some(now.duration_since(started).as_secs_f64());
        }
    }
}

/// How long committed steps stood still around the generation that took the joiner in: from
/// the last commit before the first generation change after the join started to the first
/// commit after it.
fn pause_after(timeline: &[Sample], record: &EventRecord) -> Option<f64> {
    let started = record.join_started?;
    let before_join = generation_at(timeline, started);
    let change = timeline.iter().position(|s| s.at >= started && s.generation > before_join)?;
    let step = timeline[change].step;
    let last_commit = timeline.iter().find(|s| s.step == step).map_or(timeline[change].at, |s| s.at);
    let resumed = timeline[change..].iter().find(|s| s.step > step)?;
    Some(resumed.at.duration_since(last_commit).as_secs_f64())
}

fn generation_at(timeline: &[Sample], at: Instant) -> u64 {
    timeline.iter().rev().find(|s| s.at <= at).map_or(0, |s| s.generation)
}

/// When the job removed the worker a slice event hit: the first recovery after the event whose
/// generation formed without it. (Under overlapping failures a recovery of another slice may
/// come first and keep it.)
fn removal_unix(history: &[(f64, String, String)], record: &EventRecord) -> Option<f64> {
    record.slice?;
    removal_of(history, record.unix, &record.target)
}

fn removal_of(history: &[(f64, String, String)], since_unix: f64, worker: &str) -> Option<f64> {
    let after = |at: f64| history.iter().filter(move |(unix, _, _)| *unix >= at);
    after(since_unix)
        .filter(|(_, kind, _)| kind == "recovery")
        .find(|(at, _, _)| {
            after(*at)
                .filter(|(_, kind, _)| kind == "generation")
                .find_map(|(_, _, detail)| parse_generation(detail))
                .is_some_and(|(_, _, members)| !members.iter().any(|m| m == worker))
        })
        .map(|(unix, _, _)| *unix)
}

/// Notes on the newest event that hit slice `k` that its slice's worker starts again (a
/// replacement, a heal, a rebooted host's worker) at `now`, with `step` committed.
fn join_begins(events: &mut [EventRecord], k: usize, now: Instant, step: u64) {
    if let Some(record) = events.iter_mut().rev().find(|r| r.slice == Some(k)) {
        record.join_started = Some(now);
        record.join_step = Some(step);
    }
}

/// What [`verify`] found.
#[derive(Debug, Default)]
pub struct Verified {
    /// Committed checkpoints of the chaos run whose digest equals the calm run's at that step.
    pub checkpoints_equal: usize,
    /// Committed checkpoints of the chaos run older than every one the calm run kept.
    pub checkpoints_unmatched: usize,
    /// The digest of the chaos run's final state (equal to the calm run's at that step).
    pub final_digest: String,
    /// Per cut: the cut-off worker, generations formed after its removal, checkpoints committed
    /// after it, and the lines of its log where its writes were refused.
    pub fencing: Vec<String>,
}

/// Checks a chaos run against the uninterrupted run of the same job: every committed checkpoint
/// reads back whole and equals the calm one at the same step, the final states are bitwise
/// equal, and nothing a cut-off worker did after its removal was committed.
pub fn verify(harness: &Harness, calm: &JobRun, chaos: &JobRun) -> Result<Verified> {
    let calm_digests: BTreeMap<u64, String> = calm
        .checkpoints
        .iter()
        .map(|(step, dir)| Ok((*step, harness.digest(dir)?)))
        .collect::<Result<_>>()?;
    let mut verified = Verified::default();
    if chaos.checkpoints.is_empty() {
        bail!("the chaos run committed no checkpoint");
    }
    for (step, dir) in &chaos.checkpoints {
        let digest = harness.digest(dir)?;
        let Some(expected) = calm_digests.get(step) else {
            // Expired by the calm run's retention (a long run cannot keep them all).
            if calm_digests.keys().next().is_some_and(|oldest| oldest > step) {
                verified.checkpoints_unmatched += 1;
                continue;
            }
            bail!("the calm run has no checkpoint of step {step} to compare {dir} with");
        };
        if &digest != expected {
            bail!(
                "checkpoint {dir} (step {step}) differs from the uninterrupted run's: {digest} vs {expected}"
            );
        }
        verified.checkpoints_equal += 1;
        verified.final_digest = digest;
    }
    let last = chaos.checkpoints.last().expect("checked above");
    if last.0 != chaos.steps {
        bail!("the last committed checkpoint is of step {}, not the final step {}", last.0, chaos.steps);
    }

    let generations: BTreeMap<u64, Vec<String>> = chaos
        .history
        .iter()
        .filter(|(_, kind, _)| kind == "generation")
        .filter_map(|(_, _, d)| parse_generation(d))
        .map(|(g, _, members)| (g, members))
        .collect();
    for record in chaos.events.iter().filter(|r| r.kind == Kind::Cut) {
        let worker = &record.target;
        let removed = match record.removed_unix {
            Some(removed) => removed,
            None if record.stayed => continue,
            None => bail!("no recovery removed {worker} after its cut"),
        };
        let later_generations: Vec<u64> = chaos
            .history
            .iter()
            .filter(|(unix, kind, _)| *unix >= removed && kind == "generation")
            .filter_map(|(_, _, d)| parse_generation(d))
            .map(|(g, _, members)| {
                if members.contains(worker) {
                    bail!("generation {g}, formed after {worker} was cut off, counts it as a member");
                }
                Ok(g)
            })
            .collect::<Result<_>>()?;
        let mut later_checkpoints = 0;
        for (_, _, detail) in
            chaos.history.iter().filter(|(unix, kind, _)| *unix >= removed && kind == "checkpoint")
        {
            // Save ids end in `g<generation>` (`<line>.s<nonce>g<generation>`, nonce in hex).
            let generation: u64 = detail
                .rsplit_once('g')
                .and_then(|(_, g)| g.parse().ok())
                .with_context(|| format!("a checkpoint event without a save generation: {detail}"))?;
            if generation <= record.generation
                || generations.get(&generation).is_none_or(|m| m.contains(worker))
            {
                bail!(
                    "{detail}, committed after {worker} was cut off, was saved by a generation it belonged to"
                );
            }
            later_checkpoints += 1;
        }
        let log =
            std::fs::read_to_string(chaos.run_dir.join(format!("worker-{}.log", record.slice.unwrap_or(0))))
                .unwrap_or_default();
        let refused = log.lines().filter(|l| l.contains("refused") || l.contains("stale generation")).count();
        verified.fencing.push(format!(
            "{worker} (cut at step {}, generation {}): not a member of the {} generations formed after its removal, \
             nor a saver of the {} checkpoints committed after it; {refused} log lines of its slice show refused writes",
            record.at_step,
            record.generation,
            later_generations.len(),
            later_checkpoints
        ));
    }
    Ok(verified)
}

fn seconds(value: Option<f64>) -> String {
    value.map_or("-".into(), |s| format!("{s:.2}"))
}

/// Prints one line per event and a summary per kind.
pub fn print_events(run: &JobRun) {
    println!(
        "{:>3} {:<15} {:<22} {:>5} {:>4}  {:>8} {:>9} {:>5} {:>6}  {:>6} {:>6}",
        "#", "failure", "target", "step", "gen", "resumed", "next step", "lost", "from", "join", "pause"
    );
    for r in &run.events {
        println!(
            "{:>3} {:<15} {:<22} {:>5} {:>4}  {:>7}s {:>8}s {:>5} {:>6}  {:>5}s {:>5}s",
            r.index,
            r.kind.to_string(),
            r.target,
            r.at_step,
            r.generation,
            seconds(r.resumed_after),
            seconds(r.next_step_after),
            r.steps_lost.map_or("-".into(), |l| l.to_string()),
            r.resumed_from.map_or("-".into(), |s| s.to_string()),
            seconds(r.join_after),
            seconds(r.join_pause),
        );
    }
    for kind in Kind::ALL {
        let of: Vec<&EventRecord> = run.events.iter().filter(|r| r.kind == kind).collect();
        if of.is_empty() {
            continue;
        }
        let next: Vec<f64> = of.iter().filter_map(|r| r.next_step_after).collect();
        let lost: u64 = of.iter().filter_map(|r| r.steps_lost).sum();
        println!(
            "{kind:<15} x{}: failure -> next committed step mean {:.2}s, max {:.2}s; steps lost {lost}",
            of.len(),
            next.iter().sum::<f64>() / next.len().max(1) as f64,
            next.iter().copied().fold(0.0, f64::max),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(unix: f64, kind: &str, detail: &str) -> (f64, String, String) {
        (unix, kind.into(), detail.into())
    }

    #[test]
    fn a_worker_is_removed_by_the_recovery_whose_generation_leaves_it_out() {
        // j.w2 is cut at 10.0; j.w1 was killed at 9.9 and its recovery, at 10.2, still counts
        // j.w2 in (its lease has not run out); j.w2's own recovery comes at 13.0.
        let history = [
            event(10.2, "recovery", "generation 4: j.w1 left"),
            event(10.4, "generation", "generation 4 from step 30 (j.w1 left): j.w0:[0] j.w2:[1,2] j.w3:[3]"),
            event(13.0, "recovery", "generation 5: j.w2 named lost by j.w0 (timeout)"),
            event(
                13.3,
                "generation",
                "generation 5 from step 38 (j.w2 named lost by j.w0): j.w0:[0,1] j.w3:[2,3]",
            ),
        ];
        assert_eq!(removal_of(&history, 10.0, "j.w2"), Some(13.0));
        assert_eq!(removal_of(&history, 9.9, "j.w1"), Some(10.2));
        assert_eq!(removal_of(&history, 10.0, "j.w0"), None);
    }

    #[test]
    fn a_cut_that_heals_before_the_worker_is_removed_ends_when_it_trains_again() {
        let at = |step, generation| JobStatus {
            step,
            generation,
            state: Some(JobState::Running),
            ..Default::default()
        };
        let cut = Event {
            trigger: Trigger::Step(50),
            kind: Kind::Cut,
            slice: 2,
            then_after: Duration::from_secs(5),
        };
        let started = Instant::now();
        let mut record = EventRecord::new(0, &cut, &at(50, 7), 1.0, started);
        record.target = "j.w16".into();
        record.worker_ids_before = ["j.w16".to_string()].into();
        let members: BTreeMap<usize, (String, String)> = [(2, ("h2".into(), "j.w16".into()))].into();
        // A new leader's lease kept it in while it was cut; it heals at step 53.
        record.join_started = Some(started + Duration::from_secs(5));
        record.join_step = Some(53);
        observe(&mut record, &at(53, 8), &members, &[], started + Duration::from_secs(5));
        assert!(!record.recovered(), "not yet seen to train: {record:?}");
        observe(&mut record, &at(54, 8), &members, &[], started + Duration::from_secs(6));
        assert!(record.recovered() && record.stayed, "{record:?}");
        assert_eq!(record.join_after, Some(1.0));
        // Another worker's id in the slice is a replacement, as before.
        let mut replaced = EventRecord::new(0, &cut, &at(50, 7), 1.0, started);
        replaced.target = "j.w16".into();
        replaced.worker_ids_before = ["j.w16".to_string()].into();
        replaced.join_started = Some(started);
        let rejoined: BTreeMap<usize, (String, String)> = [(2, ("h2".into(), "j.w17".into()))].into();
        observe(&mut replaced, &at(51, 8), &rejoined, &[], started + Duration::from_secs(2));
        assert!(replaced.recovered() && !replaced.stayed, "{replaced:?}");
    }
}
