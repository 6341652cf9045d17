//! Why the worker stopped, as types: what failed, which of the run's inputs must change when one
//! must, which checkpoint when one cannot be restored, and what that means for whoever decides
//! what follows ([`Fault`]).
//!
//! Every error the worker's modules return is a [`WorkerError`]; nothing below the agent turns
//! one into text, and nothing decides on its text.

use fault::{Classify, Fault};
use std::panic::Location;

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A PJRT call failed.
    #[error("{context}: {source}")]
    Pjrt {
        /// What the worker was doing.
        context: String,
        /// The plugin's error.
        source: pjrt::Error,
    },
    /// The bundle is unusable.
    #[error(transparent)]
    Bundle(#[from] bundle::BundleError),
    /// The data could not be produced.
    #[error(transparent)]
    Data(#[from] data::DataError),
    /// A reward function failed (it raised, returned what is not a reward, took too long, or
    /// its Python process died).
    #[error(transparent)]
    Reward(#[from] rewards::RewardError),
    /// A checkpoint could not be saved, committed or read.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] checkpoint::CheckpointError),
    /// The checkpoint at `uri` could not be restored.
    #[error("restoring checkpoint {uri}: {source}")]
    Restore {
        /// The checkpoint's directory.
        uri: String,
        /// Why.
        source: Box<WorkerError>,
    },
    /// A Hugging Face model directory could not be read, or does not fit the bundle.
    #[error("Hugging Face model: {0}")]
    Hf(#[from] ::hf::HfError),
    /// The all-reduce between slices failed (a peer vanished, the generation changed, ...).
    #[error("all-reduce: {0}")]
    Collective(#[from] collective::Error),
    /// The checkpoint root's newest checkpoints are another job's.
    #[error(transparent)]
    ForeignRoot(#[from] checkpoint::lineage::ForeignRoot),
    /// The run's inputs do not fit each other: `part` is the one to change (the message says
    /// how).
    #[error("{reason}")]
    Incompatible {
        /// The input to change.
        part: Part,
        /// What does not fit, and the fix.
        reason: String,
    },
    /// Told to start from `uri` (by `asked_by`), where no committed checkpoint restores.
    #[error("{asked_by} {uri}: no committed checkpoint restores there{}", reasons(passed_over))]
    NothingRestores {
        /// The checkpoint root or directory.
        uri: String,
        /// What named it: `--resume` or `grpo.init_from`.
        asked_by: &'static str,
        /// The committed checkpoints there that do not restore, and why.
        passed_over: Vec<PassedOver>,
    },
    /// 0-based step `step` had nothing to learn from.
    #[error("step {} has no {what} to learn from; {fix}", step + 1)]
    NothingToLearn {
        /// The step.
        step: u64,
        /// What it lacked: `target tokens`, `completion tokens`.
        what: &'static str,
        /// What to change.
        fix: &'static str,
    },
    /// Told to stop before the job's last step.
    #[error("the run was interrupted before the job's last step")]
    Interrupted,
    /// The operating system refused something a run needs.
    #[error("{what}: {source}")]
    Io {
        /// What the worker was doing.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// An invariant of the worker's own broke: a bug, reported with where it was caught.
    #[error("{detail} (an invariant of podctl's worker broke at {at}; please report it)")]
    Broken {
        /// What was found.
        detail: String,
        /// Where.
        at: &'static Location<'static>,
    },
}

/// The input of a run that does not fit the others, and so must change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The PJRT plugin (its platform, its devices).
    Plugin,
    /// The exported bundle (its kind, its shapes, its programs).
    Bundle,
    /// The job spec.
    Job,
    /// A checkpoint to restore (its model, its data order, its step).
    Checkpoint,
    /// A Hugging Face model directory.
    Model,
}

impl WorkerError {
    /// `part` must change: `reason` says what does not fit and how.
    pub fn incompatible(part: Part, reason: impl Into<String>) -> Self {
        Self::Incompatible { part, reason: reason.into() }
    }

    /// A broken invariant of the worker's own, caught at the caller.
    #[track_caller]
    pub fn broken(detail: impl Into<String>) -> Self {
        Self::Broken { detail: detail.into(), at: Location::caller() }
    }

    /// Wraps a failure to restore the checkpoint at `uri`.
    pub fn restore(uri: impl Into<String>) -> impl FnOnce(WorkerError) -> WorkerError {
        let uri = uri.into();
        move |source| match source {
            // Already named (a LoRA base under the checkpoint, say): the innermost is the culprit.
            restore @ WorkerError::Restore { .. } => restore,
            source => WorkerError::Restore { uri, source: Box::new(source) },
        }
    }

    /// The checkpoint whose own bytes are bad (a chunk whose CRC does not match, a manifest
    /// that does not check out), when that is why a restore failed: an older one may do, and the
    /// coordinator passes over this one. `None` for a failure of this worker, its devices or its
    /// bundle.
    pub fn corrupt_checkpoint(&self) -> Option<&str> {
        use checkpoint::CheckpointError::{BadManifest, Corrupt};
        match self {
            WorkerError::Restore { uri, source } => match &**source {
                WorkerError::Checkpoint(Corrupt { .. } | BadManifest { .. }) => Some(uri),
                _ => None,
            },
            _ => None,
        }
    }
}

impl Classify for WorkerError {
    fn fault(&self) -> Fault {
        match self {
            WorkerError::Pjrt { source, .. } => source.fault(),
            WorkerError::Bundle(e) => e.fault(),
            WorkerError::Data(e) => e.fault(),
            WorkerError::Reward(e) => e.fault(),
            WorkerError::Checkpoint(e) => e.fault(),
            WorkerError::Restore { source, .. } => source.fault(),
            WorkerError::Hf(e) => e.fault(),
            WorkerError::Collective(e) => e.fault(),
            WorkerError::ForeignRoot(_) => Fault::Input,
            WorkerError::Incompatible { .. } => Fault::Input,
            WorkerError::NothingRestores { .. } => Fault::Input,
            WorkerError::NothingToLearn { .. } => Fault::Input,
            WorkerError::Interrupted => Fault::Interrupted,
            WorkerError::Io { .. } | WorkerError::Broken { .. } => Fault::Failed,
        }
    }
}

/// Attaches what the worker was doing to a PJRT error.
pub(crate) trait PjrtContext<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, WorkerError>;
}

impl<T> PjrtContext<T> for Result<T, pjrt::Error> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, WorkerError> {
        self.map_err(|source| WorkerError::Pjrt { context: context(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corrupt() -> checkpoint::CheckpointError {
        checkpoint::CheckpointError::Corrupt {
            key: "c/000000000010-s/host-0.shards".into(),
            chunk: 1,
            bytes: 8..16,
            expected: 1,
            actual: 2,
        }
    }

    #[test]
    fn only_a_restore_of_bad_bytes_names_its_checkpoint() {
        let uri = "file:///c/000000000010-s";
        let bad = WorkerError::restore(uri)(corrupt().into());
        assert_eq!(bad.corrupt_checkpoint(), Some(uri));
        assert_eq!(bad.fault(), Fault::Failed);
        let unfit = WorkerError::restore(uri)(WorkerError::incompatible(Part::Checkpoint, "another model"));
        assert_eq!(unfit.corrupt_checkpoint(), None, "the checkpoint is sound, the bundle differs");
        assert_eq!(unfit.fault(), Fault::Input);
        assert_eq!(WorkerError::Checkpoint(corrupt()).corrupt_checkpoint(), None, "not a restore");
        let nested = WorkerError::restore("outer")(WorkerError::restore(uri)(corrupt().into()));
        assert_eq!(nested.corrupt_checkpoint(), Some(uri), "the innermost checkpoint is the culprit");
    }

    #[test]
    fn faults_say_whose_a_failure_is() {
        assert_eq!(WorkerError::Interrupted.fault(), Fault::Interrupted);
        assert_eq!(WorkerError::incompatible(Part::Plugin, "cpu plugin, tpu bundle").fault(), Fault::Input);
        let empty = WorkerError::NothingToLearn { step: 4, what: "target tokens", fix: "check the data" };
        assert_eq!(empty.to_string(), "step 5 has no target tokens to learn from; check the data");
        assert_eq!(empty.fault(), Fault::Input);
        let broken = WorkerError::broken("3 sums, not 4");
        assert_eq!(broken.fault(), Fault::Failed);
        assert!(broken.to_string().contains("crates/worker/src/error.rs"), "{broken}");
        let lost = collective::Error::PeerLost {
            rank: 1,
            member: 1,
            addr: "127.0.0.1:9".parse().unwrap(),
            detail: "reset".into(),
        };
        assert_eq!(WorkerError::from(lost).fault(), Fault::Unreachable);
        assert_eq!(WorkerError::from(collective::Error::Aborted).fault(), Fault::Interrupted);
    }
}

/// A committed checkpoint that a restore passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedOver {
    /// The checkpoint's directory.
    pub uri: String,
    /// The error that refused it, e.g. a chunk whose CRC does not match, naming the object and
    /// its byte range.
    pub reason: String,
}

/// ` (uri: reason; ...)` for the checkpoints a restore passed over, or nothing.
pub(crate) fn reasons(passed_over: &[PassedOver]) -> String {
    if passed_over.is_empty() {
        return String::new();
    }
    let reasons: Vec<String> = passed_over.iter().map(|p| format!("{}: {}", p.uri, p.reason)).collect();
    format!(" ({})", reasons.join("; "))
}
