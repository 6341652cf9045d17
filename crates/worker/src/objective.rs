//! What a step learns from.
//!
//! An [`Objective`] turns one logical rank's share of a step into a gradient in the trainer's
//! accumulator plus a few metric sums, and the sums reduced over every rank into the gradient's
//! scale and the step's metrics. [`Sft`] learns from the data's batches, [`Grpo`] from the
//! policy's own rollouts. Everything else a step does (the reduction between slices, apply,
//! reports, checkpoints, evaluation's schedule) is the driver's and the same for both: a new
//! objective is one new file that implements this trait.

use crate::error::WorkerError;
use crate::phases::Phases;
use crate::trainer::Trainer;
use std::collections::BTreeMap;

/// A way of learning, step by step.
pub trait Objective {
    /// How many metric sums each rank adds up; they are all-reduced with the gradients, so every
    /// worker learns the step's global sums without another round trip. 0: none.
    fn sums_len(&self) -> usize {
        0
    }

    /// Adds one logical rank's gradient of a step to the trainer's accumulator.
    fn rank_gradient(&self, trainer: &mut Trainer, at: RankStep) -> Result<RankShare, WorkerError>;

    /// The scale of the summed gradient of `step`, given every rank's sums added up: one over the
    /// global batch's loss tokens (the loss is a token mean).
    fn grad_scale(&self, step: u64, sums: &[f32]) -> Result<f32, WorkerError>;

    /// The step's metrics by name, from every rank's sums added up.
    fn metrics(&self, _sums: &[f32]) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }

    /// Scores the parameters on the job's held-out problems; `None` when the job has none.
    fn evaluate(&self, _trainer: &Trainer) -> Result<Option<EvalReport>, WorkerError> {
        Ok(None)
    }

    /// Evaluate after every this many steps too (0: only before the first step and after the
    /// last).
    fn eval_every(&self) -> u64 {
        0
    }
}

/// One logical rank's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankStep {
    /// The 0-based step.
    pub step: u64,
    /// The logical data-parallel rank: it computes the step's micro-batches
    /// `rank * accum .. (rank + 1) * accum`.
    pub rank: usize,
    /// Micro-batches per rank.
    pub accum: u64,
}

/// What one rank added to a step, besides its gradient.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankShare {
    /// The rank's metric sums, [`Objective::sums_len`] of them.
    pub sums: Vec<f32>,
    /// Tokens the rank processed (rows x row length).
    pub tokens: u64,
    /// Rows cut to fit (SFT: examples longer than the row; GRPO: prompts longer than the buffer).
    pub truncated_rows: u64,
    /// Where the rank's time went (the objective's own phases: `batches` and `gradients` for
    /// SFT; `prompts`, `rollout`, `rewards`, ..., `gradients` for GRPO).
    pub phases: Phases,
}

/// Greedy decoding on held-out problems.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// Problems scored.
    pub problems: u64,
    /// Problems answered exactly.
    pub correct: u64,
    /// Mean reward (the job's reward weights).
    pub reward: f64,
    /// The first problems: `(prompt, completion, reference answer)`, for people.
    pub samples: Vec<(String, String, String)>,
}

impl EvalReport {
    /// Fraction answered exactly.
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.problems.max(1) as f64
    }
}
