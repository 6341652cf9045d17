//! The replicated state: what every coordinator node agrees on, and the commands that change it.
//!
//! [`ClusterState::apply`] is the state machine's transition function. It is pure and
//! deterministic (no clock, no randomness: the leader puts times, ids' ingredients and token
//! hashes into the commands), so every replica that applies the same log holds bitwise the same
//! state. A command that no longer fits (a stale generation, a step that is not the next one) is
//! applied as a no-op with a [`Response::Refused`] that says why; this is what makes a command
//! proposed twice (by an old and a new leader) harmless.
//!
//! Heartbeats, leases and pending reports are deliberately absent: they live in the leader's
//! memory ([`crate::memory`]).

use checkpoint::CommitRecord;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Events kept per job (the status shows them; `JobStatus.events` promises at most 50).
pub const MAX_EVENTS: usize = 50;
/// Registrations a job accepts over its life: bounds the worker table.
pub const MAX_WORKERS_PER_JOB: usize = 4096;
/// Keys one job may hold in the KV store.
pub const MAX_KV_KEYS_PER_JOB: usize = 16_384;
/// Bytes (keys and values) one job may hold in the KV store.
pub const MAX_KV_BYTES_PER_JOB: usize = 64 << 20;
/// Largest KV value.
pub const MAX_KV_VALUE_BYTES: usize = 1 << 20;
/// Largest KV key.
pub const MAX_KV_KEY_BYTES: usize = 512;
/// Committed checkpoints remembered per job (retention normally keeps far fewer).
pub const MAX_CHECKPOINTS_PER_JOB: usize = 1024;
/// Jobs the cluster holds, finished ones included.
pub const MAX_JOBS: usize = 10_000;

/// Where a job is in its life: the client's type, which the commands read too.
pub use client::JobState;

/// A registered worker, as the log knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Hostname, for people.
    pub host: String,
    /// Its data-plane address.
    pub data_addr: String,
    /// Devices it has.
    pub devices: u32,
    /// `cpu`, `tpu`, `cuda`.
    pub platform: String,
    /// The slice it was started for, if any.
    pub slice: Option<u32>,
    /// The worker process's own id: registering again with it returns the same worker id.
    pub instance_id: String,
    /// When it registered.
    pub registered_unix: f64,
    /// Removed from the job (lost, preempted, suspected, or silent during a quiesce). It must
    /// register again, under a new id, to come back.
    pub removed: bool,
}

/// Where a member's state at `start_step` comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResumePlan {
    /// Initialize from the job seed.
    Fresh,
    /// The state in memory is already at `start_step`.
    Keep,
    /// Restore a committed checkpoint.
    FromCheckpoint {
        /// The checkpoint directory.
        uri: String,
        /// Its step.
        step: u64,
    },
    /// Fetch from a live peer over the data plane.
    FromPeer {
        /// The peer.
        worker_id: String,
        /// Its data-plane address.
        data_addr: String,
        /// The step its state is at.
        step: u64,
    },
}

/// One member of a generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberPlan {
    /// The worker.
    pub worker_id: String,
    /// Its place in the generation: members ordered by their lowest virtual rank.
    pub slice: u32,
    /// The logical data-parallel ranks it computes, ascending.
    pub virtual_ranks: Vec<u32>,
    /// Where its state comes from.
    pub resume: ResumePlan,
}

/// A committed step and its metrics, aggregated over the members' reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepCommit {
    /// The step (1-based: optimizer steps applied).
    pub step: u64,
    /// Mean loss per token; `None` when no report carried tokens.
    pub loss: Option<f64>,
    /// Tokens of the step over all members.
    pub tokens: u64,
    /// The slowest member's step time.
    pub step_seconds: f64,
    /// `tokens / step_seconds`.
    pub tokens_per_second: f64,
    /// The global gradient norm (every member reports the same after the all-reduce).
    pub grad_norm: Option<f64>,
    /// Other metrics, averaged over virtual ranks.
    pub metrics: BTreeMap<String, f64>,
    /// Members that reported (a step carried into a new generation may lack some).
    pub reporters: u32,
    /// Members the generation had.
    pub members: u32,
}

/// A committed checkpoint in the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointEntry {
    /// What the checkpoint crate records.
    pub record: CommitRecord,
    /// The checkpoint's directory URL.
    pub uri: String,
    /// When it was committed.
    pub committed_unix: f64,
    /// Bytes of its objects.
    pub bytes: u64,
}

/// A committed checkpoint the resume rule did not take at submission, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassedOver {
    /// Its step.
    pub step: u64,
    /// Its directory.
    pub uri: String,
    /// Why: the error that refused it (a chunk whose CRC does not match, naming the object and
    /// byte range), or that it is another job's.
    pub reason: String,
}

/// Something that happened to a job, for `podctl status` and the run record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEvent {
    /// When.
    pub unix: f64,
    /// `submitted`, `joined`, `generation`, `recovery`, `lease_expired`, `preemption`, ...
    pub kind: String,
    /// The committed step at the time.
    pub step: u64,
    /// Anything else worth knowing.
    pub detail: String,
}

/// What the leader derives from a spec at submission, so apply never parses YAML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobShape {
    /// The job's name.
    pub name: String,
    /// Logical data-parallel size (`mesh.dcn`).
    pub dp_size: u32,
    /// Steps to run.
    pub total_steps: u64,
    /// Save every this many steps (0: no checkpoints).
    pub checkpoint_every: u64,
    /// Keep the last this many checkpoints.
    pub keep_last: u32,
    /// Also keep every checkpoint whose step is a multiple of this (0: none).
    pub keep_every: u64,
    /// The run directory.
    pub output_dir: String,
}

