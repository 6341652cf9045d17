//! Checkpoints of a real trainer's state, each configuration in its own process (the CPU
//! plugin allows one multi-device client per process, as production has one worker per host).
//!
//! - A dcn(2) x (fsdp 2, tp 2) save made by two slice processes that trained together over the
//!   ring all-reduce, each writing only its share, restores bitwise under (fsdp 4) and on one
//!   device. Two processes rather than one trainer saving both hosts' shares: each host's
//!   buffers then come off its own devices, through the same `StateSaver` the agent uses, and
//!   the replicas being bitwise equal is checked, not assumed.
//! - A job killed after a checkpoint commit, with a later save uploaded but never committed,
//!   resumes from the newest commit and ends bitwise identical to the same job run without
//!   interruption; the orphan is collected. One flipped byte in the newest checkpoint makes the
//!   resume refuse it, naming the object and byte range, and start from the previous commit,
//!   still ending bitwise identical.

use crate::{members, support};
use checkpoint::{CommitLog, HostReport, SaveOptions, SaveSpec, Storage, StoreCommitLog};
use collective::{AbortHandle, Endpoint, GroupSpec};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use worker::ckpt::{CheckpointEvent, Checkpoints, Commit, HostSave, SaveLayout, Saver, StateSaver};
use worker::sft::Sft;
use worker::single::Resume;
use worker::{Reduce, Sink, Slice, StepResult, Trainer, run_step};

const SEED: u64 = 11;
const GLOBAL: usize = 8;
const MICRO: usize = 4;
const SEQ_LEN: usize = 128;
/// Steps the two slices train before their save.
const SAVED_STEP: u64 = 2;
/// What a held child prints before it sleeps until killed.
const HOLDING: &str = "PODCTL_TEST_CKPT_HOLDING";
const TASK_ENV: &str = "PODCTL_TEST_CKPT_TASK";

/// What a child process does, handed over in its environment.
#[derive(serde::Serialize, serde::Deserialize)]
enum Task {
    /// One slice of a dcn(2) job: trains `SAVED_STEP` steps over the ring, then saves its share.
    SaveSlice { bundle: PathBuf, group: GroupSpec, root: String, out: PathBuf },
    /// Restores a checkpoint directory onto the bundle's mesh.
    Restore { bundle: PathBuf, uri: String, step: u64, out: PathBuf },
    /// `worker::single::run` for a job; with `hold_at`, stops at the first save started at or after
    /// that step and waits to be killed.
    Train { bundle: PathBuf, job: String, hold_at: Option<u64>, out: PathBuf },
}

#[test]
#[ignore = "a child process of the checkpoint tests"]
fn child() {
    let task = std::env::var(TASK_ENV).expect("only run as a child of the checkpoint tests");
    match serde_json::from_str(&task).unwrap() {
        Task::SaveSlice { bundle, group, root, out } => save_slice(&bundle, &group, &root, &out),
        Task::Restore { bundle, uri, step, out } => {
            let mut trainer = trainer(&bundle);
            let runtime = tokio::runtime::Runtime::new().unwrap();
            let restored = runtime
                .block_on(worker::ckpt::restore(&mut trainer, &uri, step, &Default::default()))
                .unwrap();
            assert_eq!(
                (restored.step, restored.data_position.seed, restored.data_position.step),
                (step, SEED, step)
            );
            write_state(&out, &trainer.download_state().unwrap());
        }
        Task::Train { bundle, job, hold_at, out } => {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            let job = job::JobSpec::from_yaml(&job, Path::new("test.yaml")).unwrap();
            let mut trainer = trainer(&bundle);
            std::fs::create_dir_all(&out).unwrap();
            let events = std::fs::File::create(out.join("events.jsonl")).unwrap();
            let root = job.checkpoint_uri().map(|u| PathBuf::from(u.trim_start_matches("file://")));
            let mut recorder = Recorder { events, hold_at, root };
            let summary = worker::single::run(
                &mut trainer,
                &job,
                &mut recorder,
                &Resume::Newest,
                &worker::driver::Uninterrupted,
                runtime.handle(),
            )
            .unwrap();
            std::fs::write(out.join("start_step"), summary.trained.start.to_string()).unwrap();
            write_state(&out, &trainer.download_state().unwrap());
        }
    }
}

fn trainer(bundle: &Path) -> Trainer {
    let bundle = bundle::Bundle::load(bundle).unwrap();
    let slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    Trainer::new(slice, &bundle).unwrap()
}

