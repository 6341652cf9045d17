//! Workers: registration, the session, step and checkpoint reports, log lines.
//!
//! Every call needs the job's token (or the admin token) and, with TLS on, a client
//! certificate. Reports carry the generation and are refused when it is not the current one.

use super::{caller, find_job, require_client_cert, stale_generation};
use crate::ctx::Ctx;
use crate::decide::{Cause, MAX_STEPS_AHEAD, Out, StepReportData, finishes_step_before_leaving};
use crate::jobs::SaveReport;
use crate::leader::{directive_in_force, record_step_report, unix_now};
use crate::logs::LogRecord;
use crate::memory::{Delivery, Outbox};
use crate::state::{Command, Job, JobState, RegisterWorker, Response as Applied, WorkerRecord};
use prost::Message;
use proto::v1::workers_server::Workers;
use proto::v1::{
    CheckpointAck, CheckpointReport, Directive, FailureKind, HeartbeatAck, LogLine, PushLogsResponse,
    RegisterRequest, RegisterResponse, StepAck, StepReport, WorkerEvent, directive, worker_event,
};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// The `Workers` service.
pub struct WorkersService(pub Arc<Ctx>);

/// Directives queued per session before the session is dropped.
const SESSION_BUFFER: usize = 64;
/// A host report or save spec larger than this (encoded) is refused: the leader holds one of
/// each per member until the save commits.
const MAX_REPORT_PART: usize = 1 << 20;

type DirectiveStream = Pin<Box<dyn Stream<Item = Result<Directive, Status>> + Send>>;

/// The job a worker belongs to, checked against the caller's token.
fn worker_job(ctx: &Ctx, who: &super::Caller, worker_id: &str) -> Result<Job, Status> {
    let job = ctx.shared.read(|s| s.job_of_worker(worker_id).cloned()).ok_or_else(|| {
        Status::not_found(format!("no worker '{worker_id}'; register first (Workers.Register)"))
    })?;
    who.require_job(&job.id)?;
    Ok(job)
}

/// A step report: as [`check_report`], and while a quiesce lets the members finish the steps up
/// to its boundary, the ending generation's reports of those steps too (they are carried into
/// the next generation with their losses).
fn check_step_report(job: &Job, worker_id: &str, generation: u64, step: u64) -> Result<(), Status> {
    let finishing =
        job.state == JobState::Recovering && generation + 1 == job.generation && step <= job.quiesce_after;
    if finishing && job.member(worker_id).is_some() {
        return Ok(());
    }
    check_report(job, worker_id, generation)
}

/// Checks a report's job, worker and generation against the running generation.
fn check_report(job: &Job, worker_id: &str, generation: u64) -> Result<(), Status> {
    if generation != job.generation {
        return Err(stale_generation(generation, job.generation));
    }
    if job.state != JobState::Running {
        return Err(Status::failed_precondition(format!(
            "job {} is {:?}, not running: {}",
            job.id, job.state, job.message
        )));
    }
    if job.member(worker_id).is_none() {
        return Err(Status::failed_precondition(format!(
            "{worker_id} is not a member of generation {} of job {}",
            job.generation, job.id
        )));
    }
    Ok(())
}

/// A session's queue of directives, as the leader's memory tells it what is in force.
#[derive(Debug)]
struct SessionOutbox(mpsc::Sender<Directive>);

impl Outbox for SessionOutbox {
    fn tell(&self, job: &Job, worker_id: &str) -> Delivery {
        let Some(directive) = directive_in_force(job, worker_id) else { return Delivery::Queued };
        match self.0.try_send(directive) {
            Ok(()) => Delivery::Queued,
            Err(mpsc::error::TrySendError::Full(_)) => Delivery::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Closed,
        }
    }
}

fn ack(seq: u64, generation: u64) -> Directive {
    Directive { directive: Some(directive::Directive::Ack(HeartbeatAck { seq, generation })) }
}

