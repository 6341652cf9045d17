//! The saves of a run: one schedule for every driver run, with or without a coordinator.
//!
//! A save is due after every `checkpoint.every` steps and after the last step. Starting one
//! copies this host's shards off the devices (the training stall) and uploads them in the
//! background; while an upload runs, a due save is skipped and said so (saves are never stacked,
//! and the host never holds two copies of the state). A finished upload goes to a [`Commit`]:
//! [`StoreCommit`] commits it through the store's own markers and applies retention (a run
//! without a coordinator); under a coordinator, the host's report goes to the leader, which
//! commits once every host's share is in. A failed upload is reported and the next due save
//! tries again; the final save must succeed, since the run's end is committed by it.

use super::lora::ensure_base;
use super::restore::Restored;
use super::save::{HostSave, PendingSave, SaveLayout, SavePoll, SaveStart, StateSaver};
use super::{PassedOver, dir_uri};
use crate::WorkerError;
use crate::trainer::Trainer;
use checkpoint::{Retention, SaveOptions, Storage, StoreCommitLog, finalize, gc};
use std::time::Duration;

/// What a run's checkpoints did, for its sink.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckpointEvent {
    /// The run starts from a checkpoint, after passing over newer ones that do not restore.
    Restored {
        /// What was restored.
        restored: Restored,
        /// Newer committed checkpoints refused, and why.
        passed_over: Vec<PassedOver>,
    },
    /// The run starts afresh, beginning `line` of checkpoints, after passing over the committed
    /// checkpoints that do not restore (all of them, when any).
    Fresh {
        /// The line the run's saves begin.
        line: String,
        /// Committed checkpoints refused, and why.
        passed_over: Vec<PassedOver>,
    },
    /// A save began: the state after `step` steps was copied off the devices in `copy_seconds`
    /// (the training stall) and uploads in the background.
    Started {
        /// Steps done.
        step: u64,
        /// Bytes to upload.
        bytes: u64,
        /// The device -> host copy.
        copy_seconds: f64,
    },
    /// A save was due after `step` steps while the one of `running_step` was still uploading:
    /// not taken.
    Skipped {
        /// The step whose save was due.
        step: u64,
        /// The step whose save is uploading.
        running_step: u64,
        /// Its bytes uploaded so far.
        bytes_written: u64,
        /// Its bytes in total.
        bytes_total: u64,
    },
    /// This host's share of the save of `step` is uploaded and reported to whoever commits it.
    Uploaded {
        /// Steps done.
        step: u64,
        /// Bytes this host stored.
        bytes: u64,
        /// The background upload.
        upload_seconds: f64,
    },
    /// A save is committed (and, without a coordinator, retention applied).
    Committed {
        /// Steps done.
        step: u64,
        /// The checkpoint's directory.
        uri: String,
        /// Bytes this host stored.
        bytes: u64,
        /// The background upload.
        upload_seconds: f64,
        /// Objects retention and orphan collection deleted.
        deleted_objects: usize,
    },
    /// The upload of the save of `step` failed; the next due save tries again.
    Failed {
        /// Steps done.
        step: u64,
        /// Why.
        reason: String,
    },
}

/// What becomes of a host's finished share of a save.
pub trait Commit {
    /// Commits `saved`, or hands it to whoever commits; `last` is the run's final save, whose
    /// outcome the run waits for.
    fn commit(&mut self, saved: HostSave, last: bool) -> Result<CheckpointEvent, WorkerError>;
}

/// Commits through the store's own `COMMITTED` markers, then applies retention: a run without
/// a coordinator, whose root belongs to it (uncommitted directories there are orphans of a
/// stopped run of this job and are collected at once, not after the crate's default grace).
pub struct StoreCommit {
    storage: Storage,
    log: StoreCommitLog,
    retention: Retention,
    runtime: tokio::runtime::Handle,
}

impl StoreCommit {
    /// Commits to `storage` with the job's retention (`keep` last, `keep_every`) within the
    /// run's `line` of checkpoints (another line's are never deleted).
    pub fn new(
        storage: Storage,
        spec: &job::CheckpointSpec,
        line: &str,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        Self {
            log: StoreCommitLog::new(storage.clone()),
            storage,
            retention: Retention {
                keep_last: spec.keep as usize,
                keep_every: spec.keep_every,
                min_orphan_age: Duration::ZERO,
                line: Some(line.to_string()),
            },
            runtime,
        }
    }
}

impl Commit for StoreCommit {
    /// Writes the manifest, records the commit (the marker), then applies retention; a failed
    /// collection leaves the commit standing and is only logged.
    fn commit(&mut self, saved: HostSave, _last: bool) -> Result<CheckpointEvent, WorkerError> {
        let reports = std::slice::from_ref(&saved.report);
        let commit = self.runtime.block_on(finalize(&self.storage, &saved.spec, reports, &self.log))?;
        let deleted_objects = match self.runtime.block_on(gc(&self.storage, &self.log, &self.retention, &[]))
        {
            Ok(report) => report.objects_deleted,
            Err(error) => {
                tracing::warn!(%error, "checkpoint retention failed (the commit stands)");
                0
            }
        };
        Ok(CheckpointEvent::Committed {
            step: commit.step,
            uri: dir_uri(&self.storage, &commit.dir()),
            bytes: saved.report.object.size,
            upload_seconds: saved.upload_seconds,
            deleted_objects,
        })
    }
}

