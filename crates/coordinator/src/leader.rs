//! The leader's memory and its loop.
//!
//! Heartbeats, leases, worker sessions, pending step and checkpoint reports live here, in the
//! leader's memory only: they change every second per worker, and losing them with the leader
//! costs nothing that matters (a new leader grants every known worker one full lease before it
//! counts one as lost, and workers resend what was not acknowledged). The loop looks at every
//! live job on a tick and whenever a heartbeat or report may have changed a decision, calls the
//! pure functions of [`crate::decide`], proposes what they return through Raft, and then tells
//! every worker with a session the directive now in force.

use crate::decide::{self, Decision, JobLive, StepReportData, Timing, WorkerLive};
use crate::node::Ctx;
use crate::state::{CheckpointEntry, Command, Job, JobState, MemberPlan, Response, ResumePlan};
use checkpoint::{CheckpointError, CommitLog, CommitRecord, HostReport, SaveSpec};
use openraft::ServerState;
use proto::v1::{self, Directive, directive};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{Notify, mpsc};
use tonic::Status;

/// Seconds since the Unix epoch, for the timestamps the leader puts in commands.
pub fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The sending half of a worker's session.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    /// Distinguishes a reconnected session from the one it replaced.
    pub id: u64,
    /// Directives to the worker (bounded: a worker that does not read is dropped).
    pub tx: mpsc::Sender<Result<Directive, Status>>,
}

/// A save whose host reports are coming in.
#[derive(Debug, Clone)]
pub struct PendingSave {
    /// The generation that saves it.
    pub generation: u64,
    /// Its spec, the same from every member.
    pub spec: SaveSpec,
    /// Host reports by worker.
    pub reports: BTreeMap<String, HostReport>,
}

/// Everything the leader keeps in memory.
#[derive(Debug, Default)]
pub struct LeaderState {
    /// The term this memory belongs to; `None` until the leader has caught up with the log.
    pub term: Option<u64>,
    /// Per job: workers' liveness and pending step reports.
    pub jobs: BTreeMap<String, JobLive>,
    /// Open sessions by worker id.
    pub sessions: HashMap<String, SessionHandle>,
    /// Saves being reported, by job then (step, save id).
    pub saves: BTreeMap<String, BTreeMap<(u64, String), PendingSave>>,
    next_session: u64,
}

impl LeaderState {
    /// The job's live view, with every active worker present (a worker the leader has not seen
    /// yet gets a lease starting now).
    pub fn job_mut(&mut self, job: &Job, now: Instant) -> &mut JobLive {
        let live = self.jobs.entry(job.id.clone()).or_default();
        for (id, _) in job.active_workers() {
            live.workers.entry(id.clone()).or_insert_with(|| WorkerLive::new(now));
        }
        live
    }

    /// One worker's live view (a worker the leader has not seen yet gets a lease from now).
    pub fn worker_mut(&mut self, job_id: &str, worker_id: &str, now: Instant) -> &mut WorkerLive {
        if !self.jobs.contains_key(job_id) {
            self.jobs.insert(job_id.to_string(), JobLive::default());
        }
        let live = self.jobs.get_mut(job_id).expect("inserted above");
        if !live.workers.contains_key(worker_id) {
            live.workers.insert(worker_id.to_string(), WorkerLive::new(now));
        }
        live.workers.get_mut(worker_id).expect("inserted above")
    }

    /// Registers a session, replacing an older one of the same worker.
    pub fn open_session(&mut self, worker_id: &str, tx: mpsc::Sender<Result<Directive, Status>>) -> u64 {
        self.next_session += 1;
        self.sessions.insert(worker_id.to_string(), SessionHandle { id: self.next_session, tx });
        self.next_session
    }

    /// Forgets a session if it is still the one registered under `id`.
    pub fn close_session(&mut self, worker_id: &str, id: u64) {
        if self.sessions.get(worker_id).is_some_and(|s| s.id == id) {
            self.sessions.remove(worker_id);
        }
    }

    /// Sends a directive to a worker's session, dropping the session if it does not keep up.
    pub fn send(&mut self, worker_id: &str, directive: Directive) {
        if let Some(session) = self.sessions.get(worker_id)
            && session.tx.try_send(Ok(directive)).is_err()
        {
            tracing::warn!(worker_id, "session does not keep up with directives; closing it");
            self.sessions.remove(worker_id);
        }
    }
}

/// The leader's memory, shared by the loop and the services.
#[derive(Debug, Default)]
pub struct LeaderMemory {
    state: Mutex<LeaderState>,
    /// Wakes the loop early (a heartbeat answered a quiesce, a report completed a step).
    pub wake: Notify,
}