impl WorkersService {
    /// Handles one event of a session; returns a directive to send back at once, if any.
    fn on_event(&self, worker_id: &str, event: WorkerEvent) -> Result<Vec<Directive>, Status> {
        let ctx = &self.0;
        let gone = || Status::not_found(format!("worker {worker_id} is gone"));
        let now = Instant::now();
        let mut out = Vec::new();
        // Heartbeats are the hot path (one per worker per second): they read a few numbers of
        // the job, not a copy of it.
        let job = match &event.event {
            Some(worker_event::Event::Heartbeat(_)) => None,
            _ => Some(ctx.shared.read(|s| s.job_of_worker(worker_id).cloned()).ok_or_else(gone)?),
        };
        match event.event {
            Some(worker_event::Event::Heartbeat(hb)) => {
                let (job_id, generation, state, committed_step, start_step) = ctx
                    .shared
                    .read(|s| {
                        s.job_of_worker(worker_id)
                            .map(|j| (j.id.clone(), j.generation, j.state, j.committed_step, j.start_step))
                    })
                    .ok_or_else(gone)?;
                if hb.worker_id != worker_id {
                    return Err(Status::invalid_argument(format!(
                        "the session is {worker_id}'s; a heartbeat names {}",
                        hb.worker_id
                    )));
                }
                if hb.generation > generation {
                    return Err(stale_generation(hb.generation, generation));
                }
                if hb.steps_done > committed_step.max(start_step) + MAX_STEPS_AHEAD {
                    return Err(Status::out_of_range(format!(
                        "steps_done {} is more than {MAX_STEPS_AHEAD} steps ahead of the committed step {committed_step}",
                        hb.steps_done
                    )));
                }
                let answers_quiesce = ctx.leader.with(|m| {
                    let w = m.worker_mut(&job_id, worker_id, now);
                    let was = w.generation;
                    w.last_seen = now;
                    w.generation = hb.generation;
                    w.steps_done = hb.steps_done;
                    w.phase = hb.phase.clone();
                    state == JobState::Recovering && hb.generation == generation && was != hb.generation
                });
                if answers_quiesce {
                    ctx.leader.wake.notify_one();
                }
                out.push(ack(hb.seq, generation));
                // A worker behind the current generation (reconnected, or missed a directive)
                // is told what is in force; stale heartbeats keep the session but count for
                // nothing else.
                if hb.generation < generation || state.is_terminal() {
                    // Spares beat with generation 0 every second: read in place, no job copy.
                    out.extend(
                        ctx.shared.read(|s| {
                            s.job_of_worker(worker_id).and_then(|j| directive_in_force(j, worker_id))
                        }),
                    );
                }
            }
            Some(worker_event::Event::Preempted(p)) => {
                let job = job.ok_or_else(gone)?;
                let deadline = std::time::Duration::from_millis(p.deadline_ms);
                ctx.leader.with(|m| {
                    let live = m.job_mut(&job, now);
                    let finishes = p.finishes_step && finishes_step_before_leaving(deadline, live.step_time);
                    tracing::info!(worker_id, finishes_step = finishes, "preempted: {}", p.reason);
                    if let Some(w) = live.workers.get_mut(worker_id) {
                        let reason = p.reason.clone();
                        w.out = Some(if finishes { Out::Leaving(reason) } else { Out::Preempted(reason) });
                    }
                });
                ctx.leader.wake.notify_one();
            }
            Some(worker_event::Event::Failed(f)) => {
                let job = job.ok_or_else(gone)?;
                if f.generation < job.generation {
                    tracing::info!(
                        worker_id,
                        "ignoring a failure of generation {} (current {})",
                        f.generation,
                        job.generation
                    );
                    return Ok(out);
                }
                let cause = cause(&f);
                tracing::info!(worker_id, ?cause, "failed: {}", f.reason);
                if let Cause::Checkpoint(uri) = &cause
                    && job.checkpoints.iter().any(|c| &c.uri == uri)
                {
                    // The checkpoint leaves the catalog before the worker counts as failed, so the
                    // generation planned next restores an older one.
                    let ctx = ctx.clone();
                    let worker_id = worker_id.to_string();
                    let uri = uri.clone();
                    tokio::spawn(async move {
                        let command = Command::PassOverCheckpoint {
                            job_id: job.id.clone(),
                            uri: uri.clone(),
                            reason: f.reason.clone(),
                            unix: unix_now(),
                        };
                        if let Err(e) = ctx.propose(command).await {
                            tracing::warn!(job_id = job.id, "cannot pass over {uri}: {e}");
                        }
                        mark_failed(&ctx, &job, &worker_id, cause, f.reason);
                    });
                    return Ok(out);
                }
                mark_failed(ctx, &job, worker_id, cause, f.reason);
            }
            None => return Err(Status::invalid_argument("an empty WorkerEvent")),
        }
        Ok(out)
    }
}