/// A run's saves: when they are due, at most one uploading, and what becomes of each.
pub struct Checkpoints {
    storage: Storage,
    saver: StateSaver,
    runtime: tokio::runtime::Handle,
    every: u64,
    /// Names this run's saves; a directory of another run (or attempt) is never written.
    save_id: String,
    seed: u64,
    pending: Option<PendingSave>,
    /// The newest step this run's root holds a save of: the final save is not repeated.
    saved: Option<u64>,
    /// LoRA: whether the frozen base is known to be committed under the base root.
    base_saved: bool,
    commit: Box<dyn Commit + Send>,
}

impl Checkpoints {
    /// Saves of this host's share (`layout`) to `storage` every `every` steps, named `save_id`,
    /// uploads running on `runtime`, finished ones handed to `commit`.
    pub fn new(
        storage: Storage,
        layout: SaveLayout,
        every: u64,
        save_id: String,
        commit: Box<dyn Commit + Send>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, WorkerError> {
        let seed = layout.seed;
        let saver = StateSaver::new(storage.clone(), SaveOptions::default(), layout, runtime.clone())?;
        Ok(Self {
            storage,
            saver,
            runtime,
            every: every.max(1),
            save_id,
            seed,
            pending: None,
            saved: None,
            base_saved: false,
            commit,
        })
    }

    /// Records that the root already holds the state after `step` steps (the run resumed from
    /// it): the run's final save is not written again when the run ends there.
    pub fn mark_saved(&mut self, step: u64) {
        self.saved = Some(step);
    }

    /// Hands on a save whose upload has finished; does not wait.
    pub fn poll(&mut self) -> Result<Vec<CheckpointEvent>, WorkerError> {
        let Some(pending) = self.pending.take() else { return Ok(Vec::new()) };
        let step = pending.spec().step;
        match pending.poll() {
            SavePoll::Running(pending) => {
                self.pending = Some(pending);
                Ok(Vec::new())
            }
            SavePoll::Done(Ok(saved)) => Ok(vec![self.hand_on(saved, false)?]),
            SavePoll::Done(Err(e)) => Ok(vec![CheckpointEvent::Failed { step, reason: e.to_string() }]),
        }
    }

    /// After `step` of the run's `total` steps: hands on a finished upload and starts the save
    /// of `step` when it is due (the last step's is left to [`Checkpoints::finish`]).
    pub fn after_step(
        &mut self,
        trainer: &Trainer,
        step: u64,
        total: u64,
    ) -> Result<Vec<CheckpointEvent>, WorkerError> {
        let mut events = self.poll()?;
        if step.is_multiple_of(self.every) && step < total {
            events.push(self.start(trainer, step)?);
        }
        Ok(events)
    }

    /// At the end of the run, after `total` steps: waits for the upload in flight, then saves
    /// the final state and waits for it to be handed on, unless the root holds that step already.
    pub fn finish(&mut self, trainer: &Trainer, total: u64) -> Result<Vec<CheckpointEvent>, WorkerError> {
        let mut events = Vec::new();
        if let Some(pending) = self.pending.take() {
            let step = pending.spec().step;
            events.push(match pending.wait() {
                Ok(saved) => self.hand_on(saved, false)?,
                Err(e) => CheckpointEvent::Failed { step, reason: e.to_string() },
            });
        }
        if self.saved != Some(total) {
            self.ensure_base(trainer)?;
            let pending = self.saver.start(trainer, total, &self.save_id)?;
            events.push(started(total, &pending));
            events.push(self.hand_on(pending.wait()?, true)?);
        }
        Ok(events)
    }

    /// Starts the save of `step`, or says why it is skipped.
    fn start(&mut self, trainer: &Trainer, step: u64) -> Result<CheckpointEvent, WorkerError> {
        self.ensure_base(trainer)?;
        Ok(match self.saver.start_or_skip(trainer, step, &self.save_id)? {
            SaveStart::Started(pending) => {
                let event = started(step, &pending);
                self.pending = Some(*pending);
                event
            }
            SaveStart::Skipped { running_step, bytes_written, bytes_total } => {
                CheckpointEvent::Skipped { step, running_step, bytes_written, bytes_total }
            }
        })
    }

    fn hand_on(&mut self, saved: HostSave, last: bool) -> Result<CheckpointEvent, WorkerError> {
        let step = saved.spec.step;
        let event = self.commit.commit(saved, last)?;
        self.saved = Some(self.saved.map_or(step, |s| s.max(step)));
        Ok(event)
    }

    /// LoRA: saves the frozen base once, before the first checkpoint that names it.
    fn ensure_base(&mut self, trainer: &Trainer) -> Result<(), WorkerError> {
        if !self.base_saved && !trainer.frozen_specs().is_empty() {
            let base = self.runtime.block_on(ensure_base(trainer, &self.storage, self.seed))?;
            tracing::info!(%base, "the LoRA base is committed");
            self.base_saved = true;
        }
        Ok(())
    }
}

fn started(step: u64, pending: &PendingSave) -> CheckpointEvent {
    CheckpointEvent::Started { step, bytes: pending.bytes(), copy_seconds: pending.copy_seconds() }
}
