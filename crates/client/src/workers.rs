//! The worker protocol: registration, the session (heartbeats and notices up, directives
//! down), step and checkpoint reports, log lines and the rendezvous keys (docs/PROTOCOL.md).
//!
//! Workers speak the protocol, so these calls take and return `proto::v1` messages; only log
//! lines, which `podctl logs` reads too, travel as this crate's [`LogLine`].

use crate::{Client, ClientError, LogLine};
use proto::v1::{
    self, CheckpointAck, CheckpointReport, Directive, KvGetRequest, KvPutRequest, RegisterRequest,
    RegisterResponse, StepAck, StepReport, WorkerEvent, kv_client::KvClient,
};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Events a session queues before `send` waits.
const SESSION_BUFFER: usize = 256;

/// A worker's open session: send events, read directives.
pub struct Session {
    /// Events to the leader (heartbeats, preemption, failure).
    pub events: mpsc::Sender<WorkerEvent>,
    /// Directives from the leader; ends when the leader goes (reconnect with a new session).
    pub directives: Streaming<Directive>,
}

impl Client {
    /// Registers a worker. Idempotent through `instance_id`.
    pub async fn register(&self, request: RegisterRequest) -> Result<RegisterResponse, ClientError> {
        let t = self.timeout();
        self.call("Workers.Register", true, t, |c| {
            let r = self.request(request.clone(), Some(t));
            async move { Self::workers(c).register(r).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// Opens a session with the leader; `first` (a heartbeat) names the worker. A live leader
    /// opens one in milliseconds, so each attempt waits at most `open_within`: a node that hangs
    /// with its port open (a stopped process, one stuck in the kernel) is passed over for the
    /// next instead of holding the worker for the call timeout while a new leader counts its lease.
    pub async fn session(&self, first: WorkerEvent, open_within: Duration) -> Result<Session, ClientError> {
        let t = open_within.min(self.timeout());
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
        let lines: Vec<v1::LogLine> = lines.into_iter().map(v1::LogLine::from).collect();
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
