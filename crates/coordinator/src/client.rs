//! The client library podctl and workers use to talk to a coordinator cluster.
//!
//! A [`Client`] takes every coordinator address it knows, finds the leader, follows the
//! `x-podctl-leader` redirects followers answer with, retries what is safe to retry (every call
//! but `Submit` is idempotent; `Submit` is retried only when it provably did nothing), and puts
//! a deadline on every attempt and an overall bound on the retries.

use crate::network::endpoint_via;
use crate::tls::ClientTls;
use proto::v1::{
    self, CheckpointAck, CheckpointList, CheckpointReport, ClusterInfo, Directive, JobStatus, KvGetRequest,
    KvPutRequest, LogLine, LogsRequest, RegisterRequest, RegisterResponse, StepAck, StepReport,
    SubmitJobRequest, SubmitJobResponse, WorkerEvent, cluster_client::ClusterClient, jobs_client::JobsClient,
    kv_client::KvClient, workers_client::WorkersClient,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};

/// Events a session queues before `send` waits.
const SESSION_BUFFER: usize = 256;
/// Largest message accepted from the coordinator.
const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Coordinator addresses, `host:port`; any of them, the leader is found.
    pub addresses: Vec<String>,
    /// The admin or job token.
    pub token: String,
    /// TLS; `None` for a plaintext local coordinator.
    pub tls: Option<ClientTls>,
    /// Deadline of one attempt (and of establishing a stream).
    pub call_timeout: Duration,
    /// How long to keep retrying (elections, redirects, restarts) before giving up.
    pub retry_for: Duration,
    /// Where to connect for an address, when not at the address itself: a local port-forward
    /// to that coordinator (`podctl --kube-context`). Redirects name the coordinators' own
    /// addresses, so they follow the same routes; TLS checks the coordinator's own name.
    pub routes: BTreeMap<String, String>,
}

impl ClientConfig {
    /// Defaults: 10 s per attempt, retries for 20 s.
    pub fn new(addresses: Vec<String>, token: impl Into<String>, tls: Option<ClientTls>) -> Self {
        Self {
            addresses,
            token: token.into(),
            tls,
            call_timeout: Duration::from_secs(10),
            retry_for: Duration::from_secs(20),
            routes: BTreeMap::new(),
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator refused the call.
    #[error("{call}: {} ({:?})", status.message(), status.code())]
    Refused {
        /// The RPC.
        call: &'static str,
        /// The coordinator's answer.
        status: Status,
    },
    /// No coordinator answered in time.
    #[error(
        "{call}: no coordinator leader answered within {waited:?} (tried {addresses}); last error: {last}"
    )]
    Unavailable {
        /// The RPC.
        call: &'static str,
        /// How long it tried.
        waited: Duration,
        /// The addresses it knew.
        addresses: String,
        /// The last error seen.
        last: String,
    },
    /// The configuration cannot be used.
    #[error("coordinator client: {0}")]
    Config(String),
}

impl ClientError {
    /// The gRPC code of the failure (`Unavailable` when nobody answered).
    pub fn code(&self) -> Code {
        match self {
            Self::Refused { status, .. } => status.code(),
            Self::Unavailable { .. } => Code::Unavailable,
            Self::Config(_) => Code::InvalidArgument,
        }
    }
}

struct Inner {
    config: ClientConfig,
    /// Known nodes: address and a lazily connecting channel.
    nodes: Mutex<Vec<(String, Channel)>>,
    /// Index into `nodes` of the node to try first.
    leader: Mutex<usize>,
}

/// A handle to the cluster; cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    auth: MetadataValue<tonic::metadata::Ascii>,
}

/// A worker's open session: send events, read directives.
pub struct Session {
    /// Events to the leader (heartbeats, preemption, failure).
    pub events: mpsc::Sender<WorkerEvent>,
    /// Directives from the leader; ends when the leader goes (reconnect with a new session).
    pub directives: Streaming<Directive>,
}

/// Whether a refusal provably did nothing, so even a non-idempotent call may be retried.
fn did_nothing(status: &Status) -> bool {
    let m = status.message();
    status.code() == Code::Unavailable
        && (m.starts_with("not the leader")
            || m.contains("catching up")
            || m.contains("tcp connect error")
            || m.contains("Connection refused"))
}

