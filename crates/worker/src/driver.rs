//! The one training loop, whoever runs it: a launch on one slice (`crate::single`), the local
//! workers of several slices and the cluster's workers (`crate::agent`).
//!
//! A run is a [`Plan`] (the job, the steps already done, the ranks this worker computes, the
//! ring between workers) and an [`Objective`]. Each step: hand on a checkpoint upload that has
//! finished, stop at the boundary if told to, run the step (`crate::step`: every rank's gradient,
//! the reduction, apply), evaluate when due, report, start a save when due. After the last step
//! the final state is saved. What differs between runners is only where reports go (a [`Sink`]),
//! who may interrupt (a [`Control`]) and what becomes of a save (a `ckpt::Commit`).
//!
//! **Invariant:** the state on the devices is always that of a whole number of steps. A step
//! that fails (a peer lost mid-reduction, an abort) is discarded before apply, and the run ends
//! there; the caller decides what follows.

use crate::WorkerError;
use crate::ckpt::{CheckpointEvent, Checkpoints};
use crate::objective::{EvalReport, Objective};
use crate::step::{Reduce, StepResult, run_step};
use crate::trainer::Trainer;
use collective::Group;
use job::JobSpec;
use std::collections::BTreeMap;
use std::time::Instant;

/// What a run is asked to do.
pub struct Plan<'a> {
    /// The job.
    pub job: &'a JobSpec,
    /// Steps the state on the devices has done: the run does steps `start .. job.steps`.
    pub start: u64,
    /// The logical data-parallel ranks this worker computes, ascending.
    pub ranks: &'a [usize],
    /// Micro-batches each rank runs per step.
    pub accum: u64,
    /// The ring between workers; `None` when this worker holds every rank.
    pub group: Option<&'a Group>,
    /// Evaluate before the first step (the start of a run, not of every generation).
    pub evaluate_first: bool,
}

/// Where a run's progress goes.
pub trait Sink {
    /// After every step.
    fn on_step(&mut self, step: &StepResult);

    /// After a held-out evaluation, `step` the steps done (the start step: before training).
    fn on_eval(&mut self, _step: u64, _report: &EvalReport) {}

    /// When a checkpoint is restored, started, skipped, handed on, committed or failed.
    fn on_checkpoint(&mut self, _event: &CheckpointEvent) {}
}

/// Who may stop a run at a step boundary.
pub trait Control {
    /// Whether the run must stop before its next step.
    fn interrupted(&self) -> bool;
}

/// A run no one stops between steps.
pub struct Uninterrupted;

impl Control for Uninterrupted {
    fn interrupted(&self) -> bool {
        false
    }
}

/// Why a run ended.
#[derive(Debug)]
pub enum Ended {
    /// Every step of the job is done and the final state saved.
    Finished,
    /// Told to stop at a step boundary.
    Interrupted,
    /// 0-based step `step` failed and was discarded: the state is that of `step` steps.
    StepFailed {
        /// The step that failed.
        step: u64,
        /// Why.
        error: WorkerError,
    },
}

/// A run at a glance.
#[derive(Debug)]
pub struct Trained {
    /// Why it ended.
    pub ended: Ended,
    /// Steps done when it started.
    pub start: u64,
    /// Its first and last steps.
    pub first: Option<StepResult>,
    /// See `first`.
    pub last: Option<StepResult>,
    /// Wall time of its steps (evaluations excluded).
    pub seconds: f64,
    /// Tokens its steps processed on this worker.
    pub tokens: u64,
    /// The evaluation before the first step, and the latest one.
    pub eval_first: Option<EvalReport>,
    /// See `eval_first`.
    pub eval_last: Option<EvalReport>,
}

impl Trained {
    /// Steps this run did.
    pub fn steps(&self) -> u64 {
        self.last.as_ref().map_or(0, |last| last.step - self.start)
    }

    /// Tokens per second over its steps.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(1e-9)
    }
}

