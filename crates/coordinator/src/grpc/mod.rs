//! The gRPC services, their authentication, and the one place errors become `tonic::Status`.
//!
//! - `Jobs` (podctl): submit, get, list, watch, stop, logs, checkpoints.
//! - `Cluster` (podctl, operators): info, add and remove members.
//! - `Workers` (workers): register, the session (heartbeats up, directives down), step and
//!   checkpoint reports, log lines.
//! - `Kv` (workers): rendezvous keys.
//! - `Raft` (peers only): openraft's messages.
//!
//! The core's typed refusals ([`NotServing`], [`JobError`], the state's [`Refusal`]) become a
//! `tonic::Status` here only, by the conversions below: a code, a message for people, and a
//! `podctl.v1.Refusal` in the status's details ([`client::refusal`]) that clients decide by.
//!
//! Everything but `Cluster.Info` and `Raft` is served by the leader; a follower answers
//! UNAVAILABLE with the leader's address in `x-podctl-leader`, which the client crate
//! (`podctl-client`) follows.

mod cluster;
mod jobs;
mod kv;
mod raft_service;
mod workers;

use crate::ctx::{Ctx, NotServing};
use crate::jobs::JobError;
use crate::state::{Job, Refusal};
use client::refusal::{self, Refusal as Why};
use proto::v1::{
    cluster_server::ClusterServer, jobs_server::JobsServer, kv_server::KvServer, raft_server::RaftServer,
    workers_server::WorkersServer,
};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tonic::metadata::MetadataMap;
use tonic::transport::server::Router;
use tonic::{Code, Request, Status};

/// Adds every service to `builder`.
pub fn routes(builder: &mut tonic::transport::Server, ctx: Arc<Ctx>) -> Router {
    let max = ctx.config.max_message_bytes;
    let max_peer = ctx.config.max_peer_message_bytes;
    builder
        .add_service(JobsServer::new(jobs::JobsService(ctx.clone())).max_decoding_message_size(max))
        .add_service(ClusterServer::new(cluster::ClusterService(ctx.clone())).max_decoding_message_size(max))
        .add_service(WorkersServer::new(workers::WorkersService(ctx.clone())).max_decoding_message_size(max))
        .add_service(KvServer::new(kv::KvService(ctx.clone())).max_decoding_message_size(max))
        .add_service(
            RaftServer::new(raft_service::RaftService(ctx))
                .max_decoding_message_size(max_peer)
                .max_encoding_message_size(max_peer),
        )
}

/// UNAVAILABLE, with the leader's address when known (in the refusal's metadata and in the
/// `x-podctl-leader` header), so clients can follow it.
pub fn not_leader(leader: Option<String>) -> Status {
    let message = NotServing::NotLeader { leader: leader.clone() }.to_string();
    let named: Vec<(&str, String)> = leader.iter().map(|addr| ("leader", addr.clone())).collect();
    let mut status = refusal::status(Code::Unavailable, message, Why::NotLeader, &named);
    if let Some(addr) = leader
        && let Ok(value) = addr.parse()
    {
        status.metadata_mut().insert(proto::LEADER_METADATA_KEY, value);
    }
    status
}

impl From<NotServing> for Status {
    fn from(e: NotServing) -> Self {
        let message = e.to_string();
        match e {
            NotServing::NotLeader { leader } => not_leader(leader),
            NotServing::CatchingUp => refusal::status(Code::Unavailable, message, Why::CatchingUp, &[]),
            NotServing::NoCommit { .. } => refusal::status(Code::Unavailable, message, Why::NoCommit, &[]),
        }
    }
}

impl From<JobError> for Status {
    fn from(e: JobError) -> Self {
        let message = e.to_string();
        let refused = |code, why| refusal::status(code, message.clone(), why, &[]);
        match e {
            JobError::NotServing(e) => e.into(),
            JobError::InvalidSpec(_) | JobError::Unfit { .. } | JobError::SaveSpecDiffers { .. } => {
                refused(Code::InvalidArgument, Why::Invalid)
            }
            JobError::ForeignRoot(root) => {
                refusal::status(Code::FailedPrecondition, message, Why::ForeignRoot, &[("root", root.root)])
            }
            JobError::Refused { why, reason } => refused_by_state(why, reason),
            JobError::NotCommitted { step, .. } => refusal::status(
                Code::FailedPrecondition,
                message,
                Why::NotCommitted,
                &[("step", step.to_string())],
            ),
            JobError::Resume(_) | JobError::ResumeTimeout { .. } => Status::unavailable(message),
            JobError::FinalizeTimeout(_) => Status::deadline_exceeded(message),
            JobError::Internal { .. } => Status::internal(message),
        }
    }
}

