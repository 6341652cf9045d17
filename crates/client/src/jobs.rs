//! What podctl's commands ask of a cluster, in this crate's own types.
//!
//! The wire messages (`proto::v1`) stay behind these calls: a command sees a [`JobStatus`] with
//! a [`JobState`] it can match on, never a protobuf enum number, and a field added to the wire
//! reaches the command line only when it is added here.

use crate::{Client, ClientError};
use futures::stream::{BoxStream, StreamExt};
use proto::v1::{self, cluster_client::ClusterClient};
use std::collections::BTreeMap;

/// How long a submission may take: the leader lists the job's checkpoint root and reads every
/// chunk of the checkpoint the job resumes from before it answers.
const SUBMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Where a job is in its life: the one definition, which the coordinator's replicated state
/// holds (hence serde: it is in the Raft log) and its commands read. `proto::v1::JobState` is
/// its wire form; both conversions are here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JobState {
    /// Submitted, waiting for its workers.
    Pending,
    /// A generation is running steps.
    Running,
    /// A generation change is in progress (quiesce sent, assignment not yet committed).
    Recovering,
    /// Every step is committed.
    Completed,
    /// Given up.
    Failed,
    /// Stopped by a user.
    Stopped,
}

impl JobState {
    /// Whether the job is over.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Stopped)
    }

    /// The state a wire number names: `None` for one this client does not know (a newer
    /// coordinator's) or none at all.
    fn from_wire(state: i32) -> Option<Self> {
        match v1::JobState::try_from(state).ok()? {
            v1::JobState::Unspecified => None,
            v1::JobState::Pending => Some(Self::Pending),
            v1::JobState::Running => Some(Self::Running),
            v1::JobState::Recovering => Some(Self::Recovering),
            v1::JobState::Completed => Some(Self::Completed),
            v1::JobState::Failed => Some(Self::Failed),
            v1::JobState::Stopped => Some(Self::Stopped),
        }
    }
}

impl From<JobState> for v1::JobState {
    fn from(state: JobState) -> Self {
        match state {
            JobState::Pending => Self::Pending,
            JobState::Running => Self::Running,
            JobState::Recovering => Self::Recovering,
            JobState::Completed => Self::Completed,
            JobState::Failed => Self::Failed,
            JobState::Stopped => Self::Stopped,
        }
    }
}

/// A job as the leader sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobStatus {
    /// The job's id.
    pub job_id: String,
    /// Its name (from the spec).
    pub name: String,
    /// Where it is in its life; `None` when the coordinator's state is one this client does
    /// not know (a newer coordinator's).
    pub state: Option<JobState>,
    /// Why it failed, or what it is waiting for.
    pub message: String,
    /// The current generation (members and their data-parallel ranks).
    pub generation: u64,
    /// Global steps committed.
    pub step: u64,
    /// Steps the job runs.
    pub total_steps: u64,
    /// The loss of the last committed step (NaN before the first).
    pub loss: f64,
    /// Tokens per second of the last committed step.
    pub tokens_per_second: f64,
    /// Seconds of the last committed step.
    pub step_seconds: f64,
    /// Estimated model FLOPs utilization, 0 when unknown.
    pub mfu: f64,
    /// The slices and their workers: members of the generation first, then spares and joiners.
    pub slices: Vec<SliceStatus>,
    /// The newest committed checkpoint.
    pub last_checkpoint: Option<CheckpointInfo>,
    /// Recent events, most recent last (at most 50).
    pub events: Vec<Event>,
    /// The coordinator node that answered, `id@address`.
    pub leader: String,
    /// Other metrics of the last step (reward, kl, ...).
    pub metrics: BTreeMap<String, f64>,
    /// Where workers find the bundle.
    pub bundle_uri: String,
    /// The bundle's identity.
    pub bundle_id: String,
}

