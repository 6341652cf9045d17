//! What every service, the leader loop and the controller's plane share: the Raft node, the
//! replicated state as applied here, the leader's memory, and this node's configuration.
//!
//! [`Ctx`] sits low in the crate: it knows the state, the store, the leader's memory and the
//! configuration, and nothing that uses it (services, loops, the Kubernetes plane), which
//! `node.rs` wires together. Its refusals are a typed [`NotServing`]; the gRPC edge
//! ([`crate::grpc`]) turns them into statuses.

use crate::config::Config;
use crate::logs::LogBuffers;
use crate::memory::LeaderMemory;
use crate::peers::PeerHealth;
use crate::state::{Command, Response};
use crate::store::Shared;
use crate::typ;
use openraft::ServerState;
use openraft::error::{ClientWriteError, RaftError};
use std::sync::Arc;

/// Why this node cannot take a write or a leader's read now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotServing {
    /// Another node leads (its address, when known); clients follow it.
    #[error("{}", match leader {
        Some(addr) => format!("not the leader; the leader is {addr}"),
        None => "not the leader, and no leader is known (an election may be running); retry".into(),
    })]
    NotLeader {
        /// The leader's address.
        leader: Option<String>,
    },
    /// This node was just elected and has not applied everything committed before.
    #[error("this node was just elected and is catching up; retry in a moment")]
    CatchingUp,
    /// The cluster could not commit the command (no quorum, shutting down); it may still be
    /// applied.
    #[error("the cluster could not commit: {reason}; retry")]
    NoCommit {
        /// Whether Raft stopped on this node (it shuts down), rather than the command failing.
        fatal: bool,
        /// Raft's error.
        reason: String,
    },
}

/// What every service and the leader loop share.
pub struct Ctx {
    /// This node's id.
    pub id: u64,
    /// The Raft node.
    pub raft: typ::Raft,
    /// The replicated state, as applied here.
    pub shared: Arc<Shared>,
    /// The leader's memory (empty on followers).
    pub leader: LeaderMemory,
    /// Workers' log lines (leader only).
    pub logs: LogBuffers,
    /// Whether the peers answer this node's calls.
    pub peers: Arc<PeerHealth>,
    /// The configuration.
    pub config: Config,
    /// The address this node is reached at.
    pub advertise: String,
    /// SHA-256 of the admin token.
    pub admin_sha: [u8; 32],
}

impl Ctx {
    /// Proposes a command and waits for it to be applied. A follower refuses with the leader's
    /// address.
    pub async fn propose(&self, command: Command) -> Result<Response, NotServing> {
        match self.raft.client_write(command).await {
            Ok(response) => Ok(response.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(NotServing::NotLeader { leader: forward.leader_node.map(|n| n.addr) })
            }
            Err(e) => {
                Err(NotServing::NoCommit { fatal: matches!(e, RaftError::Fatal(_)), reason: e.to_string() })
            }
        }
    }

    /// The current leader's id and address, as this node knows them.
    pub fn leader(&self) -> Option<(u64, String)> {
        let metrics = self.raft.metrics().borrow().clone();
        let id = metrics.current_leader?;
        let addr = metrics.membership_config.membership().get_node(&id).map(|n| n.addr.clone())?;
        Some((id, addr))
    }

    /// The refusal that names the leader, as this node knows it.
    pub fn not_leader(&self) -> NotServing {
        NotServing::NotLeader { leader: self.leader().map(|(_, addr)| addr) }
    }

    /// Ok when this node leads and its memory is ready.
    pub fn require_leader(&self) -> Result<(), NotServing> {
        let metrics = self.raft.metrics().borrow().clone();
        let leading = metrics.state == ServerState::Leader && metrics.current_leader == Some(self.id);
        if leading && self.leader.term() == Some(metrics.current_term) {
            return Ok(());
        }
        if leading {
            return Err(NotServing::CatchingUp);
        }
        Err(self.not_leader())
    }

    /// `id@address` of this node, for `JobStatus.leader`.
    pub fn label(&self) -> String {
        format!("{}@{}", self.id, self.advertise)
    }
}
