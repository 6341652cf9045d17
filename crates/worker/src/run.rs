//! The loop over optimizer steps for one slice.

use crate::WorkerError;
use crate::ckpt::{CheckpointEvent, LocalCheckpoints, Resume};
use crate::dp::{Reduce, run_step};
use crate::trainer::Trainer;
use data::Loader;
use job::JobSpec;
use std::collections::BTreeMap;
use std::time::Instant;

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMetrics {
    /// 1-based step number.
    pub step: u64,
    /// Mean loss per target token.
    pub loss: f64,
    /// Target tokens that counted towards the loss.
    pub target_tokens: u64,
    /// Tokens processed (rows x sequence length).
    pub tokens: u64,
    /// The learning rate applied.
    pub learning_rate: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Wall time of the step.
    pub seconds: f64,
    /// Rows whose example was cut at the sequence length (GRPO: prompts cut to the buffer).
    pub truncated_rows: u64,
    /// Further metrics by name (GRPO's rewards, KL, clipping, evaluations).
    pub extra: BTreeMap<String, f64>,
}

/// Receives each step as it completes.
pub trait Observer {
    /// Called after every optimizer step.
    fn on_step(&mut self, metrics: &StepMetrics);

    /// Called when the run restores, saves or commits a checkpoint.
    fn on_checkpoint(&mut self, _event: &CheckpointEvent) {}
}

/// The run at a glance.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Steps done before this run: the restored checkpoint's step, or 0.
    pub start_step: u64,
    /// Steps run.
    pub steps: u64,
    /// Loss of the first step.
    pub first_loss: f64,
    /// Loss of the last step.
    pub final_loss: f64,
    /// Wall time of the training loop.
    pub seconds: f64,
    /// Tokens per second over the loop.
    pub tokens_per_second: f64,
}

/// Seeds the bundle's `init` program from the job seed (the program takes 32 bits).
pub fn init_seed(job_seed: u64) -> u32 {
    (job_seed ^ (job_seed >> 32)) as u32
}

/// Trains the job's steps on one slice holding the whole global batch, starting from a checkpoint
/// as `resume` says or else from the job seed, and saving checkpoints as the job's `checkpoint`
/// section asks (every `every` steps and after the last).
pub fn train(
    trainer: &mut Trainer,
    job: &JobSpec,
    loader: &Loader,
    observer: &mut dyn Observer,
    resume: &Resume,
) -> Result<RunSummary, WorkerError> {
    let mut checkpoints = LocalCheckpoints::for_job(job)?;
    let start = match checkpoints.resume(trainer, job, resume, observer)? {
        Some(step) => step,
        None => {
            trainer.init(init_seed(job.seed))?;
            0
        }
    };
    let started = Instant::now();
    let (mut first_loss, mut final_loss, mut tokens) = (f64::NAN, f64::NAN, 0u64);
    for step in start..job.steps {
        let step_started = Instant::now();
        let learning_rate = job.optimizer.learning_rate(step, job.steps);
        let outcome = run_step(
            trainer,
            loader,
            step,
            &[0],
            job.micro_batches_per_step(),
            learning_rate,
            Reduce::Alone,
        )?;
        let applied = outcome.applied;
        let loss = applied.loss_sum / applied.token_count;
        if step == start {
            first_loss = loss;
        }
        final_loss = loss;
        tokens += outcome.tokens;
        observer.on_step(&StepMetrics {
            step: step + 1,
            loss,
            target_tokens: applied.token_count as u64,
            tokens: outcome.tokens,
            learning_rate,
            grad_norm: applied.grad_norm,
            seconds: step_started.elapsed().as_secs_f64(),
            truncated_rows: outcome.truncated_rows,
            extra: BTreeMap::new(),
        });
        checkpoints.after_step(trainer, step + 1, observer)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    checkpoints.finish(trainer, job.steps, observer)?;
    Ok(RunSummary {
        start_step: start,
        steps: job.steps - start,
        first_loss,
        final_loss,
        seconds,
        tokens_per_second: tokens as f64 / seconds,
    })
}