fn loader() -> data::Loader {
    let config: data::DataConfig = serde_json::from_str(r#"{"kind": "arithmetic"}"#).unwrap();
    data::Loader::from_config(
        &config,
        data::BatchSpec::new(GLOBAL, MICRO, SEQ_LEN).unwrap(),
        SEED,
        &data::LocalFiles,
    )
    .unwrap()
}

fn save_slice(bundle: &Path, group: &GroupSpec, root: &str, out: &Path) {
    let endpoint = Endpoint::bind(group.members[group.me]).unwrap();
    let mut trainer = trainer(bundle);
    trainer.init(5).unwrap();
    let ring = endpoint.form(group, &members::forming(), &AbortHandle::new()).unwrap();
    let accum = (GLOBAL / MICRO / group.ranks()) as u64;
    let sft = Sft::from_loader(loader());
    for step in 0..SAVED_STEP {
        run_step(&mut trainer, &sft, step, &group.local_ranks(), accum, 2e-3, Reduce::Ring(&ring)).unwrap();
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let layout = SaveLayout {
        dcn: 2,
        slice: group.me,
        seed: SEED,
        identity: serde_json::Value::Null,
        hf_source: None,
    };
    if group.me == 0 {
        skips_while_uploading(&trainer, layout.clone(), runtime.handle(), &out.join("throttled"));
    }
    let storage = Storage::open(root, &Default::default()).unwrap();
    // Small chunks: restore onto another mesh reads partial chunks at shard boundaries.
    let options = SaveOptions { chunk_size: 64 << 10, ..SaveOptions::default() };
    let mut saver =
        StateSaver::new(storage, options, layout, "g1-s2".into(), runtime.handle().clone()).unwrap();
    let mut pending = saver.start(&trainer, SAVED_STEP).unwrap();
    // Polled from this thread, outside the runtime, as the save schedule does.
    let saved = loop {
        if let Some(outcome) = pending.try_outcome() {
            break outcome.unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(saved.copy_seconds > 0.0 && saved.upload_seconds > 0.0);
    std::fs::create_dir_all(out).unwrap();
    let file = std::fs::File::create(out.join("save.json")).unwrap();
    serde_json::to_writer(file, &(&saved.spec, &saved.report)).unwrap();
    write_state(out, &trainer.download_state().unwrap());
}

/// A save due while one uploads (slowed by a throttled store) is skipped, naming both steps;
/// the running one still completes and is committed before the final save.
fn skips_while_uploading(
    trainer: &Trainer,
    layout: SaveLayout,
    runtime: &tokio::runtime::Handle,
    dir: &Path,
) {
    std::fs::create_dir_all(dir).unwrap();
    let throttled = object_store::throttle::ThrottledStore::new(
        object_store::local::LocalFileSystem::new_with_prefix(dir).unwrap(),
        object_store::throttle::ThrottleConfig {
            wait_put_per_call: Duration::from_millis(500),
            ..Default::default()
        },
    );
    let storage = Storage::from_store(std::sync::Arc::new(throttled), "", "throttled", None).unwrap();
    let saver =
        StateSaver::new(storage, SaveOptions::default(), layout, "first".into(), runtime.clone()).unwrap();
    let committed = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let mut checkpoints = Checkpoints::new(1, Box::new(saver), Box::new(Kept(committed.clone())));
    let events = checkpoints.after_step(trainer, 2, 10).unwrap();
    assert!(
        matches!(events[..], [CheckpointEvent::Started { step: 2, bytes, .. }] if bytes > 0),
        "{events:?}"
    );
    let events = checkpoints.after_step(trainer, 3, 10).unwrap();
    assert!(
        matches!(
            events[..],
            [CheckpointEvent::Skipped { step: 3, running_step: 2, bytes_written, bytes_total }]
                if bytes_written < bytes_total
        ),
        "{events:?}"
    );
    checkpoints.finish(trainer, 3).unwrap();
    assert_eq!(*committed.borrow(), [2, 3], "the running save, then the final one");
}

/// Keeps the steps of the saves handed to it.
struct Kept(std::rc::Rc<std::cell::RefCell<Vec<u64>>>);

impl Commit for Kept {
    fn commit(&mut self, saved: HostSave, _last: bool) -> Result<CheckpointEvent, worker::WorkerError> {
        self.0.borrow_mut().push(saved.spec.step);
        Ok(CheckpointEvent::Uploaded {
            step: saved.spec.step,
            bytes: saved.report.object.size,
            upload_seconds: 0.0,
        })
    }
}

/// Writes the checkpoint events of a run, one JSON line each; holds when told to.
struct Recorder {
    events: std::fs::File,
    hold_at: Option<u64>,
    /// The checkpoint root, where a held save must have begun writing before the hold is told.
    root: Option<PathBuf>,
}

impl Sink for Recorder {
    fn on_step(&mut self, _: &StepResult) {}

    fn on_checkpoint(&mut self, event: &CheckpointEvent) {
        let line = match event {
            CheckpointEvent::Restored { restored, passed_over } => serde_json::json!({
                "kind": "restored",
                "step": restored.step,
                "uri": restored.uri,
                "passed_over": passed_over.iter().map(|p| [&p.uri, &p.reason]).collect::<Vec<_>>(),
            }),
            CheckpointEvent::Started { step, .. } => serde_json::json!({"kind": "started", "step": step}),
            CheckpointEvent::Skipped { step, .. } => serde_json::json!({"kind": "skipped", "step": step}),
            CheckpointEvent::Committed { step, uri, .. } => {
                serde_json::json!({"kind": "committed", "step": step, "uri": uri})
            }
            CheckpointEvent::Fresh { line, .. } => serde_json::json!({"kind": "fresh", "line": line}),
            CheckpointEvent::Uploaded { step, .. } => serde_json::json!({"kind": "uploaded", "step": step}),
            CheckpointEvent::Failed { step, reason } => {
                serde_json::json!({"kind": "failed", "step": step, "reason": reason})
            }
        };
        writeln!(self.events, "{line}").unwrap();
        if let (Some(hold), CheckpointEvent::Started { step, .. }) = (self.hold_at, event)
            && *step >= hold
        {
            // The upload runs in the background: tell the parent only once it has written its
            // directory, or a kill could come before the save left anything behind.
            let prefix = format!("{step:012}-");
            let started = std::time::Instant::now();
            while let Some(root) = &self.root
                && !std::fs::read_dir(root).is_ok_and(|mut d| {
                    d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&prefix)))
                })
                && started.elapsed() < Duration::from_secs(60)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            println!("{HOLDING}");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
}

fn spawn(task: &Task, stdout: Stdio) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["ckpt::child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(TASK_ENV, serde_json::to_string(task).unwrap())
        .stdout(stdout)
        .spawn()
        .unwrap()
}

fn run_all(tasks: &[Task]) {
    let children: Vec<Child> = tasks.iter().map(|t| spawn(t, Stdio::null())).collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a child process failed (its stderr is above)");
    }
}

type State = Vec<(String, Vec<u8>)>;

fn write_state(dir: &Path, state: &State) {
    std::fs::create_dir_all(dir).unwrap();
    let layout: Vec<(&str, usize)> = state.iter().map(|(n, b)| (n.as_str(), b.len())).collect();
    std::fs::write(dir.join("layout.json"), serde_json::to_vec(&layout).unwrap()).unwrap();
    std::fs::write(
        dir.join("state.bin"),
        state.iter().flat_map(|(_, b)| b.iter().copied()).collect::<Vec<_>>(),
    )
    .unwrap();
}

fn read_state(dir: &Path) -> State {
    let layout: Vec<(String, usize)> =
        serde_json::from_slice(&std::fs::read(dir.join("layout.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("state.bin")).unwrap();
    let mut at = 0;
    layout
        .into_iter()
        .map(|(name, len)| {
            at += len;
            (name, bytes[at - len..at].to_vec())
        })
        .collect()
}

fn assert_same_state(what: &str, a: &State, b: &State) {
    assert_eq!(a.len(), b.len(), "{what}: different array counts");
    for ((name, x), (other, y)) in a.iter().zip(b) {
        assert_eq!(name, other, "{what}");
        assert!(x == y, "{what}: '{name}' differs");
    }
}

#[test]
fn hsdp_save_of_two_slices_restores_bitwise_on_fsdp4_and_one_device() {
    let tmp = tempfile::tempdir().unwrap();
    let hsdp = support::export_tiny(&tmp.path().join("b22"), "fsdp=2,tp=2", MICRO as u64, SEQ_LEN as u64);
    let fsdp4 = support::export_tiny(&tmp.path().join("b4"), "fsdp=4,tp=1", MICRO as u64, SEQ_LEN as u64);
    let single = support::export_tiny(&tmp.path().join("b1"), "fsdp=1,tp=1", MICRO as u64, SEQ_LEN as u64);
    let root = format!("file://{}", tmp.path().join("ckpt").display());

    let members = members::free_addrs(2);
    let saves: Vec<Task> = (0..2)
        .map(|me| Task::SaveSlice {
            bundle: hsdp.dir().to_path_buf(),
            group: GroupSpec {
                job: "ckpt".into(),
                generation: 1,
                members: members.clone(),
                placement: vec![0, 1],
                me,
            },
            root: root.clone(),
            out: tmp.path().join(format!("slice{me}")),
        })
        .collect();
    run_all(&saves);

    type Saved = (SaveSpec, HostReport);
    let read = |me: usize| -> Saved {
        let file = std::fs::File::open(tmp.path().join(format!("slice{me}/save.json"))).unwrap();
        serde_json::from_reader(file).unwrap()
    };
    let (spec, first) = read(0);
    let (other_spec, second) = read(1);
    assert_eq!(spec, other_spec, "both hosts build the same save spec");
    let state = read_state(&tmp.path().join("slice0"));
    assert_same_state("the two slices' replicas", &state, &read_state(&tmp.path().join("slice1")));
    assert_eq!(spec.topology.to_string(), "dcn(2) x (fsdp=2, tp=2) on 2 host(s)");
    assert_eq!(spec.bundle, hsdp.id());

    // Each distinct byte is written once, and both hosts write part of the state.
    let total: u64 = state.iter().map(|(_, b)| b.len() as u64).sum();
    let (a, b) = (first.object.size, second.object.size);
    assert_eq!(a + b, total, "replicas are written once");
    assert!(a > total / 4 && b > total / 4, "the write load is spread: {a} + {b} bytes");

    // Commit as the coordinator does once every host has reported.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let storage = Storage::open(&root, &Default::default()).unwrap();
    let log = StoreCommitLog::new(storage.clone());
    let commit = runtime.block_on(checkpoint::finalize(&storage, &spec, &[second, first], &log)).unwrap();
    assert_eq!(runtime.block_on(log.list()).unwrap(), vec![commit.clone()]);
    let uri = format!("{root}/{}", commit.dir());

    let restores: Vec<Task> = [("fsdp4", &fsdp4), ("single", &single)]
        .into_iter()
        .map(|(name, bundle)| Task::Restore {
            bundle: bundle.dir().to_path_buf(),
            uri: uri.clone(),
            step: SAVED_STEP,
            out: tmp.path().join(name),
        })
        .collect();
    run_all(&restores);
    assert_same_state("restored under (fsdp 4)", &state, &read_state(&tmp.path().join("fsdp4")));
    assert_same_state("restored on one device", &state, &read_state(&tmp.path().join("single")));
    // Trained moments are in the state, so equality is not one of zeros.
    assert!(state.iter().any(|(n, b)| n.starts_with("opt/nu/") && b.iter().any(|&x| x != 0)));
}

fn job_yaml(bundle: &Path, root: &str, out: &Path) -> String {
    format!(
        r#"
name: resume
model: tiny
mesh: {{ ici: {{ fsdp: 2, tp: 2 }} }}
batch: {{ global: {GLOBAL}, micro: {MICRO} }}
seq_len: {SEQ_LEN}
steps: 8
seed: {SEED}
optimizer: {{ lr: 3.0e-3, warmup_steps: 2, schedule: cosine }}
data: {{ kind: arithmetic }}
bundle: {}
output: {}
checkpoint: {{ every: 2, uri: "{root}", keep: 2 }}
"#,
        bundle.display(),
        out.display()
    )
}

fn events(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn committed(runtime: &tokio::runtime::Runtime, root: &str) -> Vec<(u64, String)> {
    let storage = Storage::open(root, &Default::default()).unwrap();
    let log = StoreCommitLog::new(storage);
    let mut out: Vec<_> =
        runtime.block_on(log.list()).unwrap().into_iter().map(|c| (c.step, c.dir())).collect();
    out.sort();
    out
}

fn train_task(bundle: &bundle::Bundle, root: &Path, out: &Path, hold_at: Option<u64>) -> Task {
    let uri = format!("file://{}", root.display());
    Task::Train {
        bundle: bundle.dir().to_path_buf(),
        job: job_yaml(bundle.dir(), &uri, out),
        hold_at,
        out: out.to_path_buf(),
    }
}

#[test]
fn a_resumed_job_ends_bitwise_identical_even_past_a_corrupt_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = support::export_tiny(&tmp.path().join("b22"), "fsdp=2,tp=2", MICRO as u64, SEQ_LEN as u64);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (straight_root, resumed_root) = (tmp.path().join("straight"), tmp.path().join("resumed"));
    let resumed_uri = format!("file://{}", resumed_root.display());

    // The reference: 8 steps without interruption (saving checkpoints as the others do).
    run_all(&[train_task(&bundle, &straight_root, &tmp.path().join("u"), None)]);
    let reference = read_state(&tmp.path().join("u"));
    assert_eq!(std::fs::read_to_string(tmp.path().join("u/start_step")).unwrap(), "0");

    // The same job, stopped for good (SIGKILL) once the save after step 6 or later is uploading.
    let mut killed =
        spawn(&train_task(&bundle, &resumed_root, &tmp.path().join("k"), Some(6)), Stdio::piped());
    let stdout = killed.stdout.take().unwrap();
    let holding = BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l.contains(HOLDING));
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert!(holding, "the run reached its held save");
    let before = committed(&runtime, &resumed_uri);
    let held = events(&tmp.path().join("k")).last().unwrap().clone();
    let held_step = held["step"].as_u64().unwrap();
    let newest = before.last().expect("a checkpoint was committed before the kill").0;
    assert!(newest >= 2 && newest < held_step, "committed {before:?}, held at {held_step}");
    let orphans: Vec<_> = std::fs::read_dir(&resumed_root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(&format!("{held_step:012}-")))
        .collect();
    assert_eq!(orphans.len(), 1, "the held save left its directory");
    assert!(!resumed_root.join(&orphans[0]).join("COMMITTED").exists());

    // Rerun: resumes from the newest commit and ends with the reference's bits.
    run_all(&[train_task(&bundle, &resumed_root, &tmp.path().join("r"), None)]);
    let resumed_events = events(&tmp.path().join("r"));
    assert_eq!(resumed_events[0]["kind"], "restored");
    assert_eq!(resumed_events[0]["step"], newest);
    assert_eq!(std::fs::read_to_string(tmp.path().join("r/start_step")).unwrap(), newest.to_string());
    assert_same_state("resumed vs uninterrupted", &reference, &read_state(&tmp.path().join("r")));
    assert!(!resumed_root.join(&orphans[0]).exists(), "the killed run's uncommitted save was collected");
    // Retention keeps the rerun's last two commits (a save still uploading when the next is due
    // is skipped, so which steps those are depends on the machine's pace).
    let after = committed(&runtime, &resumed_uri);
    let commits: Vec<u64> = before
        .iter()
        .map(|c| c.0)
        .chain(
            resumed_events.iter().filter(|e| e["kind"] == "committed").map(|e| e["step"].as_u64().unwrap()),
        )
        .collect();
    assert_eq!(after.iter().map(|c| c.0).collect::<Vec<_>>(), commits[commits.len() - 2..], "keep: 2");
    assert_eq!((after.len(), after[1].0), (2, 8), "keep: 2 and the final step: {after:?}");
    // The final checkpoints of both runs hold the same bytes.
    let straight = committed(&runtime, &format!("file://{}", straight_root.display()));
    let final_object = |root: &Path, dir: &str| std::fs::read(root.join(dir).join("host-0.shards")).unwrap();
    let victim = resumed_root.join(&after[1].1).join("host-0.shards");
    let mut bytes = final_object(&resumed_root, &after[1].1);
    assert!(bytes == final_object(&straight_root, &straight.last().unwrap().1));

    // One flipped byte in the newest checkpoint: refused, named, and the one before is used.
    let offset = bytes.len() / 2 + 7;
    bytes[offset] ^= 0x01;
    std::fs::write(&victim, &bytes).unwrap();
    run_all(&[train_task(&bundle, &resumed_root, &tmp.path().join("c"), None)]);
    let fallback = &events(&tmp.path().join("c"))[0];
    assert_eq!((fallback["kind"].as_str(), fallback["step"].as_u64()), (Some("restored"), Some(after[0].0)));
    let passed = fallback["passed_over"].as_array().unwrap();
    assert_eq!(passed.len(), 1, "{passed:?}");
    let reason = passed[0][1].as_str().unwrap();
    let chunk = 1u64 << 20;
    let start = offset as u64 / chunk * chunk;
    let end = (start + chunk).min(bytes.len() as u64);
    assert!(reason.contains(&format!("{}/host-0.shards", after[1].1)), "{reason}");
    assert!(reason.contains(&format!("(bytes {start}..{end})")), "{reason}");
    assert_same_state("resumed past a corrupt checkpoint", &reference, &read_state(&tmp.path().join("c")));
}