/// Runs `plan` with `objective` on `trainer`, whose state is that of `plan.start` steps.
/// Errors are the run's own (a save that cannot start, an evaluation that fails); a failed step
/// ends the run with [`Ended::StepFailed`].
pub fn train(
    trainer: &mut Trainer,
    plan: &Plan<'_>,
    objective: &dyn Objective,
    mut checkpoints: Option<&mut Checkpoints>,
    sink: &mut dyn Sink,
    control: &dyn Control,
) -> Result<Trained, WorkerError> {
    let job = plan.job;
    let mut run = Trained {
        ended: Ended::Finished,
        start: plan.start,
        first: None,
        last: None,
        seconds: 0.0,
        tokens: 0,
        eval_first: None,
        eval_last: None,
    };
    // Evaluations ride on the report of the step they follow (the first one on the first step's).
    let mut evaluations = BTreeMap::new();
    if plan.evaluate_first
        && plan.start < job.steps
        && let Some(report) = objective.evaluate(trainer)?
    {
        sink.on_eval(plan.start, &report);
        evaluations.insert("eval_accuracy_initial".to_string(), report.accuracy());
        evaluations.insert("eval_reward_initial".to_string(), report.reward);
        run.eval_first = Some(report);
    }
    let started = Instant::now();
    let mut eval_seconds = 0.0;
    for step in plan.start..job.steps {
        if let Some(checkpoints) = checkpoints.as_deref_mut() {
            checkpoints.poll()?.iter().for_each(|e| sink.on_checkpoint(e));
        }
        if control.interrupted() {
            run.ended = Ended::Interrupted;
            break;
        }
        let learning_rate = job.optimizer.learning_rate(step, job.steps);
        let reduce = plan.group.map_or(Reduce::Alone, Reduce::Ring);
        let mut result =
            match run_step(trainer, objective, step, plan.ranks, plan.accum, learning_rate, reduce) {
                Ok(result) => result,
                Err(error) => {
                    // The state is still that of `step` steps: apply runs only after the reduction.
                    trainer.discard_step()?;
                    run.ended = match control.interrupted() {
                        true => Ended::Interrupted,
                        false => Ended::StepFailed { step, error },
                    };
                    break;
                }
            };
        let done = step + 1;
        if eval_due(done, job.steps, objective.eval_every()) {
            let eval_started = Instant::now();
            if let Some(report) = objective.evaluate(trainer)? {
                sink.on_eval(done, &report);
                evaluations.insert("eval_accuracy".to_string(), report.accuracy());
                evaluations.insert("eval_reward".to_string(), report.reward);
                run.eval_last = Some(report);
            }
            eval_seconds += eval_started.elapsed().as_secs_f64();
        }
        result.metrics.append(&mut evaluations);
        sink.on_step(&result);
        run.tokens += result.tokens;
        if run.first.is_none() {
            run.first = Some(result.clone());
        }
        run.last = Some(result);
        if let Some(checkpoints) = checkpoints.as_deref_mut() {
            checkpoints.after_step(trainer, done, job.steps)?.iter().for_each(|e| sink.on_checkpoint(e));
        }
    }
    run.seconds = started.elapsed().as_secs_f64() - eval_seconds;
    if matches!(run.ended, Ended::Finished)
        && let Some(checkpoints) = checkpoints
    {
        checkpoints.finish(trainer, job.steps)?.iter().for_each(|e| sink.on_checkpoint(e));
    }
    Ok(run)
}

/// Whether a held-out evaluation is due after `done` of `total` steps, evaluating every `every`.
fn eval_due(done: u64, total: u64, every: u64) -> bool {
    done == total || (every > 0 && done.is_multiple_of(every))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluations_fall_on_every_nth_step_and_the_last() {
        let due: Vec<u64> = (1..=10).filter(|&d| eval_due(d, 10, 4)).collect();
        assert_eq!(due, [4, 8, 10]);
        let only_last: Vec<u64> = (1..=10).filter(|&d| eval_due(d, 10, 0)).collect();
        assert_eq!(only_last, [10]);
    }
}
