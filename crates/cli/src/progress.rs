//! What the user sees during a run: a progress bar on a terminal, a line every few steps
//! otherwise, and every step written to the run record.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use record::{RecordError, RunRecord};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::time::Duration;
use worker::ckpt::CheckpointEvent;
use worker::{EvalReport, Sink, StepResult};

/// One line of `metrics.jsonl`.
#[derive(Serialize)]
struct StepLine<'a> {
    step: u64,
    loss: f64,
    learning_rate: f64,
    grad_norm: f32,
    target_tokens: u64,
    tokens: u64,
    step_seconds: f64,
    tokens_per_second: f64,
    truncated_rows: u64,
    #[serde(flatten)]
    extra: &'a BTreeMap<String, f64>,
    /// `phase_<name>_seconds`: where the step's time went.
    #[serde(flatten)]
    phases: BTreeMap<String, f64>,
}

/// Shows progress and records each step.
pub struct Progress {
    bar: ProgressBar,
    record: RunRecord,
    total: u64,
    plain_every: u64,
    /// Recent step times, for a tokens/s figure that follows the current speed.
    recent: VecDeque<(u64, f64)>,
    /// The first failure to write the record; training goes on, the launch reports it.
    record_error: Option<RecordError>,
}

impl Progress {
    pub fn new(record: RunRecord, total: u64) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner:.green} step {pos}/{len} [{bar:30.cyan/blue}] {msg} · ETA {eta}",
            )
            .expect("template parses")
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Self {
            bar,
            record,
            total,
            plain_every: (total / 10).max(1),
            recent: VecDeque::new(),
            record_error: None,
        }
    }

    /// Ends the bar and hands back the record (or the first error writing it).
    pub fn finish(self) -> Result<RunRecord, RecordError> {
        self.bar.finish_and_clear();
        match self.record_error {
            Some(error) => Err(error),
            None => Ok(self.record),
        }
    }
}

impl Progress {
    fn keep_first_error(&mut self, result: Result<(), RecordError>) {
        if let Err(e) = result
            && self.record_error.is_none()
        {
            self.record_error = Some(e);
        }
    }

    /// A line above the bar (printed also when there is no terminal to draw the bar on).
    fn say(&self, line: String) {
        self.bar.suspend(|| eprintln!("{line}"));
    }
}

impl Sink for Progress {
    fn on_step(&mut self, m: &StepResult) {
        self.recent.push_back((m.tokens, m.seconds));
        if self.recent.len() > 10 {
            self.recent.pop_front();
        }
        let (tokens, seconds) = self.recent.iter().fold((0, 0.0), |(t, s), (dt, ds)| (t + dt, s + ds));
        let tokens_per_second = tokens as f64 / seconds.max(1e-9);
        let line = StepLine {
            step: m.step,
            loss: m.loss(),
            learning_rate: m.learning_rate,
            grad_norm: m.grad_norm,
            target_tokens: m.token_count as u64,
            tokens: m.tokens,
            step_seconds: m.seconds,
            tokens_per_second,
            truncated_rows: m.truncated_rows,
            extra: &m.metrics,
            phases: m.phases.to_map(),
        };
        let written = self.record.step(&line);
        self.keep_first_error(written);
        self.bar.set_position(m.step);
        // GRPO's loss hovers around 0 by construction: its reward and accuracy say more.
        let headline = match (m.metrics.get("reward"), m.metrics.get("accuracy"), m.metrics.get("kl")) {
            (Some(reward), Some(accuracy), Some(kl)) => {
                format!("reward {reward:.3} · accuracy {:.1}% · kl {kl:.4}", 100.0 * accuracy)
            }
            _ => format!("loss {:.4}", m.loss()),
        };
        self.bar.set_message(format!("{headline} · {}", human_rate(tokens_per_second)));
        if !std::io::stderr().is_terminal()
            && (m.step.is_multiple_of(self.plain_every) || m.step == self.total)
        {
            eprintln!(
                "step {}/{} {headline} lr {:.2e} grad_norm {:.3} {}",
                m.step,
                self.total,
                m.learning_rate,
                m.grad_norm,
                human_rate(tokens_per_second)
            );
        }
    }