/// A job and everything the cluster knows of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// `<name>-<n>`.
    pub id: String,
    /// Derived from the spec.
    pub shape: JobShape,
    /// The spec as submitted.
    pub spec_yaml: String,
    /// Where workers find the bundle.
    pub bundle_uri: String,
    /// The bundle's identity.
    pub bundle_id: String,
    /// The checkpoint root.
    pub checkpoint_uri: String,
    /// SHA-256 (hex) of the job token; the token itself is never stored.
    pub token_sha256: String,
    /// The Kubernetes declaration it came from; empty when submitted through the API.
    #[serde(default)]
    pub source: String,
    /// The uid of its job object on Kubernetes (the controller's ConfigMap that owns its pods),
    /// once made: a job whose recorded object is gone was deleted by a user or with its release.
    #[serde(default)]
    pub kube_object: String,
    /// The line of checkpoints its saves continue or begin (`checkpoint::lineage`).
    #[serde(default)]
    pub line: String,
    /// Its submission's part of every save id; see [`Job::save_id`].
    #[serde(default)]
    pub attempt: String,
    /// Where it is in its life.
    pub state: JobState,
    /// Why it failed, or what it waits for.
    pub message: String,
    /// When it was submitted.
    pub submitted_unix: f64,
    /// Every registration, by worker id.
    pub workers: BTreeMap<String, WorkerRecord>,
    /// Registrations so far (names the next worker).
    pub worker_seq: u64,
    /// The current generation (0 before the first).
    pub generation: u64,
    /// The current generation's members (empty while pending).
    pub members: Vec<MemberPlan>,
    /// Steps done when the current generation started.
    pub start_step: u64,
    /// Global steps committed.
    pub committed_step: u64,
    /// The last committed step's metrics.
    pub last_step: Option<StepCommit>,
    /// Committed checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointEntry>,
    /// Recent events, oldest first.
    pub events: VecDeque<JobEvent>,
    /// While recovering: the step boundary the members stop at (0: at once).
    #[serde(default)]
    pub quiesce_after: u64,
}

impl Job {
    /// Whether `worker_id` is a member of the current generation.
    pub fn member(&self, worker_id: &str) -> Option<&MemberPlan> {
        self.members.iter().find(|m| m.worker_id == worker_id)
    }

    /// Registered workers that were not removed, by id.
    pub fn active_workers(&self) -> impl Iterator<Item = (&String, &WorkerRecord)> {
        self.workers.iter().filter(|(_, w)| !w.removed)
    }

    /// The save id of the current generation's saves: `<line>.<attempt>g<generation>`, unique
    /// per submission and generation, so no committed directory is ever written twice.
    pub fn save_id(&self) -> String {
        format!("{}{}", self.save_id_prefix(), self.generation)
    }

    /// What every save id of this submission starts with, before its generation.
    pub fn save_id_prefix(&self) -> String {
        checkpoint::lineage::save_id(&self.line, &format!("{}g", self.attempt))
    }

    /// Whether a checkpoint of the final step is committed.
    pub fn final_checkpoint_committed(&self) -> bool {
        self.checkpoints.iter().any(|c| c.record.step >= self.shape.total_steps)
    }

    /// The newest committed checkpoint.
    pub fn last_checkpoint(&self) -> Option<&CheckpointEntry> {
        self.checkpoints.iter().max_by_key(|c| (c.record.step, c.record.save_id.clone()))
    }

    fn event(&mut self, unix: f64, kind: &str, detail: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(JobEvent { unix, kind: kind.into(), step: self.committed_step, detail });
    }

    fn mark_removed(&mut self, removed: &[String]) {
        for id in removed {
            if let Some(w) = self.workers.get_mut(id) {
                w.removed = true;
            }
        }
    }

    /// Commits `commit` if it is the next step; false when it is not.
    fn commit_step(&mut self, mut commit: StepCommit, unix: f64) -> bool {
        if commit.step != self.committed_step + 1 {
            return false;
        }
        // Held-out accuracy is measured every few steps: the latest stays in view until the next.
        if let Some(previous) = &self.last_step {
            for key in ["eval_accuracy_initial", "eval_accuracy", "eval_reward"] {
                if let (false, Some(&value)) = (commit.metrics.contains_key(key), previous.metrics.get(key)) {
                    commit.metrics.insert(key.to_string(), value);
                }
            }
        }
        self.committed_step = commit.step;
        self.last_step = Some(commit);
        if self.committed_step >= self.shape.total_steps {
            if self.shape.checkpoint_every == 0 {
                self.complete(unix, format!("all {} steps committed", self.shape.total_steps));
            } else {
                self.message = "all steps committed; waiting for the final checkpoint".into();
            }
        }
        true
    }

    fn complete(&mut self, unix: f64, message: String) {
        self.state = JobState::Completed;
        self.event(unix, "completed", message.clone());
        self.message = message;
    }
}

/// A submission, with everything the leader derived and generated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitJob {
    /// Derived from the spec.
    pub shape: JobShape,
    /// The spec as written.
    pub spec_yaml: String,
    /// Where workers find the bundle.
    pub bundle_uri: String,
    /// The bundle's identity.
    pub bundle_id: String,
    /// The checkpoint root.
    pub checkpoint_uri: String,
    /// SHA-256 (hex) of the job token the leader generated.
    pub token_sha256: String,
    /// When.
    pub unix: f64,
    /// The Kubernetes declaration it comes from (`configmap/<name>/<uid>`); empty for a job
    /// submitted through the API. At most one job per declaration.
    #[serde(default)]
    pub source: String,
    /// The line of checkpoints the job's saves continue or begin (`checkpoint::lineage`).
    #[serde(default)]
    pub line: String,
    /// This submission's part of every save id (`s<nonce>`), unique per submission.
    #[serde(default)]
    pub attempt: String,
    /// The line's committed checkpoints up to the one the job resumes from (the last), oldest
    /// first; empty for a fresh start.
    #[serde(default)]
    pub catalog: Vec<CheckpointEntry>,
    /// Newer committed checkpoints the resume rule passed over, newest first.
    #[serde(default)]
    pub passed_over: Vec<PassedOver>,
}

