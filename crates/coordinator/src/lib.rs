//! The Raft-replicated control plane: jobs, hosts, leases, generations, checkpoints.
//!
//! Three coordinator nodes form one Raft group (openraft 0.9). The replicated state
//! ([`state::ClusterState`]) holds jobs and their lifecycle, registered workers, generations and
//! placements, committed steps, the checkpoint catalog and the KV store. Heartbeats, leases and
//! pending reports stay in the leader's memory ([`memory`]); only registrations, generation
//! changes, commits and KV writes go through the log. `docs/COORDINATOR.md` explains the design,
//! `docs/PROTOCOL.md` the sequences.
//!
//! # Layout
//! In dependency order, lowest first: each module uses only those above it (and the
//! configuration, the errors, the log buffers, the peers' health and the logging setup).
//! - [`state`]: the replicated state and its pure transition function (`apply`).
//! - [`decide`]: the decisions as pure functions of (now, job, leader memory): placement of
//!   virtual ranks, generation changes, the quiesce -> assignment plan, step commits.
//! - [`store`]: the redb-backed Raft log, vote, snapshot and the state machine store.
//! - [`memory`]: the leader's memory (liveness, sessions, pending reports and saves).
//! - [`ctx`]: [`ctx::Ctx`], what everything below shares (Raft, the applied state, the leader's
//!   memory, the configuration), and its typed refusal [`ctx::NotServing`].
//! - [`leader`]: the leader loop, which turns decisions into proposals and directives.
//! - [`resume`]: the resume rule at submission: the newest committed checkpoint under the job's
//!   root that verifies, the line its saves continue, what was passed over and why.
//! - [`jobs`]: submitting and stopping a job, and committing a checkpoint once every member
//!   reported ([`jobs::RaftCommitLog`]); the checkpoint root is decided at submission. Typed
//!   refusals ([`jobs::JobError`]).
//! - [`kubernetes`]: the coordinator's side of the Kubernetes controller (`crates/controller`):
//!   the jobs' desired pods, lost pods as preemptions, declared jobs submitted through [`jobs`],
//!   the workers' tokens.
//! - [`grpc`]: the services (`Jobs`, `Cluster`, `Workers`, `Kv`, `Raft`), authentication and
//!   the one place errors become `tonic::Status`.
//! - [`metrics`]: Prometheus `/metrics` (jobs' steps, step times, recoveries, checkpoints, Raft),
//!   served when `Config::metrics_listen` is set, with `/healthz` and `/readyz`.
//! - [`health`]: readiness: a voter of the cluster that knows its leader (the chart's probe).
//! - [`recorder`]: a job's run record (`metrics.jsonl`, `events.jsonl`, plots), when asked.
//! - [`network`]: outbound Raft RPCs to peers over the `Raft` gRPC service; every call's
//!   outcome goes to [`peers`], which logs a peer that stops answering once, not at every retry.
//! - [`logging`]: how the processes log (colour only on a terminal, openraft's own warnings
//!   rate-limited).
//! - [`tls`]: a development CA and certificates, and loading them. Clients, this node's peer
//!   connections included, dial through the `client` crate (`podctl-client`).
//! - [`node`]: wiring: storage, Raft, services, TLS, shutdown; [`run`] and [`Embedded`].
//! - [`command`]: a node's command line (`podctl-coordinator`, `podctl coordinator`).
//!
//! **Architecture Invariant:** only this crate names openraft. Protobuf and gRPC types cross
//! its public API only in the services ([`grpc`]), the outbound Raft network and the
//! directives the leader sends ([`leader`]); below them ([`state`], [`decide`], [`memory`],
//! [`ctx`], [`jobs`]) refusals are typed and become a `tonic::Status` only in [`grpc`].
//! Kubernetes is reached only through the controller crate's `ControlPlane` trait, which
//! [`kubernetes::Plane`] implements.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod command;
mod config;
pub mod ctx;
pub mod decide;
mod error;
pub mod grpc;
pub mod health;
pub mod jobs;
pub mod kubernetes;
pub mod leader;
pub mod logging;
pub mod logs;
pub mod memory;
pub mod metrics;
pub mod network;
pub mod node;
pub mod peers;
pub mod recorder;
pub mod resume;
pub mod state;
pub mod store;
pub mod tls;

pub use config::{Config, Timeouts, TlsFiles};
pub use error::Error;
pub use node::{Embedded, Node, run};

openraft::declare_raft_types!(
    /// The coordinator's Raft types: commands in, responses out, nodes addressed by their gRPC
    /// address, snapshots as bytes.
    pub TypeConfig:
        D = state::Command,
        R = state::Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// Short names for openraft's generic types over [`TypeConfig`], so no other code spells them out.
pub mod typ {
    use super::TypeConfig;

    /// The Raft node.
    pub type Raft = openraft::Raft<TypeConfig>;
    /// A log entry.
    pub type Entry = openraft::Entry<TypeConfig>;
    /// A snapshot.
    pub type Snapshot = openraft::Snapshot<TypeConfig>;
    /// An error of a Raft API call.
    pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<u64, E>;
    /// Why a client write failed.
    pub type ClientWriteError = openraft::error::ClientWriteError<u64, openraft::BasicNode>;
    /// Why a linearizable read failed.
    pub type CheckIsLeaderError = openraft::error::CheckIsLeaderError<u64, openraft::BasicNode>;
    /// A network error of a Raft RPC.
    pub type RpcError<E = openraft::error::Infallible> =
        openraft::error::RPCError<u64, openraft::BasicNode, RaftError<E>>;
    /// The answer to a client write.
    pub type ClientWriteResponse = openraft::raft::ClientWriteResponse<TypeConfig>;
    /// Raft metrics.
    pub type Metrics = openraft::RaftMetrics<u64, openraft::BasicNode>;
}
