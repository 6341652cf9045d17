//! Jobs: what podctl submits, watches and stops.

use super::{Caller, caller, find_job, linearizable};
use crate::ctx::Ctx;
use crate::decide::{JobLive, Out};
use crate::logs::LogRecord;
use crate::state::{self, Job};
use proto::v1::jobs_server::Jobs;
use proto::v1::{
    CheckpointInfo, CheckpointList, Event, GetJobRequest, JobState, JobStatus, ListJobsRequest,
    ListJobsResponse, LogLine, LogsRequest, SliceStatus, StopJobRequest, StopJobResponse, SubmitJobRequest,
    SubmitJobResponse, WatchJobRequest,
};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The `Jobs` service.
pub struct JobsService(pub Arc<Ctx>);

/// Statuses or lines queued for one streaming client.
const STREAM_BUFFER: usize = 64;
/// Shortest watch interval honoured.
const MIN_WATCH_INTERVAL: Duration = Duration::from_millis(100);

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn health(
    now: Instant,
    live: Option<&crate::decide::WorkerLive>,
    lease: Duration,
    heartbeat: Duration,
) -> (String, f64) {
    let Some(w) = live else { return ("unknown".into(), 0.0) };
    let age = now.saturating_duration_since(w.last_seen);
    let health = match &w.out {
        Some(Out::Preempted(_) | Out::Leaving(_)) => "preempted",
        Some(_) => "lost",
        None if age > lease => "lost",
        None if age > heartbeat * 2 => "late",
        None if matches!(w.phase.as_str(), "loading" | "compiling" | "syncing") => "joining",
        None => "ok",
    };
    (health.into(), age.as_secs_f64())
}

/// A job's status as podctl shows it; slices come from the leader's memory.
pub fn job_status(ctx: &Ctx, job: &Job, live: Option<&JobLive>) -> JobStatus {
    let now = Instant::now();
    let t = &ctx.config.timeouts;
    let worker_live = |id: &str| live.and_then(|l| l.workers.get(id));
    let mut slices: Vec<SliceStatus> = job
        .members
        .iter()
        .map(|m| {
            let (health, age) = health(now, worker_live(&m.worker_id), t.lease, t.heartbeat);
            SliceStatus {
                slice: m.slice,
                worker_id: m.worker_id.clone(),
                host: job.workers.get(&m.worker_id).map(|w| w.host.clone()).unwrap_or_default(),
                virtual_ranks: m.virtual_ranks.clone(),
                health,
                step: worker_live(&m.worker_id).map_or(0, |w| w.steps_done),
                heartbeat_age_seconds: age,
            }
        })
        .collect();
    // Registered workers that are not members: spares, or joiners before their first generation.
    for (id, w) in job.active_workers().filter(|(id, _)| job.member(id).is_none()) {
        let (health, age) = health(now, worker_live(id), t.lease, t.heartbeat);
        slices.push(SliceStatus {
            slice: slices.len() as u32,
            worker_id: id.clone(),
            host: w.host.clone(),
            virtual_ranks: vec![],
            health: if health == "ok" { "spare".into() } else { health },
            step: worker_live(id).map_or(0, |w| w.steps_done),
            heartbeat_age_seconds: age,
        });
    }
    let last = job.last_step.clone().unwrap_or_default();
    JobStatus {
        job_id: job.id.clone(),
        name: job.shape.name.clone(),
        state: JobState::from(job.state) as i32,
        message: job.message.clone(),
        generation: job.generation,
        step: job.committed_step,
        total_steps: job.shape.total_steps,
        loss: last.loss.unwrap_or(f64::NAN),
        tokens_per_second: last.tokens_per_second,
        step_seconds: last.step_seconds,
        mfu: last.metrics.get("mfu").copied().unwrap_or(0.0),
        slices,
        last_checkpoint: job.last_checkpoint().map(checkpoint_info),
        events: job
            .events
            .iter()
            .map(|e| Event {
                unix_seconds: e.unix,
                kind: e.kind.clone(),
                step: e.step,
                detail: e.detail.clone(),
            })
            .collect(),
        leader: ctx.label(),
        metrics: last.metrics.into_iter().collect(),
        bundle_uri: job.bundle_uri.clone(),
        bundle_id: job.bundle_id.clone(),
    }
}

fn checkpoint_info(c: &state::CheckpointEntry) -> CheckpointInfo {
    CheckpointInfo {
        step: c.record.step,
        uri: c.uri.clone(),
        committed_unix: c.committed_unix,
        bytes: c.bytes,
    }
}

fn status_now(ctx: &Ctx, job_id: &str) -> Option<JobStatus> {
    let job = ctx.shared.read(|s| s.jobs.get(job_id).cloned())?;
    let live = ctx.leader.with(|m| m.jobs.get(job_id).cloned());
    Some(job_status(ctx, &job, live.as_ref()))
}

#[tonic::async_trait]
impl Jobs for JobsService {
    async fn submit(
        &self,
        request: Request<SubmitJobRequest>,
    ) -> Result<Response<SubmitJobResponse>, Status> {
        let ctx = &self.0;
        caller(ctx, &request)?.require_admin("submitting a job")?;
        ctx.require_leader()?;
        let SubmitJobRequest { spec_yaml, bundle_uri, bundle_id, start_over } = request.into_inner();
        let submission =
            crate::jobs::Submission { spec_yaml, bundle_uri, bundle_id, source: String::new(), start_over };
        let submitted = crate::jobs::submit(ctx, submission).await?;
        Ok(Response::new(SubmitJobResponse { job_id: submitted.job_id, job_token: submitted.token }))
    }