/// The status of a command the replicated state refused.
pub fn refused_by_state(why: Refusal, reason: String) -> Status {
    match why {
        Refusal::NoJob => Status::not_found(reason),
        Refusal::StaleGeneration => {
            refusal::status(Code::FailedPrecondition, reason, Why::StaleGeneration, &[])
        }
        Refusal::State => refusal::status(Code::FailedPrecondition, reason, Why::State, &[]),
        Refusal::Limit => refusal::status(Code::ResourceExhausted, reason, Why::Limit, &[]),
    }
}

/// FAILED_PRECONDITION for a message of an older (or unknown newer) generation.
pub fn stale_generation(got: u64, current: u64) -> Status {
    let message = if got < current {
        format!(
            "stale generation {got}, current {current}: this worker was cut off; wait for the directive of generation {current}"
        )
    } else {
        format!("generation {got} is ahead of the current generation {current}")
    };
    refusal::status(
        Code::FailedPrecondition,
        message,
        Why::StaleGeneration,
        &[("current", current.to_string())],
    )
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The admin token: everything.
    Admin,
    /// A job token: that job only.
    Job(String),
}

impl Caller {
    /// Ok when the caller may touch `job_id`.
    pub fn require_job(&self, job_id: &str) -> Result<(), Status> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Job(own) if own == job_id => Ok(()),
            Caller::Job(own) => Err(Status::permission_denied(format!(
                "the token is for job {own}, not {job_id}; use that job's token or the admin token"
            ))),
        }
    }

    /// Ok for the admin token.
    pub fn require_admin(&self, what: &str) -> Result<(), Status> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Job(own) => Err(Status::permission_denied(format!(
                "{what} needs the admin token; the token given is job {own}'s"
            ))),
        }
    }
}

fn bearer(metadata: &MetadataMap) -> Result<&str, Status> {
    let value = metadata.get("authorization").ok_or_else(|| {
        Status::unauthenticated("no `authorization: Bearer <token>` metadata; pass the admin or job token")
    })?;
    let text =
        value.to_str().map_err(|_| Status::unauthenticated("the authorization metadata is not text"))?;
    text.strip_prefix("Bearer ")
        .ok_or_else(|| Status::unauthenticated("the authorization metadata must be `Bearer <token>`"))
}

