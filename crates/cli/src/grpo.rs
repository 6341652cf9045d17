//! `podctl launch` of a GRPO job: where the policy starts (`grpo.init_from`; an SFT job spec
//! there is trained first when it has no checkpoint yet), the single-slice run, and its
//! before/after report.

use crate::connect::ConnectArgs;
use crate::launch::{compile_trainer, print_nothing_to_train};
use crate::progress::{Progress, human_rate};
use anyhow::{Context, Result, bail};
use bundle::Bundle;
use checkpoint::{Storage, StoreCommitLog, StoreOptions, committed_newest_first};
use job::JobSpec;
use record::RunRecord;
use serde::Serialize;
use std::path::Path;
use worker::ckpt::{Resume, split_uri};
use worker::grpo::{EvalReport, GrpoTask};

/// Rewrites `grpo.init_from` into the checkpoint directory it means, so that every worker and
/// every restart starts from the same one. An SFT job spec there (`*.yaml`) is launched first
/// when its checkpoint root holds no committed checkpoint.
pub fn resolve_init_from(job: &mut JobSpec, connect: &ConnectArgs) -> Result<()> {
    let Some(grpo) = &job.grpo else { return Ok(()) };
    let Some(from) = grpo.init_from.clone() else { return Ok(()) };
    let uri = match grpo.init_from_job() {
        Some(path) => {
            if connect.is_remote() {
                bail!(
                    "grpo.init_from {path}: a cluster's workers cannot train a local job spec first; \
                     train it, then set init_from to its checkpoint root (s3://, gs://)"
                );
            }
            let sft = JobSpec::load(Path::new(path)).with_context(|| format!("grpo.init_from {path}"))?;
            if sft.grpo.is_some() || sft.model != job.model {
                bail!(
                    "grpo.init_from {path}: expected an SFT job of model {}, found a {} job of model {}",
                    job.model,
                    if sft.grpo.is_some() { "GRPO" } else { "SFT" },
                    sft.model
                );
            }
            let Some(root) = sft.checkpoint_uri() else {
                bail!(
                    "grpo.init_from {path}: that job saves no checkpoints; add `checkpoint: {{ every: N }}` to it"
                );
            };
            match newest_checkpoint(&root)? {
                Some(dir) => dir,
                None => {
                    println!(
                        "grpo.init_from {path}: no checkpoint under {root} yet; training that job first"
                    );
                    crate::launch::run(Path::new(path), false, None, None, connect)?;
                    println!();
                    newest_checkpoint(&root)?.with_context(|| {
                        format!("{path} ran but left no committed checkpoint under {root}")
                    })?
                }
            }
        }
        None => {
            let uri = match from.contains("://") {
                true => from.clone(),
                false => format!("file://{}", std::path::absolute(&from)?.display()),
            };
            match split_uri(&uri) {
                (_, Some(_)) => uri,
                (root, None) => newest_checkpoint(root)?.with_context(|| {
                    format!("grpo.init_from {from}: no committed checkpoint under {root}; name a checkpoint, or a root that has one")
                })?,
            }
        }
    };
    job.grpo.as_mut().expect("checked above").init_from = Some(uri);
    Ok(())
}

/// The newest committed checkpoint's directory under `root`, if any.
fn newest_checkpoint(root: &str) -> Result<Option<String>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let storage = Storage::open(root, &StoreOptions::default())?;
        let log = StoreCommitLog::new(storage.clone());
        let newest = committed_newest_first(&log).await?.into_iter().next();
        Ok(newest.map(|commit| format!("{}/{}", storage.url().trim_end_matches('/'), commit.dir())))
    })
}

/// Prints a GRPO job's held-out accuracy before and after from its run's `metrics.jsonl`, when
/// the run wrote one here (the workers report `eval_accuracy_initial` with the first step and
/// `eval_accuracy` with the last).
pub fn print_held_out(run_dir: &Path) {
    let Ok(text) = std::fs::read_to_string(run_dir.join("metrics.jsonl")) else { return };
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let find = |key: &str| lines.iter().find_map(|l| l.get(key)?.as_f64());
    let last = lines.iter().rev().find_map(|l| l.get("eval_accuracy")?.as_f64());
    if let (Some(before), Some(after)) = (find("eval_accuracy_initial"), last) {
        println!(
            "held-out accuracy (greedy): {:.1}% -> {:.1}% ({:+.1} points)",
            100.0 * before,
            100.0 * after,
            100.0 * (after - before)
        );
    }
}

/// `summary.json` of a GRPO run.
#[derive(Serialize)]
struct Summary<'a> {
    job: &'a str,
    model: &'a str,
    parameters: u64,
    mesh: String,
    bundle: &'a str,
    init_from: Option<&'a str>,
    start_step: u64,
    steps: u64,
    first_reward: f64,
    final_reward: f64,
    eval_before: Option<Eval>,
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

/// Trains a GRPO job on this machine's devices, one slice, and prints the held-out accuracy
/// before and after.
pub fn run_local(
    job: &JobSpec,
    bundle: &Bundle,
    plugin: &'static pjrt::Plugin,
    resume: Option<String>,
    parameters: u64,
) -> Result<()> {
    let manifest = bundle.manifest();
    let (mut trainer, compile_seconds) = compile_trainer(job, bundle, plugin)?;
    let task = GrpoTask::new(job, manifest)?;
    if let Some(from) = &task.spec().init_from {
        println!("policy and reference start from {from}");
    }

    let run_dir = job.output_dir();
    let record = RunRecord::create(&run_dir)?;
    let mut progress = Progress::new(record, job.steps);
    let resume = resume.map_or(Resume::Newest, Resume::From);
    let outcome = worker::grpo::train(&mut trainer, job, &task, &mut progress, &resume);
    let record = progress.finish()?;
    let summary = outcome?;
    if summary.steps == 0 {
        print_nothing_to_train(summary.start_step);
        return Ok(());
    }
    record.summary(&Summary {
        job: &job.name,
        model: &job.model.name(),
        parameters,
        mesh: job.ici_mesh().to_string(),
        bundle: bundle.id(),
        init_from: summary.init_from.as_deref(),
        start_step: summary.start_step,
        steps: summary.steps,
        first_reward: summary.first_reward,
        final_reward: summary.final_reward,
        eval_before: summary.eval_before.as_ref().map(Eval::from),
        eval_after: summary.eval_after.as_ref().map(Eval::from),
        compile_seconds,
        train_seconds: summary.seconds,
        tokens_per_second: summary.tokens_per_second,
    })?;
    let plots = record.plot()?;
    println!(
        "done: {} steps in {:.1}s ({}), mean reward {:.3} -> {:.3}",
        summary.steps,
        summary.seconds,
        human_rate(summary.tokens_per_second),
        summary.first_reward,
        summary.final_reward
    );
    if let (Some(before), Some(after)) = (&summary.eval_before, &summary.eval_after) {
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
        run_dir.display(),
        names.join(", ")
    );
    Ok(())
}
