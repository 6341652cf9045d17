//! One global step over the data-parallel ranks this worker hosts: each rank's gradient, the
//! reduction between workers, apply. The same for every objective.
//!
//! The logical data-parallel size `D` is fixed for a job; a worker hosts one or more of the `D`
//! virtual ranks. Rank `r` computes its share of the global step (micro-batches
//! `r * A .. (r + 1) * A`) into a gradient of its own, never merged with another rank's on
//! device, so the all-reduce sums exactly `D` gradients in its fixed order, and the result is the
//! same bits whichever worker computed which rank. Gradient tensors are downloaded and submitted
//! one by one, so the ring reduces early tensors while later ones are still being copied; the
//! objective's metric sums ride along as one more bucket.

use crate::error::WorkerError;
use crate::objective::{Objective, RankStep};
use crate::phases::Phases;
use crate::trainer::Trainer;
use collective::{Buffer, Group};
use std::collections::BTreeMap;
use std::time::Instant;

/// Where a step's gradients are summed.
pub enum Reduce<'a> {
    /// This worker holds every rank: the sum is its own.
    Alone,
    /// Over a ring of `D` logical ranks.
    Ring(&'a Group),
}

/// What a step did, on this worker: the one result of every objective's step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// 1-based: the number of steps done after this one.
    pub step: u64,
    /// Summed loss over this worker's ranks.
    pub loss_sum: f64,
    /// Loss tokens over this worker's ranks.
    pub token_count: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// The learning rate applied.
    pub learning_rate: f64,
    /// Tokens this worker's ranks processed (rows x row length).
    pub tokens: u64,
    /// Rows cut to fit on this worker's ranks.
    pub truncated_rows: u64,
    /// Wall time of the step.
    pub seconds: f64,
    /// The objective's metrics over the global batch, and evaluations, by name.
    pub metrics: BTreeMap<String, f64>,
    /// Where this worker's time went: the objective's phases, `reduce` (the gradients and sums
    /// between workers) and `apply`.
    pub phases: Phases,
}

impl StepResult {
    /// Mean loss per loss token.
    pub fn loss(&self) -> f64 {
        self.loss_sum / self.token_count.max(1.0)
    }
}

/// Runs 0-based global step `step` of `objective` for `ranks` (ascending) with `accum`
/// micro-batches per rank, then applies the summed gradient at `learning_rate`.
#[allow(clippy::too_many_arguments)]
pub fn run_step(
    trainer: &mut Trainer,
    objective: &dyn Objective,
    step: u64,
    ranks: &[usize],
    accum: u64,
    learning_rate: f64,
    reduce: Reduce<'_>,
) -> Result<StepResult, WorkerError> {
    let started = Instant::now();
    let n = trainer.grad_specs().len();
    let sums_len = objective.sums_len();
    let mut round = match reduce {
        Reduce::Alone => None,
        Reduce::Ring(group) => Some(group.round(n + usize::from(sums_len > 0))?),
    };
    let mut sums = vec![0f32; sums_len];
    let (mut tokens, mut truncated_rows) = (0u64, 0u64);
    let mut phases = Phases::new();
    for (i, &rank) in ranks.iter().enumerate() {
        if i > 0 && round.is_some() {
            phases.time("reduce", || trainer.zero_grads())?;
        }
        let share = objective.rank_gradient(trainer, RankStep { step, rank, accum })?;
        phases.merge(&share.phases);
        if share.sums.len() != sums_len {
            return Err(WorkerError::broken(format!(
                "rank {rank} reported {} metric sums, not {sums_len}",
                share.sums.len()
            )));
        }
        tokens += share.tokens;
        truncated_rows += share.truncated_rows;
        match &mut round {
            None => sums.iter_mut().zip(&share.sums).for_each(|(total, x)| *total += x),
            Some(round) => phases.time("reduce", || -> Result<(), WorkerError> {
                for bucket in 0..n {
                    let dtype = trainer.grad_specs()[bucket].dtype;
                    round.submit(bucket, rank, Buffer::from_vec(dtype, trainer.download_grad(bucket)?)?)?;
                }
                if sums_len > 0 {
                    round.submit(n, rank, Buffer::from_f32(&share.sums))?;
                }
                Ok(())
            })?,
        }
    }
    if let Some(round) = round {
        let reduce_started = Instant::now();
        let mut reduced = round.finish()?;
        if sums_len > 0 {
            sums = reduced.pop().expect("n + 1 buckets").swap_remove(0).to_f32()?;
            if sums.len() != sums_len {
                return Err(WorkerError::broken(format!(
                    "a step's reduced metric sums have {} values, not {sums_len}",
                    sums.len()
                )));
            }
        }
        let grads: Vec<Vec<u8>> =
            reduced.into_iter().map(|mut per_rank| per_rank.swap_remove(0).into_vec()).collect();
        trainer.upload_grads(&grads)?;
        phases.add("reduce", reduce_started.elapsed());
    }
    let grad_scale = objective.grad_scale(step, &sums)?;
    let applied = phases.time("apply", || trainer.apply(step + 1, learning_rate as f32, grad_scale))?;
    Ok(StepResult {
        step: step + 1,
        loss_sum: applied.loss_sum,
        token_count: applied.token_count,
        grad_norm: applied.grad_norm,
        learning_rate,
        tokens,
        truncated_rows,
        seconds: started.elapsed().as_secs_f64(),
        metrics: objective.metrics(&sums),
        phases,
    })
}