/// A registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterWorker {
    /// The job.
    pub job_id: String,
    /// What the worker said about itself.
    pub record: WorkerRecord,
}

/// Everything that goes through the Raft log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// A new job.
    SubmitJob(Box<SubmitJob>),
    /// A worker joins a job.
    RegisterWorker(Box<RegisterWorker>),
    /// Opens generation `generation` (= current + 1): the job is recovering and messages of
    /// older generations are refused from now on.
    BeginGeneration {
        /// The job.
        job_id: String,
        /// The new generation.
        generation: u64,
        /// Why.
        reason: String,
        /// Workers removed from the job.
        removed: Vec<String>,
        /// The step boundary the members stop at; 0: at once, aborting the step in flight.
        #[serde(default)]
        after_step: u64,
        /// When.
        unix: f64,
    },
    /// Fixes the members and placement of `generation` (the first one, or the one a
    /// `BeginGeneration` opened); the job runs.
    NewGeneration {
        /// The job.
        job_id: String,
        /// The generation.
        generation: u64,
        /// Steps done at its start.
        start_step: u64,
        /// The members.
        members: Vec<MemberPlan>,
        /// Steps the previous generation finished but did not commit, committed now with the
        /// reports that arrived.
        carried: Vec<StepCommit>,
        /// Workers removed from the job.
        removed: Vec<String>,
        /// Why (for the event).
        reason: String,
        /// When.
        unix: f64,
    },
    /// Every member reported `commit.step`.
    CommitStep {
        /// The job.
        job_id: String,
        /// The generation the reports came from.
        generation: u64,
        /// The step.
        commit: StepCommit,
        /// When.
        unix: f64,
    },
    /// A checkpoint is complete (manifest written); the catalog records it.
    CommitCheckpoint {
        /// The job.
        job_id: String,
        /// The generation that saved it.
        generation: u64,
        /// The catalog entry.
        entry: CheckpointEntry,
    },
    /// Retention dropped a checkpoint.
    ForgetCheckpoint {
        /// The job.
        job_id: String,
        /// The checkpoint's step.
        step: u64,
        /// Its save id.
        save_id: String,
    },
    /// A worker's restore of a checkpoint failed its integrity check: the checkpoint leaves the
    /// catalog, and the next generation plans from an older one.
    PassOverCheckpoint {
        /// The job.
        job_id: String,
        /// The checkpoint's directory.
        uri: String,
        /// Why (the worker's error: the object, chunk and CRCs).
        reason: String,
        /// When.
        unix: f64,
    },
    /// A user stopped the job.
    StopJob {
        /// The job.
        job_id: String,
        /// When.
        unix: f64,
    },
    /// Every step is committed and the final checkpoint is, or will never be.
    CompleteJob {
        /// The job.
        job_id: String,
        /// Why now.
        reason: String,
        /// When.
        unix: f64,
    },
    /// The job cannot go on.
    FailJob {
        /// The job.
        job_id: String,
        /// Why.
        reason: String,
        /// When.
        unix: f64,
    },
    /// The Kubernetes controller made the job's job object, with this uid (a job keeps its
    /// first).
    RecordJobObject {
        /// The job.
        job_id: String,
        /// The object's uid.
        uid: String,
    },
    /// A key-value write (rendezvous).
    KvPut {
        /// The job.
        job_id: String,
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The writer's generation, when it has one: a stale one is refused.
        generation: Option<u64>,
    },
}

impl Command {
    /// The job the command is about, if any.
    pub fn job_id(&self) -> Option<&str> {
        match self {
            Self::SubmitJob(_) => None,
            Self::RegisterWorker(r) => Some(&r.job_id),
            Self::BeginGeneration { job_id, .. }
            | Self::NewGeneration { job_id, .. }
            | Self::CommitStep { job_id, .. }
            | Self::CommitCheckpoint { job_id, .. }
            | Self::ForgetCheckpoint { job_id, .. }
            | Self::PassOverCheckpoint { job_id, .. }
            | Self::StopJob { job_id, .. }
            | Self::CompleteJob { job_id, .. }
            | Self::FailJob { job_id, .. }
            | Self::RecordJobObject { job_id, .. }
            | Self::KvPut { job_id, .. } => Some(job_id),
        }
    }
}

/// What applying a command gave.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// Applied (also the answer to membership and blank entries).
    #[default]
    Applied,
    /// A job was created.
    JobSubmitted {
        /// Its id.
        job_id: String,
    },
    /// A worker was registered (or was already, under this id).
    WorkerRegistered {
        /// Its id.
        worker_id: String,
    },
    /// The command no longer fits the state and changed nothing.
    Refused {
        /// Why, as a type.
        why: Refusal,
        /// Why, naming the values, for people.
        reason: String,
    },
}

/// Why a command changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// The job it names does not exist.
    NoJob,
    /// A worker's command of a generation older than the job's.
    StaleGeneration,
    /// The job is not in a state the command applies to (it ended, or it moved on).
    State,
    /// A limit of the cluster or the job.
    Limit,
}

/// The whole replicated state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Jobs by id.
    pub jobs: BTreeMap<String, Job>,
    /// Jobs submitted so far (names the next job).
    pub job_seq: u64,
    /// Per job, its key-value store.
    pub kv: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
}

fn refused(why: Refusal, reason: String) -> Response {
    Response::Refused { why, reason }
}

impl ClusterState {
    /// Finds a job by id or, failing that, the newest job with that name.
    pub fn find_job(&self, id_or_name: &str) -> Option<&Job> {
        self.jobs.get(id_or_name).or_else(|| {
            self.jobs.values().filter(|j| j.shape.name == id_or_name).max_by_key(|j| job_number(&j.id))
        })
    }

