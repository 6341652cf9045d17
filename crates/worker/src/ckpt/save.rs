//! Saving one host's share of the state: the save spec (a function of the bundle, the layout
//! and the step, the same on every host), the shards the write plan gives this host copied off
//! the devices at a step boundary, and the upload in the background.

use super::lora::{BASE_DIR, base_save_id, ensure_base};
use crate::error::WorkerError;
use crate::trainer::Trainer;
use bytes::Bytes;
use checkpoint::layout::dir_name;
use checkpoint::lineage::IDENTITY_KEY;
use checkpoint::{
    ArraySpec, CheckpointError, DataPosition, HostReport, HostUpload, SaveOptions, SaveProgress, SaveSpec,
    ShardBuffer, Storage, Topology,
};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Where this host's share of a save sits in the job, and what the save records of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveLayout {
    /// The job's slices (`mesh.dcn`), one host each.
    pub dcn: usize,
    /// This host's slice: its host id in the checkpoint's topology.
    pub slice: usize,
    /// The job seed: with the step, where the data order resumes.
    pub seed: u64,
    /// What a run must match to resume from the save (`JobSpec::checkpoint_identity`), recorded
    /// in its metadata under `checkpoint::lineage::IDENTITY_KEY`; `Null` records nothing.
    pub identity: serde_json::Value,
    /// The Hugging Face model the job's weights came from (`model: { hf }`), recorded as
    /// `metadata.hf.source` so that `podctl ckpt export --hf` carries its tokenizer files over.
    pub hf_source: Option<String>,
}

impl SaveLayout {
    /// Slice `slice` of `dcn` of `job`'s saves.
    pub fn for_job(job: &job::JobSpec, dcn: usize, slice: usize) -> Self {
        Self {
            dcn,
            slice,
            seed: job.seed,
            identity: job.checkpoint_identity(),
            hf_source: job.model.hf_dir().map(String::from),
        }
    }
}

/// The save spec of `trainer`'s state after `step` steps: a function of the bundle, the layout
/// and the step only, so every host of a save builds the same one, as the finalizer requires.
fn save_spec(
    trainer: &Trainer,
    layout: &SaveLayout,
    step: u64,
    save_id: &str,
) -> Result<SaveSpec, WorkerError> {
    if layout.slice >= layout.dcn {
        return Err(WorkerError::broken(format!(
            "slice {} does not exist in a job of {} slice(s) (mesh.dcn)",
            layout.slice, layout.dcn
        )));
    }
    let topology = Topology::new(layout.dcn, trainer.slice().mesh().clone(), 1)?;
    let arrays = trainer
        .state_specs()
        .iter()
        .map(|t| ArraySpec::new(t.name.clone(), t.shape.clone(), t.dtype, t.sharding.clone()))
        .collect();
    let mut metadata = std::collections::BTreeMap::new();
    // The model's dimensions, for exports (`podctl ckpt export --hf` writes config.json from it).
    metadata.insert(
        "model".to_string(),
        serde_json::to_value(&trainer.manifest().model).expect("model configs serialize"),
    );
    if let Some(source) = &layout.hf_source {
        metadata.insert("hf".to_string(), serde_json::json!({ "source": source }));
    }
    if !layout.identity.is_null() {
        metadata.insert(IDENTITY_KEY.to_string(), layout.identity.clone());
    }
    if let Some(lora) = &trainer.manifest().train.lora {
        let base = format!("{BASE_DIR}/{}", dir_name(0, &base_save_id(trainer, layout.seed)));
        metadata.insert(
            "lora".to_string(),
            serde_json::json!({
                "rank": lora.rank,
                "alpha": lora.alpha,
                "targets": lora.targets,
                "base_dtype": lora.base_dtype.to_string(),
                "base": base,
            }),
        );
    }
    Ok(SaveSpec {
        step,
        save_id: save_id.to_string(),
        topology,
        arrays,
        bundle: trainer.bundle_id().to_string(),
        data_position: DataPosition { seed: layout.seed, step },
        rng_state: Vec::new(),
        metadata,
    })
}

/// Copies off the devices exactly the shards the write plan gives `host`: one copy of each,
/// nothing of what another host writes. `spec` lists the state in the trainer's order.
fn host_buffers(trainer: &Trainer, spec: &SaveSpec, host: usize) -> Result<Vec<ShardBuffer>, WorkerError> {
    plan_buffers(spec, host, |array, device| trainer.download_state_shard(array, device))
}

/// The shards the write plan gives `host`, each downloaded once with `download(array index,
/// device of the host)`.
pub(super) fn plan_buffers(
    spec: &SaveSpec,
    host: usize,
    download: impl Fn(usize, usize) -> Result<Vec<u8>, WorkerError>,
) -> Result<Vec<ShardBuffer>, WorkerError> {
    let plan = spec.plan()?;
    let local = spec.topology.devices_of_host(host);
    let mut buffers = Vec::new();
    for shard in plan.host_shards(host) {
        let name = &spec.arrays[shard.array].name;
        let device = shard.devices.iter().copied().find(|d| local.contains(d)).ok_or_else(|| {
            WorkerError::broken(format!(
                "the write plan gives host {host} a shard of '{name}' held only by devices {:?}",
                shard.devices
            ))
        })?;
        let data = download(shard.array, device - local.start)?;
        buffers.push(ShardBuffer { array: name.clone(), device, data: Bytes::from(data) });
    }
    Ok(buffers)
}