/// What a worker's failure report says happened, by its kind (by the fields it names, from a
/// worker older than `kind`).
fn cause(f: &proto::v1::Failed) -> Cause {
    let named = |field: &String| (!field.is_empty()).then(|| field.clone());
    match FailureKind::try_from(f.kind).unwrap_or(FailureKind::Unspecified) {
        FailureKind::Own => Cause::Own,
        FailureKind::Job => Cause::Job,
        FailureKind::Peer => named(&f.suspect_worker_id).map_or(Cause::Own, Cause::Peer),
        FailureKind::Checkpoint => named(&f.corrupt_checkpoint).map_or(Cause::Own, Cause::Checkpoint),
        FailureKind::Unspecified => match (named(&f.corrupt_checkpoint), named(&f.suspect_worker_id)) {
            (Some(uri), _) => Cause::Checkpoint(uri),
            (None, Some(suspect)) => Cause::Peer(suspect),
            (None, None) => Cause::Own,
        },
    }
}

/// Marks a worker that reported a failure (or the peer it suspects) out of the generation.
fn mark_failed(ctx: &Ctx, job: &Job, worker_id: &str, cause: Cause, reason: String) {
    let now = Instant::now();
    ctx.leader.with(|m| {
        let live = m.job_mut(job, now);
        let (whom, out) = match cause {
            Cause::Peer(suspect) if suspect != worker_id && live.workers.contains_key(&suspect) => {
                (suspect, Out::Suspected { by: worker_id.to_string(), reason })
            }
            Cause::Job => (worker_id.to_string(), Out::Unrunnable(reason)),
            Cause::Own | Cause::Peer(_) | Cause::Checkpoint(_) => {
                (worker_id.to_string(), Out::Failed(reason))
            }
        };
        if let Some(w) = live.workers.get_mut(&whom) {
            w.out = Some(out);
        }
    });
    ctx.leader.wake.notify_one();
}

