//! A job on one slice in this process, without a coordinator: what `podctl launch` runs for
//! `mesh.dcn = 1`, and what the resume tests run in their child processes. It decides where the state starts (the
//! newest checkpoint under the job's root that restores, a checkpoint named by `--resume`, or a
//! fresh start), commits its saves through the store's own markers, and runs the driver.

use crate::ckpt::{
    self, CheckpointEvent, Checkpoints, PassedOver, Restored, SaveLayout, StateSaver, StoreCommit,
    restore_newest,
};
use crate::driver::{self, Control, Ended, OnInterrupt, Plan, Sink, Trained, TrainerSteps};
use crate::error::{Part, WorkerError};
use crate::start;
use crate::trainer::Trainer;
use checkpoint::lineage::{line_of, new_line, save_id};
use checkpoint::{SaveOptions, Storage, StoreCommitLog, StoreOptions};
use job::JobSpec;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where the run's state comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Resume {
    /// The newest committed checkpoint of this job under its checkpoint root that restores (the
    /// root's newest line first); a fresh start when there is none (or the job saves no
    /// checkpoints). A root whose newest line is another job's is refused.
    #[default]
    Newest,
    /// A checkpoint directory (`<root>/<step:012>-<save_id>`), or a root whose newest committed
    /// checkpoint that restores is taken. Nothing restorable there is an error.
    From(String),
    /// A fresh start beside whatever the job's root holds: the run begins a new line of
    /// checkpoints there, and nothing already there is deleted or rewritten.
    StartOver,
}

/// The run at a glance: the driver's account, and where a fresh start took its parameters.
#[derive(Debug)]
pub struct RunSummary {
    /// What the driver did.
    pub trained: Trained,
    /// The checkpoint a fresh start took its parameters from (`grpo.init_from`).
    pub init_from: Option<String>,
}

/// Trains `job` on `trainer`'s slice, starting where `resume` says (else from `grpo.init_from`
/// or the job seed), saving as the job's `checkpoint` section asks, reporting to `sink`. When
/// `control` interrupts the run (Ctrl-C), it stops at the step boundary and saves the state of
/// the steps done (where the job has checkpoints): the summary's `trained.ended` says so.
/// Reads and uploads run on `handle`, the process's runtime; training stays on this thread.
pub fn run(
    trainer: &mut Trainer,
    job: &JobSpec,
    sink: &mut dyn Sink,
    resume: &Resume,
    control: &dyn Control,
    handle: &tokio::runtime::Handle,
) -> Result<RunSummary, WorkerError> {
    let root = match (&job.checkpoint, job.checkpoint_uri()) {
        (Some(spec), Some(uri)) => Some((spec, Storage::open(&uri, &StoreOptions::default())?)),
        _ => None,
    };
    let found = match (resume, &root) {
        (Resume::Newest, Some((_, storage))) => {
            let log = StoreCommitLog::new(storage.clone());
            handle.block_on(restore_newest(trainer, storage, &log, Some(&job.checkpoint_identity())))?
        }
        (Resume::From(uri), _) => restore_from(trainer, uri, handle)?,
        (Resume::Newest | Resume::StartOver, _) => (None, Vec::new()),
    };
    let (start, init_from, line) = match found {
        (Some(restored), passed_over) => {
            check_restored(&restored, job)?;
            let step = restored.step;
            // A run resumed from the job's own root continues the line it resumed.
            let line = match (resume, ckpt::split_uri(&restored.uri)) {
                (Resume::Newest, (_, Some((_, save_id)))) => line_of(&save_id).to_string(),
                _ => new_line(unix_millis()),
            };
            sink.on_checkpoint(&CheckpointEvent::Restored { restored, passed_over });
            (step, None, line)
        }
        (None, passed_over) => {
            let line = new_line(unix_millis());
            if root.is_some() {
                sink.on_checkpoint(&CheckpointEvent::Fresh { line: line.clone(), passed_over });
            }
            (0, start::fresh(trainer, job, handle)?, line)
        }
    };
    let mut checkpoints = match &root {
        Some((spec, storage)) => {
            let layout = SaveLayout::for_job(job, 1, 0);
            let commit = Box::new(StoreCommit::new(storage.clone(), spec, &line, handle.clone()));
            let save_id = save_id(&line, &format!("l{:x}", unix_millis()));
            let saver =
                StateSaver::new(storage.clone(), SaveOptions::default(), layout, save_id, handle.clone())?;
            let mut checkpoints = Checkpoints::new(spec.every, Box::new(saver), commit);
            // Resumed from the job's own root: that step needs no second save at the end.
            if matches!(resume, Resume::Newest) && start > 0 {
                checkpoints.mark_saved(start);
            }
            Some(checkpoints)
        }
        None => None,
    };

    let objective = start::objective(trainer, job, handle)?;
    let plan = Plan {
        steps: job.steps,
        optimizer: &job.optimizer,
        start,
        evaluate_first: true,
        // Stopped (Ctrl-C): the state of the steps done is saved, so a relaunch resumes there.
        on_interrupt: OnInterrupt::SaveAndLeave,
    };
    let mut steps = TrainerSteps {
        trainer,
        objective: &*objective,
        ranks: &[0],
        accum: job.micro_batches_per_step(),
        group: None,
    };
    let mut trained = driver::train(&mut steps, &plan, checkpoints.as_mut(), sink, control)?;
    match std::mem::replace(&mut trained.ended, Ended::Finished) {
        Ended::StepFailed { error, .. } => Err(error),
        ended => {
            trained.ended = ended;
            Ok(RunSummary { trained, init_from })
        }
    }
}

/// Restores what `--resume` names: a checkpoint directory, or the newest under a root that
/// restores (nothing there is an error).
fn restore_from(
    trainer: &mut Trainer,
    uri: &str,
    runtime: &tokio::runtime::Handle,
) -> Result<(Option<Restored>, Vec<PassedOver>), WorkerError> {
    let store = StoreOptions::default();
    let found = match ckpt::split_uri(uri) {
        (_, Some((step, _))) => (Some(runtime.block_on(ckpt::restore(trainer, uri, step, &store))?), vec![]),
        (root, None) => {
            let storage = Storage::open(root, &store)?;
            runtime.block_on(restore_newest(
                trainer,
                &storage,
                &StoreCommitLog::new(storage.clone()),
                None,
            ))?
        }
    };
    if found.0.is_none() {
        return Err(WorkerError::NothingRestores {
            uri: uri.to_string(),
            asked_by: "--resume",
            passed_over: found.1,
        });
    }
    Ok(found)
}

/// A restored checkpoint continues this job only with its data order and within its steps.
fn check_restored(restored: &Restored, job: &JobSpec) -> Result<(), WorkerError> {
    let position = restored.data_position;
    if position.seed != job.seed {
        return Err(WorkerError::incompatible(
            Part::Checkpoint,
            format!(
                "checkpoint {} continues the data order of seed {}, but the job's seed is {}; set `seed: {}` or start without it",
                restored.uri, position.seed, job.seed, position.seed
            ),
        ));
    }
    if restored.step > job.steps {
        return Err(WorkerError::incompatible(
            Part::Checkpoint,
            format!(
                "checkpoint {} is at step {}, past the job's {} steps; raise `steps` or start without it",
                restored.uri, restored.step, job.steps
            ),
        ));
    }
    Ok(())
}

/// Now, in Unix milliseconds: names lines and attempts (unique per process, so a rerun never
/// writes into a directory of an earlier attempt).
fn unix_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}