    /// The job a worker id belongs to (`<job id>.w<n>`).
    pub fn job_of_worker(&self, worker_id: &str) -> Option<&Job> {
        let (job_id, _) = worker_id.rsplit_once(".w")?;
        self.jobs.get(job_id).filter(|j| j.workers.contains_key(worker_id))
    }

    /// Applies one command. Deterministic: the same state and command give the same result.
    pub fn apply(&mut self, command: Command) -> Response {
        if let Command::SubmitJob(submit) = command {
            return self.submit(*submit);
        }
        if let Command::KvPut { job_id, key, value, generation } = command {
            return self.kv_put(job_id, key, value, generation);
        }
        let Some(job_id) = command.job_id().map(str::to_owned) else {
            return Response::Applied;
        };
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return refused(Refusal::NoJob, format!("no job '{job_id}'"));
        };
        // Retention still runs after the end (a leader that died between the final commit and
        // its retention leaves it to the next one, whatever happened to the job meanwhile).
        if job.state.is_terminal() && !matches!(command, Command::ForgetCheckpoint { .. }) {
            return refused(Refusal::State, format!("job {job_id} is {:?}", job.state));
        }
        match command {
            Command::SubmitJob(_) | Command::KvPut { .. } => Response::Applied,
            Command::RegisterWorker(register) => register_worker(job, register.record),
            Command::BeginGeneration { generation, reason, removed, after_step, unix, .. } => {
                if generation != job.generation + 1 || job.state == JobState::Pending {
                    return refused(
                        Refusal::State,
                        format!(
                            "cannot begin generation {generation}: job {job_id} is {:?} in generation {}",
                            job.state, job.generation
                        ),
                    );
                }
                job.generation = generation;
                job.state = JobState::Recovering;
                job.quiesce_after = after_step;
                job.mark_removed(&removed);
                job.message = format!("recovering: {reason}");
                job.event(unix, "recovery", format!("generation {generation}: {reason}"));
                Response::Applied
            }
            Command::NewGeneration {
                generation,
                start_step,
                members,
                carried,
                removed,
                reason,
                unix,
                ..
            } => {
                let fits = match job.state {
                    JobState::Pending => generation == job.generation + 1,
                    JobState::Recovering => generation == job.generation,
                    _ => false,
                };
                if !fits {
                    return refused(
                        Refusal::State,
                        format!(
                            "cannot form generation {generation}: job {job_id} is {:?} in generation {}",
                            job.state, job.generation
                        ),
                    );
                }
                for commit in carried {
                    job.commit_step(commit, unix);
                }
                job.mark_removed(&removed);
                job.generation = generation;
                job.members = members;
                job.start_step = start_step;
                if job.state.is_terminal() {
                    return Response::Applied;
                }
                job.state = JobState::Running;
                job.message = String::new();
                let summary = job
                    .members
                    .iter()
                    .map(|m| format!("{}:{:?}", m.worker_id, m.virtual_ranks))
                    .collect::<Vec<_>>()
                    .join(" ");
                job.event(
                    unix,
                    "generation",
                    format!("generation {generation} from step {start_step} ({reason}): {summary}"),
                );
                Response::Applied
            }
            Command::CommitStep { generation, commit, unix, .. } => {
                if generation != job.generation || job.state != JobState::Running {
                    return refused(
                        Refusal::StaleGeneration,
                        format!(
                            "stale generation {generation}, current {} ({:?})",
                            job.generation, job.state
                        ),
                    );
                }
                let step = commit.step;
                if job.commit_step(commit, unix) {
                    Response::Applied
                } else {
                    refused(
                        Refusal::State,
                        format!("step {step} is not the next step; {} is committed", job.committed_step),
                    )
                }
            }
            Command::CommitCheckpoint { generation, entry, .. } => {
                if generation != job.generation {
                    return refused(
                        Refusal::StaleGeneration,
                        format!(
                            "stale generation {generation}, current {}: the save was interrupted",
                            job.generation
                        ),
                    );
                }
                if job.checkpoints.iter().any(|c| c.record == entry.record) {
                    return Response::Applied;
                }
                if job.checkpoints.len() >= MAX_CHECKPOINTS_PER_JOB {
                    return refused(
                        Refusal::Limit,
                        format!(
                            "job {job_id} already has {MAX_CHECKPOINTS_PER_JOB} checkpoints; lower checkpoint.keep"
                        ),
                    );
                }
                job.event(
                    entry.committed_unix,
                    "checkpoint",
                    format!("step {} at {}", entry.record.step, entry.uri),
                );
                let last =
                    entry.record.step >= job.shape.total_steps && job.committed_step >= job.shape.total_steps;
                job.checkpoints.push(entry);
                job.checkpoints.sort_by(|a, b| {
                    (a.record.step, &a.record.save_id).cmp(&(b.record.step, &b.record.save_id))
                });
                if last {
                    // The leader completes the job once retention has run (`decide`).
                    job.message = "the final checkpoint is committed; applying retention".into();
                }
                Response::Applied
            }
            Command::ForgetCheckpoint { step, save_id, .. } => {
                job.checkpoints.retain(|c| !(c.record.step == step && c.record.save_id == save_id));
                Response::Applied
            }
            Command::PassOverCheckpoint { uri, reason, unix, .. } => {
                // Every member that restored it reports it; the first one counts.
                if let Some(at) = job.checkpoints.iter().position(|c| c.uri == uri) {
                    let passed = job.checkpoints.remove(at);
                    job.event(
                        unix,
                        "passed_over",
                        format!("checkpoint of step {} ({uri}): {reason}", passed.record.step),
                    );
                }
                Response::Applied
            }
            Command::StopJob { unix, .. } => {
                job.state = JobState::Stopped;
                job.message = "stopped by a user".into();
                job.event(unix, "stopped", String::new());
                Response::Applied
            }
            Command::CompleteJob { reason, unix, .. } => {
                if job.committed_step < job.shape.total_steps {
                    return refused(
                        Refusal::State,
                        format!(
                            "job {job_id} has {} of {} steps committed",
                            job.committed_step, job.shape.total_steps
                        ),
                    );
                }
                job.complete(unix, reason);
                Response::Applied
            }
            Command::FailJob { reason, unix, .. } => {
                job.state = JobState::Failed;
                job.message = reason.clone();
                job.event(unix, "failed", reason);
                Response::Applied
            }
            Command::RecordJobObject { uid, .. } => {
                if job.kube_object.is_empty() || job.kube_object == uid {
                    job.kube_object = uid;
                    Response::Applied
                } else {
                    refused(
                        Refusal::State,
                        format!("job {job_id} has job object {} already", job.kube_object),
                    )
                }
            }
        }
    }

    fn submit(&mut self, submit: SubmitJob) -> Response {
        // A declaration submits once, whichever leader proposed it and however often.
        if !submit.source.is_empty()
            && let Some(job) = self.jobs.values().find(|j| j.source == submit.source)
        {
            return Response::JobSubmitted { job_id: job.id.clone() };
        }
        if self.jobs.len() >= MAX_JOBS {
            return refused(
                Refusal::Limit,
                format!("the cluster holds {MAX_JOBS} jobs; remove finished ones first"),
            );
        }
        self.job_seq += 1;
        let id = format!("{}-{}", submit.shape.name, self.job_seq);
        let mut job = Job {
            id: id.clone(),
            shape: submit.shape,
            spec_yaml: submit.spec_yaml,
            bundle_uri: submit.bundle_uri,
            bundle_id: submit.bundle_id,
            checkpoint_uri: submit.checkpoint_uri,
            token_sha256: submit.token_sha256,
            source: submit.source.clone(),
            kube_object: String::new(),
            line: submit.line,
            attempt: submit.attempt,
            state: JobState::Pending,
            message: "waiting for workers".into(),
            submitted_unix: submit.unix,
            workers: BTreeMap::new(),
            worker_seq: 0,
            generation: 0,
            members: Vec::new(),
            start_step: 0,
            // A resumed job has done the steps of the checkpoint it resumes from.
            committed_step: submit.catalog.last().map_or(0, |c| c.record.step),
            last_step: None,
            checkpoints: submit.catalog,
            events: VecDeque::new(),
            quiesce_after: 0,
        };
        let detail = match submit.source.is_empty() {
            true => String::new(),
            false => format!("declared by {}", submit.source),
        };
        job.event(submit.unix, "submitted", detail);
        for passed in &submit.passed_over {
            job.event(
                submit.unix,
                "passed_over",
                format!("checkpoint of step {} ({}): {}", passed.step, passed.uri, passed.reason),
            );
        }
        let start = match job.checkpoints.last() {
            Some(c) => format!("resuming from step {} ({}), line {}", c.record.step, c.uri, job.line),
            None => format!("starting at step 0, line {}", job.line),
        };
        job.event(submit.unix, "resume", start);
        if let Some(last) = job.checkpoints.last()
            && last.record.step >= job.shape.total_steps
        {
            // Relaunched after its end: the checkpoint is the final state, nothing is left to do.
            let message =
                format!("all {} steps were done: {} is the final state", job.shape.total_steps, last.uri);
            job.complete(submit.unix, message);
        }
        self.jobs.insert(id.clone(), job);
        Response::JobSubmitted { job_id: id }
    }

    fn kv_put(&mut self, job_id: String, key: String, value: Vec<u8>, generation: Option<u64>) -> Response {
        let Some(job) = self.jobs.get(&job_id) else {
            return refused(Refusal::NoJob, format!("no job '{job_id}'"));
        };
        if let Some(g) = generation
            && g < job.generation
        {
            return refused(
                Refusal::StaleGeneration,
                format!("stale generation {g}, current {}", job.generation),
            );
        }
        if key.len() > MAX_KV_KEY_BYTES || value.len() > MAX_KV_VALUE_BYTES {
            return refused(
                Refusal::Limit,
                format!(
                    "key of {} bytes or value of {} bytes is over the limits ({MAX_KV_KEY_BYTES}, {MAX_KV_VALUE_BYTES})",
                    key.len(),
                    value.len()
                ),
            );
        }
        let store = self.kv.entry(job_id.clone()).or_default();
        let used: usize = store.iter().map(|(k, v)| k.len() + v.len()).sum();
        let old = store.get(&key).map_or(0, |v| key.len() + v.len());
        if !store.contains_key(&key) && store.len() >= MAX_KV_KEYS_PER_JOB {
            return refused(
                Refusal::Limit,
                format!("job {job_id} holds {MAX_KV_KEYS_PER_JOB} keys, the limit"),
            );
        }
        if used - old + key.len() + value.len() > MAX_KV_BYTES_PER_JOB {
            return refused(
                Refusal::Limit,
                format!("job {job_id} would hold over {MAX_KV_BYTES_PER_JOB} bytes of KV data"),
            );
        }
        store.insert(key, value);
        Response::Applied
    }
}

