//! A writer process crashed at every fail point of the save and commit path, against the file
//! store and against moto's S3 server (`cargo nextest run -p podctl-checkpoint --features
//! failpoints --test failpoints`; docs/CHECKPOINTS.md lists the points).
//!
//! Each test commits step 10 (the checkpoint an earlier launch left), then runs the save and
//! commit of step 20 in a child process (this binary again, running `writer_child`) with
//! `FAILPOINTS` set so that it panics at one point; the child turns that panic into an abort,
//! so the writer really dies, mid-save, of SIGABRT. Then it checks what the next launch sees:
//! - no torn checkpoint: every checkpoint the log lists as committed opens and verifies, and the
//!   crashed save is committed only when the crash came after its commit record;
//! - nothing committed is lost: every object of step 10 is unchanged, byte for byte;
//! - the newest committed checkpoint that verifies is the one expected, nothing is skipped, and
//!   it restores bit for bit onto another mesh;
//! - the root stays usable: a new save of step 20 under another id commits and verifies.
//!
//! Fail points are process-global: the tests run one at a time (nextest runs each in its own
//! process anyway), and only the children configure any.

// The workspace names this crate `checkpoint` everywhere else; so do its tests.
extern crate podctl_checkpoint as checkpoint;

// The integration binary's fixtures (states, buffers, moto); this binary uses a few of them.
#[allow(dead_code)]
#[path = "integration/common.rs"]
mod common;

use checkpoint::manifest::Limits;
use checkpoint::{
    ArraySpec, Checkpoint, CommitLog, CommitRecord, SaveOptions, SaveSpec, Storage, StoreCommitLog,
    StoreOptions, finalize, newest_verified, save_host,
};
use common::*;
use object_store::ObjectStoreExt;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use test_support::Moto;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The store URL the child writes to.
const CHILD_URL: &str = "PODCTL_FP_CHILD_URL";
/// The S3 endpoint, for an `s3://` URL.
const CHILD_S3: &str = "PODCTL_FP_CHILD_S3_ENDPOINT";
/// `big` (multipart objects) or `small` (one put per object).
const CHILD_SIZE: &str = "PODCTL_FP_CHILD_SIZE";
/// SIGABRT: what `std::process::abort` dies of.
const SIGABRT: i32 = 6;

/// The step the crashed writer saves, and its save id.
const CRASHED: (u64, &str) = (20, "g2");

#[derive(Clone, Copy, PartialEq)]
enum Size {
    /// About 6.5 MiB per host: two parts each (5 MiB, the smallest S3 allows, and the rest).
    Big,
    /// A few KiB per host: one put each (S3); the file store writes it as one part.
    Small,
}

fn arrays(size: Size) -> Vec<ArraySpec> {
    let mut arrays = state(2);
    if size == Size::Big {
        arrays.push(ArraySpec::new(
            "params/big",
            vec![3072, 1024],
            mesh::DType::Float32,
            spec(&[&["fsdp"], &["tp"]]),
        ));
    }
    arrays
}

fn save_options() -> SaveOptions {
    SaveOptions { chunk_size: 64 << 10, part_size: 5 << 20, max_parts_in_flight: 2 }
}

/// Distinct bytes per step, so a restore of the wrong step never matches by accident.
fn fulls_at(spec: &SaveSpec) -> Vec<Vec<u8>> {
    spec.arrays.iter().enumerate().map(|(i, a)| full_array(i + 1000 * spec.step as usize, a)).collect()
}

/// Saves every host's share of `spec` and commits it.
async fn save_and_commit_at(storage: &Storage, log: &impl CommitLog, spec: &SaveSpec) -> CommitRecord {
    let fulls = fulls_at(spec);
    let mut reports = Vec::new();
    for host in 0..spec.topology.num_hosts() {
        let buffers = host_buffers(spec, &fulls, host);
        reports.push(save_host(storage, spec, host, buffers, &save_options()).await.unwrap());
    }
    finalize(storage, spec, &reports, log).await.unwrap()
}

