//! Finding the leader: the client's nodes, redirects, retries and deadlines.

use crate::ClientError;
use crate::refusal;
use crate::tls::{ClientTls, endpoint_via};
use proto::v1::{jobs_client::JobsClient, workers_client::WorkersClient};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

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

struct Inner {
    config: ClientConfig,
    /// Known nodes: address and a lazily connecting channel.
    nodes: Mutex<Vec<(String, Channel)>>,
    /// Index into `nodes` of the node to try first.
    leader: Mutex<usize>,
    /// Counts [`Client::suspect_leader`]'s moves, for calls held by the node it left.
    suspected: watch::Sender<u64>,
}

/// A handle to the cluster; cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    auth: MetadataValue<tonic::metadata::Ascii>,
}

/// Whether a refusal provably did nothing, so even a non-idempotent call may be repeated: an
/// UNAVAILABLE whose details say the coordinator did nothing (not the leader, catching up,
/// [`Refusal::did_nothing`]), or whose source is a connection that was never made (the
/// channel's connector failed: no request left this process).
pub fn retry_safe(status: &Status) -> bool {
    status.code() == Code::Unavailable
        && (refusal::of(status).is_some_and(|(r, _)| r.did_nothing()) || never_connected(status))
}

/// Whether `status` comes from a connection that was never made.
fn never_connected(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// The `authorization` metadata of `token`.
fn bearer(token: &str) -> Result<MetadataValue<tonic::metadata::Ascii>, ClientError> {
    format!("Bearer {token}").parse().map_err(|_| ClientError::Config {
        setting: "token",
        reason: "the token must be printable ASCII".into(),
    })
}

impl Client {
    /// A client of the cluster at `config.addresses` (nothing is dialled yet).
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        if config.addresses.is_empty() {
            return Err(ClientError::Config {
                setting: "addresses",
                reason: "no coordinator address given".into(),
            });
        }
        let auth = bearer(&config.token)?;
        let mut nodes = Vec::new();
        for addr in &config.addresses {
            nodes.push((addr.clone(), Self::dial(&config, addr)?));
        }
        let inner =
            Inner { config, nodes: Mutex::new(nodes), leader: Mutex::new(0), suspected: watch::channel(0).0 };
        Ok(Self { inner: Arc::new(inner), auth })
    }

    fn dial(config: &ClientConfig, addr: &str) -> Result<Channel, ClientError> {
        let connect = config.routes.get(addr).map_or(addr, String::as_str);
        endpoint_via(addr, connect, config.tls.as_ref(), config.call_timeout)
            .map(|e| e.connect_lazy())
            .map_err(|reason| ClientError::Config { setting: "address", reason })
    }

    /// The same cluster, calling with another token (a job's).
    pub fn with_token(&self, token: &str) -> Result<Self, ClientError> {
        Ok(Self { inner: self.inner.clone(), auth: bearer(token)? })
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

    /// Changes each time [`Client::suspect_leader`] leaves a node: a call that node holds may
    /// get no answer until its timeout (it hangs with its connections open), so its caller can
    /// ask again where the client is now.
    pub fn suspicions(&self) -> watch::Receiver<u64> {
        self.inner.suspected.subscribe()
    }

    /// Moves off the node believed to lead: its session went silent, so it may hang with its
    /// connections open. The next call asks another node, which redirects back if it still leads.
    pub fn suspect_leader(&self) {
        let (index, _) = self.current();
        self.rotate(index);
        self.inner.suspected.send_modify(|n| *n += 1);
    }

    pub(crate) fn request<T>(&self, message: T, timeout: Option<Duration>) -> Request<T> {
        let mut request = Request::new(message);
        request.metadata_mut().insert("authorization", self.auth.clone());
        if let Some(timeout) = timeout {
            request.set_timeout(timeout);
        }
        request
    }

    /// Calls `f` on the leader's channel until it answers, following redirects and retrying
    /// what is safe within `retry_for`; each attempt is bounded by `attempt_timeout`.
    pub(crate) async fn call<T, F, Fut>(
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
                Code::Unavailable => idempotent || retry_safe(&status),
                Code::DeadlineExceeded => idempotent && timed_out,
                Code::Cancelled | Code::Unknown => idempotent,
                _ => false,
            };
            if !retryable {
                return Err(ClientError::refused(call, &status));
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

    pub(crate) fn timeout(&self) -> Duration {
        self.inner.config.call_timeout
    }

    pub(crate) fn jobs(channel: Channel) -> JobsClient<Channel> {
        JobsClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub(crate) fn workers(channel: Channel) -> WorkersClient<Channel> {
        WorkersClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Refusal;

    #[test]
    fn only_refusals_that_did_nothing_are_safe_to_repeat() {
        // What a follower and a leader still catching up answer (the coordinator's tests check
        // that its own refusals are these).
        let refused = |code, refusal| refusal::status(code, "words", refusal, &[]);
        assert!(retry_safe(&refused(Code::Unavailable, Refusal::NotLeader)));
        assert!(retry_safe(&refused(Code::Unavailable, Refusal::CatchingUp)));
        assert!(!retry_safe(&refused(Code::Unavailable, Refusal::NoCommit)));
        assert!(!retry_safe(&refused(Code::FailedPrecondition, Refusal::NotLeader)));
        // The words are for people: alone, they decide nothing.
        assert!(!retry_safe(&Status::unavailable("not the leader; the leader is a:1")));
        assert!(!retry_safe(&Status::unavailable("tcp connect error: Connection refused")));
    }

    #[tokio::test]
    async fn a_connection_never_made_is_safe_to_repeat_and_a_timeout_is_not() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let channel = endpoint_via("a", &format!("127.0.0.1:{port}"), None, Duration::from_secs(1))
            .unwrap()
            .connect_lazy();
        let status = Client::jobs(channel).list(proto::v1::ListJobsRequest {}).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(retry_safe(&status), "nobody listens, so nothing was sent: {status:?}");
        assert!(!retry_safe(&Status::deadline_exceeded("no answer within 10s")));
    }

    #[tokio::test]
    async fn a_suspected_leader_is_asked_last() {
        let config = ClientConfig::new(vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()], "t", None);
        let client = Client::new(config).unwrap();
        let suspicions = client.suspicions();
        client.follow("127.0.0.1:2").unwrap();
        assert!(!suspicions.has_changed().unwrap(), "a redirect is no suspicion");
        client.suspect_leader();
        assert!(suspicions.has_changed().unwrap(), "calls held by the node left are told");
        assert_eq!(client.leader_address(), "127.0.0.1:1");
        client.suspect_leader();
        assert_eq!(client.leader_address(), "127.0.0.1:2", "with every node suspected, round they go");
    }

    #[test]
    fn a_client_needs_an_address_and_a_printable_token() {
        let none = Client::new(ClientConfig::new(vec![], "t", None)).err().unwrap();
        assert!(matches!(none, ClientError::Config { setting: "addresses", .. }), "{none}");
        let bad = ClientConfig::new(vec!["127.0.0.1:1".into()], "line\nbreak", None);
        let bad = Client::new(bad).err().unwrap();
        assert!(matches!(bad, ClientError::Config { setting: "token", .. }), "{bad}");
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