/// Compares two digests in time independent of where they differ.
fn same_digest(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Authenticates the bearer token of a request.
pub fn caller<T>(ctx: &Ctx, request: &Request<T>) -> Result<Caller, Status> {
    let token = bearer(request.metadata())?;
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    if same_digest(&digest, &ctx.admin_sha) {
        return Ok(Caller::Admin);
    }
    if let Some(job_id) = crate::kubernetes::check_worker_token(&ctx.config.admin_token, token) {
        return Ok(Caller::Job(job_id));
    }
    let hex_digest = hex::encode(digest);
    ctx.shared
        .read(|s| {
            s.jobs
                .values()
                .find(|j| same_digest(j.token_sha256.as_bytes(), hex_digest.as_bytes()))
                .map(|j| j.id.clone())
        })
        .map(Caller::Job)
        .ok_or_else(|| Status::unauthenticated("the token is neither the admin token nor any job's token"))
}

/// With TLS on, the worker and peer services require a client certificate (the handshake
/// already checked it is signed by the cluster CA).
pub fn require_client_cert<T>(ctx: &Ctx, request: &Request<T>, service: &str) -> Result<(), Status> {
    if ctx.config.tls.is_none() {
        return Ok(());
    }
    match request.peer_certs() {
        Some(certs) if !certs.is_empty() => Ok(()),
        _ => Err(Status::unauthenticated(format!(
            "the {service} service needs a client certificate signed by the cluster CA (mutual TLS)"
        ))),
    }
}

/// With TLS on, the Raft service admits only the coordinators' peer certificate (common name
/// [`crate::tls::PEER_COMMON_NAME`]): a worker's certificate, signed by the same CA, is refused.
pub fn require_peer_cert<T>(ctx: &Ctx, request: &Request<T>) -> Result<(), Status> {
    if ctx.config.tls.is_none() {
        return Ok(());
    }
    require_client_cert(ctx, request, "Raft")?;
    let presented =
        request.peer_certs().and_then(|certs| certs.first().and_then(|c| crate::tls::common_name(c)));
    match presented {
        Some(name) if name == crate::tls::PEER_COMMON_NAME => Ok(()),
        other => Err(Status::permission_denied(format!(
            "the Raft service admits only the coordinators' peer certificate (common name {}); this one's \
             common name is {}: a worker's or a user's certificate cannot speak Raft",
            crate::tls::PEER_COMMON_NAME,
            other.map_or_else(|| "missing".to_string(), |n| format!("{n:?}"))
        ))),
    }
}

/// The job `id_or_name`, if the caller may see it.
pub fn find_job(ctx: &Ctx, caller: &Caller, id_or_name: &str) -> Result<Job, Status> {
    let job = ctx
        .shared
        .read(|s| s.find_job(id_or_name).cloned())
        .ok_or_else(|| Status::not_found(format!("no job '{id_or_name}'; `podctl status` lists the jobs")))?;
    caller.require_job(&job.id)?;
    Ok(job)
}

/// Waits until this node has applied everything committed before the call (a linearizable
/// read), on the leader.
pub async fn linearizable(ctx: &Ctx) -> Result<(), Status> {
    ctx.require_leader()?;
    ctx.raft.ensure_linearizable().await.map(|_| ()).map_err(|e| {
        tracing::debug!("linearizable read refused: {e}");
        ctx.not_leader().into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_leader_carries_the_address() {
        let status = not_leader(Some("127.0.0.1:7001".into()));
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.metadata().get(proto::LEADER_METADATA_KEY).unwrap(), "127.0.0.1:7001");
        assert!(not_leader(None).metadata().get(proto::LEADER_METADATA_KEY).is_none());
        // The client repeats even a submission after these: they provably did nothing.
        assert!(client::retry_safe(&not_leader(Some("a:1".into()))));
        assert!(client::retry_safe(&not_leader(None)));
        assert!(client::retry_safe(&NotServing::CatchingUp.into()));
        // A commit that failed may have happened: not safe to repeat blindly.
        let no_commit = NotServing::NoCommit { fatal: false, reason: "timeout".into() };
        assert!(!client::retry_safe(&no_commit.into()));
    }

    #[test]
    fn job_refusals_keep_their_codes_at_the_edge() {
        let code = |e: JobError| Status::from(e).code();
        let unfit = JobError::Unfit { field: "mesh.dcn", reason: "x".into() };
        assert_eq!(refusal::of(&Status::from(unfit)).map(|(r, _)| r), Some(Why::Invalid));
        let full = JobError::Refused { why: Refusal::Limit, reason: "x".into() };
        assert_eq!(code(full), tonic::Code::ResourceExhausted);
        let foreign = JobError::ForeignRoot(checkpoint::lineage::ForeignRoot {
            root: "file:///r".into(),
            checkpoint: "c".into(),
            difference: "d".into(),
        });
        let (why, metadata) = refusal::of(&Status::from(foreign)).unwrap();
        assert_eq!((why, metadata["root"].as_str()), (Why::ForeignRoot, "file:///r"));
        assert_eq!(
            code(JobError::NotCommitted { step: 4, reason: "x".into() }),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(code(NotServing::NotLeader { leader: None }.into()), tonic::Code::Unavailable);
        let redirect = Status::from(JobError::from(NotServing::NotLeader { leader: Some("b:2".into()) }));
        assert_eq!(redirect.metadata().get(proto::LEADER_METADATA_KEY).unwrap(), "b:2");
    }

    #[test]
    fn job_tokens_reach_only_their_job() {
        assert!(Caller::Admin.require_job("a-1").is_ok());
        assert!(Caller::Job("a-1".into()).require_job("a-1").is_ok());
        let e = Caller::Job("a-1".into()).require_job("b-2").unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("for job a-1, not b-2"));
        assert_eq!(
            Caller::Job("a-1".into()).require_admin("submit").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
    }

    #[test]
    fn stale_and_future_generations_are_told_apart() {
        assert!(stale_generation(1, 2).message().starts_with("stale generation 1, current 2"));
        assert!(stale_generation(3, 2).message().contains("ahead"));
        assert_eq!(stale_generation(1, 2).code(), tonic::Code::FailedPrecondition);
        let (why, metadata) = refusal::of(&stale_generation(1, 2)).unwrap();
        assert_eq!((why, metadata["current"].as_str()), (Why::StaleGeneration, "2"));
    }

    #[test]
    fn digests_compare_equal_only_when_equal() {
        assert!(same_digest(b"abc", b"abc"));
        assert!(!same_digest(b"abc", b"abd"));
        assert!(!same_digest(b"abc", b"ab"));
    }
}