impl LeaderMemory {
    /// Runs `f` on the memory; keep it short and never hold it across an await.
    pub fn with<T>(&self, f: impl FnOnce(&mut LeaderState) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The term the memory is ready for.
    pub fn term(&self) -> Option<u64> {
        self.with(|m| m.term)
    }
}

/// The directive in force for a worker: what a worker that reconnects or lags is told.
pub fn directive_in_force(job: &Job, worker_id: &str) -> Option<Directive> {
    let stop = |reason: String, removed: bool| {
        Some(Directive { directive: Some(directive::Directive::Stop(v1::StopWork { reason, removed })) })
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
    }
}

/// Tells every worker of `job_id` with a session the directive now in force.
pub fn broadcast_in_force(ctx: &Ctx, job_id: &str) {
    let Some(job) = ctx.shared.read(|s| s.jobs.get(job_id).cloned()) else { return };
    ctx.leader.with(|m| {
        for worker_id in job.workers.keys() {
            if m.sessions.contains_key(worker_id)
                && let Some(directive) = directive_in_force(&job, worker_id)
            {
                m.send(worker_id, directive);
            }
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
            *m = LeaderState { term: Some(term), ..LeaderState::default() };
        });
        tracing::info!(id = ctx.id, term, "leading; every known worker gets one full lease");
    }
    let now = Instant::now();
    let jobs: Vec<String> = ctx
        .shared
        .read(|s| s.jobs.values().filter(|j| !j.state.is_terminal()).map(|j| j.id.clone()).collect());
    for job_id in jobs {
        if let Err(status) = tick_job(ctx, &job_id, now).await {
            tracing::warn!(job_id, "leader loop: {}", status.message());
            return;
        }
    }
}

fn timing(ctx: &Ctx) -> Timing {
    let t = &ctx.config.timeouts;
    Timing {
        lease: t.lease,
        formation_wait: t.formation_wait,
        abandon_after: t.abandon_after,
        final_checkpoint_wait: t.final_checkpoint,
    }
}

async fn tick_job(ctx: &Arc<Ctx>, job_id: &str, now: Instant) -> Result<(), Status> {
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
        Some(Decision::Begin { reason, removed }) => {
            tracing::info!(job_id, generation = job.generation + 1, "new generation: {reason}");
            Command::BeginGeneration {
                job_id: job.id.clone(),
                generation: job.generation + 1,
                reason,
                removed,
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

/// The checkpoint crate's commit log over Raft: a commit is durable once the
/// `CommitCheckpoint` entry is applied, and it is refused when the generation that saved it
/// has ended.
pub struct RaftCommitLog {
    /// The node.
    pub ctx: Arc<Ctx>,
    /// The job.
    pub job_id: String,
    /// The generation that saved.
    pub generation: u64,
    /// The checkpoint root URL.
    pub root: String,
    /// Bytes of the save's objects.
    pub bytes: u64,
}

fn commit_log_error(operation: &'static str, reason: String) -> CheckpointError {
    CheckpointError::CommitLog { operation, source: reason.into() }
}

impl CommitLog for RaftCommitLog {
    async fn record(&self, commit: &CommitRecord) -> checkpoint::Result<()> {
        let entry = CheckpointEntry {
            record: commit.clone(),
            uri: format!("{}/{}", self.root.trim_end_matches('/'), commit.dir()),
            committed_unix: unix_now(),
            bytes: self.bytes,
        };
        let command =
            Command::CommitCheckpoint { job_id: self.job_id.clone(), generation: self.generation, entry };
        match self.ctx.propose(command).await {
            Ok(Response::Refused { reason }) => Err(commit_log_error("record", reason)),
            Ok(_) => Ok(()),
            Err(status) => Err(commit_log_error("record", status.message().to_string())),
        }
    }

    async fn list(&self) -> checkpoint::Result<Vec<CommitRecord>> {
        Ok(self.ctx.shared.read(|s| {
            s.jobs
                .get(&self.job_id)
                .map(|j| j.checkpoints.iter().map(|c| c.record.clone()).collect())
                .unwrap_or_default()
        }))
    }

    async fn remove(&self, commit: &CommitRecord) -> checkpoint::Result<()> {
        let command = Command::ForgetCheckpoint {
            job_id: self.job_id.clone(),
            step: commit.step,
            save_id: commit.save_id.clone(),
        };
        match self.ctx.propose(command).await {
            Ok(Response::Refused { reason }) => Err(commit_log_error("remove", reason)),
            Ok(_) => Ok(()),
            Err(status) => Err(commit_log_error("remove", status.message().to_string())),
        }
    }
}
