//! What is done to a job from outside the leader loop: submission (through `Jobs.Submit` or a
//! Kubernetes declaration), stopping it, and committing a checkpoint once every member reported
//! its part; and the retention run the leader loop starts after each commit.
//!
//! Each runs on the leader and goes through Raft. The refusals are a typed [`JobError`]; the
//! gRPC edge ([`crate::grpc`]) and the Kubernetes plane ([`crate::kubernetes`]) say them each in
//! their own terms.
//!
//! A job's checkpoint root is decided here, once, at submission, from its spec (`checkpoint.uri`,
//! else `file://<output>/checkpoints`): every assignment hands it to the workers, and the
//! committed checkpoints' directories are made from it.

use crate::ctx::{Ctx, NotServing};
use crate::decide;
use crate::leader::{broadcast_in_force, unix_now};
use crate::memory::PendingSave;
use crate::state::{CheckpointEntry, Command, Job, JobShape, Response, SubmitJob};
use checkpoint::{CheckpointError, CommitLog, CommitRecord, HostReport, SaveSpec};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// Longest time one checkpoint finalization may take (manifest write, commit, marker).
const FINALIZE_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest time one retention run may take (listing the root, forgetting commits through Raft,
/// deleting their objects).
const RETENTION_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest time the resume rule may take at submission (listing the root, reading every chunk
/// of the checkpoint resumed from). The client's submission waits longer.
const RESUME_SCAN_TIMEOUT: Duration = Duration::from_secs(240);

/// Why a job operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// This node cannot serve it now.
    #[error(transparent)]
    NotServing(#[from] NotServing),
    /// The submitted spec does not parse or validate.
    #[error(transparent)]
    InvalidSpec(#[from] job::JobError),
    /// A field of the submitted spec does not work with the cluster or its checkpoint root.
    #[error("{field}: {reason}")]
    Unfit {
        /// The field, e.g. `checkpoint.uri`.
        field: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The checkpoint root's newest line is another job's (the message names `--start-over`).
    #[error(transparent)]
    ForeignRoot(#[from] checkpoint::lineage::ForeignRoot),
    /// The checkpoint root could not be read to decide where the job resumes.
    #[error(transparent)]
    Resume(crate::resume::ResumeError),
    /// Verifying the checkpoint root took longer than a submission may wait.
    #[error("verifying the checkpoints under {root} took over {after:?}")]
    ResumeTimeout {
        /// The root.
        root: String,
        /// How long it may take.
        after: Duration,
    },
    /// The replicated state refused the command.
    #[error("{reason}")]
    Refused {
        /// Why, as a type.
        why: crate::state::Refusal,
        /// Why, for people.
        reason: String,
    },
    /// Members of one save sent different save specs.
    #[error("{worker_id} sent a save spec for step {step} that differs from another member's")]
    SaveSpecDiffers {
        /// The worker whose spec differs.
        worker_id: String,
        /// The save's step.
        step: u64,
    },
    /// The checkpoint was not committed (its root cannot be opened, a write failed, the
    /// generation that saved it ended).
    #[error("checkpoint step {step} not committed: {reason}")]
    NotCommitted {
        /// The save's step.
        step: u64,
        /// Why.
        reason: String,
    },
    /// Finalizing took longer than it may.
    #[error("finalizing the checkpoint took over {0:?}")]
    FinalizeTimeout(Duration),
    /// Something this node should never see (no randomness, an answer of the wrong kind).
    #[error("{what}: {detail}")]
    Internal {
        /// What the node was doing.
        what: &'static str,
        /// What happened.
        detail: String,
    },
}

/// Retention could not be applied to a job's root (the commits stand; the leader retries).
#[derive(Debug, thiserror::Error)]
#[error("retention of job {job_id}'s checkpoints: {reason}")]
pub struct RetentionError {
    /// The job.
    pub job_id: String,
    /// Why.
    pub reason: String,
}

/// What the leader derives from a spec.
fn shape_of(spec: &job::JobSpec) -> Result<JobShape, JobError> {
    let dp_size = u32::try_from(spec.mesh.dcn).map_err(|_| JobError::Unfit {
        field: "mesh.dcn",
        reason: format!("{} is too large", spec.mesh.dcn),
    })?;
    Ok(JobShape {
        name: spec.name.clone(),
        dp_size,
        total_steps: spec.steps,
        checkpoint_every: spec.checkpoint.as_ref().map_or(0, |c| c.every),
        keep_last: spec.checkpoint.as_ref().map_or(3, |c| c.keep),
        keep_every: spec.checkpoint.as_ref().map_or(0, |c| c.keep_every),
        output_dir: spec.output_dir().display().to_string(),
    })
}

fn new_token() -> Result<String, JobError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| JobError::Internal { what: "drawing a job token", detail: e.to_string() })?;
    Ok(hex::encode(bytes))
}

/// Eight hex digits, unique per submission in practice: the attempt part of its save ids.
fn new_nonce() -> Result<String, JobError> {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes)
        .map_err(|e| JobError::Internal { what: "drawing a save id", detail: e.to_string() })?;
    Ok(hex::encode(bytes))
}

/// The resume rule over the job's root (nothing to find without checkpoints), bounded in time.
async fn find_resume(
    ctx: &Ctx,
    spec: &job::JobSpec,
    checkpoint_uri: &str,
    start_over: bool,
) -> Result<crate::resume::Found, JobError> {
    let now_ms = (unix_now() * 1000.0) as u64;
    if spec.checkpoint.is_none() || checkpoint_uri.is_empty() {
        return Ok(crate::resume::Found {
            line: checkpoint::lineage::new_line(now_ms),
            ..Default::default()
        });
    }
    let storage = checkpoint::Storage::open(checkpoint_uri, &ctx.config.store_options)
        .map_err(|e| JobError::Unfit { field: "checkpoint.uri", reason: format!("{checkpoint_uri}: {e}") })?;
    let identity = spec.checkpoint_identity();
    // On a blocking thread of its own: the checkpoint crate's verification future is not `Send`
    // (a closure over borrowed read jobs), which a gRPC handler's future must be.
    let runtime = tokio::runtime::Handle::current();
    let find = tokio::task::spawn_blocking(move || {
        runtime.block_on(async {
            let find = crate::resume::find(&storage, &identity, start_over, now_ms);
            tokio::time::timeout(RESUME_SCAN_TIMEOUT, find).await
        })
    });
    match find
        .await
        .map_err(|e| JobError::Internal { what: "applying the resume rule", detail: e.to_string() })?
    {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(crate::resume::ResumeError::ForeignRoot(e))) => Err(JobError::ForeignRoot(e)),
        Ok(Err(e)) => Err(JobError::Resume(e)),
        Err(_) => {
            Err(JobError::ResumeTimeout { root: checkpoint_uri.to_string(), after: RESUME_SCAN_TIMEOUT })
        }
    }
}

/// A submitted job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// Its id.
    pub job_id: String,
    /// Its token (only its hash is replicated).
    pub token: String,
}

