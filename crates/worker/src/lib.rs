//! The worker: one per host. It compiles a bundle's programs for the host's devices, keeps the
//! parameters and optimizer state resident on device, and trains.
//!
//! # Layout
//! - [`slice`]: a PJRT client over the slice's devices, programs compiled for them, and
//!   [`DeviceArray`]s, global arrays held as one buffer per device, moved to and from the host by
//!   their sharding.
//! - [`compile_cache`]: compiled programs on disk, loaded instead of compiled by a process that
//!   starts again (a replacement, a restart).
//! - [`trainer`]: the train state on device and its programs: gradient steps into a donated
//!   accumulator, apply.
//! - [`objective`]: what a step learns from; [`sft`] (the data's batches) and [`grpo`] (the
//!   policy's own rollouts, scored by verifiable rewards; [`grpo_stats`] its advantages and
//!   tallies).
//! - [`step`]: one global step of any objective over the data-parallel ranks this worker
//!   hosts: every rank's gradient, the reduction between workers, apply.
//! - [`phases`]: where a step's time went, by named phase, returned with every step.
//! - [`eval`]: held-out evaluation of either objective through the bundle's `rollout`.
//! - [`driver`]: the one training loop (steps, evaluation, reports, saves), whoever runs it.
//! - [`start`]: where a fresh run's state comes from, and an objective's frozen reference.
//! - [`ckpt`]: checkpoints of the train state: a host's share saved in the background, restore
//!   onto any mesh, the one save schedule.
//! - [`single`]: a job on one slice in this process, without a coordinator.
//! - [`agent`]: the worker process under a coordinator: session, assignments and resume,
//!   reports, decisions.
//! - [`peer`]: state transfer from a live peer to a replacement.
//! - [`metrics`]: the agent's Prometheus page.
//! - [`hf`]: a Hugging Face model's weights onto the devices, each device reading its regions.
//!
//! **Architecture Invariant:** the worker never interprets StableHLO; everything it knows about a
//! program comes from the bundle manifest. Buffers stay on device between steps; the host sees
//! only batches going in and metrics coming out (and, for syncs and saves, gradients and state).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod agent;
pub mod ckpt;
pub mod compile_cache;
pub mod driver;
pub mod eval;
pub mod grpo;
pub mod grpo_stats;
pub mod hf;
pub mod metrics;
pub mod objective;
pub mod peer;
pub mod phases;
pub mod sft;
pub mod single;
pub mod slice;
pub mod start;
pub mod step;
pub mod trainer;

pub use driver::{Control, Ended, Plan, Sink, Trained};
pub use objective::{EvalReport, Objective};
pub use phases::Phases;
pub use slice::{Arg, DeviceArray, Program, Slice};
pub use step::{Reduce, StepResult, run_step};
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
    /// The checkpoint root's newest checkpoints are another job's.
    #[error(transparent)]
    ForeignRoot(#[from] checkpoint::lineage::ForeignRoot),
    /// A state transfer with a peer failed.
    #[error(transparent)]
    Peer(#[from] peer::PeerError),
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
