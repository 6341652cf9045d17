//! The coordinator's side of the Kubernetes controller (`crates/controller`): what the jobs want,
//! and what the controller saw lost.
//!
//! [`Plane`] implements [`controller::ControlPlane`] over the node's replicated state and the
//! leader's memory. A pod the controller reports lost marks its workers `Preempted` in the
//! leader's memory, exactly as a worker's own SIGTERM notice does, so the recovery path
//! (`decide::decide_generation`) is the same one. Each registration tells the controller whether
//! the leader has heard from it within a lease (a hung worker's pod is replaced). A job's job
//! object uid is recorded through Raft, so a new leader knows it was made. A declared job
//! (`controller::declare`) is submitted as `Jobs.Submit` would, with its source recorded; the
//! state machine keeps one job per source. The loop runs on every node but acts only on the
//! leader whose memory is ready ([`crate::ctx::Ctx::require_leader`]).

use crate::ctx::Ctx;
use crate::decide::Out;
use crate::state::{Command, Job};
use controller::{ControlPlane, Declaration, DeclaredJob, DesiredJob, Registration};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The prefix of worker tokens (see [`worker_token`]).
pub const WORKER_TOKEN_PREFIX: &str = "pw.";

/// The token the controller gives a job's worker pods: `pw.<job id>.<HMAC-SHA256(admin token,
/// job id)>`. Every node can check it without replicating anything, a new leader derives the
/// same one (the job's Secret never changes), and it reaches that job only.
pub fn worker_token(admin_token: &str, job_id: &str) -> String {
    let tag = keyed(admin_token, job_id).finalize().into_bytes();
    format!("{WORKER_TOKEN_PREFIX}{job_id}.{}", hex::encode(tag))
}

fn keyed(admin_token: &str, job_id: &str) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(admin_token.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(b"podctl worker token\0");
    mac.update(job_id.as_bytes());
    mac
}

/// The job a worker token is for, when it is one and it is genuine.
pub fn check_worker_token(admin_token: &str, token: &str) -> Option<String> {
    let (job_id, tag) = token.strip_prefix(WORKER_TOKEN_PREFIX)?.rsplit_once('.')?;
    let tag = hex::decode(tag).ok()?;
    // Constant time.
    keyed(admin_token, job_id).verify_slice(&tag).ok()?;
    Some(job_id.to_string())
}

/// The coordinator as the controller sees it.
pub struct Plane(pub Arc<Ctx>);

/// What the controller needs of one job; `silent` are its workers the leader has not heard from
/// within a lease.
fn desired(job: &Job, admin_token: &str, silent: &BTreeSet<String>) -> Option<DesiredJob> {
    let spec = match job::JobSpec::from_yaml(&job.spec_yaml, Path::new(&job.id)) {
        Ok(spec) => spec,
        Err(e) => {
            // Validated at submission; a spec that no longer parses is this binary's problem.
            tracing::warn!(job_id = job.id, "controller: cannot read the job's spec: {e}");
            return None;
        }
    };
    Some(DesiredJob {
        id: job.id.clone(),
        running: !job.state.is_terminal(),
        slices: u32::try_from(spec.mesh.dcn).unwrap_or(u32::MAX),
        devices_per_slice: u32::try_from(spec.mesh.ici.fsdp * spec.mesh.ici.tp).unwrap_or(u32::MAX),
        worker_token: worker_token(admin_token, &job.id),
        registrations: job
            .workers
            .iter()
            .map(|(id, w)| Registration {
                worker_id: id.clone(),
                instance_id: w.instance_id.clone(),
                removed: w.removed,
                silent: silent.contains(id),
            })
            .collect(),
        object_uid: (!job.kube_object.is_empty()).then(|| job.kube_object.clone()),
        queue: spec.kubernetes.queue.clone(),
        priority_class: spec.kubernetes.priority_class.clone(),
    })
}

impl ControlPlane for Plane {
    fn leading(&self) -> bool {
        self.0.require_leader().is_ok()
    }

