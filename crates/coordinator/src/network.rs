//! Outbound Raft RPCs: this node to its peers, over the peers' `Raft` gRPC service.
//!
//! openraft's messages travel as JSON in `RaftPayload.data`; the answer carries the peer's
//! `Result` the same way, so a remote Raft error comes back as openraft's `RemoteError`. Peers
//! are dialled with this node's client certificate (mutual TLS) and every call has a deadline.
//!
//! Every call's outcome goes to [`PeerHealth`], which logs a peer that stops answering once.

use crate::TypeConfig;
use crate::peers::PeerHealth;
use crate::typ;
use client::tls::endpoint;
use openraft::error::{InstallSnapshotError, NetworkError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};
use proto::v1::RaftPayload;
use proto::v1::raft_client::RaftClient;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

/// Builds channels to peers.
#[derive(Clone)]
pub struct PeerDialer {
    /// TLS towards peers (with this node's client certificate); `None` in plaintext mode.
    pub tls: Option<client::ClientTls>,
    /// Deadline of one RPC.
    pub rpc_timeout: Duration,
    /// Largest message accepted back.
    pub max_message_bytes: usize,
}

impl PeerDialer {
    /// A lazily connecting channel to `addr` (`host:port`).
    pub fn channel(&self, addr: &str) -> Result<Channel, String> {
        endpoint(addr, self.tls.as_ref(), self.rpc_timeout).map(|e| e.connect_lazy())
    }
}

/// The factory openraft asks for a connection per peer.
pub struct Network {
    dialer: PeerDialer,
    health: Arc<PeerHealth>,
    /// One channel per peer address, kept across `new_client` calls: openraft asks again after
    /// every replication error and term change, and a new TLS handshake each time would turn a
    /// slow moment into a storm of reconnects. A channel reconnects by itself.
    channels: HashMap<String, Channel>,
}

impl Network {
    /// Dials peers with `dialer`, recording their reachability in `health`.
    pub fn new(dialer: PeerDialer, health: Arc<PeerHealth>) -> Self {
        Self { dialer, health, channels: HashMap::new() }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerConnection {
        let channel = match self.channels.get(&node.addr) {
            Some(channel) => Ok(channel.clone()),
            None => self.dialer.channel(&node.addr).inspect(|channel| {
                self.channels.insert(node.addr.clone(), channel.clone());
            }),
        };
        let client = channel.map(|channel| {
            RaftClient::new(channel)
                .max_decoding_message_size(self.dialer.max_message_bytes)
                .max_encoding_message_size(self.dialer.max_message_bytes)
        });
        PeerConnection { target, addr: node.addr.clone(), client, health: self.health.clone(), failure: None }
    }
}

/// One peer.
pub struct PeerConnection {
    target: u64,
    addr: String,
    health: Arc<PeerHealth>,
    /// Why the call in progress failed to reach the peer, in words for people.
    failure: Option<String>,
    /// The client, or why the address could not be used.
    client: Result<RaftClient<Channel>, String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

impl PeerConnection {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: &'static str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, typ::RpcError<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        self.failure = None;
        let result = self.attempt(kind, request, timeout).await;
        let outcome = match (&result, self.failure.take()) {
            (Err(typ::RpcError::Unreachable(_) | typ::RpcError::Network(_)), Some(why)) => Err(why),
            (Err(typ::RpcError::Unreachable(e)), None) => Err(e.to_string()),
            (Err(typ::RpcError::Network(e)), None) => Err(e.to_string()),
            _ => Ok(()),
        };
        self.health.record(self.target, &self.addr, outcome);
        result
    }

    async fn attempt<Req, Resp, E>(
        &mut self,
        kind: &'static str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, typ::RpcError<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = self
            .client
            .as_mut()
            .map_err(|e| typ::RpcError::Unreachable(Unreachable::new(&Message(e.clone()))))?;
        let data = serde_json::to_vec(request).map_err(|e| typ::RpcError::Network(NetworkError::new(&e)))?;
        let mut request = tonic::Request::new(RaftPayload { data });
        request.set_timeout(timeout);
        let call = async {
            match kind {
                "append" => client.append_entries(request).await,
                "vote" => client.vote(request).await,
                _ => client.install_snapshot(request).await,
            }
        };
        let response = tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(format!("no answer within {timeout:?}")))
        });
        let payload = response.map_err(|status| {
            self.failure = Some(format!("{kind}: {}", status.message()));
            let e = Message(format!("{kind} to node {}: {status}", self.target));
            match status.code() {
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
                    typ::RpcError::Unreachable(Unreachable::new(&e))
                }
                _ => typ::RpcError::Network(NetworkError::new(&e)),
            }
        })?;
        let result: Result<Resp, typ::RaftError<E>> = serde_json::from_slice(&payload.into_inner().data)
            .map_err(|e| typ::RpcError::Network(NetworkError::new(&AnyError::new(&e))))?;
        result.map_err(|e| typ::RpcError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, typ::RpcError> {
        self.call("append", &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, typ::RpcError<InstallSnapshotError>> {
        self.call("snapshot", &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, typ::RpcError> {
        self.call("vote", &rpc, option.hard_ttl()).await
    }
}
