//! One checkpoint root, two jobs: a launch whose root's newest checkpoints are another job's is
//! refused; starting over trains beside them in a line of its own, and nothing committed before
//! is deleted or rewritten; the next launch resumes the newest line.

use crate::support;
use checkpoint::lineage::line_of;
use checkpoint::{CommitLog, Storage, StoreCommitLog};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use worker::ckpt::CheckpointEvent;
use worker::single::Resume;
use worker::{Sink, Slice, StepResult, Trainer, WorkerError};

/// The checkpoint events of a run.
#[derive(Default)]
struct Events(Vec<CheckpointEvent>);

impl Sink for Events {
    fn on_step(&mut self, _: &StepResult) {}

    fn on_checkpoint(&mut self, event: &CheckpointEvent) {
        self.0.push(event.clone());
    }
}

fn job(bundle: &Path, root: &Path, seed: u64, steps: u64) -> job::JobSpec {
    let yaml = format!(
        "name: lines\nmodel: tiny\nmesh: {{ ici: {{ fsdp: 1, tp: 1 }} }}\nbatch: {{ global: 4, micro: 4 }}\n\
         seq_len: 128\nsteps: {steps}\nseed: {seed}\ndata: {{ kind: arithmetic }}\nbundle: {}\n\
         checkpoint: {{ every: 2, keep: 2, uri: \"file://{}\" }}\n",
        bundle.display(),
        root.display()
    );
    job::JobSpec::from_yaml(&yaml, Path::new("lines.yaml")).unwrap()
}

/// SHA-256 of every object of every committed checkpoint, by directory and file.
fn committed_digests(root: &Path) -> BTreeMap<String, String> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let storage = Storage::open(&format!("file://{}", root.display()), &Default::default()).unwrap();
    let commits = runtime.block_on(StoreCommitLog::new(storage).list()).unwrap();
    let mut digests = BTreeMap::new();
    for commit in commits {
        for entry in std::fs::read_dir(root.join(commit.dir())).unwrap() {
            let path = entry.unwrap().path();
            let digest = hex::encode(Sha256::digest(std::fs::read(&path).unwrap()));
            digests
                .insert(format!("{}/{}", commit.dir(), path.file_name().unwrap().to_string_lossy()), digest);
        }
    }
    digests
}

/// The lines the committed checkpoints belong to, oldest first.
fn lines(digests: &BTreeMap<String, String>) -> Vec<String> {
    let lines: std::collections::BTreeSet<String> = digests
        .keys()
        .map(|key| {
            let dir = key.split('/').next().unwrap();
            line_of(dir.split_once('-').unwrap().1).to_string()
        })
        .collect();
    lines.into_iter().collect()
}

#[test]
fn another_jobs_root_is_refused_and_starting_over_keeps_every_earlier_checkpoint() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let bundle = support::export_tiny(&tmp.path().join("bundle"), "fsdp=1,tp=1", 4, 128);
    let root = tmp.path().join("ckpt");
    let slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    let mut trainer = Trainer::new(slice, &bundle).unwrap();

    let first = job(bundle.dir(), &root, 1, 4);
    worker::single::run(
        &mut trainer,
        &first,
        &mut Events::default(),
        &Resume::Newest,
        &worker::driver::Uninterrupted,
        runtime.handle(),
    )
    .unwrap();
    let before = committed_digests(&root);
    assert_eq!(lines(&before).len(), 1, "a fresh run begins one line: {before:?}");

    let other_seed = job(bundle.dir(), &root, 2, 4);
    let refused = worker::single::run(
        &mut trainer,
        &other_seed,
        &mut Events::default(),
        &Resume::Newest,
        &worker::driver::Uninterrupted,
        runtime.handle(),
    )
    .expect_err("another job's root is refused");
    let message = refused.to_string();
    assert!(matches!(refused, WorkerError::ForeignRoot(_)), "{message}");
    assert!(message.contains("--start-over") && message.contains("seed 1, this job's 2"), "{message}");
    assert_eq!(committed_digests(&root), before, "a refused launch writes nothing");

    let mut events = Events::default();
    worker::single::run(
        &mut trainer,
        &other_seed,
        &mut events,
        &Resume::StartOver,
        &worker::driver::Uninterrupted,
        runtime.handle(),
    )
    .unwrap();
    assert!(matches!(&events.0[0], CheckpointEvent::Fresh { .. }), "{:?}", events.0[0]);
    let after = committed_digests(&root);
    for (object, digest) in &before {
        assert_eq!(after.get(object), Some(digest), "{object} was deleted or rewritten");
    }
    let both = lines(&after);
    assert_eq!(both.len(), 2, "the start-over run saves in a line of its own: {after:?}");

    // The next launch resumes the newest line, and its retention stays in it.
    let longer = job(bundle.dir(), &root, 2, 8);
    let mut events = Events::default();
    worker::single::run(
        &mut trainer,
        &longer,
        &mut events,
        &Resume::Newest,
        &worker::driver::Uninterrupted,
        runtime.handle(),
    )
    .unwrap();
    let CheckpointEvent::Restored { restored, .. } = &events.0[0] else { panic!("{:?}", events.0[0]) };
    assert_eq!(restored.step, 4);
    assert!(restored.uri.contains(&both[1]), "resumed the newest line: {}", restored.uri);
    let last = committed_digests(&root);
    for (object, digest) in &before {
        assert_eq!(last.get(object), Some(digest), "{object} was deleted or rewritten");
    }
}