/// One slice of a job and the worker on it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SliceStatus {
    /// The slice.
    pub slice: u32,
    /// Its worker.
    pub worker_id: String,
    /// The worker's host.
    pub host: String,
    /// The logical data-parallel ranks it computes (none for a spare).
    pub virtual_ranks: Vec<u32>,
    /// `ok`, `late`, `lost`, `joining`, `preempted`, `spare` or `unknown`.
    pub health: String,
    /// Steps its state holds.
    pub step: u64,
    /// Seconds since its last heartbeat.
    pub heartbeat_age_seconds: f64,
}

/// Something that happened to a job (a preemption, a recovery, a checkpoint, ...).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Event {
    /// When, in seconds since the Unix epoch.
    pub unix_seconds: f64,
    /// `preemption`, `lease_expired`, `recovery`, `checkpoint`, `joined`, ...
    pub kind: String,
    /// The committed step then.
    pub step: u64,
    /// For people.
    pub detail: String,
}

/// A committed checkpoint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CheckpointInfo {
    /// Its step.
    pub step: u64,
    /// Its directory.
    pub uri: String,
    /// When it was committed, in seconds since the Unix epoch.
    pub committed_unix: f64,
    /// Bytes written.
    pub bytes: u64,
}

/// A worker's log line, as workers push them and `podctl logs` reads them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogLine {
    /// The job.
    pub job_id: String,
    /// The worker that logged it.
    pub worker_id: String,
    /// Its slice.
    pub slice: u32,
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// `error`, `warn`, `info`, ...
    pub level: String,
    /// The line.
    pub message: String,
    /// The worker's step then.
    pub step: u64,
    /// The worker's generation then.
    pub generation: u64,
    /// The worker's count of its lines, from 1 (0: not numbered): a line seen again, from a
    /// retried push or the run record, has the same `(worker_id, seq)`.
    pub seq: u64,
}

/// The coordinator cluster as the node that answered sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterInfo {
    /// The leader's id; 0 when there is none.
    pub leader_id: u64,
    /// The leader's address.
    pub leader_address: String,
    /// The Raft term.
    pub term: u64,
    /// The answering node's last applied log index.
    pub commit_index: u64,
    /// Every member.
    pub members: Vec<Member>,
    /// The node that answered.
    pub answered_by: u64,
    /// The answering node's last snapshot (0: none).
    pub snapshot_index: u64,
    /// The answering node's log is purged up to here (0: nothing).
    pub purged_index: u64,
}

/// A coordinator node of the cluster.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Member {
    /// Its Raft id.
    pub id: u64,
    /// Its address.
    pub address: String,
    /// Whether it votes (a learner does not yet).
    pub voter: bool,
    /// The log index the leader knows it holds (known on the leader only).
    pub matched_index: u64,
    /// Whether it answers the answering node's Raft calls: `self`, `answering`, `unreachable`,
    /// or `unknown` (a follower calls its peers only in elections).
    pub reachability: String,
    /// How long it has not answered (`unreachable` only).
    pub unreachable_seconds: f64,
    /// Why the first unanswered call failed (`unreachable` only).
    pub unreachable_error: String,
}

/// A job to submit. Its checkpoint root is not part of it: the coordinator decides it from the
/// spec, once, at submission (docs/PROTOCOL.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The job spec as written (JSON is YAML); the coordinator validates it again.
    pub spec_yaml: String,
    /// Where workers find the exported bundle (a path or an object-store URL).
    pub bundle_uri: String,
    /// The bundle's identity (hex SHA-256), checked by workers.
    pub bundle_id: String,
    /// Begin a new line of checkpoints beside what the job's root holds instead of resuming
    /// from its newest verified checkpoint.
    pub start_over: bool,
}

/// A submitted job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// Its id.
    pub job_id: String,
    /// The token that scopes its workers and clients to it.
    pub job_token: String,
}

/// Updates streamed from the leader: a job's statuses or its log lines. The stream ends when the
/// job ends or the leader changes (ask again to follow the new one).
pub struct Updates<T> {
    stream: BoxStream<'static, Result<T, ClientError>>,
}

