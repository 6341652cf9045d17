//! The leader's memory: what the Raft leader keeps and no log records.
//!
//! Heartbeats, leases, worker sessions, pending step and checkpoint reports live here, in the
//! leader's memory only: they change every second per worker, and losing them with the leader
//! costs nothing that matters (a new leader grants every known worker one full lease before it
//! counts one as lost, and workers resend what was not acknowledged). The services write it,
//! the leader loop ([`crate::leader`]) reads it and hands it to the pure decisions of
//! [`crate::decide`].

use crate::decide::{JobLive, WorkerLive};
use crate::state::Job;
use checkpoint::{HostReport, SaveSpec};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;

/// How a worker's session is told what is in force, in whatever form its wire has: the services
/// implement it (`grpc`'s bounded channel of directives), so the leader's memory holds
/// sessions without naming a gRPC type.
pub trait Outbox: std::fmt::Debug + Send + Sync {
    /// Queues what is in force for `worker_id` of `job`, without waiting.
    fn tell(&self, job: &Job, worker_id: &str) -> Delivery;
}

/// What became of a [`Outbox::tell`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Queued, or nothing was in force to say.
    Queued,
    /// The worker does not read what it is sent: the queue is full.
    Full,
    /// The worker hung up.
    Closed,
}

/// The sending half of a worker's session.
#[derive(Debug, Clone)]
pub struct SessionHandle {
    /// Distinguishes a reconnected session from the one it replaced.
    pub id: u64,
    /// What the leader says to the worker (bounded: a worker that does not read is dropped).
    pub outbox: Arc<dyn Outbox>,
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
    /// Empty memory for the leader of `term`, once it has applied everything committed before.
    pub fn ready(term: u64) -> Self {
        Self { term: Some(term), ..Self::default() }
    }

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
    pub fn open_session(&mut self, worker_id: &str, outbox: Arc<dyn Outbox>) -> u64 {
        self.next_session += 1;
        self.sessions.insert(worker_id.to_string(), SessionHandle { id: self.next_session, outbox });
        self.next_session
    }

    /// Forgets a session if it is still the one registered under `id`.
    pub fn close_session(&mut self, worker_id: &str, id: u64) {
        if self.sessions.get(worker_id).is_some_and(|s| s.id == id) {
            self.sessions.remove(worker_id);
        }
    }

    /// Tells a worker's session, if it has one, what is in force for it in `job`, dropping
    /// the session if it does not keep up or the worker hung up (which is no fault: a worker
    /// leaves once the job is done).
    pub fn tell(&mut self, job: &Job, worker_id: &str) {
        let Some(session) = self.sessions.get(worker_id) else { return };
        match session.outbox.tell(job, worker_id) {
            Delivery::Queued => return,
            Delivery::Full => {
                tracing::warn!(worker_id, "session does not keep up with directives; closing it")
            }
            Delivery::Closed => tracing::debug!(worker_id, "the worker closed its session"),
        }
        self.sessions.remove(worker_id);
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