/// What is submitted.
#[derive(Debug, Clone, Default)]
pub struct Submission {
    /// The job spec as written.
    pub spec_yaml: String,
    /// Where workers find the bundle.
    pub bundle_uri: String,
    /// The bundle's identity.
    pub bundle_id: String,
    /// The Kubernetes declaration it comes from (empty through the API).
    pub source: String,
    /// Begin a new line of checkpoints beside what the root holds instead of resuming.
    pub start_over: bool,
}

/// Submits a job on the leader: checks the spec, derives its shape and its checkpoint root,
/// applies the resume rule to the root ([`crate::resume`]), proposes it. The state machine
/// keeps one job per Kubernetes declaration.
pub async fn submit(ctx: &Ctx, submission: Submission) -> Result<Submitted, JobError> {
    let Submission { spec_yaml, bundle_uri, bundle_id, source, start_over } = submission;
    let spec = job::JobSpec::from_yaml(&spec_yaml, std::path::Path::new("<submitted spec>"))?;
    if let Some(template) = &ctx.config.kubernetes {
        let devices = u32::try_from(spec.mesh.ici.fsdp * spec.mesh.ici.tp).unwrap_or(u32::MAX);
        if let Some(reason) = template.refusal(devices) {
            return Err(JobError::Unfit { field: "mesh", reason });
        }
    }
    let checkpoint_uri = spec.checkpoint_uri().unwrap_or_default();
    let found = find_resume(ctx, &spec, &checkpoint_uri, start_over).await?;
    if let Some(resumed) = found.resumed()
        && resumed.record.step > spec.steps
    {
        return Err(JobError::Unfit {
            field: "steps",
            reason: format!(
                "checkpoint {} is at step {}, past the job's {} steps; raise `steps`, or launch with \
                 --start-over to train afresh beside it",
                resumed.uri, resumed.record.step, spec.steps
            ),
        });
    }
    let token = new_token()?;
    let submit = SubmitJob {
        shape: shape_of(&spec)?,
        checkpoint_uri,
        spec_yaml,
        bundle_uri,
        bundle_id,
        token_sha256: hex::encode(Sha256::digest(token.as_bytes())),
        unix: unix_now(),
        source,
        line: found.line,
        attempt: format!("s{}", new_nonce()?),
        catalog: found.catalog,
        passed_over: found.passed_over,
    };
    match ctx.propose(Command::SubmitJob(Box::new(submit))).await? {
        Response::JobSubmitted { job_id } => Ok(Submitted { job_id, token }),
        Response::Refused { why, reason } => Err(JobError::Refused { why, reason }),
        other => {
            Err(JobError::Internal { what: "submitting", detail: format!("unexpected answer {other:?}") })
        }
    }
}

