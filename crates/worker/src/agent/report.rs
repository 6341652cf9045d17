//! What the driver's run reports, under a coordinator: steps to the leader (in order, through
//! the session side), metrics to Prometheus, lines to the logs, and each host's share of a save
//! to the leader, which commits once every member's is in.

use super::Shared;
use super::trainer_side::{TrainerSide, log};
use crate::ckpt::{CheckpointEvent, Commit, HostSave};
use crate::driver::{Control, Sink};
use crate::error::WorkerError;
use crate::metrics::WorkerMetrics;
use crate::objective::EvalReport;
use crate::step::StepResult;
use client::{Client, LogLine};
use proto::v1::{CheckpointReport, StepReport};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// How often a trainer waiting for room in the report queue looks for a newer generation.
const INTERRUPT_POLL: Duration = Duration::from_millis(50);

/// Stops a generation's run when the worker stops or a newer generation is asked for.
pub(super) struct GenerationControl {
    pub(super) shared: Arc<Shared>,
    pub(super) generation: u64,
}

impl Control for GenerationControl {
    fn interrupted(&self, done: u64) -> bool {
        self.shared.at_boundary(self.generation, done)
    }
}

/// The run's reports, through the trainer side.
pub(super) struct AgentSink<'a> {
    pub(super) side: &'a mut TrainerSide,
}

impl Sink for AgentSink<'_> {
    fn on_step(&mut self, step: &StepResult) {
        let side = &mut *self.side;
        side.steps_done = step.step;
        side.steps_this_registration += 1;
        let metrics = &side.metrics;
        metrics.steps_total.add(1.0);
        metrics.tokens_total.add(step.tokens as f64);
        metrics.step_seconds.set(step.seconds);
        metrics.tokens_per_second.set(step.tokens as f64 / step.seconds.max(1e-9));
        side.publish("training");
        let mut reported = step.metrics.clone();
        reported.insert("learning_rate".to_string(), step.learning_rate);
        reported.extend(step.phases.to_map());
        let report = StepReport {
            job_id: side.config.job_id.clone(),
            worker_id: side.worker_id.clone(),
            generation: side.generation,
            step: step.step,
            loss_sum: step.loss_sum,
            token_count: step.token_count,
            grad_norm: f64::from(step.grad_norm),
            step_seconds: step.seconds,
            tokens: step.tokens,
            metrics: reported.into_iter().collect(),
        };
        // Full while no leader takes the reports: the trainer waits, `REPORTS_IN_FLIGHT` steps
        // ahead, unless a newer generation is asked for meanwhile, which carries the steps done
        // and not committed (so this report goes unsent) and must hear this worker answer now,
        // not once a hung leader's calls time out. Closed only when this registration ended.
        if let Err(mpsc::error::TrySendError::Full(report)) = side.reports.try_send(report) {
            loop {
                let reports = &side.reports;
                let space = side
                    .runtime
                    .block_on(async { tokio::time::timeout(INTERRUPT_POLL, reports.reserve()).await });
                match space {
                    Ok(Ok(permit)) => break permit.send(report),
                    Ok(Err(_closed)) => break,
                    Err(_waiting) if side.shared.interrupted(side.generation) => break,
                    Err(_waiting) => {}
                }
            }
        }
        side.log("info", format!("step {} loss {:.4} ({:.2}s)", step.step, step.loss(), step.seconds));
    }

    /// Every member evaluates alike, so the value the leader records is the same from each.
    fn on_eval(&mut self, step: u64, report: &EvalReport) {
        self.side.log(
            "info",
            format!(
                "held-out accuracy after step {step}: {:.1}% ({} of {} problems, greedy), mean reward {:.3}",
                100.0 * report.accuracy(),
                report.correct,
                report.problems,
                report.reward
            ),
        );
    }

    fn on_checkpoint(&mut self, event: &CheckpointEvent) {
        let side = &*self.side;
        let metrics = &side.metrics;
        match event {
            CheckpointEvent::Started { step, bytes, copy_seconds } => {
                metrics.checkpoint_stall_seconds_total.add(*copy_seconds);
                side.log(
                    "info",
                    format!(
                        "checkpoint of step {step}: {:.1} MiB copied off the devices in {copy_seconds:.3}s, uploading",
                        *bytes as f64 / (1 << 20) as f64,
                    ),
                );
            }
            CheckpointEvent::Skipped { step, running_step, bytes_written, bytes_total } => {
                metrics.checkpoint_skipped_total.add(1.0);
                side.log(
                    "warn",
                    format!(
                        "checkpoint of step {step} skipped: the save of step {running_step} is still \
                         uploading ({bytes_written} of {bytes_total} bytes)"
                    ),
                );
            }
            CheckpointEvent::Failed { step, reason } => {
                side.log("warn", format!("the checkpoint upload of step {step} failed: {reason}"));
            }
            // The commit's own messages come from `CoordinatorCommit`, when the leader answers.
            CheckpointEvent::Uploaded { .. } | CheckpointEvent::Committed { .. } => {}
            CheckpointEvent::Restored { .. } | CheckpointEvent::Fresh { .. } => {}
        }
    }
}