    fn on_eval(&mut self, step: u64, report: &EvalReport) {
        let when = if step == 0 { "before training".to_string() } else { format!("after step {step}") };
        self.say(format!(
            "held-out accuracy {when}: {:.1}% ({} of {} problems, greedy), mean reward {:.3}",
            100.0 * report.accuracy(),
            report.correct,
            report.problems,
            report.reward
        ));
        let detail = serde_json::json!({
            "accuracy": report.accuracy(),
            "correct": report.correct,
            "problems": report.problems,
            "reward": report.reward,
            "samples": report.samples.iter().map(|(prompt, completion, answer)| {
                serde_json::json!({ "prompt": prompt, "completion": completion, "answer": answer })
            }).collect::<Vec<_>>(),
        });
        let written = self.record.event("eval", step, detail);
        self.keep_first_error(written);
    }

    fn on_checkpoint(&mut self, event: &CheckpointEvent) {
        let (kind, step, detail) = match event {
            CheckpointEvent::Restored { restored, passed_over } => {
                for p in passed_over {
                    self.say(format!("passed over checkpoint {}: {}", p.uri, p.reason));
                }
                self.say(format!("resuming after step {} from {}", restored.step, restored.uri));
                let passed: Vec<_> = passed_over.iter().map(|p| [&p.uri, &p.reason]).collect();
                ("restore", restored.step, serde_json::json!({"uri": restored.uri, "passed_over": passed}))
            }
            CheckpointEvent::Fresh { line, passed_over } => {
                for p in passed_over {
                    self.say(format!("passed over checkpoint {}: {}", p.uri, p.reason));
                }
                let passed: Vec<_> = passed_over.iter().map(|p| [&p.uri, &p.reason]).collect();
                ("fresh", 0, serde_json::json!({"line": line, "passed_over": passed}))
            }
            CheckpointEvent::Started { step, bytes, copy_seconds } => {
                ("save", *step, serde_json::json!({"bytes": bytes, "copy_seconds": copy_seconds}))
            }
            CheckpointEvent::Skipped { step, running_step, bytes_written, bytes_total } => {
                self.say(format!(
                    "checkpoint at step {step} skipped: the save of step {running_step} is still uploading \
                     ({bytes_written} of {bytes_total} bytes)"
                ));
                ("save_skipped", *step, serde_json::json!({"running_step": running_step}))
            }
            CheckpointEvent::Uploaded { step, bytes, upload_seconds } => (
                "checkpoint_uploaded",
                *step,
                serde_json::json!({"bytes": bytes, "upload_seconds": upload_seconds}),
            ),
            CheckpointEvent::Failed { step, reason } => {
                self.say(format!("checkpoint of step {step} failed (the next one tries again): {reason}"));
                ("checkpoint_failed", *step, serde_json::json!({"reason": reason}))
            }
            CheckpointEvent::Committed { step, uri, bytes, upload_seconds, deleted_objects } => {
                self.say(format!("checkpoint of step {step} committed: {uri}"));
                let detail = serde_json::json!({
                    "uri": uri,
                    "bytes": bytes,
                    "upload_seconds": upload_seconds,
                    "deleted_objects": deleted_objects,
                });
                ("checkpoint", *step, detail)
            }
        };
        let written = self.record.event(kind, step, detail);
        self.keep_first_error(written);
    }
}

/// `12.3k tok/s`.
pub fn human_rate(tokens_per_second: f64) -> String {
    match tokens_per_second {
        r if r >= 1e6 => format!("{:.2}M tok/s", r / 1e6),
        r if r >= 1e3 => format!("{:.1}k tok/s", r / 1e3),
        r => format!("{r:.0} tok/s"),
    }
}

/// A spinner with `message`, for work whose length is not known.
pub fn spinner(message: String) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}
