//! Cluster membership: who the nodes are and who leads; adding and removing nodes.

use super::caller;
use crate::ctx::Ctx;
use crate::peers::PeerState;
use openraft::BasicNode;
use openraft::error::{ClientWriteError, RaftError};
use proto::v1::cluster_server::Cluster;
use proto::v1::{AddMemberRequest, ClusterInfo, ClusterInfoRequest, Member, RemoveMemberRequest};
use std::collections::BTreeSet;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `Cluster` service.
pub struct ClusterService(pub Arc<Ctx>);

/// What this node knows of the cluster.
pub fn info(ctx: &Ctx) -> ClusterInfo {
    let metrics = ctx.raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership().clone();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let matched = |id: u64| {
        metrics.replication.as_ref().and_then(|r| r.get(&id).cloned().flatten()).map_or(0, |l| l.index)
    };
    let leader_id = metrics.current_leader.unwrap_or(0);
    let peers = ctx.peers.view();
    let reachability = |id: u64| match peers.get(&id) {
        _ if id == ctx.id => ("self", 0.0, String::new()),
        Some((_, PeerState::Answering)) => ("answering", 0.0, String::new()),
        Some((_, PeerState::Unreachable { since, error })) => {
            ("unreachable", since.elapsed().as_secs_f64(), error.clone())
        }
        None => ("unknown", 0.0, String::new()),
    };
    ClusterInfo {
        leader_id,
        leader_address: membership.get_node(&leader_id).map(|n| n.addr.clone()).unwrap_or_default(),
        term: metrics.current_term,
        commit_index: metrics.last_applied.map_or(0, |l| l.index),
        members: membership
            .nodes()
            .map(|(id, node)| {
                let (reachability, unreachable_seconds, unreachable_error) = reachability(*id);
                Member {
                    id: *id,
                    address: node.addr.clone(),
                    voter: voters.contains(id),
                    matched_index: matched(*id),
                    reachability: reachability.into(),
                    unreachable_seconds,
                    unreachable_error,
                }
            })
            .collect(),
        answered_by: ctx.id,
        snapshot_index: metrics.snapshot.map_or(0, |l| l.index),
        purged_index: metrics.purged.map_or(0, |l| l.index),
    }
}

fn membership_error(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> Status {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            super::not_leader(f.leader_node.map(|n| n.addr))
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            Status::failed_precondition(format!("membership change refused: {e}"))
        }
        RaftError::Fatal(e) => Status::unavailable(format!("raft stopped: {e}")),
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn info(&self, request: Request<ClusterInfoRequest>) -> Result<Response<ClusterInfo>, Status> {
        caller(&self.0, &request)?;
        Ok(Response::new(info(&self.0)))
    }

    async fn add_member(&self, request: Request<AddMemberRequest>) -> Result<Response<ClusterInfo>, Status> {
        caller(&self.0, &request)?.require_admin("adding a member")?;
        self.0.require_leader()?;
        let AddMemberRequest { id, address } = request.into_inner();
        if id == 0 || address.is_empty() {
            return Err(Status::invalid_argument("give a non-zero node id and its host:port address"));
        }
        // As a learner first: it catches up (log or snapshot) before it counts in any quorum.
        self.0.raft.add_learner(id, BasicNode::new(&address), true).await.map_err(membership_error)?;
        let metrics = self.0.raft.metrics().borrow().clone();
        let mut voters: BTreeSet<u64> = metrics.membership_config.membership().voter_ids().collect();
        voters.insert(id);
        self.0.raft.change_membership(voters, false).await.map_err(membership_error)?;
        Ok(Response::new(info(&self.0)))
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<ClusterInfo>, Status> {
        caller(&self.0, &request)?.require_admin("removing a member")?;
        self.0.require_leader()?;
        let id = request.into_inner().id;
        let metrics = self.0.raft.metrics().borrow().clone();
        let mut voters: BTreeSet<u64> = metrics.membership_config.membership().voter_ids().collect();
        if !voters.remove(&id) {
            return Err(Status::not_found(format!("node {id} is not a voter; see `Cluster.Info`")));
        }
        if voters.is_empty() {
            return Err(Status::failed_precondition("cannot remove the last voter"));
        }
        self.0.raft.change_membership(voters, false).await.map_err(membership_error)?;
        Ok(Response::new(info(&self.0)))
    }
}