/// How a run's state `S` is saved: copied at a step boundary, uploaded in the background. The
/// real one is [`StateSaver`]; the driver's tests use fakes.
pub trait Saver<S: ?Sized> {
    /// Starts saving `state`, that of `step` steps.
    fn start(&mut self, state: &S, step: u64) -> Result<PendingSave, WorkerError>;
}

/// Saves one host's share of a trainer's state: copies the shards the write plan gives the
/// host off the devices at a step boundary, then uploads them in the background. When a save may
/// start is the schedule's to say: [`super::Checkpoints`] holds the one save in flight.
pub struct StateSaver {
    storage: Storage,
    options: SaveOptions,
    layout: SaveLayout,
    /// Names this run's saves; a directory of another run (or attempt) is never written.
    save_id: String,
    /// LoRA: whether the frozen base is known to be committed under the base root.
    base_saved: bool,
    runtime: tokio::runtime::Handle,
}

impl StateSaver {
    /// Saves named `save_id` of this host's share (`layout`) to `storage`, uploads running on
    /// `runtime`.
    pub fn new(
        storage: Storage,
        options: SaveOptions,
        layout: SaveLayout,
        save_id: String,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, WorkerError> {
        options.validate()?;
        Ok(Self { storage, options, layout, save_id, base_saved: false, runtime })
    }

    /// LoRA: saves the frozen base once, before the first checkpoint that names it.
    fn ensure_base(&mut self, trainer: &Trainer) -> Result<(), WorkerError> {
        if !self.base_saved && !trainer.frozen_specs().is_empty() {
            let base = self.runtime.block_on(ensure_base(trainer, &self.storage, self.layout.seed))?;
            tracing::info!(%base, "the LoRA base is committed");
            self.base_saved = true;
        }
        Ok(())
    }
}

impl Saver<Trainer> for StateSaver {
    /// Copies this host's shards off the devices (the training stall; the state may change once
    /// this returns), then uploads them in the background.
    fn start(&mut self, trainer: &Trainer, step: u64) -> Result<PendingSave, WorkerError> {
        self.ensure_base(trainer)?;
        let spec = save_spec(trainer, &self.layout, step, &self.save_id)?;
        let copy_started = Instant::now();
        let buffers = host_buffers(trainer, &spec, self.layout.slice)?;
        let copy_seconds = copy_started.elapsed().as_secs_f64();
        let upload = HostUpload::new(&spec, self.layout.slice, buffers)?;
        let progress = upload.progress();
        let (done, outcome) = oneshot::channel();
        let (storage, options) = (self.storage.clone(), self.options);
        let started = Instant::now();
        self.runtime.spawn(async move {
            let saved = upload.run(&storage, &options).await.map(|report| HostSave {
                spec,
                report,
                copy_seconds,
                upload_seconds: started.elapsed().as_secs_f64(),
            });
            // The schedule may have gone (the run ended in an error): nobody waits then.
            let _ = done.send(saved.map_err(WorkerError::from));
        });
        Ok(PendingSave::new(step, copy_seconds, progress, outcome))
    }
}

/// A save whose upload runs in the background.
pub struct PendingSave {
    step: u64,
    copy_seconds: f64,
    progress: Arc<SaveProgress>,
    outcome: oneshot::Receiver<Result<HostSave, WorkerError>>,
}

/// One host's finished share of a save: what `ReportCheckpoint` carries and what
/// [`checkpoint::finalize`] takes.
#[derive(Debug, Clone, PartialEq)]
pub struct HostSave {
    /// The save, the same on every host.
    pub spec: SaveSpec,
    /// What this host wrote.
    pub report: HostReport,
    /// The device -> host copy: how long training stood still.
    pub copy_seconds: f64,
    /// The background upload, from its start to the report.
    pub upload_seconds: f64,
}

impl PendingSave {
    /// The save of `step`, copied off the devices in `copy_seconds`, uploading with `progress`;
    /// its outcome arrives on `outcome`.
    pub fn new(
        step: u64,
        copy_seconds: f64,
        progress: Arc<SaveProgress>,
        outcome: oneshot::Receiver<Result<HostSave, WorkerError>>,
    ) -> Self {
        Self { step, copy_seconds, progress, outcome }
    }

    /// The step saved.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The upload's live counters.
    pub fn progress(&self) -> &SaveProgress {
        &self.progress
    }

    /// The device -> host copy: how long training stood still.
    pub fn copy_seconds(&self) -> f64 {
        self.copy_seconds
    }

    /// The outcome, if the upload has ended; does not wait.
    pub fn try_outcome(&mut self) -> Option<Result<HostSave, WorkerError>> {
        match self.outcome.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(self.lost())),
        }
    }

    /// Waits for the upload to end, blocking the thread (not for use inside an async task).
    pub fn wait(self) -> Result<HostSave, WorkerError> {
        let lost = self.lost();
        self.outcome.blocking_recv().unwrap_or(Err(lost))
    }

    /// The upload's task ended without an outcome (it panicked, or its runtime shut down).
    fn lost(&self) -> WorkerError {
        CheckpointError::Task {
            what: format!("background save of step {}", self.step),
            reason: "it ended without an outcome".into(),
        }
        .into()
    }
}
