//! A client of a podctl coordinator cluster: what `podctl` and the workers use to reach it.
//!
//! A [`Client`] takes every coordinator address it knows, finds the leader, follows the
//! `x-podctl-leader` redirects followers answer with, retries what is safe to retry (every call
//! but `Submit` is idempotent; `Submit` is retried only when it provably did nothing), and puts
//! a deadline on every attempt and an overall bound on the retries.
//!
//! # Layout
//! - [`Client`] (`leader.rs`): finding the leader, redirects, retries, deadlines.
//! - [`jobs`]: what podctl's commands ask (submit, status, watch, stop, logs, checkpoints, the
//!   cluster's members), answered in this crate's own types ([`JobStatus`], [`JobState`],
//!   [`LogLine`], [`ClusterInfo`], ...), so that no protobuf type reaches the command line.
//! - [`workers`]: the worker protocol (registration, the session, step and checkpoint reports,
//!   log lines, the rendezvous keys). Workers speak the protocol, so these calls take and
//!   return `proto::v1` messages.
//! - [`checkpoint`]: a checkpoint report's parts (the checkpoint crate's `SaveSpec` and
//!   `HostReport`) to and from their messages, read with every field checked.
//! - [`refusal`]: why the coordinator refused a call, as a type in the status's details
//!   ([`Refusal`]); the coordinator builds its refusals with it, the client decides by it.
//! - [`tls`]: the CA and client certificate a client presents, and the gRPC endpoint to a
//!   coordinator (the coordinator dials its Raft peers through the same [`tls::endpoint`]).
//!
//! **Architecture Invariant:** knows nothing of the coordinator's insides (no openraft, no
//! state): only the wire schema (`proto`) and its conventions (the leader redirect, which
//! refusals did nothing). Protobuf types cross its public API only in [`workers`] and
//! [`checkpoint`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod checkpoint;
mod error;
pub mod jobs;
mod leader;
pub mod refusal;
pub mod tls;
pub mod workers;

pub use error::ClientError;
pub use jobs::{
    CheckpointInfo, ClusterInfo, Event, JobState, JobStatus, LogLine, Member, SliceStatus, Submission,
    Submitted, Updates,
};
pub use leader::{Client, ClientConfig, retry_safe};
pub use refusal::Refusal;
pub use tls::ClientTls;
pub use workers::Session;