impl<T> std::fmt::Debug for Updates<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Updates").finish_non_exhaustive()
    }
}

impl<T> Updates<T> {
    /// The next update; `None` once the stream ended.
    pub async fn next(&mut self) -> Result<Option<T>, ClientError> {
        self.stream.next().await.transpose()
    }
}

fn updates<W, T>(call: &'static str, stream: tonic::Streaming<W>, convert: fn(W) -> T) -> Updates<T>
where
    W: Send + 'static,
    T: Send + 'static,
{
    let stream =
        stream.map(move |item| item.map(convert).map_err(|status| ClientError::refused(call, &status)));
    Updates { stream: stream.boxed() }
}

impl JobStatus {
    /// Whether the job is over (a state this client does not know is not an end).
    pub fn is_terminal(&self) -> bool {
        self.state.is_some_and(JobState::is_terminal)
    }
}

impl From<v1::JobStatus> for JobStatus {
    fn from(s: v1::JobStatus) -> Self {
        Self {
            state: JobState::from_wire(s.state),
            job_id: s.job_id,
            name: s.name,
            message: s.message,
            generation: s.generation,
            step: s.step,
            total_steps: s.total_steps,
            loss: s.loss,
            tokens_per_second: s.tokens_per_second,
            step_seconds: s.step_seconds,
            mfu: s.mfu,
            slices: s.slices.into_iter().map(SliceStatus::from).collect(),
            last_checkpoint: s.last_checkpoint.map(CheckpointInfo::from),
            events: s.events.into_iter().map(Event::from).collect(),
            leader: s.leader,
            metrics: s.metrics.into_iter().collect(),
            bundle_uri: s.bundle_uri,
            bundle_id: s.bundle_id,
        }
    }
}

impl From<v1::SliceStatus> for SliceStatus {
    fn from(s: v1::SliceStatus) -> Self {
        Self {
            slice: s.slice,
            worker_id: s.worker_id,
            host: s.host,
            virtual_ranks: s.virtual_ranks,
            health: s.health,
            step: s.step,
            heartbeat_age_seconds: s.heartbeat_age_seconds,
        }
    }
}

impl From<v1::Event> for Event {
    fn from(e: v1::Event) -> Self {
        Self { unix_seconds: e.unix_seconds, kind: e.kind, step: e.step, detail: e.detail }
    }
}

impl From<v1::CheckpointInfo> for CheckpointInfo {
    fn from(c: v1::CheckpointInfo) -> Self {
        Self { step: c.step, uri: c.uri, committed_unix: c.committed_unix, bytes: c.bytes }
    }
}

impl From<v1::LogLine> for LogLine {
    fn from(l: v1::LogLine) -> Self {
        let v1::LogLine { job_id, worker_id, slice, unix_ms, level, message, step, generation, seq } = l;
        Self { job_id, worker_id, slice, unix_ms, level, message, step, generation, seq }
    }
}

impl From<LogLine> for v1::LogLine {
    fn from(l: LogLine) -> Self {
        let LogLine { job_id, worker_id, slice, unix_ms, level, message, step, generation, seq } = l;
        Self { job_id, worker_id, slice, unix_ms, level, message, step, generation, seq }
    }
}

impl From<v1::ClusterInfo> for ClusterInfo {
    fn from(c: v1::ClusterInfo) -> Self {
        Self {
            leader_id: c.leader_id,
            leader_address: c.leader_address,
            term: c.term,
            commit_index: c.commit_index,
            members: c
                .members
                .into_iter()
                .map(|m| Member {
                    id: m.id,
                    address: m.address,
                    voter: m.voter,
                    matched_index: m.matched_index,
                    reachability: m.reachability,
                    unreachable_seconds: m.unreachable_seconds,
                    unreachable_error: m.unreachable_error,
                })
                .collect(),
            answered_by: c.answered_by,
            snapshot_index: c.snapshot_index,
            purged_index: c.purged_index,
        }
    }
}

impl Client {
    /// Submits a job (admin token). Retried only when the refusal shows nothing was done.
    pub async fn submit(&self, job: &Submission) -> Result<Submitted, ClientError> {
        // The leader verifies the checkpoint it resumes from (every chunk) before it answers.
        let t = SUBMIT_TIMEOUT.max(self.timeout());
        let request = v1::SubmitJobRequest {
            spec_yaml: job.spec_yaml.clone(),
            bundle_uri: job.bundle_uri.clone(),
            bundle_id: job.bundle_id.clone(),
            start_over: job.start_over,
        };
        let answer = self
            .call("Jobs.Submit", false, t, |c| {
                let r = self.request(request.clone(), Some(t));
                async move { Self::jobs(c).submit(r).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(Submitted { job_id: answer.job_id, job_token: answer.job_token })
    }

    /// A job's status, by id or name (linearizable).
    pub async fn get_job(&self, job_id: &str) -> Result<JobStatus, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Get", true, t, |c| {
            let r = self.request(v1::GetJobRequest { job_id: job_id.into() }, Some(t));
            async move { Self::jobs(c).get(r).await.map(|r| r.into_inner().into()) }
        })
        .await
    }

    /// Every job the token may see.
    pub async fn list_jobs(&self) -> Result<Vec<JobStatus>, ClientError> {
        let t = self.timeout();
        self.call("Jobs.List", true, t, |c| {
            let r = self.request(v1::ListJobsRequest {}, Some(t));
            async move {
                Self::jobs(c)
                    .list(r)
                    .await
                    .map(|r| r.into_inner().jobs.into_iter().map(JobStatus::from).collect())
            }
        })
        .await
    }

    /// A job's statuses: one at once, then one on every change and at least every
    /// `interval_ms` (ends when the job ends or the leader changes).
    pub async fn watch_job(&self, job_id: &str, interval_ms: u32) -> Result<Updates<JobStatus>, ClientError> {
        let t = self.timeout();
        let stream = self
            .call("Jobs.Watch", true, t, |c| {
                let r = self.request(v1::WatchJobRequest { job_id: job_id.into(), interval_ms }, None);
                async move { Self::jobs(c).watch(r).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(updates("Jobs.Watch", stream, JobStatus::from))
    }

    /// Stops a job; returns its state (`None`: one this client does not know).
    pub async fn stop_job(&self, job_id: &str) -> Result<Option<JobState>, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Stop", true, t, |c| {
            let r = self.request(v1::StopJobRequest { job_id: job_id.into() }, Some(t));
            async move { Self::jobs(c).stop(r).await.map(|r| JobState::from_wire(r.into_inner().state)) }
        })
        .await
    }

    /// A job's log lines: the last `tail` kept (every one kept when 0), only `slice`'s when
    /// given; with `follow`, new lines as they arrive.
    pub async fn logs(
        &self,
        job_id: &str,
        follow: bool,
        slice: Option<u32>,
        tail: u32,
    ) -> Result<Updates<LogLine>, ClientError> {
        let t = self.timeout();
        let request = v1::LogsRequest { job_id: job_id.into(), follow, slice, tail };
        let stream = self
            .call("Jobs.Logs", true, t, |c| {
                let r = self.request(request.clone(), None);
                async move { Self::jobs(c).logs(r).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(updates("Jobs.Logs", stream, LogLine::from))
    }

    /// A job's committed checkpoints, oldest first.
    pub async fn checkpoints(&self, job_id: &str) -> Result<Vec<CheckpointInfo>, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Checkpoints", true, t, |c| {
            let r = self.request(v1::GetJobRequest { job_id: job_id.into() }, Some(t));
            async move {
                Self::jobs(c)
                    .checkpoints(r)
                    .await
                    .map(|r| r.into_inner().checkpoints.into_iter().map(CheckpointInfo::from).collect())
            }
        })
        .await
    }

    /// The cluster as the first node that answers sees it (any node answers).
    pub async fn cluster_info(&self) -> Result<ClusterInfo, ClientError> {
        let t = self.timeout();
        self.call("Cluster.Info", true, t, |c| {
            let r = self.request(v1::ClusterInfoRequest {}, Some(t));
            async move { ClusterClient::new(c).info(r).await.map(|r| r.into_inner().into()) }
        })
        .await
    }

    /// Adds a node (admin token): it joins as a learner, catches up, then votes.
    pub async fn add_member(&self, id: u64, address: &str) -> Result<ClusterInfo, ClientError> {
        let t = self.timeout() * 6;
        self.call("Cluster.AddMember", true, t, |c| {
            let r = self.request(v1::AddMemberRequest { id, address: address.into() }, Some(t));
            async move { ClusterClient::new(c).add_member(r).await.map(|r| r.into_inner().into()) }
        })
        .await
    }

    /// Removes a node (admin token).
    pub async fn remove_member(&self, id: u64) -> Result<ClusterInfo, ClientError> {
        let t = self.timeout();
        self.call("Cluster.RemoveMember", true, t, |c| {
            let r = self.request(v1::RemoveMemberRequest { id }, Some(t));
            async move { ClusterClient::new(c).remove_member(r).await.map(|r| r.into_inner().into()) }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wire_status_becomes_the_client_s_own_with_every_field() {
        let wire = v1::JobStatus {
            job_id: "j1".into(),
            name: "tiny".into(),
            state: v1::JobState::Recovering as i32,
            step: 7,
            slices: vec![v1::SliceStatus { slice: 1, health: "late".into(), ..Default::default() }],
            last_checkpoint: Some(v1::CheckpointInfo {
                step: 5,
                uri: "file:///c/5".into(),
                ..Default::default()
            }),
            events: vec![v1::Event { kind: "recovery".into(), step: 7, ..Default::default() }],
            metrics: [("reward".to_string(), 0.5)].into(),
            ..Default::default()
        };
        let status = JobStatus::from(wire);
        assert_eq!(status.state, Some(JobState::Recovering));
        assert!(!JobState::Recovering.is_terminal());
        assert_eq!((status.job_id.as_str(), status.step), ("j1", 7));
        assert_eq!(status.slices[0].health, "late");
        assert_eq!(status.last_checkpoint.unwrap().uri, "file:///c/5");
        assert_eq!(status.events[0].kind, "recovery");
        assert_eq!(status.metrics["reward"], 0.5);
    }

    #[test]
    fn an_unknown_state_number_is_unknown_not_a_panic() {
        let wire = v1::JobStatus { state: 99, ..Default::default() };
        assert_eq!(JobStatus::from(wire).state, None);
        assert_eq!(JobState::from_wire(v1::JobState::Unspecified as i32), None);
        for (wire, state) in
            [(v1::JobState::Completed, JobState::Completed), (v1::JobState::Stopped, JobState::Stopped)]
        {
            assert_eq!(JobState::from_wire(wire as i32), Some(state));
            assert!(state.is_terminal());
        }
    }

    #[test]
    fn every_state_crosses_the_wire_and_back() {
        use JobState::*;
        for state in [Pending, Running, Recovering, Completed, Failed, Stopped] {
            assert_eq!(JobState::from_wire(v1::JobState::from(state) as i32), Some(state));
        }
    }

    #[test]
    fn log_lines_cross_the_wire_unchanged() {
        let line = LogLine {
            job_id: "j".into(),
            worker_id: "w".into(),
            slice: 2,
            unix_ms: 9,
            level: "warn".into(),
            message: "m".into(),
            step: 3,
            generation: 4,
            seq: 5,
        };
        assert_eq!(LogLine::from(v1::LogLine::from(line.clone())), line);
    }
}
