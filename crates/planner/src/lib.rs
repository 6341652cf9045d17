//! `podctl plan`'s engine: how much memory each device needs for a training step, for every
//! mesh, micro-batch and rematerialization policy, and which of them to run.
//!
//! # Layout
//! - `workload`: what is planned ([`Workload`]: model, SFT or GRPO shapes, batch, dtypes) and
//!   what a plan chooses among ([`Candidate`]: a [`Layout`] of devices, a micro-batch, a
//!   [`Remat`] policy).
//! - `hardware`: [`Accelerator`] (a slice's devices: memory limit, speed, compile topology) and
//!   [`Target`] (slices joined by the data-centre network).
//! - `shapes`: parameter shapes and how many bytes a device's shard takes once laid out.
//! - `memory`: the analytic model, program by program, term by term ([`estimate`]).
//! - `time`: the step-time estimate ([`step_time`]).
//! - `search`: candidates, pruning, the choice and the memory-cliff search ([`plan`]), over an
//!   [`Oracle`] that measures candidates exactly.
//! - `report`: the tables `podctl plan` prints.
//! - `layout`: which device of which host holds which shard of each parameter
//!   ([`render_layout`], for `podctl launch --dry-run`).
//!
//! Exact mode (compiling each candidate through PJRT) is the `planner-exact` crate, so that the
//! crates which only plan analytically (the job spec, and through it the coordinator) do not
//! link PJRT.
//!
//! **Architecture Invariant:** pure: no I/O, no threads, no tokio, no PJRT; the same inputs
//! give the same plan, byte for byte. Exact numbers enter the search only through the
//! [`Oracle`] trait.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod hardware;
mod layout;
mod memory;
mod report;
pub(crate) mod search;
mod shapes;
mod time;
mod workload;

pub use hardware::{Accelerator, GIB, Platform, Target, V6E_HBM_LIMIT};
pub use layout::render_layout;
pub use memory::{MemoryEstimate, ProgramEstimate, Term, TermKind, block_size, estimate, peak_programs};
pub use report::{format_bytes, render_breakdown, render_levers, render_plan};
pub use search::{
    Cliff, CliffSide, Exact, Measured, Oracle, Plan, PlanOptions, Row, candidates, layouts, plan,
    plan_analytic,
};
pub use shapes::{ParamShape, laid_out_bytes, lora_bytes, lora_shapes, param_bytes, param_shapes};
pub use time::{StepTime, step_time};
pub use workload::{Attention, Candidate, Kind, Layout, LoraShape, Remat, Workload};

/// Why a plan cannot be made. Messages name the input at fault and what would work instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A field of the request does not work.
    #[error("plan input `{field}`: {reason}")]
    Invalid {
        /// The field, e.g. `global_batch`.
        field: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The accelerator name is not one podctl knows.
    #[error("unknown topology '{name}'; podctl plans for {}", known.join(", "))]
    UnknownTopology {
        /// The name given.
        name: String,
        /// The names that work.
        known: Vec<String>,
    },
    /// A requested mesh does not split the model's dimensions evenly.
    #[error("mesh {layout}: {reason}; meshes that divide the model: {}", fits.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", "))]
    MeshDoesNotDivide {
        /// The mesh asked for.
        layout: Layout,
        /// Which dimension it does not divide.
        reason: String,
        /// Layouts of the same devices that do divide it.
        fits: Vec<Layout>,
    },
    /// Nothing fits, not even the smallest candidate.
    #[error("{model} does not fit: {smallest}; {advice}")]
    DoesNotFit {
        /// The model preset.
        model: String,
        /// The smallest candidate tried, its bytes and the accelerator's limit.
        smallest: String,
        /// What would fit instead.
        advice: String,
    },
}

impl fault::Classify for PlanError {
    /// A plan's request is the input: every refusal names what to change.
    fn fault(&self) -> fault::Fault {
        fault::Fault::Input
    }
}
