//! Async saves, retention, removal and hostile manifests on the file:// backend.

use crate::common::*;
use checkpoint::layout::{COMMITTED, MANIFEST};
use checkpoint::manifest::{Limits, Manifest};
use checkpoint::{
    Checkpoint, CommitLog, CommitRecord, HostUpload, Retention, SaveOptions, Storage, StoreCommitLog,
    finalize, gc,
};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

fn open_dir() -> (tempfile::TempDir, Storage, StoreCommitLog) {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(dir.path().to_str().unwrap(), &Default::default()).unwrap();
    let log = StoreCommitLog::new(storage.clone());
    (dir, storage, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_upload_reports_progress_and_then_commits() {
    let (dir, _, log) = open_dir();
    // Throttled parts keep the save running long enough to watch it.
    let throttled = object_store::throttle::ThrottledStore::new(
        object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
        object_store::throttle::ThrottleConfig {
            wait_put_per_call: Duration::from_millis(200),
            ..Default::default()
        },
    );
    // Only the upload's writes go through the throttle (it cannot serve local file reads).
    let slow = Storage::from_store(std::sync::Arc::new(throttled), "", "throttled", None).unwrap();
    let storage = Storage::open(dir.path().to_str().unwrap(), &Default::default()).unwrap();
    let options = SaveOptions { chunk_size: 4096, part_size: 5 << 20, max_parts_in_flight: 1 };
    let topology = checkpoint::Topology::single_host(ici(&[("fsdp", 2)])).unwrap();
    let arrays = vec![checkpoint::ArraySpec::new(
        "w",
        vec![3 << 20, 2],
        mesh::DType::Float32,
        spec(&[&["fsdp"], &[]]),
    )];
    let first = save_spec(10, "s10", topology, arrays);
    let upload = HostUpload::new(&first, 0, host_buffers(&first, &fulls(&first), 0)).unwrap();
    let progress = upload.progress();
    assert_eq!((progress.bytes_total(), progress.is_finished()), (24 << 20, false));
    let task = tokio::spawn(async move { upload.run(&slow, &options).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!progress.is_finished(), "the throttled upload is still running");
    let report = task.await.unwrap().unwrap();
    assert!(progress.is_finished());
    assert_eq!(progress.bytes_written(), 24 << 20);
    let commit = finalize(&storage, &first, &[report], &log).await.unwrap();
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap();
    assert_eq!(checkpoint.verify().await.unwrap().bytes, 24 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_hand_over_fails_before_anything_uploads() {
    let (dir, _, _) = open_dir();
    let spec = save_spec(1, "x", hsdp(), state(1));
    let fulls = fulls(&spec);
    let mut buffers = host_buffers(&spec, &fulls, 0);
    buffers.retain(|b| b.array != "params/wq");
    let e = HostUpload::new(&spec, 0, buffers).err().unwrap().to_string();
    assert!(e.contains("array 'params/wq'") && e.contains("no buffer"), "{e}");
    let mut buffers = host_buffers(&spec, &fulls, 1);
    buffers[0].data.truncate(3);
    let e = HostUpload::new(&spec, 1, buffers).err().unwrap().to_string();
    assert!(e.contains("has 3 bytes"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_last_k_every_nth_and_collects_orphans() {
    let (dir, storage, log) = open_dir();
    let mut commits = Vec::new();
    for step in [100, 200, 300, 400, 500] {
        let spec = save_spec(step, &format!("s{step}"), hsdp(), state(1));
        commits.push(save_and_commit(&storage, &log, &spec, &small_chunks()).await.0);
    }
    // A failed save (host 0 only) and one still running, both newer than every commit.
    for (step, id) in [(600, "failed"), (700, "running")] {
        let spec = save_spec(step, id, hsdp(), state(1));
        let buffers = host_buffers(&spec, &fulls(&spec), 0);
        checkpoint::save_host(&storage, &spec, 0, buffers, &small_chunks()).await.unwrap();
    }
    let retention =
        Retention { keep_last: 2, keep_every: 200, min_orphan_age: Duration::ZERO, ..Default::default() };
    let report = gc(&storage, &log, &retention, &[(700, "running".to_string())]).await.unwrap();
    let kept: Vec<u64> = report.plan.keep.iter().map(|c| c.step).collect();
    assert_eq!(kept, vec![500, 400, 200]);
    assert_eq!(report.plan.orphans, vec!["000000000600-failed".to_string()]);
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["000000000200-s200", "000000000400-s400", "000000000500-s500", "000000000700-running"]);
    let mut listed: Vec<u64> = log.list().await.unwrap().iter().map(|c| c.step).collect();
    listed.sort();
    assert_eq!(listed, vec![200, 400, 500]);

    // Keeping nothing still keeps the newest.
    let none = Retention { keep_last: 0, min_orphan_age: Duration::ZERO, ..Default::default() };
    gc(&storage, &log, &none, &[(700, "running".to_string())]).await.unwrap();
    let listed: Vec<u64> = log.list().await.unwrap().iter().map(|c| c.step).collect();
    assert_eq!(listed, vec![500]);
    let checkpoint = Checkpoint::open(&storage, &commits[4], &Limits::default()).await.unwrap();
    checkpoint.verify().await.unwrap();

    // The CLI's remove takes a checkpoint out explicitly.
    let removed = checkpoint::remove(&storage, &log, 700, "running").await.unwrap();
    assert!(removed > 0);
    assert!(!dir.path().join("000000000700-running").exists());
}

/// A commit log apart from the markers, as the coordinator's Raft log is. Forgetting a commit
/// notes whether its directory was still there, and fails while `failing_forgets` lasts.
struct RaftLikeLog {
    root: std::path::PathBuf,
    commits: std::sync::Mutex<Vec<CommitRecord>>,
    forgotten_before_deleted: std::sync::Mutex<Vec<u64>>,
    failing_forgets: std::sync::atomic::AtomicUsize,
}

impl CommitLog for RaftLikeLog {
    async fn record(&self, commit: &CommitRecord) -> checkpoint::Result<()> {
        let mut commits = self.commits.lock().unwrap();
        if !commits.contains(commit) {
            commits.push(commit.clone());
        }
        Ok(())
    }

    async fn list(&self) -> checkpoint::Result<Vec<CommitRecord>> {
        Ok(self.commits.lock().unwrap().clone())
    }

    async fn remove(&self, commit: &CommitRecord) -> checkpoint::Result<()> {
        if self.root.join(commit.dir()).exists() {
            self.forgotten_before_deleted.lock().unwrap().push(commit.step);
        }
        let failing = &self.failing_forgets;
        if failing.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(checkpoint::CheckpointError::CommitLog {
                operation: "remove",
                source: "no leader".into(),
            });
        }
        self.commits.lock().unwrap().retain(|c| c != commit);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_checkpoint_leaves_the_log_last_so_a_failed_expiry_is_finished_later() {
    let (dir, storage, _) = open_dir();
    let log = RaftLikeLog {
        root: dir.path().to_path_buf(),
        commits: Default::default(),
        forgotten_before_deleted: Default::default(),
        failing_forgets: 1.into(),
    };
    for step in [100, 200, 300] {
        let spec = save_spec(step, &format!("s{step}"), hsdp(), state(1));
        save_and_commit(&storage, &log, &spec, &small_chunks()).await;
    }
    let retention = Retention { keep_last: 1, min_orphan_age: Duration::ZERO, ..Default::default() };
    // The log fails to forget the first expired commit: the run stops with its data deleted
    // and the commit still in the log.
    let e = gc(&storage, &log, &retention, &[]).await.unwrap_err();
    assert!(e.to_string().contains("no leader"), "{e}");
    let listed = |log: &RaftLikeLog| log.commits.lock().unwrap().iter().map(|c| c.step).collect::<Vec<_>>();
    assert_eq!(listed(&log), [100, 200, 300]);
    // The next run finishes it: nothing committed is left beyond `keep`, no directory either.
    gc(&storage, &log, &retention, &[]).await.unwrap();
    assert_eq!(listed(&log), [300]);
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["000000000300-s300"]);
    let early = log.forgotten_before_deleted.lock().unwrap().clone();
    assert!(early.is_empty(), "commits forgotten while their directory was still there: {early:?}");
}

/// A change made to a manifest's JSON.
type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

/// Commits a forged manifest for an existing checkpoint, with a matching commit record, so only
/// the manifest checks stand between it and a restore.
async fn forge(
    storage: &Storage,
    log: &StoreCommitLog,
    base: &CommitRecord,
    edit: impl FnOnce(&mut serde_json::Value),
) -> CommitRecord {
    let key = format!("{}/{MANIFEST}", base.dir());
    let store = storage.object_store();
    let bytes = store.get(&Path::from(key)).await.unwrap().bytes().await.unwrap();
    let mut value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    value["step"] = serde_json::json!(base.step + 1);
    value["save_id"] = serde_json::json!("forged");
    edit(&mut value);
    let forged = serde_json::to_vec(&value).unwrap();
    let dir = format!("{:012}-forged", base.step + 1);
    for name in ["host-0.shards", "host-1.shards"] {
        let from = Path::from(format!("{}/{name}", base.dir()));
        store.copy(&from, &Path::from(format!("{dir}/{name}"))).await.unwrap();
    }
    let record = CommitRecord {
        step: base.step + 1,
        save_id: "forged".into(),
        bundle: base.bundle.clone(),
        manifest_size: forged.len() as u64,
        manifest_crc32c: crc32c::crc32c(&forged),
    };
    store.put(&Path::from(format!("{dir}/{MANIFEST}")), forged.into()).await.unwrap();
    log.record(&record).await.unwrap();
    assert!(store.head(&Path::from(format!("{dir}/{COMMITTED}"))).await.is_ok());
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_manifests_are_refused_before_allocating() {
    let (_dir, storage, log) = open_dir();
    let spec = save_spec(10, "good", hsdp(), state(1));
    let (good, _) = save_and_commit(&storage, &log, &spec, &small_chunks()).await;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "exceeds the limit",
            Box::new(|m| {
                // A 1 TiB array.
                m["arrays"][1]["shape"] = serde_json::json!([1u64 << 28, 1024]);
            }),
        ),
        (
            "the store holds",
            Box::new(|m| {
                // Claims the object is longer than it is, with the chunk list to match.
                let size = m["objects"][0]["size"].as_u64().unwrap() + 4096;
                m["objects"][0]["size"] = serde_json::json!(size);
                let n = size.div_ceil(1024) as usize;
                m["objects"][0]["chunk_crc32c"] = serde_json::json!(vec![0u32; n]);
            }),
        ),
        (
            "runs past the end",
            Box::new(|m| {
                m["arrays"][0]["shards"][0]["offset"] = serde_json::json!(u64::MAX - 3);
            }),
        ),
        (
            "byte ranges overlap",
            Box::new(|m| {
                let shards = m["arrays"][0]["shards"].as_array_mut().unwrap();
                let (object, offset) = (shards[0]["object"].clone(), shards[0]["offset"].clone());
                let other = m["arrays"].as_array_mut().unwrap()[3]["shards"].as_array_mut().unwrap();
                other[0]["object"] = object;
                other[0]["offset"] = offset;
            }),
        ),
        (
            "not a plain file name",
            Box::new(|m| {
                m["objects"][0]["name"] = serde_json::json!("../../etc/passwd");
            }),
        ),
        (
            "not a plain file name",
            Box::new(|m| {
                m["objects"][0]["name"] = serde_json::json!("/abs/host-0.shards");
            }),
        ),
    ];
    for (expected, edit) in cases {
        let forged = forge(&storage, &log, &good, edit).await;
        let e = Checkpoint::open(&storage, &forged, &Limits::default()).await.unwrap_err().to_string();
        assert!(e.contains(expected), "expected '{expected}', got: {e}");
        checkpoint::remove(&storage, &log, forged.step, &forged.save_id).await.unwrap();
    }
    // A manifest swapped after commit no longer matches the commit's CRC.
    let mut tampered = good.clone();
    tampered.manifest_crc32c ^= 1;
    let e = Checkpoint::open(&storage, &tampered, &Limits::default()).await.unwrap_err().to_string();
    assert!(e.contains("differs from the committed"), "{e}");
    // And the genuine one still opens.
    let genuine = Checkpoint::open(&storage, &good, &Limits::default()).await.unwrap();
    let m: &Manifest = genuine.manifest();
    assert_eq!(m.step, 10);
}