#[test]
#[ignore = "the writer process the fail-point tests crash"]
fn writer_child() {
    let url = std::env::var(CHILD_URL).expect("only run as the child of a fail-point test");
    // A panic at a fail point is the crash: abort, as a process with panic = "abort" would,
    // instead of unwinding into the runtime, which would turn it into an error.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let scenario = fault::fail::FailScenario::setup();
    let options = std::env::var(CHILD_S3).map_or_else(|_| StoreOptions::default(), |e| s3_options(&e));
    let size = if std::env::var(CHILD_SIZE).as_deref() == Ok("small") { Size::Small } else { Size::Big };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let storage = Storage::open(&url, &options).unwrap();
        let spec = save_spec(CRASHED.0, CRASHED.1, hsdp(), arrays(size));
        save_and_commit_at(&storage, &StoreCommitLog::new(storage.clone()), &spec).await;
    });
    scenario.teardown();
}

/// Where the test's checkpoints live, and the emulator behind them if any.
enum Backend {
    File(tempfile::TempDir),
    S3(Moto),
}

impl Backend {
    fn file() -> Self {
        Backend::File(tempfile::tempdir().unwrap())
    }

    fn s3() -> Self {
        Backend::S3(Moto::with_bucket("ckpt"))
    }

    fn url(&self) -> String {
        match self {
            Backend::File(dir) => format!("file://{}", dir.path().join("ckpt").display()),
            Backend::S3(_) => "s3://ckpt/runs/exp1".into(),
        }
    }

    fn options(&self) -> StoreOptions {
        match self {
            Backend::File(_) => StoreOptions::default(),
            Backend::S3(server) => s3_options(&server.endpoint()),
        }
    }

