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
//! - [`WorkerError`] (`error.rs`): why the worker stopped, as types, and what that means
//!   ([`fault::Fault`]).
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
mod error;
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
pub(crate) use error::PjrtContext;
pub use error::{Part, WorkerError};
pub use objective::{EvalReport, Objective};
pub use phases::Phases;
pub use slice::{Arg, DeviceArray, Program, Slice};
pub use step::{Reduce, StepResult, run_step};
pub use trainer::Trainer;
