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

use super::restore::Restored;
use super::save::{HostSave, PendingSave, Saver};
use super::{PassedOver, dir_uri};
use crate::error::WorkerError;
use crate::trainer::Trainer;
use checkpoint::{Retention, Storage, StoreCommitLog, finalize, gc};
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
                own_saves: None,
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
        let (commit, collected) = self.runtime.block_on(async {
            let commit = finalize(&self.storage, &saved.spec, reports, &self.log).await?;
            Ok::<_, WorkerError>((commit, gc(&self.storage, &self.log, &self.retention, &[]).await))
        })?;
        let deleted_objects = match collected {
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

/// The final save commits the run's end, and a store's throttling or errors can outlast one
/// upload's own retries (a soak once lost a run's final checkpoint to 0.85 s of them): it is
/// tried this many times, waiting [`FINAL_SAVE_BACKOFF`] times the attempts so far in between.
const FINAL_SAVE_ATTEMPTS: u32 = 5;
/// See [`FINAL_SAVE_ATTEMPTS`]: 20 s of waiting in all, within the leader's wait for it.
const FINAL_SAVE_BACKOFF: Duration = Duration::from_secs(2);

/// A run's saves: when they are due, the one uploading (the only place that knows a save is
/// in flight), and what becomes of each. `S` is the state saved: a [`Trainer`]'s on a worker.
pub struct Checkpoints<S: ?Sized = Trainer> {
    saver: Box<dyn Saver<S>>,
    commit: Box<dyn Commit>,
    every: u64,
    pending: Option<PendingSave>,
    /// The newest step this run's root holds a save of: the final save is not repeated.
    saved: Option<u64>,
    final_backoff: Duration,
}

impl<S: ?Sized> Checkpoints<S> {
    /// Saves through `saver` every `every` steps, finished ones handed to `commit`.
    pub fn new(every: u64, saver: Box<dyn Saver<S>>, commit: Box<dyn Commit>) -> Self {
        Self {
            saver,
            commit,
            every: every.max(1),
            pending: None,
            saved: None,
            final_backoff: FINAL_SAVE_BACKOFF,
        }
    }

    /// The same with no wait between the final save's attempts (the driver's tests).
    #[cfg(test)]
    pub(crate) fn without_final_backoff(mut self) -> Self {
        self.final_backoff = Duration::ZERO;
        self
    }

    /// Records that the root already holds the state after `step` steps (the run resumed from
    /// it): the run's final save is not written again when the run ends there.
    pub fn mark_saved(&mut self, step: u64) {
        self.saved = Some(step);
    }

    /// Hands on a save whose upload has finished; does not wait.
    pub fn poll(&mut self) -> Result<Vec<CheckpointEvent>, WorkerError> {
        let Some(pending) = self.pending.as_mut() else { return Ok(Vec::new()) };
        let step = pending.step();
        match pending.try_outcome() {
            None => Ok(Vec::new()),
            Some(outcome) => {
                self.pending = None;
                Ok(vec![self.hand_on(step, outcome, false)?])
            }
        }
    }

    /// After `step` of the run's `total` steps: hands on a finished upload and starts the save
    /// of `step` when it is due (the last step's is left to [`Checkpoints::finish`]). A save due
    /// while another uploads is skipped and said so: saves are never stacked, and the host never
    /// holds two copies of the state.
    pub fn after_step(
        &mut self,
        state: &S,
        step: u64,
        total: u64,
    ) -> Result<Vec<CheckpointEvent>, WorkerError> {
        let mut events = self.poll()?;
        if step.is_multiple_of(self.every) && step < total {
            events.push(match &self.pending {
                Some(running) => CheckpointEvent::Skipped {
                    step,
                    running_step: running.step(),
                    bytes_written: running.progress().bytes_written(),
                    bytes_total: running.progress().bytes_total(),
                },
                None => {
                    let pending = self.saver.start(state, step)?;
                    let event = started(&pending);
                    self.pending = Some(pending);
                    event
                }
            });
        }
        Ok(events)
    }

    /// At the end of the run, after `step` steps: waits for the upload in flight, then saves the
    /// state and waits for it to be handed on, unless the root holds that step already. The
    /// final save must succeed: the run's end is committed by it, so a failed upload is tried
    /// again ([`FINAL_SAVE_ATTEMPTS`]).
    pub fn finish(&mut self, state: &S, step: u64) -> Result<Vec<CheckpointEvent>, WorkerError> {
        let mut events = Vec::new();
        if let Some(pending) = self.pending.take() {
            let running = pending.step();
            events.push(self.hand_on(running, pending.wait(), false)?);
        }
        let mut attempt = 1;
        while self.saved != Some(step) {
            let pending = self.saver.start(state, step)?;
            events.push(started(&pending));
            match pending.wait() {
                Ok(saved) => events.push(self.hand_on(step, Ok(saved), true)?),
                Err(e) if attempt < FINAL_SAVE_ATTEMPTS => {
                    let reason =
                        format!("{e}; the final save is tried again ({attempt} of {FINAL_SAVE_ATTEMPTS})");
                    events.push(CheckpointEvent::Failed { step, reason });
                    std::thread::sleep(self.final_backoff * attempt);
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(events)
    }

    /// Commits a finished upload (or reports that it failed: the next due save tries again).
    fn hand_on(
        &mut self,
        step: u64,
        outcome: Result<HostSave, WorkerError>,
        last: bool,
    ) -> Result<CheckpointEvent, WorkerError> {
        let saved = match outcome {
            Ok(saved) => saved,
            Err(e) => return Ok(CheckpointEvent::Failed { step, reason: e.to_string() }),
        };
        let event = self.commit.commit(saved, last)?;
        self.saved = Some(self.saved.map_or(step, |s| s.max(step)));
        Ok(event)
    }
}

fn started(pending: &PendingSave) -> CheckpointEvent {
    CheckpointEvent::Started {
        step: pending.step(),
        bytes: pending.progress().bytes_total(),
        copy_seconds: pending.copy_seconds(),
    }
}