/// Hands this host's share of a save to the leader, which commits once every member's report is
/// in. The run's final save waits for the answer: the job completes once that checkpoint
/// commits.
pub(super) struct CoordinatorCommit {
    client: Client,
    runtime: tokio::runtime::Handle,
    shared: Arc<Shared>,
    logs: mpsc::Sender<LogLine>,
    line: LogLine,
    generation: u64,
    /// The newest step this generation's saves committed: an earlier save still waiting for a
    /// member's part (one whose upload failed) is past hoping for, and stops asking.
    newest_committed: Arc<AtomicU64>,
    metrics: Arc<WorkerMetrics>,
}

impl CoordinatorCommit {
    pub(super) fn new(side: &TrainerSide, generation: u64) -> Self {
        Self {
            client: side.client.clone(),
            runtime: side.runtime.clone(),
            shared: side.shared.clone(),
            logs: side.logs.clone(),
            line: side.line_template(),
            generation,
            newest_committed: Arc::new(AtomicU64::new(0)),
            metrics: side.metrics.clone(),
        }
    }
}

impl Commit for CoordinatorCommit {
    fn commit(&mut self, saved: HostSave, last: bool) -> Result<CheckpointEvent, WorkerError> {
        self.metrics.checkpoint_bytes_total.add(saved.report.object.size as f64);
        self.metrics.checkpoint_upload_seconds.set(saved.upload_seconds);
        let step = saved.spec.step;
        let report = CheckpointReport {
            job_id: self.line.job_id.clone(),
            worker_id: self.line.worker_id.clone(),
            generation: self.generation,
            step,
            save_id: saved.spec.save_id.clone(),
            host_report: Some(client::checkpoint::host_report_to_wire(&saved.report)),
            save_spec: Some(client::checkpoint::save_spec_to_wire(&saved.spec)),
        };
        let uploaded = CheckpointEvent::Uploaded {
            step,
            bytes: saved.report.object.size,
            upload_seconds: saved.upload_seconds,
        };
        let (client, logs, line) = (self.client.clone(), self.logs.clone(), self.line.clone());
        let (shared, newest_committed, generation) =
            (self.shared.clone(), self.newest_committed.clone(), self.generation);
        // The leader holds the parts reported so far in memory only, and answers "not yet" once
        // its wait ends: the report goes again until the save commits, so a leader that dies
        // holding this part loses nothing. It stops once the generation ends (or the worker
        // stops), or a later save committed.
        let send = async move {
            let mut waiting_told = false;
            loop {
                let answer = client.report_checkpoint(report.clone()).await;
                let message = match &answer {
                    Ok(ack) if ack.committed => {
                        newest_committed.fetch_max(step, Ordering::SeqCst);
                        format!("checkpoint of step {step} committed: {}", ack.uri)
                    }
                    Ok(_) if shared.interrupted(generation) => format!(
                        "checkpoint of step {step} not committed: generation {generation} ended before every member's part came"
                    ),
                    Ok(_) if newest_committed.load(Ordering::SeqCst) > step => format!(
                        "checkpoint of step {step} not committed: a member's part never came, and a later save committed"
                    ),
                    Ok(_) if waiting_told => continue,
                    Ok(_) => {
                        waiting_told = true;
                        let message =
                            format!("checkpoint of step {step} uploaded; waiting for the other members");
                        log(&logs, LogLine { step, ..line.clone() }, "info", message);
                        continue;
                    }
                    Err(e) => format!("checkpoint of step {step}: the report was refused: {e}"),
                };
                log(&logs, LogLine { step, ..line }, "info", message);
                return answer;
            }
        };
        if !last {
            self.runtime.spawn(send);
            return Ok(uploaded);
        }
        match self.runtime.block_on(send) {
            Ok(ack) if ack.committed => Ok(CheckpointEvent::Committed {
                step,
                uri: ack.uri,
                bytes: saved.report.object.size,
                upload_seconds: saved.upload_seconds,
                deleted_objects: 0,
            }),
            // A refusal is logged above; a newer generation (which refused it) saves again.
            Ok(_) | Err(_) => Ok(uploaded),
        }
    }
}
