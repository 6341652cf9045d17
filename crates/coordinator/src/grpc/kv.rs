//! The rendezvous key-value store: puts go through the log; gets are linearizable reads on the
//! leader and may wait for a key to appear.

use super::{caller, find_job, linearizable, require_client_cert};
use crate::ctx::Ctx;
use crate::state::{Command, Response as Applied};
use proto::v1::kv_server::Kv;
use proto::v1::{KvGetRequest, KvGetResponse, KvPutRequest, KvPutResponse};
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// The `Kv` service.
pub struct KvService(pub Arc<Ctx>);

#[tonic::async_trait]
impl Kv for KvService {
    async fn put(&self, request: Request<KvPutRequest>) -> Result<Response<KvPutResponse>, Status> {
        let ctx = &self.0;
        require_client_cert(ctx, &request, "Kv")?;
        let who = caller(ctx, &request)?;
        ctx.require_leader()?;
        let KvPutRequest { job_id, key, value, generation } = request.into_inner();
        let job = find_job(ctx, &who, &job_id)?;
        if let Some(g) = generation
            && g != job.generation
        {
            return Err(super::stale_generation(g, job.generation));
        }
        match ctx.propose(Command::KvPut { job_id: job.id, key, value, generation }).await? {
            Applied::Refused { why, reason } => Err(super::refused_by_state(why, reason)),
            _ => Ok(Response::new(KvPutResponse {})),
        }
    }

    async fn get(&self, request: Request<KvGetRequest>) -> Result<Response<KvGetResponse>, Status> {
        let ctx = &self.0;
        require_client_cert(ctx, &request, "Kv")?;
        let who = caller(ctx, &request)?;
        let KvGetRequest { job_id, key, wait_ms } = request.into_inner();
        let job = find_job(ctx, &who, &job_id)?;
        linearizable(ctx).await?;
        let wait = Duration::from_millis(wait_ms.into()).min(ctx.config.timeouts.kv_wait_max);
        let deadline = tokio::time::Instant::now() + wait;
        let mut applied = ctx.shared.applied.subscribe();
        loop {
            let value = ctx.shared.read(|s| s.kv.get(&job.id).and_then(|kv| kv.get(&key)).cloned());
            if let Some(value) = value {
                return Ok(Response::new(KvGetResponse { value }));
            }
            if wait.is_zero() {
                return Err(Status::not_found(format!("no key '{key}' in job {}", job.id)));
            }
            match tokio::time::timeout_at(deadline, applied.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Status::unavailable("the node is shutting down; retry")),
                Err(_) => {
                    return Err(Status::deadline_exceeded(format!(
                        "key '{key}' of job {} did not appear within {} ms",
                        job.id,
                        wait.as_millis()
                    )));
                }
            }
            ctx.require_leader()?;
        }
    }
}
