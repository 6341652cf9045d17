//! The leader loop, and the directives it sends.
//!
//! The loop looks at every live job on a tick and whenever a heartbeat or report may have
//! changed a decision (the leader's memory, [`crate::memory`], wakes it), calls the pure
//! functions of [`crate::decide`], proposes what they return through Raft, and then tells every
//! worker with a session the directive now in force. It also starts each job's retention runs
//! ([`decide::retention_due`]), in tasks of their own so a slow store never holds it up.

use crate::ctx::{Ctx, NotServing};
use crate::decide::{self, Decision, StepReportData, Timing};
use crate::memory::LeaderState;
use crate::state::{Command, Job, JobState, MemberPlan, Response, ResumePlan};
use openraft::ServerState;
use proto::v1::{self, Directive, directive};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a failed retention run waits before the next try.
const RETENTION_RETRY: Duration = Duration::from_secs(5);

/// Seconds since the Unix epoch, for the timestamps the leader puts in commands.
pub fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The directive in force for a worker: what a worker that reconnects or lags is told.
pub fn directive_in_force(job: &Job, worker_id: &str) -> Option<Directive> {
    let stop = |reason: String, removed: bool| {
        // A member of the ending generation removed while the others finish the step in flight
        // (it leaves with that step finishing: `Out::Leaving`) finishes it too; nobody else's
        // ring waits on any other removed worker.
        let after_step = if removed && job.state == JobState::Recovering && job.member(worker_id).is_some() {
            job.quiesce_after
        } else {
            0
        };
        Some(Directive {
            directive: Some(directive::Directive::Stop(v1::StopWork { reason, removed, after_step })),
        })
    };
    if job.state.is_terminal() {
        return stop(format!("job {} is {:?}: {}", job.id, job.state, job.message), false);
    }
    match job.workers.get(worker_id) {
        None => return stop(format!("{worker_id} is not a worker of job {}", job.id), false),
        Some(w) if w.removed => {
            return stop(
                format!(
                    "{worker_id} was removed from job {} (generation {}); register again to rejoin",
                    job.id, job.generation
                ),
                true,
            );
        }
        Some(_) => {}
    }
    match job.state {
        JobState::Recovering => Some(Directive {
            directive: Some(directive::Directive::Quiesce(v1::Quiesce {
                generation: job.generation,
                reason: job.message.clone(),
                after_step: job.quiesce_after,
            })),
        }),
        JobState::Running => job
            .member(worker_id)
            .map(|m| Directive { directive: Some(directive::Directive::Assignment(assignment(job, m))) }),
        _ => None,
    }
}

/// A member's assignment.
pub fn assignment(job: &Job, member: &MemberPlan) -> v1::Assignment {
    use v1::resume::Source;
    let source = match &member.resume {
        ResumePlan::Fresh => Source::Fresh(v1::Fresh {}),
        ResumePlan::Keep => Source::Keep(v1::Keep {}),
        ResumePlan::FromCheckpoint { uri, step } => {
            Source::Checkpoint(v1::FromCheckpoint { uri: uri.clone(), step: *step })
        }
        ResumePlan::FromPeer { worker_id, data_addr, step } => Source::Peer(v1::FromPeer {
            worker_id: worker_id.clone(),
            data_addr: data_addr.clone(),
            step: *step,
        }),
    };
    v1::Assignment {
        job_id: job.id.clone(),
        generation: job.generation,
        slice: member.slice,
        virtual_ranks: member.virtual_ranks.clone(),
        dp_size: job.shape.dp_size,
        peers: job
            .members
            .iter()
            .map(|m| v1::Peer {
                worker_id: m.worker_id.clone(),
                data_addr: job.workers.get(&m.worker_id).map(|w| w.data_addr.clone()).unwrap_or_default(),
                virtual_ranks: m.virtual_ranks.clone(),
            })
            .collect(),
        spec_yaml: job.spec_yaml.clone(),
        bundle_uri: job.bundle_uri.clone(),
        bundle_id: job.bundle_id.clone(),
        checkpoint_uri: job.checkpoint_uri.clone(),
        start_step: job.start_step,
        resume: Some(v1::Resume { source: Some(source) }),
        save_id: job.save_id(),
        serve_to: job
            .members
            .iter()
            .filter(|m| {
                matches!(&m.resume, ResumePlan::FromPeer { worker_id, .. } if *worker_id == member.worker_id)
            })
            .map(|m| m.worker_id.clone())
            .collect(),
    }
}

