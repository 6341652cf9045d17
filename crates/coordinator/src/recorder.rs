//! A job's run record, written by the coordinator when `Config::record_runs` asks for it (local
//! mode): `metrics.jsonl` gets one line per committed step with the aggregated metrics,
//! `events.jsonl` one per generation change, recovery, checkpoint and the end, and the plots and
//! `summary.json` are drawn when the job ends. The files go to the job's `output_dir()`.
//!
//! It follows the commands as they are applied on this node, so it writes what the cluster
//! committed, in log order.

use crate::ctx::Ctx;
use crate::state::{Command, Response, StepCommit};
use crate::store::Applied;
use record::RunRecord;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

fn step_line(commit: &StepCommit, generation: u64) -> Value {
    let mut line = json!({
        "step": commit.step,
        "loss": commit.loss,
        "tokens": commit.tokens,
        "step_seconds": commit.step_seconds,
        "tokens_per_second": commit.tokens_per_second,
        "grad_norm": commit.grad_norm,
        "generation": generation,
        "reporters": commit.reporters,
        "members": commit.members,
    });
    if let Value::Object(fields) = &mut line {
        for (k, v) in &commit.metrics {
            fields.entry(k.clone()).or_insert(json!(v));
        }
    }
    line
}

/// Writes run records until `shutdown` fires, then takes what was applied before it.
pub async fn run(ctx: Arc<Ctx>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut applied = ctx.shared.commands.subscribe();
    let mut records: BTreeMap<String, RunRecord> = BTreeMap::new();
    let mut closed: BTreeSet<String> = BTreeSet::new();
    let mut take = |a: Applied| {
        if let Err(e) = write(&ctx, &mut records, &mut closed, &a.command, &a.response) {
            tracing::warn!("run record: {e}");
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            item = applied.recv() => match item {
                Ok(a) => take(a),
                Err(RecvError::Lagged(n)) => tracing::warn!("the run recorder skipped {n} applied commands"),
                Err(RecvError::Closed) => return,
            },
        }
    }
    // A job's end applied before the stop still closes its record and draws its plots: the
    // store queues commands before the state shows them, so the queue holds them by now.
    loop {
        match applied.try_recv() {
            Ok(a) => take(a),
            Err(TryRecvError::Lagged(n)) => tracing::warn!("the run recorder skipped {n} applied commands"),
            Err(TryRecvError::Empty | TryRecvError::Closed) => return,
        }
    }
}

fn write(
    ctx: &Ctx,
    records: &mut BTreeMap<String, RunRecord>,
    closed: &mut BTreeSet<String>,
    command: &Command,
    response: &Response,
) -> Result<(), record::RecordError> {
    let job_id = match (command, response) {
        (Command::SubmitJob(_), Response::JobSubmitted { job_id }) => job_id.clone(),
        (_, Response::Refused { .. }) => return Ok(()),
        (c, _) => match c.job_id() {
            Some(id) => id.to_string(),
            None => return Ok(()),
        },
    };
    let Some(job) = ctx.shared.read(|s| s.jobs.get(&job_id).cloned()) else { return Ok(()) };
    // The state read here may be ahead of the command; the command says when the run ends.
    if closed.contains(&job_id) {
        return Ok(());
    }
    if !records.contains_key(&job_id) {
        records.insert(job_id.clone(), RunRecord::create(&job.shape.output_dir)?);
    }
    let record = records.get_mut(&job_id).expect("inserted above");
    let step = job.committed_step;
    match command {
        Command::SubmitJob(submit) => {
            record.event("submitted", step, json!({"job_id": job_id}))?;
            for passed in &submit.passed_over {
                record.event("passed_over", step, json!({"uri": passed.uri, "reason": passed.reason}))?;
            }
            let from = submit.catalog.last().map(|c| &c.uri);
            record.event("resume", step, json!({"from": from, "line": submit.line}))?
        }
        Command::PassOverCheckpoint { uri, reason, .. } => {
            record.event("passed_over", step, json!({"uri": uri, "reason": reason}))?
        }
        Command::RegisterWorker(r) => record.event("joined", step, json!({"host": r.record.host}))?,
        Command::BeginGeneration { generation, reason, removed, .. } => {
            let kind = if reason.contains("preempted") {
                "preemption"
            } else if reason.contains("lease expired") {
                "lease_expired"
            } else {
                "recovery"
            };
            record.event(
                kind,
                step,
                json!({"generation": generation, "reason": reason, "removed": removed}),
            )?
        }
        Command::NewGeneration { generation, start_step, members, carried, reason, .. } => {
            for commit in carried {
                record.step(&step_line(commit, generation - 1))?;
            }
            let placement: BTreeMap<&str, &Vec<u32>> =
                members.iter().map(|m| (m.worker_id.as_str(), &m.virtual_ranks)).collect();
            record.event(
                "generation",
                step,
                json!({"generation": generation, "start_step": start_step, "reason": reason, "placement": placement}),
            )?
        }
        Command::CommitStep { commit, generation, .. } => record.step(&step_line(commit, *generation))?,
        Command::CommitCheckpoint { entry, .. } => {
            record.event("checkpoint", entry.record.step, json!({"uri": entry.uri, "bytes": entry.bytes}))?
        }
        Command::StopJob { .. }
        | Command::CompleteJob { .. }
        | Command::FailJob { .. }
        | Command::ForgetCheckpoint { .. }
        | Command::RecordJobObject { .. }
        | Command::KvPut { .. } => {}
    }
    let total = job.shape.total_steps;
    let ends = match command {
        Command::StopJob { .. } | Command::CompleteJob { .. } | Command::FailJob { .. } => true,
        Command::CommitStep { commit, .. } => commit.step >= total && job.shape.checkpoint_every == 0,
        Command::NewGeneration { carried, .. } => {
            carried.last().is_some_and(|c| c.step >= total) && job.shape.checkpoint_every == 0
        }
        _ => false,
    };
    if ends {
        closed.insert(job_id.clone());
        let mut record = records.remove(&job_id).expect("present");
        record.event(&format!("{:?}", job.state).to_lowercase(), step, json!({"message": job.message}))?;
        record.summary(&json!({
            "job_id": job.id,
            "state": format!("{:?}", job.state),
            "message": job.message,
            "steps": job.committed_step,
            "generation": job.generation,
            "checkpoints": job.checkpoints.len(),
        }))?;
        record.plot()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_lines_carry_the_metrics_without_overriding_the_fixed_fields() {
        let commit = StepCommit {
            step: 3,
            loss: Some(2.0),
            metrics: BTreeMap::from([("reward".to_string(), 0.5), ("step".to_string(), 99.0)]),
            ..Default::default()
        };
        let line = step_line(&commit, 2);
        assert_eq!(line["step"], 3);
        assert_eq!(line["reward"], 0.5);
        assert_eq!(line["generation"], 2);
    }
}