    fn desired(&self) -> Vec<DesiredJob> {
        let ctx = &self.0;
        let live: Vec<Job> =
            ctx.shared.read(|s| s.jobs.values().filter(|j| !j.state.is_terminal()).cloned().collect());
        let (now, lease) = (Instant::now(), ctx.config.timeouts.lease);
        live.iter()
            .filter_map(|job| {
                // Every registration, removed ones too (a removed worker that is alive keeps
                // beating until it registers again): one the leader has not seen yet gets a lease
                // from now, as active workers do after an election.
                let silent = ctx.leader.with(|m| {
                    job.workers
                        .keys()
                        .filter(|id| {
                            let w = m.worker_mut(&job.id, id, now);
                            now.saturating_duration_since(w.last_seen) > lease
                        })
                        .cloned()
                        .collect()
                });
                desired(job, &ctx.config.admin_token, &silent)
            })
            .collect()
    }

    fn lost(&self, job_id: &str, worker_ids: &[String], reason: &str) {
        let ctx = &self.0;
        let Some(job) = ctx.shared.read(|s| s.jobs.get(job_id).cloned()) else { return };
        ctx.leader.with(|m| {
            let live = m.job_mut(&job, Instant::now());
            for id in worker_ids {
                // A worker's own notice (SIGTERM) or failure report says more; keep it.
                if let Some(w) = live.workers.get_mut(id)
                    && w.out.is_none()
                {
                    tracing::info!(job_id, worker_id = id, "preempted: {reason}");
                    w.out = Some(Out::Preempted(reason.to_string()));
                }
            }
        });
        ctx.leader.wake.notify_one();
    }

    fn fail(&self, job_id: &str, reason: &str) -> impl Future<Output = ()> + Send {
        let ctx = self.0.clone();
        let command = Command::FailJob {
            job_id: job_id.into(),
            reason: reason.into(),
            unix: crate::leader::unix_now(),
        };
        async move {
            if let Err(e) = ctx.propose(command).await {
                tracing::warn!("controller: cannot fail the job: {e}");
            }
        }
    }

    fn record_object(&self, job_id: &str, uid: &str) -> impl Future<Output = ()> + Send {
        let ctx = self.0.clone();
        let command = Command::RecordJobObject { job_id: job_id.into(), uid: uid.into() };
        async move {
            match ctx.propose(command).await {
                Ok(crate::state::Response::Refused { reason, .. }) => {
                    tracing::warn!("controller: the job object was not recorded: {reason}")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("controller: cannot record the job object: {e}"),
            }
        }
    }

    fn declared(&self) -> Vec<DeclaredJob> {
        self.0.shared.read(|s| {
            s.jobs
                .values()
                .filter(|j| !j.source.is_empty())
                .map(|j| DeclaredJob {
                    source: j.source.clone(),
                    job_id: j.id.clone(),
                    running: !j.state.is_terminal(),
                })
                .collect()
        })
    }

    fn submit(
        &self,
        source: &str,
        declaration: &Declaration,
    ) -> impl Future<Output = Result<String, String>> + Send {
        let ctx = self.0.clone();
        let Declaration { spec_yaml, bundle_uri, bundle_id } = declaration.clone();
        let source = source.to_string();
        async move {
            let submission =
                crate::jobs::Submission { spec_yaml, bundle_uri, bundle_id, source, start_over: false };
            crate::jobs::submit(&ctx, submission)
                .await
                .map(|submitted| submitted.job_id)
                .map_err(|e| e.to_string())
        }
    }

    fn stop(&self, job_id: &str, reason: &str) -> impl Future<Output = ()> + Send {
        let ctx = self.0.clone();
        let job = ctx.shared.read(|s| s.jobs.get(job_id).cloned());
        let reason = reason.to_string();
        async move {
            let Some(job) = job else { return };
            if let Err(e) = crate::jobs::stop(&ctx, &job).await {
                tracing::warn!(job_id = job.id, "controller: cannot stop the job ({reason}): {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_tokens_reach_their_job_only() {
        let admin = "admin-token-for-tests-0123456789";
        let token = worker_token(admin, "llm-1");
        assert!(token.starts_with("pw.llm-1."), "{token}");
        assert_eq!(check_worker_token(admin, &token).as_deref(), Some("llm-1"));
        assert_eq!(check_worker_token("another-admin-token-0123456789", &token), None);
        let forged = token.replace("pw.llm-1.", "pw.llm-2.");
        assert_eq!(check_worker_token(admin, &forged), None);
        assert_eq!(check_worker_token(admin, "pw.llm-1.zz"), None);
        assert_eq!(check_worker_token(admin, "0123abcd"), None);
        // Deterministic: a new leader derives the same token for the job's Secret.
        assert_eq!(worker_token(admin, "llm-1"), token);
    }
}