/// Stops a job on the leader unless it already ended; its state after.
pub async fn stop(ctx: &Ctx, job: &Job) -> Result<Option<crate::state::JobState>, JobError> {
    if !job.state.is_terminal() {
        ctx.propose(Command::StopJob { job_id: job.id.clone(), unix: unix_now() }).await?;
        broadcast_in_force(ctx, &job.id);
    }
    Ok(ctx.shared.read(|s| s.jobs.get(&job.id).map(|j| j.state)))
}

/// A member's report of its part of a save, checked against the request it came in.
pub struct SaveReport {
    /// The reporting member.
    pub worker_id: String,
    /// What it wrote.
    pub report: HostReport,
    /// The save as every member planned it.
    pub spec: SaveSpec,
}

/// Records a member's part of a save; once every member's part is in, commits the checkpoint
/// (manifest, Raft entry, marker) and asks the leader loop for a retention run. Returns the
/// checkpoint's directory once it is committed, `None` while parts are missing.
pub async fn report_checkpoint(
    ctx: &Arc<Ctx>,
    job: Job,
    part: SaveReport,
) -> Result<Option<String>, JobError> {
    let SaveReport { worker_id, report, spec } = part;
    let (step, save_id) = (spec.step, spec.save_id.clone());
    if let Some(done) = job.checkpoints.iter().find(|c| c.record.step == step && c.record.save_id == save_id)
    {
        return Ok(Some(done.uri.clone()));
    }
    let key = (step, save_id);
    let ready = ctx.leader.with(|m| {
        let saves = m.saves.entry(job.id.clone()).or_default();
        let save = saves.entry(key.clone()).or_insert_with(|| PendingSave {
            generation: job.generation,
            spec: spec.clone(),
            reports: Default::default(),
        });
        if save.spec != spec {
            return Err(JobError::SaveSpecDiffers { worker_id: worker_id.clone(), step });
        }
        save.reports.insert(worker_id.clone(), report);
        let complete = job.members.iter().all(|m| save.reports.contains_key(&m.worker_id));
        if !complete {
            return Ok(None);
        }
        m.jobs.entry(job.id.clone()).or_default().saves_finalizing += 1;
        Ok(Some((save.clone(), m.term)))
    })?;
    let Some((save, term)) = ready else { return Ok(None) };
    // In its own task: a worker that goes away must not cancel the commit.
    let ctx = ctx.clone();
    let task = tokio::spawn(async move {
        let finalized = tokio::time::timeout(FINALIZE_TIMEOUT, finalize(&ctx, &job, save))
            .await
            .map_err(|_| JobError::FinalizeTimeout(FINALIZE_TIMEOUT))
            .and_then(|r| r);
        ctx.leader.with(|m| {
            if m.term != term {
                return;
            }
            let live = m.jobs.entry(job.id.clone()).or_default();
            live.saves_finalizing = live.saves_finalizing.saturating_sub(1);
            if finalized.is_err() {
                return;
            }
            // The leader loop applies retention (and, after the final one, completes the job).
            live.retention.wanted = true;
            // Only this save: an earlier one may still complete (its reports went to a leader
            // that died and reach this one after a later save's). An ended generation's saves
            // are forgotten when the next one begins.
            if let Some(saves) = m.saves.get_mut(&job.id) {
                saves.remove(&key);
            }
        });
        ctx.leader.wake.notify_one();
        finalized.map(Some)
    });
    task.await.map_err(|e| JobError::Internal { what: "finalizing a checkpoint", detail: e.to_string() })?
}

/// Writes the manifest, commits through Raft, writes the marker. Returns the checkpoint's
/// directory.
async fn finalize(ctx: &Arc<Ctx>, job: &Job, save: PendingSave) -> Result<String, JobError> {
    let step = save.spec.step;
    let not_committed = |reason: String| JobError::NotCommitted { step, reason };
    let storage = checkpoint::Storage::open(&job.checkpoint_uri, &ctx.config.store_options)
        .map_err(|e| not_committed(e.to_string()))?;
    let reports: Vec<HostReport> = save.reports.into_values().collect();
    let bytes = reports.iter().map(|r| r.object.size).sum();
    let log = RaftCommitLog {
        ctx: ctx.clone(),
        job_id: job.id.clone(),
        generation: save.generation,
        root: storage.url().to_string(),
        bytes,
    };
    let commit = checkpoint::finalize(&storage, &save.spec, &reports, &log)
        .await
        .map_err(|e| not_committed(e.to_string()))?;
    Ok(checkpoint_dir(&log.root, &commit))
}