    async fn get(&self, request: Request<GetJobRequest>) -> Result<Response<JobStatus>, Status> {
        let ctx = &self.0;
        let who = caller(ctx, &request)?;
        linearizable(ctx).await?;
        let job = find_job(ctx, &who, &request.get_ref().job_id)?;
        status_now(ctx, &job.id).map(Response::new).ok_or_else(|| Status::not_found("the job vanished"))
    }

    async fn list(&self, request: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        let ctx = &self.0;
        let who = caller(ctx, &request)?;
        linearizable(ctx).await?;
        let ids: Vec<String> =
            ctx.shared.read(|s| s.jobs.keys().filter(|id| who.require_job(id).is_ok()).cloned().collect());
        let jobs = ids.iter().filter_map(|id| status_now(ctx, id)).collect();
        Ok(Response::new(ListJobsResponse { jobs }))
    }

    type WatchStream = Stream_<JobStatus>;

    async fn watch(&self, request: Request<WatchJobRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let ctx = self.0.clone();
        let who = caller(&ctx, &request)?;
        ctx.require_leader()?;
        let WatchJobRequest { job_id, interval_ms } = request.into_inner();
        let job_id = find_job(&ctx, &who, &job_id)?.id;
        let interval = match interval_ms {
            0 => Duration::from_secs(1),
            ms => Duration::from_millis(ms.into()).max(MIN_WATCH_INTERVAL),
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(async move {
            let mut applied = ctx.shared.applied.subscribe();
            let mut last_sent: Option<JobStatus> = None;
            let mut last_time = tokio::time::Instant::now();
            loop {
                if let Err(refused) = ctx.require_leader() {
                    let _ = tx.send(Err(refused.into())).await;
                    return;
                }
                let Some(status) = status_now(&ctx, &job_id) else { return };
                let terminal = status.state >= JobState::Completed as i32;
                let mut compare = status.clone();
                // Heartbeat ages change every call; they alone do not make a new status.
                for s in &mut compare.slices {
                    s.heartbeat_age_seconds = 0.0;
                }
                let changed = last_sent.as_ref() != Some(&compare);
                if changed || last_time.elapsed() >= interval {
                    if tx.send(Ok(status)).await.is_err() {
                        return;
                    }
                    last_sent = Some(compare);
                    last_time = tokio::time::Instant::now();
                }
                if terminal {
                    return;
                }
                // Coalesce: at most one status per 100 ms however fast entries are applied.
                let wait = tokio::time::sleep(interval.saturating_sub(last_time.elapsed()));
                tokio::select! {
                    () = wait => {}
                    changed = applied.changed() => if changed.is_err() { return },
                }
                tokio::time::sleep(MIN_WATCH_INTERVAL.min(interval)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn stop(&self, request: Request<StopJobRequest>) -> Result<Response<StopJobResponse>, Status> {
        let ctx = &self.0;
        let who = caller(ctx, &request)?;
        ctx.require_leader()?;
        let job = find_job(ctx, &who, &request.get_ref().job_id)?;
        let state = crate::jobs::stop(ctx, &job).await?.map_or(JobState::Unspecified, JobState::from);
        Ok(Response::new(StopJobResponse { state: state as i32 }))
    }

    type LogsStream = Stream_<LogLine>;

    async fn logs(&self, request: Request<LogsRequest>) -> Result<Response<Self::LogsStream>, Status> {
        let ctx = self.0.clone();
        let who = caller(&ctx, &request)?;
        ctx.require_leader()?;
        let LogsRequest { job_id, follow, slice, tail } = request.into_inner();
        let job = find_job(&ctx, &who, &job_id)?;
        // A new leader's ring starts empty: the lines its predecessors took are in the run record.
        if let Some(uri) = LogRecord::location(&job, ctx.config.record_runs) {
            ctx.logs.read_history(&job.id, &uri, &ctx.config.store_options).await;
        }
        let job_id = job.id;
        let (backlog, mut follower) = ctx.logs.read(&job_id, tail as usize, slice);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(async move {
            for line in backlog {
                if tx.send(Ok(line)).await.is_err() {
                    return;
                }
            }
            if !follow {
                return;
            }
            loop {
                let line = tokio::select! {
                    line = follower.recv() => line,
                    () = tx.closed() => return,
                };
                match line {
                    Ok(line) if slice.is_none_or(|s| line.slice == s) => {
                        if tx.send(Ok(line)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::debug!(job_id, "a log follower skipped {n} lines");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn checkpoints(&self, request: Request<GetJobRequest>) -> Result<Response<CheckpointList>, Status> {
        let ctx = &self.0;
        let who: Caller = caller(ctx, &request)?;
        linearizable(ctx).await?;
        let job = find_job(ctx, &who, &request.get_ref().job_id)?;
        Ok(Response::new(CheckpointList {
            checkpoints: job.checkpoints.iter().map(checkpoint_info).collect(),
        }))
    }
}