#[tonic::async_trait]
impl Workers for WorkersService {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let ctx = &self.0;
        require_client_cert(ctx, &request, "Workers")?;
        let who = caller(ctx, &request)?;
        ctx.require_leader()?;
        let r = request.into_inner();
        let job = find_job(ctx, &who, &r.job_id)?;
        if job.id != r.job_id {
            return Err(Status::invalid_argument(format!(
                "register with the job id ({}), not its name",
                job.id
            )));
        }
        if r.instance_id.is_empty() || r.data_addr.is_empty() {
            return Err(Status::invalid_argument("instance_id and data_addr must be set"));
        }
        let record = WorkerRecord {
            host: r.host,
            data_addr: r.data_addr,
            devices: r.devices,
            platform: r.platform,
            slice: r.slice,
            instance_id: r.instance_id,
            registered_unix: unix_now(),
            removed: false,
        };
        let command = Command::RegisterWorker(Box::new(RegisterWorker { job_id: job.id.clone(), record }));
        let worker_id = match ctx.propose(command).await? {
            Applied::WorkerRegistered { worker_id } => worker_id,
            Applied::Refused { why, reason } => return Err(super::refused_by_state(why, reason)),
            other => return Err(Status::internal(format!("unexpected answer to a registration: {other:?}"))),
        };
        if let Some(job) = ctx.shared.read(|s| s.jobs.get(&job.id).cloned()) {
            ctx.leader.with(|m| {
                m.job_mut(&job, Instant::now());
            });
        }
        ctx.leader.wake.notify_one();
        let t = &ctx.config.timeouts;
        Ok(Response::new(RegisterResponse {
            worker_id,
            lease_ms: t.lease.as_millis() as u64,
            heartbeat_ms: t.heartbeat.as_millis() as u64,
        }))
    }

    type SessionStream = DirectiveStream;

    async fn session(
        &self,
        request: Request<Streaming<WorkerEvent>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let ctx = self.0.clone();
        require_client_cert(&ctx, &request, "Workers")?;
        let who = caller(&ctx, &request)?;
        ctx.require_leader()?;
        let mut events = request.into_inner();
        // The first event names the worker.
        let first = tokio::time::timeout(ctx.config.timeouts.lease, events.next())
            .await
            .map_err(|_| Status::deadline_exceeded("no first event within a lease; send a heartbeat first"))?
            .ok_or_else(|| Status::cancelled("the session ended before its first event"))??;
        let worker_id = match &first.event {
            Some(worker_event::Event::Heartbeat(h)) => h.worker_id.clone(),
            Some(worker_event::Event::Preempted(p)) => p.worker_id.clone(),
            Some(worker_event::Event::Failed(f)) => f.worker_id.clone(),
            None => return Err(Status::invalid_argument("an empty WorkerEvent")),
        };
        // A leader deposed without knowing it yet must not answer "no such worker" for one
        // its successor just registered.
        super::linearizable(&ctx).await?;
        let job = worker_job(&ctx, &who, &worker_id)?;
        let sessions = ctx.leader.with(|m| m.sessions.len());
        if sessions >= ctx.config.max_sessions {
            return Err(Status::resource_exhausted(format!("{sessions} sessions are open, the limit")));
        }
        let (tx, rx) = mpsc::channel(SESSION_BUFFER);
        // Why the session ended, when it ended on an error: sent after the directives queued.
        let (end_tx, end_rx) = oneshot::channel::<Status>();
        let session_id = ctx.leader.with(|m| m.open_session(&worker_id, Arc::new(SessionOutbox(tx.clone()))));
        // What is in force now (a reconnect after a leader change, a quiesce in progress).
        if let Some(directive) = directive_in_force(&job, &worker_id) {
            let _ = tx.try_send(directive);
        }
        let service = WorkersService(ctx.clone());
        let lease = ctx.config.timeouts.lease;
        tokio::spawn(async move {
            let mut next = Some(Ok(first));
            loop {
                let event = match next.take() {
                    Some(event) => event,
                    None => match tokio::time::timeout(lease * 2, events.next()).await {
                        Ok(Some(event)) => event,
                        // Ended, or silent for two leases: the lease logic takes it from here.
                        Ok(None) | Err(_) => break,
                    },
                };
                let result = event.and_then(|e| service.on_event(&worker_id, e));
                let still_leader = ctx.require_leader().map_err(Status::from);
                match (result, still_leader) {
                    (_, Err(status)) | (Err(status), _) => {
                        let _ = end_tx.send(status);
                        break;
                    }
                    (Ok(directives), Ok(())) => {
                        for d in directives {
                            match tx.try_send(d) {
                                Ok(()) => {}
                                Err(mpsc::error::TrySendError::Full(_)) => {
                                    tracing::warn!(worker_id, "session does not keep up; closing it");
                                    ctx.leader.with(|m| m.close_session(&worker_id, session_id));
                                    return;
                                }
                                // The worker hung up (it left once told the job is done): nothing
                                // is wrong, the session just ends.
                                Err(mpsc::error::TrySendError::Closed(_)) => {
                                    tracing::debug!(worker_id, "the worker closed its session");
                                    ctx.leader.with(|m| m.close_session(&worker_id, session_id));
                                    return;
                                }
                            }
                        }
                    }
                }
            }
            ctx.leader.with(|m| m.close_session(&worker_id, session_id));
        });
        // The stream ends once the task and the leader's memory let go of the session.
        let ended = futures::stream::once(end_rx).filter_map(|end| end.ok().map(Err));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx).map(Ok).chain(ended))))
    }

    async fn report_step(&self, request: Request<StepReport>) -> Result<Response<StepAck>, Status> {
        let ctx = &self.0;
        require_client_cert(ctx, &request, "Workers")?;
        let who = caller(ctx, &request)?;
        ctx.require_leader()?;
        let r = request.into_inner();
        let job = worker_job(ctx, &who, &r.worker_id)?;
        if job.id != r.job_id {
            return Err(Status::permission_denied(format!(
                "{} is not a worker of job {}",
                r.worker_id, r.job_id
            )));
        }
        check_step_report(&job, &r.worker_id, r.generation, r.step)?;
        if r.step == 0 {
            return Err(Status::invalid_argument(
                "step 0 is not a step; report the step just applied (1-based)",
            ));
        }
        if r.step > job.committed_step + MAX_STEPS_AHEAD {
            return Err(Status::out_of_range(format!(
                "step {} is more than {MAX_STEPS_AHEAD} steps ahead of the committed step {}",
                r.step, job.committed_step
            )));
        }
        if r.step > job.committed_step {
            let report = StepReportData {
                loss_sum: r.loss_sum,
                token_count: r.token_count,
                grad_norm: r.grad_norm,
                step_seconds: r.step_seconds,
                tokens: r.tokens,
                metrics: r.metrics.into_iter().collect(),
            };
            if !record_step_report(ctx, &job, &r.worker_id, r.step, report) {
                return Err(super::not_leader(ctx.leader().map(|(_, a)| a)));
            }
        }
        // Answer once the step is committed, the generation changes, or the wait ends.
        let deadline = tokio::time::Instant::now() + ctx.config.timeouts.report_wait;
        let mut applied = ctx.shared.applied.subscribe();
        loop {
            let (committed, generation, state) = ctx
                .shared
                .read(|s| s.jobs.get(&job.id).map(|j| (j.committed_step, j.generation, j.state)))
                .ok_or_else(|| Status::not_found("the job vanished"))?;
            if committed >= r.step || generation != r.generation || state.is_terminal() {
                return Ok(Response::new(StepAck { committed_step: committed, generation }));
            }
            match tokio::time::timeout_at(deadline, applied.changed()).await {
                Ok(Ok(())) => ctx.require_leader()?,
                Ok(Err(_)) => return Err(Status::unavailable("the node is shutting down; retry")),
                Err(_) => return Ok(Response::new(StepAck { committed_step: committed, generation })),
            }
        }
    }

    async fn report_checkpoint(
        &self,
        request: Request<CheckpointReport>,
    ) -> Result<Response<CheckpointAck>, Status> {
        let ctx = self.0.clone();
        require_client_cert(&ctx, &request, "Workers")?;
        let who = caller(&ctx, &request)?;
        ctx.require_leader()?;
        let r = request.into_inner();
        let job = worker_job(&ctx, &who, &r.worker_id)?;
        if job.id != r.job_id {
            return Err(Status::permission_denied(format!(
                "{} is not a worker of job {}",
                r.worker_id, r.job_id
            )));
        }
        check_report(&job, &r.worker_id, r.generation)?;
        let (Some(report), Some(spec)) = (r.host_report, r.save_spec) else {
            return Err(Status::invalid_argument("a checkpoint report needs host_report and save_spec"));
        };
        for (field, len) in [("host_report", report.encoded_len()), ("save_spec", spec.encoded_len())] {
            if len > MAX_REPORT_PART {
                return Err(Status::invalid_argument(format!(
                    "{field} is {len} bytes; a checkpoint report part may have {MAX_REPORT_PART}"
                )));
            }
        }
        let invalid = |e: client::checkpoint::WireError| Status::invalid_argument(e.to_string());
        let report = client::checkpoint::host_report_from_wire(report).map_err(invalid)?;
        let spec = client::checkpoint::save_spec_from_wire(spec).map_err(invalid)?;
        if report.step != r.step
            || spec.step != r.step
            || report.save_id != r.save_id
            || spec.save_id != r.save_id
        {
            return Err(Status::invalid_argument(format!(
                "the report is for step {} save '{}', the host report for step {} save '{}', the spec for step {} save '{}'",
                r.step, r.save_id, report.step, report.save_id, spec.step, spec.save_id
            )));
        }
        let part = SaveReport { worker_id: r.worker_id, report, spec };
        let (job_id, step, save_id) = (job.id.clone(), r.step, r.save_id);
        if let Some(uri) = crate::jobs::report_checkpoint(&ctx, job, part).await? {
            return Ok(Response::new(CheckpointAck { committed: true, uri }));
        }
        // Parts are missing, and they live only in this leader's memory: answer once the save
        // commits, the generation changes, or the wait ends. A member told "not yet" reports
        // again, so a leader that dies holding its part loses nothing (the next one hears it).
        let deadline = tokio::time::Instant::now() + ctx.config.timeouts.report_wait;
        let mut applied = ctx.shared.applied.subscribe();
        loop {
            let (uri, generation, state) = ctx
                .shared
                .read(|s| {
                    s.jobs.get(&job_id).map(|j| {
                        let done = j
                            .checkpoints
                            .iter()
                            .find(|c| c.record.step == step && c.record.save_id == save_id);
                        (done.map(|c| c.uri.clone()), j.generation, j.state)
                    })
                })
                .ok_or_else(|| Status::not_found("the job vanished"))?;
            if let Some(uri) = uri {
                return Ok(Response::new(CheckpointAck { committed: true, uri }));
            }
            if generation != r.generation || state.is_terminal() {
                return Ok(Response::new(CheckpointAck { committed: false, uri: String::new() }));
            }
            match tokio::time::timeout_at(deadline, applied.changed()).await {
                Ok(Ok(())) => ctx.require_leader()?,
                Ok(Err(_)) => return Err(Status::unavailable("the node is shutting down; retry")),
                Err(_) => return Ok(Response::new(CheckpointAck { committed: false, uri: String::new() })),
            }
        }
    }

    async fn push_logs(
        &self,
        request: Request<Streaming<LogLine>>,
    ) -> Result<Response<PushLogsResponse>, Status> {
        let ctx = &self.0;
        require_client_cert(ctx, &request, "Workers")?;
        let who = caller(ctx, &request)?;
        ctx.require_leader()?;
        let mut lines = request.into_inner();
        let idle = ctx.config.timeouts.lease * 10;
        let mut jobs = std::collections::BTreeSet::new();
        while let Some(line) = tokio::time::timeout(idle, lines.next())
            .await
            .map_err(|_| Status::deadline_exceeded("no log line for 10 leases; open a new stream"))?
        {
            let line = line?;
            who.require_job(&line.job_id)?;
            jobs.insert(line.job_id.clone());
            ctx.logs.push(line);
        }
        // Answered once the lines are in the run record: a worker whose push fails offers them
        // again, so a leader change loses none.
        for job_id in jobs {
            let job = ctx.shared.read(|s| s.jobs.get(&job_id).cloned());
            if let Some(uri) = job.and_then(|job| LogRecord::location(&job, ctx.config.record_runs)) {
                ctx.logs.write(&job_id, &uri, &ctx.config.store_options, ctx.id).await;
            }
        }
        Ok(Response::new(PushLogsResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::{form, member, register, submit};
    use crate::state::{ClusterState, Command};

    #[test]
    fn the_steps_up_to_a_quiesces_boundary_are_reported_by_the_generation_that_ends() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 2, 10);
        let (a, b) = (register(&mut state, &job, "a"), register(&mut state, &job, "b"));
        form(&mut state, &job, 1, vec![member(&a, vec![0]), member(&b, vec![1])]);
        let begin = |after_step| Command::BeginGeneration {
            job_id: job.clone(),
            generation: 2,
            reason: "replacement joined".into(),
            removed: vec![],
            after_step,
            unix: 1.0,
        };
        let mut finishing = state.clone();
        finishing.apply(begin(4));
        let j = &finishing.jobs[&job];
        assert!(check_step_report(j, &a, 1, 4).is_ok(), "the boundary's step is finished");
        assert!(check_step_report(j, &a, 1, 5).is_err(), "past the boundary");
        assert!(check_step_report(j, &a, 1, 4).is_ok() && check_report(j, &a, 1).is_err(), "not a save");
        assert!(check_step_report(j, "stranger", 1, 4).is_err());
        // A quiesce at once (a member lost): nothing of the old generation counts any more.
        state.apply(begin(0));
        assert!(check_step_report(&state.jobs[&job], &a, 1, 1).is_err());
    }
}
