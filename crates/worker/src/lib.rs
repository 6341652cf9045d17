//! The worker: one per host. It compiles a bundle's programs for the host's devices, keeps the
//! parameters and optimizer state resident on device, and runs the train step.
//!
//! - [`slice`]: a PJRT client over the slice's devices, programs compiled for them, and
//!   [`DeviceArray`]s, global arrays held as one buffer per device, moved to and from the host by
//!   their sharding.
//! - [`compile_cache`]: compiled programs on disk, loaded instead of compiled by a process that
//!   starts again (a replacement, a restart).
//! - [`trainer`]: the train state on device and the step: accumulate gradients over
//!   micro-batches, then apply.
//! - [`run`]: the loop over steps for a job on one slice, reporting each step to an observer.
//! - [`dp`]: one global step over the data-parallel ranks this worker hosts.
//! - [`grpo`]: GRPO's step (rollouts, rewards, group advantages, the clipped objective) over the
//!   same ranks and reduction, held-out evaluation, and its single-slice loop.
//! - [`agent`]: the worker process under a coordinator: session, assignments, step reports,
//!   quiesce and recovery.
//! - [`peer`]: state transfer from a live peer to a replacement.
//! - [`metrics`]: the agent's Prometheus page.
//! - [`hf`]: a Hugging Face model's weights onto the devices, each device reading its regions.
//! - [`ckpt`]: checkpoints of the train state: a slice's share saved in the background, restore
//!   onto any mesh, and the single-process loop's save schedule and resume.
//!
//! **Architecture Invariant:** the worker never interprets StableHLO; everything it knows about a
//! program comes from the bundle manifest. Buffers stay on device between steps; the host sees
//! only batches going in and metrics coming out (and, for syncs and saves, gradients and state).
#![deny(missing_docs)]

pub mod agent;
pub mod ckpt;
pub mod compile_cache;
pub mod dp;
pub mod grpo;
pub mod hf;
pub mod metrics;
pub mod peer;
pub mod run;
pub mod slice;
pub mod trainer;

pub use dp::{Reduce, StepOutcome, run_step};
pub use run::{Observer, RunSummary, StepMetrics, train};
pub use slice::{Arg, DeviceArray, Program, Slice};
pub use trainer::Trainer;

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
    /// A checkpoint could not be saved, committed or restored.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] checkpoint::CheckpointError),
    /// A Hugging Face model directory could not be read, or does not fit the bundle.
    #[error("Hugging Face model: {0}")]
    Hf(#[from] ::hf::HfError),
    /// The all-reduce between slices failed (a peer vanished, the generation changed, ...).
    #[error("all-reduce: {0}")]
    Collective(#[from] collective::Error),
    /// The plugin, the bundle and the job disagree.
    #[error("{0}")]
    Mismatch(String),
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