fn register_worker(job: &mut Job, record: WorkerRecord) -> Response {
    if let Some((id, _)) = job.workers.iter().find(|(_, w)| w.instance_id == record.instance_id && !w.removed)
    {
        return Response::WorkerRegistered { worker_id: id.clone() };
    }
    if job.workers.len() >= MAX_WORKERS_PER_JOB {
        return refused(
            Refusal::Limit,
            format!("job {} had {MAX_WORKERS_PER_JOB} registrations, the limit", job.id),
        );
    }
    job.worker_seq += 1;
    let worker_id = format!("{}.w{}", job.id, job.worker_seq);
    let detail = format!("{worker_id} on {} ({})", record.host, record.data_addr);
    let unix = record.registered_unix;
    job.workers.insert(worker_id.clone(), record);
    job.event(unix, "joined", detail);
    Response::WorkerRegistered { worker_id }
}

/// The number after the last `-` of a job id.
fn job_number(id: &str) -> u64 {
    id.rsplit_once('-').and_then(|(_, n)| n.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn shape(dp_size: u32, total_steps: u64) -> JobShape {
        JobShape {
            name: "demo".into(),
            dp_size,
            total_steps,
            checkpoint_every: 0,
            keep_last: 3,
            keep_every: 0,
            output_dir: "runs/demo".into(),
        }
    }

    pub(crate) fn submit(state: &mut ClusterState, dp_size: u32, total_steps: u64) -> String {
        let command = Command::SubmitJob(Box::new(SubmitJob {
            shape: shape(dp_size, total_steps),
            spec_yaml: String::new(),
            bundle_uri: "b".into(),
            bundle_id: "00".into(),
            checkpoint_uri: "file:///tmp/c".into(),
            token_sha256: "ab".into(),
            unix: 1.0,
            source: String::new(),
            line: String::new(),
            attempt: String::new(),
            catalog: Vec::new(),
            passed_over: Vec::new(),
        }));
        match state.apply(command) {
            Response::JobSubmitted { job_id } => job_id,
            other => panic!("{other:?}"),
        }
    }

    pub(crate) fn worker(instance: &str) -> WorkerRecord {
        WorkerRecord {
            host: "h".into(),
            data_addr: format!("127.0.0.1:{}", 9000 + instance.len()),
            devices: 1,
            platform: "cpu".into(),
            slice: None,
            instance_id: instance.into(),
            registered_unix: 2.0,
            removed: false,
        }
    }

    pub(crate) fn register(state: &mut ClusterState, job_id: &str, instance: &str) -> String {
        let command = Command::RegisterWorker(Box::new(RegisterWorker {
            job_id: job_id.into(),
            record: worker(instance),
        }));
        match state.apply(command) {
            Response::WorkerRegistered { worker_id } => worker_id,
            other => panic!("{other:?}"),
        }
    }

    pub(crate) fn member(worker_id: &str, ranks: Vec<u32>) -> MemberPlan {
        MemberPlan { worker_id: worker_id.into(), slice: 0, virtual_ranks: ranks, resume: ResumePlan::Fresh }
    }

    pub(crate) fn form(
        state: &mut ClusterState,
        job_id: &str,
        generation: u64,
        members: Vec<MemberPlan>,
    ) -> Response {
        state.apply(Command::NewGeneration {
            job_id: job_id.into(),
            generation,
            start_step: 0,
            members,
            carried: vec![],
            removed: vec![],
            reason: "test".into(),
            unix: 3.0,
        })
    }

    fn commit(state: &mut ClusterState, job_id: &str, generation: u64, step: u64) -> Response {
        state.apply(Command::CommitStep {
            job_id: job_id.into(),
            generation,
            commit: StepCommit { step, ..Default::default() },
            unix: 4.0,
        })
    }

    #[test]
    fn a_job_runs_from_pending_to_completed() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 1, 2);
        assert_eq!(job, "demo-1");
        let w = register(&mut state, &job, "i1");
        assert_eq!(w, "demo-1.w1");
        assert_eq!(state.job_of_worker(&w).unwrap().id, job);
        assert_eq!(form(&mut state, &job, 1, vec![member(&w, vec![0])]), Response::Applied);
        assert_eq!(state.jobs[&job].state, JobState::Running);
        assert_eq!(commit(&mut state, &job, 1, 1), Response::Applied);
        assert_eq!(commit(&mut state, &job, 1, 2), Response::Applied);
        assert_eq!(state.jobs[&job].state, JobState::Completed);
        assert!(matches!(commit(&mut state, &job, 1, 3), Response::Refused { .. }));
    }

    #[test]
    fn a_declaration_submits_one_job_however_often_it_is_proposed() {
        let mut state = ClusterState::default();
        let declared = |source: &str| {
            Command::SubmitJob(Box::new(SubmitJob {
                shape: shape(1, 2),
                spec_yaml: String::new(),
                bundle_uri: String::new(),
                bundle_id: "00".into(),
                checkpoint_uri: String::new(),
                token_sha256: String::new(),
                unix: 0.0,
                source: source.into(),
                line: String::new(),
                attempt: String::new(),
                catalog: Vec::new(),
                passed_over: Vec::new(),
            }))
        };
        let first = state.apply(declared("configmap/a/u1"));
        assert_eq!(first, Response::JobSubmitted { job_id: "demo-1".into() });
        // Two leaders, or one retrying after a lost answer: the same job.
        assert_eq!(state.apply(declared("configmap/a/u1")), first);
        assert_eq!(state.jobs.len(), 1);
        assert_eq!(state.jobs["demo-1"].events[0].detail, "declared by configmap/a/u1");
        // Another declaration, or the same name applied again (a new uid): a new job.
        assert_eq!(
            state.apply(declared("configmap/a/u2")),
            Response::JobSubmitted { job_id: "demo-2".into() }
        );
    }

    #[test]
    fn a_resumed_submission_starts_at_its_checkpoint_and_names_its_saves_uniquely() {
        let mut state = ClusterState::default();
        let entry = |step: u64, save_id: &str| CheckpointEntry {
            record: CommitRecord {
                step,
                save_id: save_id.into(),
                bundle: "00".into(),
                manifest_size: 1,
                manifest_crc32c: 2,
            },
            uri: format!("file:///c/{step:012}-{save_id}"),
            committed_unix: 0.0,
            bytes: 1,
        };
        let passed =
            PassedOver { step: 60, uri: "file:///c/000000000060-r1.s1g1".into(), reason: "crc".into() };
        let submit = SubmitJob {
            shape: shape(2, 70),
            spec_yaml: String::new(),
            bundle_uri: String::new(),
            bundle_id: "00".into(),
            checkpoint_uri: "file:///c".into(),
            token_sha256: String::new(),
            unix: 0.0,
            source: String::new(),
            line: "r1".into(),
            attempt: "s2".into(),
            catalog: vec![entry(40, "r1.s1g1"), entry(50, "r1.s1g1")],
            passed_over: vec![passed],
        };
        let submit_again = submit.clone();
        let Response::JobSubmitted { job_id } = state.apply(Command::SubmitJob(Box::new(submit))) else {
            panic!("not submitted")
        };
        let job = &state.jobs[&job_id];
        assert_eq!((job.committed_step, job.last_checkpoint().unwrap().record.step), (50, 50));
        let kinds: Vec<&str> = job.events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["submitted", "passed_over", "resume"]);
        assert!(job.events[1].detail.contains("step 60") && job.events[1].detail.contains("crc"));
        assert!(job.events[2].detail.starts_with("resuming from step 50"), "{}", job.events[2].detail);
        // Unique per submission and generation, within the resumed line.
        assert_eq!(job.save_id(), "r1.s2g0");
        let w = register(&mut state, &job_id, "i1");
        form(&mut state, &job_id, 1, vec![member(&w, vec![0, 1])]);
        assert_eq!(state.jobs[&job_id].save_id(), "r1.s2g1");

        // Relaunched once its last step is saved: done at once, nothing written.
        let mut done = SubmitJob { catalog: vec![entry(70, "r1.s2g1")], passed_over: vec![], ..submit_again };
        done.attempt = "s3".into();
        let Response::JobSubmitted { job_id } = state.apply(Command::SubmitJob(Box::new(done))) else {
            panic!("not submitted")
        };
        assert_eq!(state.jobs[&job_id].state, JobState::Completed);
        assert!(state.jobs[&job_id].message.contains("final state"), "{}", state.jobs[&job_id].message);
    }

    #[test]
    fn a_checkpointing_job_awaits_its_final_checkpoint_and_the_leader_completes_it() {
        let mut state = ClusterState::default();
        let mut submit_shape = shape(1, 2);
        submit_shape.checkpoint_every = 2;
        let job = match state.apply(Command::SubmitJob(Box::new(SubmitJob {
            shape: submit_shape,
            spec_yaml: String::new(),
            bundle_uri: String::new(),
            bundle_id: "00".into(),
            checkpoint_uri: String::new(),
            token_sha256: String::new(),
            unix: 0.0,
            source: String::new(),
            line: String::new(),
            attempt: String::new(),
            catalog: Vec::new(),
            passed_over: Vec::new(),
        }))) {
            Response::JobSubmitted { job_id } => job_id,
            other => panic!("{other:?}"),
        };
        let w = register(&mut state, &job, "i1");
        form(&mut state, &job, 1, vec![member(&w, vec![0])]);
        commit(&mut state, &job, 1, 1);
        commit(&mut state, &job, 1, 2);
        assert_eq!(state.jobs[&job].state, JobState::Running, "{}", state.jobs[&job].message);
        let entry = CheckpointEntry {
            record: CommitRecord {
                step: 2,
                save_id: "s".into(),
                bundle: "00".into(),
                manifest_size: 1,
                manifest_crc32c: 0,
            },
            uri: "file:///c/000000000002-s".into(),
            committed_unix: 5.0,
            bytes: 4,
        };
        state.apply(Command::CommitCheckpoint { job_id: job.clone(), generation: 1, entry });
        // Still running: the leader completes it once retention has run (`decide`).
        assert_eq!(state.jobs[&job].state, JobState::Running);
        assert!(state.jobs[&job].message.contains("applying retention"), "{}", state.jobs[&job].message);
        assert_eq!(state.jobs[&job].last_checkpoint().unwrap().record.step, 2);
        let complete = Command::CompleteJob { job_id: job.clone(), reason: "done".into(), unix: 6.0 };
        assert_eq!(state.apply(complete), Response::Applied);
        assert_eq!(state.jobs[&job].state, JobState::Completed);
    }

    #[test]
    fn steps_commit_only_in_order_and_once() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 1, 10);
        let w = register(&mut state, &job, "i1");
        form(&mut state, &job, 1, vec![member(&w, vec![0])]);
        assert!(
            matches!(commit(&mut state, &job, 1, 2), Response::Refused { reason, .. } if reason.contains("not the next"))
        );
        commit(&mut state, &job, 1, 1);
        assert!(matches!(commit(&mut state, &job, 1, 1), Response::Refused { .. }));
        assert_eq!(state.jobs[&job].committed_step, 1);
    }

    #[test]
    fn a_stale_generation_is_refused_after_a_new_one_begins() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 2, 10);
        let a = register(&mut state, &job, "a");
        let b = register(&mut state, &job, "b");
        form(&mut state, &job, 1, vec![member(&a, vec![0]), member(&b, vec![1])]);
        let begin = Command::BeginGeneration {
            job_id: job.clone(),
            generation: 2,
            reason: "lease expired".into(),
            removed: vec![b.clone()],
            after_step: 0,
            unix: 5.0,
        };
        assert_eq!(state.apply(begin.clone()), Response::Applied);
        assert!(state.jobs[&job].workers[&b].removed);
        // The same command proposed again (by a new leader) changes nothing.
        assert!(matches!(state.apply(begin), Response::Refused { .. }));
        assert!(
            matches!(commit(&mut state, &job, 1, 1), Response::Refused { reason, .. } if reason.contains("stale generation 1, current 2"))
        );
        let put =
            |g| Command::KvPut { job_id: job.clone(), key: "k".into(), value: vec![1], generation: Some(g) };
        assert!(matches!(state.apply(put(1)), Response::Refused { .. }));
        assert_eq!(state.apply(put(2)), Response::Applied);
        // A save of the ended generation (a member cut off mid-save, its report late) is never
        // committed, whoever finalizes it.
        let entry = CheckpointEntry {
            record: CommitRecord {
                step: 1,
                save_id: "g1".into(),
                bundle: "00".into(),
                manifest_size: 1,
                manifest_crc32c: 0,
            },
            uri: "file:///c/000000000001-g1".into(),
            committed_unix: 6.0,
            bytes: 4,
        };
        let late = Command::CommitCheckpoint { job_id: job.clone(), generation: 1, entry };
        assert!(
            matches!(state.apply(late), Response::Refused { reason, .. } if reason.contains("the save was interrupted"))
        );
        assert!(state.jobs[&job].checkpoints.is_empty());
        // The removed member is told the job goes on without it (it may register again); a
        // worker the job does not know is not.
        let stop = |worker: &str| match crate::leader::directive_in_force(&state.jobs[&job], worker) {
            Some(proto::v1::Directive { directive: Some(proto::v1::directive::Directive::Stop(s)) }) => s,
            other => panic!("{other:?}"),
        };
        assert!(stop(&b).removed, "{:?}", stop(&b));
        assert_eq!(stop(&b).after_step, 0, "its generation ended at once");
        assert!(!stop("nobody").removed);
    }

    #[test]
    fn a_member_leaving_after_its_step_in_flight_is_told_the_boundary_the_others_stop_at() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 3, 10);
        let [a, b, c] = ["a", "b", "c"].map(|host| register(&mut state, &job, host));
        form(&mut state, &job, 1, vec![member(&a, vec![0]), member(&b, vec![1]), member(&c, vec![2])]);
        let begin = |generation, removed: &String, after_step| Command::BeginGeneration {
            job_id: job.clone(),
            generation,
            reason: "preempted (SIGTERM) after its step in flight".into(),
            removed: vec![removed.clone()],
            after_step,
            unix: 5.0,
        };
        let stop = |state: &ClusterState, worker: &str| match crate::leader::directive_in_force(
            &state.jobs[&job],
            worker,
        ) {
            Some(proto::v1::Directive { directive: Some(proto::v1::directive::Directive::Stop(s)) }) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(state.apply(begin(2, &c, 4)), Response::Applied);
        assert!(stop(&state, &c).removed);
        assert_eq!(stop(&state, &c).after_step, 4, "it finishes step 4 with a and b");
        // Another loss meanwhile ends the next generation at once: so does the leaver.
        assert_eq!(state.apply(begin(3, &b, 0)), Response::Applied);
        assert_eq!((stop(&state, &c).after_step, stop(&state, &b).after_step), (0, 0));
    }

    #[test]
    fn carried_steps_close_the_gap_a_lost_member_left() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 2, 10);
        let a = register(&mut state, &job, "a");
        let b = register(&mut state, &job, "b");
        form(&mut state, &job, 1, vec![member(&a, vec![0]), member(&b, vec![1])]);
        commit(&mut state, &job, 1, 1);
        state.apply(Command::BeginGeneration {
            job_id: job.clone(),
            generation: 2,
            reason: "x".into(),
            removed: vec![b.clone()],
            after_step: 0,
            unix: 5.0,
        });
        let response = state.apply(Command::NewGeneration {
            job_id: job.clone(),
            generation: 2,
            start_step: 2,
            members: vec![member(&a, vec![0, 1])],
            carried: vec![StepCommit { step: 2, reporters: 1, members: 2, ..Default::default() }],
            removed: vec![],
            reason: "x".into(),
            unix: 6.0,
        });
        assert_eq!(response, Response::Applied);
        assert_eq!(state.jobs[&job].committed_step, 2);
        assert_eq!(state.jobs[&job].state, JobState::Running);
    }

    #[test]
    fn registering_again_with_the_same_instance_returns_the_same_id() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 1, 1);
        let first = register(&mut state, &job, "i1");
        assert_eq!(register(&mut state, &job, "i1"), first);
        assert_ne!(register(&mut state, &job, "i2"), first);
    }

    #[test]
    fn stopped_jobs_refuse_everything_but_stay_readable() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 1, 1);
        state.apply(Command::StopJob { job_id: job.clone(), unix: 2.0 });
        assert_eq!(state.jobs[&job].state, JobState::Stopped);
        let again =
            Command::RegisterWorker(Box::new(RegisterWorker { job_id: job.clone(), record: worker("x") }));
        assert!(matches!(state.apply(again), Response::Refused { reason, .. } if reason.contains("Stopped")));
        assert_eq!(state.find_job("demo").unwrap().id, job);
    }

    #[test]
    fn kv_limits_are_enforced() {
        let mut state = ClusterState::default();
        let job = submit(&mut state, 1, 1);
        let big = Command::KvPut {
            job_id: job.clone(),
            key: "k".into(),
            value: vec![0; MAX_KV_VALUE_BYTES + 1],
            generation: None,
        };
        assert!(matches!(state.apply(big), Response::Refused { .. }));
        assert!(state.kv.get(&job).is_none_or(|kv| kv.is_empty()));
    }

    #[test]
    fn a_job_keeps_its_first_job_object() {
        let mut state = ClusterState::default();
        let job_id = submit(&mut state, 1, 10);
        let record = |uid: &str| Command::RecordJobObject { job_id: job_id.clone(), uid: uid.into() };
        assert_eq!(state.apply(record("u1")), Response::Applied);
        // A second leader records the same object again: nothing changes.
        assert_eq!(state.apply(record("u1")), Response::Applied);
        assert!(
            matches!(state.apply(record("u2")), Response::Refused { why: Refusal::State, reason } if reason.contains("u1"))
        );
        assert_eq!(state.jobs[&job_id].kube_object, "u1");
    }
}