/// Applies the job's retention rule to its root: expires the commits the rule does not keep
/// (forgotten through Raft, then marker, then data) and removes orphaned save directories,
/// leaving alone the saves whose reports are coming in. Scoped through the job's catalog: it
/// holds the line's checkpoints up to the one resumed from and the job's own saves, never
/// another line's.
pub async fn apply_retention(ctx: &Arc<Ctx>, job: &Job) -> Result<checkpoint::GcReport, RetentionError> {
    let failed = |reason: String| RetentionError { job_id: job.id.clone(), reason };
    let storage = checkpoint::Storage::open(&job.checkpoint_uri, &ctx.config.store_options)
        .map_err(|e| failed(e.to_string()))?;
    let log = RaftCommitLog {
        ctx: ctx.clone(),
        job_id: job.id.clone(),
        generation: job.generation,
        root: storage.url().to_string(),
        bytes: 0,
    };
    let (active, finished) = ctx.leader.with(|m| {
        let finished = m.jobs.get(&job.id).is_some_and(|live| decide::saves_finished(job, live));
        // Once finished, a save still listed here lacks a part that will never come.
        let active: Vec<checkpoint::ActiveSave> = match m.saves.get(&job.id) {
            Some(saves) if !finished => saves.keys().cloned().collect(),
            _ => Vec::new(),
        };
        (active, finished)
    });
    let retention = decide::retention(job, finished);
    let gc = checkpoint::gc(&storage, &log, &retention, &active);
    match tokio::time::timeout(RETENTION_TIMEOUT, gc).await {
        Ok(Ok(report)) => Ok(report),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(failed(format!("took over {RETENTION_TIMEOUT:?}"))),
    }
}

/// A committed checkpoint's directory under the job's root.
fn checkpoint_dir(root: &str, commit: &CommitRecord) -> String {
    format!("{}/{}", root.trim_end_matches('/'), commit.dir())
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
            uri: checkpoint_dir(&self.root, commit),
            committed_unix: unix_now(),
            bytes: self.bytes,
        };
        let command =
            Command::CommitCheckpoint { job_id: self.job_id.clone(), generation: self.generation, entry };
        match self.ctx.propose(command).await {
            Ok(Response::Refused { reason, .. }) => Err(commit_log_error("record", reason)),
            Ok(_) => Ok(()),
            Err(e) => Err(commit_log_error("record", e.to_string())),
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
            Ok(Response::Refused { reason, .. }) => Err(commit_log_error("remove", reason)),
            Ok(_) => Ok(()),
            Err(e) => Err(commit_log_error("remove", e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> job::JobSpec {
        let yaml = format!(
            "name: t\nmodel: tiny\nmesh: {{ dcn: 2, ici: {{ fsdp: 1, tp: 1 }} }}\nbatch: {{ global: 4, micro: 1 }}\n\
             seq_len: 16\nsteps: 10\ndata: {{ kind: arithmetic }}\noutput: /runs/t\n{extra}"
        );
        job::JobSpec::from_yaml(&yaml, std::path::Path::new("t.yaml")).unwrap()
    }

    #[test]
    fn the_shape_carries_the_retention_and_the_output() {
        let shape = shape_of(&spec("checkpoint: { every: 5, keep: 2 }\n")).unwrap();
        assert_eq!(
            (shape.dp_size, shape.total_steps, shape.checkpoint_every, shape.keep_last),
            (2, 10, 5, 2)
        );
        assert_eq!(shape.output_dir, "/runs/t");
        let none = shape_of(&spec("")).unwrap();
        assert_eq!((none.checkpoint_every, none.keep_last), (0, 3));
    }

    #[test]
    fn a_checkpoint_directory_is_its_root_and_its_own_name() {
        let commit = CommitRecord {
            step: 40,
            save_id: "s".into(),
            bundle: "b".into(),
            manifest_size: 1,
            manifest_crc32c: 2,
        };
        let dir = checkpoint_dir("file:///runs/t/checkpoints/", &commit);
        assert_eq!(dir, "file:///runs/t/checkpoints/000000000040-s");
        assert_eq!(checkpoint_dir("file:///runs/t/checkpoints", &commit), dir);
    }

    #[test]
    fn job_tokens_are_long_and_fresh() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