/// Tells every worker of `job_id` with a session the directive now in force.
pub fn broadcast_in_force(ctx: &Ctx, job_id: &str) {
    let Some(job) = ctx.shared.read(|s| s.jobs.get(job_id).cloned()) else { return };
    ctx.leader.with(|m| {
        for worker_id in job.workers.keys() {
            m.tell(&job, worker_id);
        }
    });
}

/// The leader loop: runs until `shutdown` fires. On followers it only keeps the memory empty.
pub async fn run(ctx: Arc<Ctx>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(ctx.config.timeouts.tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = interval.tick() => {}
            () = ctx.leader.wake.notified() => {}
        }
        tick(&ctx).await;
    }
}

async fn tick(ctx: &Arc<Ctx>) {
    let metrics = ctx.raft.metrics().borrow().clone();
    if metrics.state != ServerState::Leader || metrics.current_leader != Some(ctx.id) {
        if ctx.leader.term().is_some() {
            // Lost the leadership: end every session so workers find the new leader.
            ctx.leader.with(|m| *m = LeaderState::default());
        }
        return;
    }
    let term = metrics.current_term;
    if ctx.leader.term() != Some(term) {
        // First tick of this term: apply everything committed before acting on it.
        if let Err(e) = ctx.raft.ensure_linearizable().await {
            tracing::info!("not ready to lead yet: {e}");
            return;
        }
        ctx.leader.with(|m| {
            *m = LeaderState::ready(term);
        });
        tracing::info!(id = ctx.id, term, "leading; every known worker gets one full lease");
    }
    let now = Instant::now();
    let jobs: Vec<String> = ctx
        .shared
        .read(|s| s.jobs.values().filter(|j| !j.state.is_terminal()).map(|j| j.id.clone()).collect());
    for job_id in jobs {
        if let Err(e) = tick_job(ctx, &job_id, now).await {
            tracing::warn!(job_id, "leader loop: {e}");
            return;
        }
    }
    start_retention(ctx, term, Instant::now());
}

/// Starts a retention run for every job due one, ended jobs included (a leader that died
/// between a job's final commit and its retention leaves the run to this one).
fn start_retention(ctx: &Arc<Ctx>, term: u64, now: Instant) {
    let lives: std::collections::BTreeMap<String, decide::RetentionLive> =
        ctx.leader.with(|m| m.jobs.iter().map(|(id, live)| (id.clone(), live.retention.clone())).collect());
    let due: Vec<Job> = ctx.shared.read(|s| {
        s.jobs
            .values()
            .filter(|job| {
                let live = decide::JobLive {
                    retention: lives.get(&job.id).cloned().unwrap_or_default(),
                    ..Default::default()
                };
                decide::retention_due(now, job, &live)
            })
            .cloned()
            .collect()
    });
    for job in due {
        let started = ctx.leader.with(|m| {
            if m.term != Some(term) {
                return false;
            }
            let retention = &mut m.jobs.entry(job.id.clone()).or_default().retention;
            // A commit while this run is under way asks for another.
            retention.wanted = false;
            retention.running = true;
            true
        });
        if !started {
            return;
        }
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let result = crate::jobs::apply_retention(&ctx, &job).await;
            match &result {
                Ok(report) if !report.plan.expire.is_empty() || !report.plan.orphans.is_empty() => {
                    let steps = |c: &[checkpoint::CommitRecord]| c.iter().map(|c| c.step).collect::<Vec<_>>();
                    tracing::info!(
                        job_id = job.id,
                        kept = ?steps(&report.plan.keep),
                        expired = ?steps(&report.plan.expire),
                        orphans = report.plan.orphans.len(),
                        "retention applied"
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(job_id = job.id, "{e}; retrying in {RETENTION_RETRY:?}"),
            }
            ctx.leader.with(|m| {
                if m.term != Some(term) {
                    return;
                }
                let retention = &mut m.jobs.entry(job.id.clone()).or_default().retention;
                retention.running = false;
                match result {
                    Ok(_) => {
                        retention.retry_at = None;
                        retention.failed = None;
                    }
                    Err(e) => {
                        retention.wanted = true;
                        retention.retry_at = Some(Instant::now() + RETENTION_RETRY);
                        retention.failed = Some(e.to_string());
                    }
                }
            });
            ctx.leader.wake.notify_one();
        });
    }
}