    /// Runs `writer_child` with `FAILPOINTS=<failpoints>` and returns once it died.
    fn crash_writer(&self, failpoints: &str, size: Size) {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["writer_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_URL, self.url())
            .env(CHILD_SIZE, if size == Size::Small { "small" } else { "big" })
            .env("FAILPOINTS", failpoints)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Backend::S3(server) = self {
            command.env(CHILD_S3, server.endpoint());
        }
        let mut child = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(180);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the writer with FAILPOINTS={failpoints} neither crashed nor ended within 180 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(
            status.signal(),
            Some(SIGABRT),
            "the writer with FAILPOINTS={failpoints} must die at the fail point, not {status}: {stderr}"
        );
        assert!(stderr.contains("failpoint") && stderr.contains("panic"), "{stderr}");
    }
}

/// Every object in the directory of the committed checkpoint `commit`, by key.
async fn objects_of(storage: &Storage, commit: &CommitRecord) -> BTreeMap<String, Vec<u8>> {
    let stored = checkpoint::gc::scan(storage).await.unwrap();
    let save = stored.iter().find(|s| s.dir == commit.dir()).expect("the committed directory is stored");
    let mut objects = BTreeMap::new();
    for key in &save.objects {
        let bytes = storage.object_store().get(key).await.unwrap().bytes().await.unwrap();
        objects.insert(key.to_string(), bytes.to_vec());
    }
    assert!(objects.len() >= 4, "two host objects, the manifest and the marker: {:?}", objects.keys());
    objects
}

/// Commits step 10, crashes a writer of step 20 at `failpoints`, and checks what the next launch
/// finds. `commits` says whether the crash came after the commit record (the crashed save is then
/// committed and must be whole).
async fn crash_at(backend: Backend, failpoints: &str, size: Size, commits: bool) {
    let _serial = SERIAL.lock().await;
    let storage = Storage::open(&backend.url(), &backend.options()).unwrap();
    let log = StoreCommitLog::new(storage.clone());
    let earlier_spec = save_spec(10, "g1", hsdp(), arrays(size));
    let earlier = save_and_commit_at(&storage, &log, &earlier_spec).await;
    let earlier_objects = objects_of(&storage, &earlier).await;
    let opened = Checkpoint::open(&storage, &earlier, &Limits::default()).await.unwrap();
    let sizes: Vec<u64> = opened.manifest().objects.iter().map(|o| o.size).collect();
    let parted = sizes.iter().all(|&s| s > save_options().part_size);
    assert_eq!(parted, size == Size::Big, "every host object in parts, or none: {sizes:?}");

    backend.crash_writer(failpoints, size);

    // No torn checkpoint is visible: every committed one opens and verifies.
    let crashed_dir = checkpoint::layout::dir_name(CRASHED.0, CRASHED.1);
    let committed = log.list().await.unwrap();
    for commit in &committed {
        let checkpoint = Checkpoint::open(&storage, commit, &Limits::default()).await.unwrap();
        checkpoint.verify().await.unwrap();
    }
    let mut committed_dirs: Vec<String> = committed.iter().map(CommitRecord::dir).collect();
    committed_dirs.sort();
    let want: Vec<String> =
        if commits { vec![earlier.dir(), crashed_dir.clone()] } else { vec![earlier.dir()] };
    assert_eq!(committed_dirs, want, "FAILPOINTS={failpoints}");
    let listed = checkpoint::list(&storage, &log).await.unwrap();
    assert!(
        listed.iter().all(|l| l.committed == want.contains(&l.dir)),
        "the listing marks exactly those committed: {listed:?}"
    );

    // Nothing committed is lost.
    assert_eq!(objects_of(&storage, &earlier).await, earlier_objects, "step 10 changed");

    // What the next launch does: the newest committed checkpoint that verifies, restored.
    let (newest, skipped) = newest_verified(&storage, &log, &Limits::default()).await.unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let newest = newest.expect("a committed checkpoint");
    let expected_spec =
        if commits { save_spec(CRASHED.0, CRASHED.1, hsdp(), arrays(size)) } else { earlier_spec };
    assert_eq!(newest.commit().dir(), expected_spec.dir());
    let fsdp4 = ici(&[("fsdp", 4)]);
    let shardings: Vec<mesh::Sharding> = expected_spec
        .arrays
        .iter()
        .map(|a| {
            let mut dims = vec![vec![]; a.shape.len()];
            if let Some(first) = dims.first_mut() {
                *first = vec!["fsdp".to_string()];
            }
            mesh::Sharding::new(dims)
        })
        .collect();
    assert_restores(&newest, &expected_spec, &fulls_at(&expected_spec), &fsdp4, &shardings).await;

    // The root stays usable: the next launch's own save of step 20 commits beside what is there.
    let next = save_and_commit_at(&storage, &log, &save_spec(CRASHED.0, "g3", hsdp(), arrays(size))).await;
    let (newest, _) = newest_verified(&storage, &log, &Limits::default()).await.unwrap();
    assert_eq!(newest.unwrap().commit(), &next);
    assert_eq!(objects_of(&storage, &earlier).await, earlier_objects, "step 10 changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_crash_mid_host_object() {
    // The second part of host 0's stream: one part written into the staging file.
    crash_at(Backend::file(), "checkpoint::host_part=1*off->panic", Size::Big, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_crash_before_a_host_object_is_complete() {
    // Host 0's object is in place, host 1's staging file is written but not renamed.
    crash_at(Backend::file(), "checkpoint::host_complete=1*off->panic", Size::Big, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_crash_before_the_manifest() {
    crash_at(Backend::file(), "checkpoint::manifest_put=panic", Size::Big, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_crash_before_the_commit_record() {
    crash_at(Backend::file(), "checkpoint::commit_record=panic", Size::Big, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_crash_after_the_commit_record() {
    crash_at(Backend::file(), "checkpoint::commit_marker=panic", Size::Big, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_crash_between_host_puts() {
    // Host 0's object is stored by one put; host 1's put never happens.
    crash_at(Backend::s3(), "checkpoint::host_put=1*off->panic", Size::Small, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_crash_mid_multipart_upload() {
    crash_at(Backend::s3(), "checkpoint::host_part=1*off->panic", Size::Big, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_crash_before_a_multipart_completion() {
    crash_at(Backend::s3(), "checkpoint::host_complete=1*off->panic", Size::Big, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_crash_before_the_manifest() {
    crash_at(Backend::s3(), "checkpoint::manifest_put=panic", Size::Big, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_crash_before_the_commit_record() {
    crash_at(Backend::s3(), "checkpoint::commit_record=panic", Size::Big, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_crash_after_the_commit_record() {
    crash_at(Backend::s3(), "checkpoint::commit_marker=panic", Size::Big, true).await;
}