impl Client {
    /// A client of the cluster at `config.addresses` (nothing is dialled yet).
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        if config.addresses.is_empty() {
            return Err(ClientError::Config("no coordinator address given".into()));
        }
        let auth = format!("Bearer {}", config.token)
            .parse()
            .map_err(|_| ClientError::Config("the token must be printable ASCII".into()))?;
        let mut nodes = Vec::new();
        for addr in &config.addresses {
            nodes.push((addr.clone(), Self::dial(&config, addr)?));
        }
        Ok(Self { inner: Arc::new(Inner { config, nodes: Mutex::new(nodes), leader: Mutex::new(0) }), auth })
    }

    fn dial(config: &ClientConfig, addr: &str) -> Result<Channel, ClientError> {
        let connect = config.routes.get(addr).map_or(addr, String::as_str);
        endpoint_via(addr, connect, config.tls.as_ref(), config.call_timeout)
            .map(|e| e.connect_lazy())
            .map_err(ClientError::Config)
    }

    /// The same cluster, calling with another token (a job's).
    pub fn with_token(&self, token: &str) -> Result<Self, ClientError> {
        let auth = format!("Bearer {token}")
            .parse()
            .map_err(|_| ClientError::Config("the token must be printable ASCII".into()))?;
        Ok(Self { inner: self.inner.clone(), auth })
    }

    /// The address the client currently believes leads.
    pub fn leader_address(&self) -> String {
        let nodes = self.inner.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let i = *self.inner.leader.lock().unwrap_or_else(|e| e.into_inner());
        nodes.get(i).map(|(a, _)| a.clone()).unwrap_or_default()
    }

    fn current(&self) -> (usize, Channel) {
        let nodes = self.inner.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let i = *self.inner.leader.lock().unwrap_or_else(|e| e.into_inner()) % nodes.len();
        (i, nodes[i].1.clone())
    }

    /// Points at `addr` (adding it if new).
    fn follow(&self, addr: &str) -> Result<(), ClientError> {
        let mut nodes = self.inner.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let i = match nodes.iter().position(|(a, _)| a == addr) {
            Some(i) => i,
            None => {
                nodes.push((addr.to_string(), Self::dial(&self.inner.config, addr)?));
                nodes.len() - 1
            }
        };
        *self.inner.leader.lock().unwrap_or_else(|e| e.into_inner()) = i;
        Ok(())
    }

    fn rotate(&self, from: usize) {
        let n = self.inner.nodes.lock().unwrap_or_else(|e| e.into_inner()).len();
        let mut leader = self.inner.leader.lock().unwrap_or_else(|e| e.into_inner());
        if *leader == from {
            *leader = (from + 1) % n;
        }
    }

    fn request<T>(&self, message: T, timeout: Option<Duration>) -> Request<T> {
        let mut request = Request::new(message);
        request.metadata_mut().insert("authorization", self.auth.clone());
        if let Some(timeout) = timeout {
            request.set_timeout(timeout);
        }
        request
    }

    /// Calls `f` on the leader's channel until it answers, following redirects and retrying
    /// what is safe within `retry_for`; each attempt is bounded by `attempt_timeout`.
    async fn call<T, F, Fut>(
        &self,
        call: &'static str,
        idempotent: bool,
        attempt_timeout: Duration,
        mut f: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let started = tokio::time::Instant::now();
        let retry_for = self.inner.config.retry_for;
        let mut backoff = Duration::from_millis(25);
        loop {
            let (index, channel) = self.current();
            // A deadline the server reports (a KV wait that ended) is an answer; only our own
            // attempt timing out is worth another try.
            let (status, timed_out) = match tokio::time::timeout(attempt_timeout, f(channel)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(status)) => (status, false),
                Err(_) => (Status::deadline_exceeded(format!("no answer within {attempt_timeout:?}")), true),
            };
            let redirect = status
                .metadata()
                .get(proto::LEADER_METADATA_KEY)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let retryable = match status.code() {
                Code::Unavailable => idempotent || did_nothing(&status),
                Code::DeadlineExceeded => idempotent && timed_out,
                Code::Cancelled | Code::Unknown => idempotent,
                _ => false,
            };
            if !retryable {
                return Err(ClientError::Refused { call, status });
            }
            let last = format!("{} ({:?})", status.message(), status.code());
            if started.elapsed() >= retry_for {
                let addresses = self
                    .inner
                    .nodes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|(a, _)| a.clone())
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(ClientError::Unavailable { call, waited: started.elapsed(), addresses, last });
            }
            match redirect {
                Some(addr) if addr != self.leader_address() => self.follow(&addr)?,
                _ => {
                    self.rotate(index);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    fn timeout(&self) -> Duration {
        self.inner.config.call_timeout
    }

    fn jobs(channel: Channel) -> JobsClient<Channel> {
        JobsClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn workers(channel: Channel) -> WorkersClient<Channel> {
        WorkersClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Submits a job (admin token). Retried only when the refusal shows nothing was done.
    pub async fn submit(&self, request: SubmitJobRequest) -> Result<SubmitJobResponse, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Submit", false, t, |c| {
            let r = self.request(request.clone(), Some(t));
            async move { Self::jobs(c).submit(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// A job's status, by id or name (linearizable).
    pub async fn get_job(&self, job_id: &str) -> Result<JobStatus, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Get", true, t, |c| {
            let r = self.request(v1::GetJobRequest { job_id: job_id.into() }, Some(t));
            async move { Self::jobs(c).get(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Every job the token may see.
    pub async fn list_jobs(&self) -> Result<Vec<JobStatus>, ClientError> {
        let t = self.timeout();
        self.call("Jobs.List", true, t, |c| {
            let r = self.request(v1::ListJobsRequest {}, Some(t));
            async move { Self::jobs(c).list(r).await.map(|r| r.into_inner().jobs) }
        })
        .await
    }

    /// A stream of a job's statuses (ends when the job ends or the leader changes).
    pub async fn watch_job(
        &self,
        job_id: &str,
        interval_ms: u32,
    ) -> Result<Streaming<JobStatus>, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Watch", true, t, |c| {
            let r = self.request(v1::WatchJobRequest { job_id: job_id.into(), interval_ms }, None);
            async move { Self::jobs(c).watch(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Stops a job; returns its state.
    pub async fn stop_job(&self, job_id: &str) -> Result<v1::JobState, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Stop", true, t, |c| {
            let r = self.request(v1::StopJobRequest { job_id: job_id.into() }, Some(t));
            async move { Self::jobs(c).stop(r).await.map(|r| r.into_inner().state()) }
        })
        .await
    }

    /// A job's log lines.
    pub async fn logs(&self, request: LogsRequest) -> Result<Streaming<LogLine>, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Logs", true, t, |c| {
            let r = self.request(request.clone(), None);
            async move { Self::jobs(c).logs(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// A job's committed checkpoints, oldest first.
    pub async fn checkpoints(&self, job_id: &str) -> Result<CheckpointList, ClientError> {
        let t = self.timeout();
        self.call("Jobs.Checkpoints", true, t, |c| {
            let r = self.request(v1::GetJobRequest { job_id: job_id.into() }, Some(t));
            async move { Self::jobs(c).checkpoints(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// The cluster as the first node that answers sees it (any node answers).
    pub async fn cluster_info(&self) -> Result<ClusterInfo, ClientError> {
        let t = self.timeout();
        self.call("Cluster.Info", true, t, |c| {
            let r = self.request(v1::ClusterInfoRequest {}, Some(t));
            async move { ClusterClient::new(c).info(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Adds a node (admin token): it joins as a learner, catches up, then votes.
    pub async fn add_member(&self, id: u64, address: &str) -> Result<ClusterInfo, ClientError> {
        let t = self.timeout() * 6;
        self.call("Cluster.AddMember", true, t, |c| {
            let r = self.request(v1::AddMemberRequest { id, address: address.into() }, Some(t));
            async move { ClusterClient::new(c).add_member(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Removes a node (admin token).
    pub async fn remove_member(&self, id: u64) -> Result<ClusterInfo, ClientError> {
        let t = self.timeout();
        self.call("Cluster.RemoveMember", true, t, |c| {
            let r = self.request(v1::RemoveMemberRequest { id }, Some(t));
            async move { ClusterClient::new(c).remove_member(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Registers a worker. Idempotent through `instance_id`.
    pub async fn register(&self, request: RegisterRequest) -> Result<RegisterResponse, ClientError> {
        let t = self.timeout();
        self.call("Workers.Register", true, t, |c| {
            let r = self.request(request.clone(), Some(t));
            async move { Self::workers(c).register(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Opens a session with the leader; `first` (a heartbeat) names the worker.
    pub async fn session(&self, first: WorkerEvent) -> Result<Session, ClientError> {
        let t = self.timeout();
        let sender: Mutex<Option<mpsc::Sender<WorkerEvent>>> = Mutex::new(None);
        let directives = self
            .call("Workers.Session", true, t, |c| {
                let (tx, rx) = mpsc::channel(SESSION_BUFFER);
                // The first event goes in before the call: the leader reads it to know who calls.
                let _ = tx.try_send(first.clone());
                *sender.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
                let r = self.request(ReceiverStream::new(rx), None);
                async move { Self::workers(c).session(r).await.map(|r| r.into_inner()) }
            })
            .await?;
        let events =
            sender.lock().unwrap_or_else(|e| e.into_inner()).take().expect("set by the successful attempt");
        Ok(Session { events, directives })
    }

    /// Reports a step; answers when it is committed (or the leader's wait ends).
    pub async fn report_step(&self, report: StepReport) -> Result<StepAck, ClientError> {
        let t = self.timeout();
        self.call("Workers.ReportStep", true, t, |c| {
            let r = self.request(report.clone(), Some(t));
            async move { Self::workers(c).report_step(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Reports a host's part of a checkpoint.
    pub async fn report_checkpoint(&self, report: CheckpointReport) -> Result<CheckpointAck, ClientError> {
        let t = self.timeout() * 12;
        self.call("Workers.ReportCheckpoint", true, t, |c| {
            let r = self.request(report.clone(), Some(t));
            async move { Self::workers(c).report_checkpoint(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Sends a batch of log lines.
    pub async fn push_logs(&self, lines: Vec<LogLine>) -> Result<(), ClientError> {
        let t = self.timeout();
        self.call("Workers.PushLogs", true, t, |c| {
            let r = self.request(tokio_stream::iter(lines.clone()), Some(t));
            async move { Self::workers(c).push_logs(r).await.map(|_| ()) }
        })
        .await
    }

    /// Writes a rendezvous key; `generation` fences a worker that was cut off.
    pub async fn kv_put(
        &self,
        job_id: &str,
        key: &str,
        value: Vec<u8>,
        generation: Option<u64>,
    ) -> Result<(), ClientError> {
        let t = self.timeout();
        self.call("Kv.Put", true, t, |c| {
            let r = self.request(
                KvPutRequest { job_id: job_id.into(), key: key.into(), value: value.clone(), generation },
                Some(t),
            );
            async move { KvClient::new(c).put(r).await.map(|_| ()) }
        })
        .await
    }

    /// Reads a rendezvous key, waiting up to `wait` for it to appear.
    pub async fn kv_get(&self, job_id: &str, key: &str, wait: Duration) -> Result<Vec<u8>, ClientError> {
        let t = self.timeout() + wait;
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        self.call("Kv.Get", true, t, |c| {
            let r = self.request(KvGetRequest { job_id: job_id.into(), key: key.into(), wait_ms }, Some(t));
            async move { KvClient::new(c).get(r).await.map(|r| r.into_inner().value) }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_that_did_nothing_are_safe_to_repeat() {
        assert!(did_nothing(&crate::grpc::not_leader(Some("a:1".into()))));
        assert!(did_nothing(&crate::grpc::not_leader(None)));
        assert!(!did_nothing(&Status::unavailable("the cluster could not commit: timeout")));
        assert!(!did_nothing(&Status::failed_precondition("not the leader")));
    }

    #[test]
    fn a_client_needs_an_address_and_a_printable_token() {
        assert!(matches!(Client::new(ClientConfig::new(vec![], "t", None)), Err(ClientError::Config(_))));
        let bad = ClientConfig::new(vec!["127.0.0.1:1".into()], "line\nbreak", None);
        assert!(Client::new(bad).is_err());
    }

    #[tokio::test]
    async fn nobody_listening_is_unavailable_after_the_retry_bound() {
        // A port nothing listens on: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut config = ClientConfig::new(vec![format!("127.0.0.1:{port}")], "t", None);
        config.retry_for = Duration::from_millis(300);
        config.call_timeout = Duration::from_millis(200);
        let client = Client::new(config).unwrap();
        let e = client.list_jobs().await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e}");
        assert!(e.to_string().contains("Jobs.List"), "{e}");
    }
}