fn timing(ctx: &Ctx) -> Timing {
    let t = &ctx.config.timeouts;
    Timing {
        lease: t.lease,
        // A live worker may be a heartbeat interval silent while it waits in the all-reduce.
        suspect_after: t.suspect_after.max(t.heartbeat * 3 / 2),
        formation_wait: t.formation_wait,
        abandon_after: t.abandon_after,
        final_checkpoint_wait: t.final_checkpoint,
    }
}

async fn tick_job(ctx: &Arc<Ctx>, job_id: &str, now: Instant) -> Result<(), NotServing> {
    let Some(job) = ctx.shared.read(|s| s.jobs.get(job_id).cloned()) else { return Ok(()) };
    let timing = timing(ctx);
    let (commit, decision) = ctx.leader.with(|m| {
        let live = m.job_mut(&job, now);
        if job.state == JobState::Recovering && live.recovering_since.map(|(g, _)| g) != Some(job.generation)
        {
            live.recovering_since = Some((job.generation, now));
        }
        if job.committed_step >= job.shape.total_steps && live.finished_since.is_none() {
            live.finished_since = Some(now);
        }
        (decide::step_to_commit(&job, live), decide::decide_generation(now, &job, live, &timing))
    });
    if let Some(commit) = commit {
        let step = commit.step;
        let command = Command::CommitStep {
            job_id: job.id.clone(),
            generation: job.generation,
            commit,
            unix: unix_now(),
        };
        if ctx.propose(command).await? == Response::Applied {
            ctx.leader.with(|m| {
                if let Some(live) = m.jobs.get_mut(job_id) {
                    live.step_reports.retain(|&s, _| s > step);
                    live.committed(step, Instant::now());
                }
            });
            if ctx.shared.read(|s| s.jobs.get(job_id).is_some_and(|j| j.state.is_terminal())) {
                broadcast_in_force(ctx, job_id);
                return Ok(());
            }
        }
    }
    let unix = unix_now();
    let command = match decision {
        None => return Ok(()),
        Some(Decision::Begin { reason, removed, after_step }) => {
            tracing::info!(job_id, generation = job.generation + 1, after_step, "new generation: {reason}");
            Command::BeginGeneration {
                job_id: job.id.clone(),
                generation: job.generation + 1,
                reason,
                removed,
                after_step,
                unix,
            }
        }
        Some(Decision::Form(plan)) => {
            tracing::info!(
                job_id,
                generation = plan.generation,
                start_step = plan.start_step,
                "forming: {}",
                plan.reason
            );
            Command::NewGeneration {
                job_id: job.id.clone(),
                generation: plan.generation,
                start_step: plan.start_step,
                members: plan.members,
                carried: plan.carried,
                removed: plan.removed,
                reason: plan.reason,
                unix,
            }
        }
        Some(Decision::Complete { reason }) => Command::CompleteJob { job_id: job.id.clone(), reason, unix },
        Some(Decision::Fail { reason }) => Command::FailJob { job_id: job.id.clone(), reason, unix },
    };
    let begin = matches!(command, Command::BeginGeneration { .. });
    let formed_at = match &command {
        Command::NewGeneration { start_step, .. } => Some(*start_step),
        _ => None,
    };
    if ctx.propose(command).await? == Response::Applied {
        ctx.leader.with(|m| {
            if let Some(live) = m.jobs.get_mut(job_id) {
                if begin {
                    live.recovering_since = Some((job.generation + 1, Instant::now()));
                }
                // Reports up to the new start are committed or carried; the rest may still
                // be needed to carry steps into the next generation.
                if let Some(start) = formed_at {
                    live.step_reports.retain(|&s, _| s > start);
                }
            }
            if begin && let Some(saves) = m.saves.get_mut(job_id) {
                // Saves of an ended generation are never committed.
                saves.retain(|_, save| save.generation > job.generation);
            }
        });
        broadcast_in_force(ctx, job_id);
    }
    Ok(())
}

/// Records a step report; returns false when the leader memory is not ready (not leading).
pub fn record_step_report(ctx: &Ctx, job: &Job, worker_id: &str, step: u64, report: StepReportData) -> bool {
    let recorded = ctx.leader.with(|m| {
        if m.term.is_none() {
            return false;
        }
        let live = m.job_mut(job, Instant::now());
        live.step_reports.entry(step).or_default().insert(worker_id.to_string(), report);
        true
    });
    ctx.leader.wake.notify_one();
    recorded
}
