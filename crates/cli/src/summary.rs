//! What a run says at its end, and leaves in `summary.json`: one summary for every objective.

use crate::progress::human_rate;
use anyhow::Result;
use bundle::Bundle;
use job::JobSpec;
use record::RunRecord;
use serde::Serialize;
use std::path::Path;
use worker::EvalReport;
use worker::single::RunSummary;

/// `summary.json`.
#[derive(Serialize)]
struct Summary<'a> {
    job: &'a str,
    model: &'a str,
    parameters: u64,
    mesh: String,
    bundle: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    init_from: Option<&'a str>,
    start_step: u64,
    steps: u64,
    first_loss: f64,
    final_loss: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_reward: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    final_reward: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    eval_before: Option<Eval>,
    #[serde(skip_serializing_if = "Option::is_none")]
    eval_after: Option<Eval>,
    compile_seconds: f64,
    train_seconds: f64,
    tokens_per_second: f64,
}

#[derive(Serialize)]
struct Eval {
    accuracy: f64,
    correct: u64,
    problems: u64,
    reward: f64,
}

impl From<&EvalReport> for Eval {
    fn from(r: &EvalReport) -> Self {
        Self { accuracy: r.accuracy(), correct: r.correct, problems: r.problems, reward: r.reward }
    }
}

/// What was launched, for the summary.
pub struct Launched<'a> {
    pub job: &'a JobSpec,
    pub bundle: &'a Bundle,
    pub parameters: u64,
    pub compile_seconds: f64,
}

/// Writes `summary.json` and the plots of a finished run on this machine, and says how it went.
pub fn finish(record: &RunRecord, launched: &Launched<'_>, summary: &RunSummary) -> Result<()> {
    let run = &summary.trained;
    let (first, last) = (run.first.as_ref(), run.last.as_ref());
    let loss = |step: Option<&worker::StepResult>| step.map_or(f64::NAN, |s| s.loss());
    let reward = |step: Option<&worker::StepResult>| step.and_then(|s| s.metrics.get("reward").copied());
    let job = launched.job;
    record.summary(&Summary {
        job: &job.name,
        model: &job.model.name(),
        parameters: launched.parameters,
        mesh: job.ici_mesh().to_string(),
        bundle: launched.bundle.id(),
        init_from: summary.init_from.as_deref(),
        start_step: run.start,
        steps: run.steps(),
        first_loss: loss(first),
        final_loss: loss(last),
        first_reward: reward(first),
        final_reward: reward(last),
        eval_before: run.eval_first.as_ref().map(Eval::from),
        eval_after: run.eval_last.as_ref().map(Eval::from),
        compile_seconds: launched.compile_seconds,
        train_seconds: run.seconds,
        tokens_per_second: run.tokens_per_second(),
    })?;
    let plots = record.plot()?;
    // GRPO's loss hovers around 0 by construction: its reward says more.
    let progress = match (reward(first), reward(last)) {
        (Some(first), Some(last)) => format!("mean reward {first:.3} -> {last:.3}"),
        _ => format!(
            "loss {:.4} -> {:.4} ({:.1}% of the first)",
            loss(first),
            loss(last),
            100.0 * loss(last) / loss(first)
        ),
    };
    println!(
        "done: {} steps in {:.1}s ({}), {progress}",
        run.steps(),
        run.seconds,
        human_rate(run.tokens_per_second())
    );
    if let (Some(before), Some(after)) = (&run.eval_first, &run.eval_last) {
        println!(
            "held-out accuracy (greedy, {} problems): {:.1}% -> {:.1}% ({:+.1} points)",
            after.problems,
            100.0 * before.accuracy(),
            100.0 * after.accuracy(),
            100.0 * (after.accuracy() - before.accuracy())
        );
        if let Some((prompt, completion, answer)) = after.samples.first() {
            println!(
                "  e.g. {:?}\n  answered {:?} (expected {:?})",
                prompt.trim_end(),
                completion,
                answer.rsplit("#### ").next().unwrap_or(answer)
            );
        }
    }
    let names: Vec<_> = plots.iter().filter_map(|p| p.file_name()?.to_str()).collect();
    println!(
        "run record in {}: metrics.jsonl, events.jsonl, summary.json, {}",
        job.output_dir().display(),
        names.join(", ")
    );
    Ok(())
}

/// Prints a run's held-out accuracy before and after from its `metrics.jsonl`, when the run
/// wrote one here with both (`eval_accuracy_initial` on the first step, `eval_accuracy` later).
pub fn print_held_out(run_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(run_dir.join("metrics.jsonl")) else { return };
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let first = lines.iter().find_map(|l| l.get("eval_accuracy_initial")?.as_f64());
    let last = lines.iter().rev().find_map(|l| l.get("eval_accuracy")?.as_f64());
    if let (Some(before), Some(after)) = (first, last) {
        println!(
            "held-out accuracy (greedy): {:.1}% -> {:.1}% ({:+.1} points)",
            100.0 * before,
            100.0 * after,
            100.0 * (after - before)
        );
    }
}

/// What a launch says when the checkpoint it resumed from is already at the job's last step.
pub fn print_nothing_to_train(start_step: u64) {
    println!("nothing to train: the checkpoint restored is at step {start_step}, the job's last");
}
