//! One global step over the data-parallel ranks this worker hosts.
//!
//! The logical data-parallel size `D` is fixed for a job; a worker hosts one or more of the `D`
//! virtual ranks. Rank `r` computes micro-batches `r * A .. (r + 1) * A` of the global step into
//! a gradient of its own (never merged with another rank's on device), so the all-reduce sums
//! exactly `D` gradients in its fixed order, and the result is the same bits whichever worker
//! computed which rank. Gradient tensors are downloaded and submitted one by one, so the ring
//! reduces early tensors while later ones are still being copied.

use crate::WorkerError;
use crate::phases::Phases;
use crate::trainer::{AppliedStep, Trainer};
use collective::{Buffer, Group};
use data::Loader;

/// Where a step's gradients are summed.
pub enum Reduce<'a> {
    /// `D = 1`: the one rank's gradient is the sum.
    Alone,
    /// Over a ring of `D` logical ranks.
    Ring(&'a Group),
}

/// What a step did, on this worker.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutcome {
    /// The optimizer step's result; `loss_sum` and `token_count` cover this worker's ranks.
    pub applied: AppliedStep,
    /// Tokens processed by this worker's ranks (rows x sequence length).
    pub tokens: u64,
    /// Rows cut at the sequence length.
    pub truncated_rows: u64,
    /// Where this worker's time went: `batches` (the loader), `gradients` (uploads and grad
    /// steps), `reduce` (the all-reduce between slices, gradients down and up) and `apply`.
    pub phases: Phases,
}

/// Runs 0-based global step `step` for `ranks` (ascending) with `accum` micro-batches per rank,
/// then applies the summed gradient at `learning_rate`.
pub fn run_step(
    trainer: &mut Trainer,
    loader: &Loader,
    step: u64,
    ranks: &[usize],
    accum: u64,
    learning_rate: f64,
    reduce: Reduce<'_>,
) -> Result<StepOutcome, WorkerError> {
    // Every worker derives the global token count from the data alone: no extra round trip.
    let global_tokens = loader.step_token_count(step)?;
    if global_tokens == 0 {
        return Err(WorkerError::Mismatch(format!(
            "step {} has no target tokens to learn from; check the data and seq_len",
            step + 1
        )));
    }
    let (mut tokens, mut truncated_rows) = (0u64, 0u64);
    let mut phases = Phases::new();
    let mut micro_batches =
        |trainer: &mut Trainer, rank: usize, phases: &mut Phases| -> Result<(), WorkerError> {
            for micro in rank as u64 * accum..(rank as u64 + 1) * accum {
                let batch = phases.time("batches", || loader.micro_batch(step, micro))?;
                tokens += (batch.rows * batch.seq_len) as u64;
                truncated_rows += batch.truncated_rows as u64;
                phases.time("gradients", || trainer.grad_step(&batch))?;
            }
            Ok(())
        };
    match reduce {
        Reduce::Alone => {
            for &rank in ranks {
                micro_batches(trainer, rank, &mut phases)?;
            }
        }
        Reduce::Ring(group) => {
            let n = trainer.grad_specs().len();
            let mut round = group.round(n)?;
            for (i, &rank) in ranks.iter().enumerate() {
                if i > 0 {
                    phases.time("reduce", || trainer.zero_grads())?;
                }
                micro_batches(trainer, rank, &mut phases)?;
                phases.time("reduce", || -> Result<(), WorkerError> {
                    for bucket in 0..n {
                        let dtype = trainer.grad_specs()[bucket].dtype;
                        let bytes = trainer.download_grad(bucket)?;
                        let buffer = Buffer::from_vec(dtype, bytes)?;
                        round.submit(bucket, rank, buffer)?;
                    }
                    Ok(())
                })?;
            }
            phases.time("reduce", || -> Result<(), WorkerError> {
                let sums: Vec<Vec<u8>> = round
                    .finish()?
                    .into_iter()
                    .map(|mut per_rank| per_rank.swap_remove(0).into_vec())
                    .collect();
                trainer.upload_grads(&sums)
            })?;
        }
    }
    let applied =
        phases.time("apply", || trainer.apply(step + 1, learning_rate as f32, 1.0 / global_tokens as f32))?;
    Ok(StepOutcome { applied, tokens, truncated_rows, phases })
}
