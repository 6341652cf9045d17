//! Inbound Raft RPCs from peers. Only the coordinator's own nodes may call these: with TLS on,
//! the peer certificate (signed by the cluster CA, common name `podctl-peer`) is required, and
//! the bearer token is not used.

use super::require_peer_cert;
use crate::ctx::Ctx;
use proto::v1::RaftPayload;
use proto::v1::raft_server::Raft;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `Raft` service.
pub struct RaftService(pub Arc<Ctx>);

fn decode<T: DeserializeOwned>(request: Request<RaftPayload>, what: &str) -> Result<T, Status> {
    serde_json::from_slice(&request.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("not a Raft {what} message: {e}")))
}

fn encode<T: Serialize>(result: &T) -> Result<Response<RaftPayload>, Status> {
    serde_json::to_vec(result)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| Status::internal(format!("cannot encode the Raft answer: {e}")))
}

#[tonic::async_trait]
impl Raft for RaftService {
    async fn append_entries(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        require_peer_cert(&self.0, &request)?;
        let rpc = decode(request, "AppendEntries")?;
        encode(&self.0.raft.append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        require_peer_cert(&self.0, &request)?;
        let rpc = decode(request, "Vote")?;
        encode(&self.0.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        require_peer_cert(&self.0, &request)?;
        let rpc = decode(request, "InstallSnapshot")?;
        encode(&self.0.raft.install_snapshot(rpc).await)
    }
}
