//! Bringing the state to an assignment's start step: afresh, kept, from a live peer, or from a
//! committed checkpoint, as `decide::resume_plan` says.

use super::AssignmentError;
use super::decide::{self, ResumePlan, Unassignable};
use super::trainer_side::{TrainerSide, state_key};
use crate::ckpt;
use crate::error::WorkerError;
use crate::peer;
use crate::start;
use checkpoint::StoreOptions;
use job::JobSpec;
use proto::v1::Assignment;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a replacement waits for its peer to offer the state, and a survivor for the
/// members it serves to pull it.
const PEER_STATE_WAIT: Duration = Duration::from_secs(120);
/// How long finding a peer's state server in the job's KV may take.
const PEER_LOOKUP_WAIT: Duration = Duration::from_secs(30);

/// This process's resident memory, read from `/proc/self/status` (Linux).
mod memory {
    /// Resident bytes now, after resetting the peak to it (`/proc/self/clear_refs`: 5).
    pub(super) fn resident_and_reset_peak() -> Option<u64> {
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        kib("VmRSS:")
    }

    /// The peak resident bytes since the last reset.
    pub(super) fn peak() -> Option<u64> {
        kib("VmHWM:")
    }

    fn kib(field: &str) -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    }
}

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
                self.serve_peers(a)?;
            }
            ResumePlan::KeepAndOffer => self.serve_peers(a)?,
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

    /// Serves the state on the devices to the members that pull it from this worker
    /// (`serve_to`), before the generation's first step: they cannot train without it, nor this
    /// worker without them. The pieces go out of the device buffers themselves.
    fn serve_peers(&mut self, a: &Assignment) -> Result<(), AssignmentError> {
        if a.serve_to.is_empty() {
            return Ok(());
        }
        self.shared.publish(|s| s.phase = "serving");
        let loaded = self.loaded.as_ref().expect("loaded before resume");
        let trainer = &loaded.trainer;
        let layout = peer::Layout::new(trainer.state_specs(), trainer.slice().mesh());
        let arrays = trainer.state_arrays().map_err(AssignmentError::doing("reading the state to serve"))?;
        let sources: Vec<&pjrt::Buffer> = layout
            .pieces
            .iter()
            .map(|p| arrays.get(p.array).and_then(|array| array.shard(p.device)))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                AssignmentError::doing("serving the state")(WorkerError::broken(
                    "the state on the devices does not match its layout",
                ))
            })?;
        let window = self.state_server.open(&a.job_id, self.steps_done, &layout, &a.serve_to);
        let shared = self.shared.clone();
        let interrupted = || shared.interrupted(a.generation);
        let served = peer::serve(&window, &layout, &sources, &a.serve_to, PEER_STATE_WAIT, &interrupted)?;
        for (worker, bytes, seconds) in served.pulls {
            self.log(
                "info",
                format!(
                    "served the state at step {} to {worker}: {:.2} GB in {seconds:.2}s ({:.2} GB/s)",
                    self.steps_done,
                    bytes as f64 / 1e9,
                    bytes as f64 / 1e9 / seconds.max(1e-9)
                ),
            );
        }
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
        let cancel = peer::Cancel::default();
        *self.shared.fetch.lock().unwrap_or_else(|e| e.into_inner()) = Some(cancel.clone());
        if self.shared.interrupted(a.generation) {
            cancel.cancel();
        }
        let request = peer::Request { job: a.job_id.clone(), step, worker: self.worker_id.clone() };
        // What the pull adds to this process at its peak: the state, and nothing else worth
        // counting (`benches/heal.rs` prints it beside the state's size).
        let before = memory::resident_and_reset_peak();
        self.holds_state = false;
        let trainer = &mut loaded.trainer;
        let (arrays, pulled) =
            peer::pull(addr, &request, trainer.slice(), trainer.state_specs(), PEER_STATE_WAIT, &cancel)?;
        // Read before `set_state`, which adds the gradient accumulator (the parameters' size)
        // every member holds to train: that is the step's memory, not the pull's.
        let peak = memory::peak();
        trainer.set_state(arrays).map_err(AssignmentError::doing("placing the peer's state"))?;
        self.holds_state = true;
        self.steps_done = step;
        self.metrics.peer_catchups_total.add(1.0);
        self.metrics.peer_catchup_seconds.set(started.elapsed().as_secs_f64());
        let growth = match (before, peak) {
            (Some(before), Some(peak)) => {
                format!("; peak memory +{:.2} GB", peak.saturating_sub(before) as f64 / 1e9)
            }
            _ => String::new(),
        };
        self.log(
            "info",
            format!(
                "caught up from peer {worker_id} at step {step}: {:.2} GB in {:.2}s on the wire ({:.2} GB/s), \
                 {:.2}s in all{growth}",
                pulled.bytes as f64 / 1e9,
                pulled.seconds,
                pulled.bytes as f64 / 1e9 / pulled.seconds.max(1e-9),
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
