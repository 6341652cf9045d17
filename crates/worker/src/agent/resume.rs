//! Bringing the state to an assignment's start step: afresh, kept, from a live peer, or from a
//! committed checkpoint, as `decide::resume_plan` says.

use super::AssignmentError;
use super::decide::{self, ResumePlan, Unassignable};
use super::trainer_side::{TrainerSide, state_key};
use crate::ckpt;
use crate::peer;
use crate::start;
use checkpoint::StoreOptions;
use job::JobSpec;
use proto::v1::Assignment;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a replacement waits for its peer to offer the state.
const PEER_STATE_WAIT: Duration = Duration::from_secs(120);
/// How long finding a peer's state server in the job's KV may take.
const PEER_LOOKUP_WAIT: Duration = Duration::from_secs(30);

impl TrainerSide {
    /// Brings the state to the assignment's start step.
    pub(super) fn resume(&mut self, a: &Assignment, spec: &JobSpec) -> Result<(), AssignmentError> {
        let source = a.resume.as_ref().and_then(|r| r.source.as_ref());
        let plan = decide::resume_plan(source, a.start_step, self.holds_state, self.steps_done)?;
        match plan {
            ResumePlan::Fresh => {
                self.fresh(spec)?;
            }
            ResumePlan::FreshAndOffer => {
                self.fresh(spec)?;
                self.offer_state(&a.job_id)?;
            }
            ResumePlan::KeepAndOffer => self.offer_state(&a.job_id)?,
            ResumePlan::Peer { worker_id, step } => self.catch_up_from_peer(a, &worker_id, step)?,
            ResumePlan::Checkpoint { uri, step } => self.restore_checkpoint(&uri, step)?,
        }
        if self.steps_done != a.start_step {
            return Err(Unassignable::WrongStart { start_step: a.start_step, held: self.steps_done }.into());
        }
        Ok(())
    }

    /// The state a fresh run of the job starts from.
    fn fresh(&mut self, spec: &JobSpec) -> Result<(), AssignmentError> {
        let loaded = self.loaded.as_mut().expect("loaded before resume");
        self.holds_state = false;
        let from = start::fresh(&mut loaded.trainer, spec, &self.runtime)
            .map_err(AssignmentError::doing("starting the policy"))?;
        self.holds_state = true;
        self.steps_done = 0;
        if let Some(from) = from {
            self.log("info", format!("the policy starts from {from}"));
        }
        Ok(())
    }

    /// Offers the state on the devices to members that are new to the job.
    fn offer_state(&mut self, job_id: &str) -> Result<(), AssignmentError> {
        let loaded = self.loaded.as_ref().expect("loaded before resume");
        let state =
            loaded.trainer.download_state().map_err(AssignmentError::doing("copying the state to offer"))?;
        self.state_server.publish(job_id, self.steps_done, state);
        Ok(())
    }

    /// Fetches the state of `step` steps from live peer `worker_id` over the data plane.
    fn catch_up_from_peer(
        &mut self,
        a: &Assignment,
        worker_id: &str,
        step: u64,
    ) -> Result<(), AssignmentError> {
        self.shared.publish(|s| s.phase = "syncing");
        let started = Instant::now();
        let addr = self
            .runtime
            .block_on(self.client.kv_get(&a.job_id, &state_key(worker_id), PEER_LOOKUP_WAIT))
            .map_err(|source| AssignmentError::PeerLookup { worker_id: worker_id.to_string(), source })?;
        let addr = String::from_utf8_lossy(&addr).into_owned();
        let addr: SocketAddr = addr.parse().map_err(|source| Unassignable::PeerAddress {
            worker_id: worker_id.to_string(),
            addr: addr.clone(),
            source,
        })?;
        let loaded = self.loaded.as_mut().expect("loaded before resume");
        let layout = loaded.trainer.state_layout();
        let cancel = peer::Cancel::default();
        *self.shared.fetch.lock().unwrap_or_else(|e| e.into_inner()) = Some(cancel.clone());
        if self.shared.interrupted(a.generation) {
            cancel.cancel();
        }
        let state = peer::fetch(addr, &a.job_id, step, &layout, PEER_STATE_WAIT, &cancel)?;
        let bytes: usize = state.iter().map(|(_, b)| b.len()).sum();
        self.holds_state = false;
        loaded.trainer.upload_state(&state).map_err(AssignmentError::doing("placing the peer's state"))?;
        self.holds_state = true;
        self.steps_done = step;
        self.metrics.peer_catchups_total.add(1.0);
        self.metrics.peer_catchup_seconds.set(started.elapsed().as_secs_f64());
        self.log(
            "info",
            format!(
                "caught up from peer {worker_id} at step {step}: {:.1} MiB in {:.2}s",
                bytes as f64 / (1 << 20) as f64,
                started.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }

    /// Restores the committed checkpoint at `uri`, of `step` steps.
    fn restore_checkpoint(&mut self, uri: &str, step: u64) -> Result<(), AssignmentError> {
        self.shared.publish(|s| s.phase = "restoring");
        let started = Instant::now();
        let loaded = self.loaded.as_mut().expect("loaded before resume");
        self.holds_state = false;
        let restored = self
            .runtime
            .block_on(ckpt::restore(&mut loaded.trainer, uri, step, &StoreOptions::default()))
            .map_err(AssignmentError::doing("resuming"))?;
        self.holds_state = true;
        self.steps_done = restored.step;
        self.metrics.restores_total.add(1.0);
        self.metrics.restore_seconds.set(started.elapsed().as_secs_f64());
        self.log(
            "info",
            format!(
                "restored checkpoint {} (step {}) in {:.2}s",
                restored.uri,
                restored.step,
                started.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }
}
