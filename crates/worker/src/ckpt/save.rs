//! Saving one host's share of the state: the save spec (a function of the bundle, the layout
//! and the step, the same on every host), the shards the write plan gives this host copied off
//! the devices at a step boundary, and the upload in the background.

use super::lora::{BASE_DIR, base_save_id};
use crate::WorkerError;
use crate::trainer::Trainer;
use bytes::Bytes;
use checkpoint::layout::dir_name;
use checkpoint::lineage::IDENTITY_KEY;
use checkpoint::{
    ArraySpec, AsyncSaver, CheckpointError, DataPosition, HostReport, SaveOptions, SaveSpec, SaverStatus,
    ShardBuffer, Storage, Topology,
};
use futures::FutureExt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

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

/// Saves one host's share of the state in the background, one save at a time.
pub struct StateSaver {
    saver: AsyncSaver,
    layout: SaveLayout,
    runtime: tokio::runtime::Handle,
}

impl StateSaver {
    /// A saver writing to `storage` whose uploads run on `runtime`.
    pub fn new(
        storage: Storage,
        options: SaveOptions,
        layout: SaveLayout,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, WorkerError> {
        Ok(Self { saver: AsyncSaver::new(storage, options)?, layout, runtime })
    }

    /// What the saver is doing.
    pub fn status(&self) -> SaverStatus {
        self.saver.status()
    }

    /// Starts saving the state after `step` steps as save attempt `save_id`: copies this host's
    /// shards off the devices (the training stall; the state may change once this returns), then
    /// uploads them in the background. While a previous save is still uploading, the new one is
    /// refused with [`CheckpointError::SaveInProgress`] before anything is copied: saves are
    /// reported, never stacked, and never hold two copies of the state.
    pub fn start(&self, trainer: &Trainer, step: u64, save_id: &str) -> Result<PendingSave, WorkerError> {
        if let SaverStatus::Running { step: running_step, bytes_written, bytes_total } = self.saver.status() {
            return Err(CheckpointError::SaveInProgress {
                running_step,
                requested_step: step,
                bytes_written,
                bytes_total,
            }
            .into());
        }
        let spec = save_spec(trainer, &self.layout, step, save_id)?;
        let copy_started = Instant::now();
        let buffers = host_buffers(trainer, &spec, self.layout.slice)?;
        let copy = copy_started.elapsed();
        let bytes = buffers.iter().map(|b| b.data.len() as u64).sum();
        let handle = {
            let _inside = self.runtime.enter();
            self.saver.start(&spec, self.layout.slice, buffers)?
        };
        Ok(PendingSave {
            spec,
            bytes,
            copy,
            started: Instant::now(),
            upload: Box::pin(handle.finish()),
            runtime: self.runtime.clone(),
        })
    }
}

/// What [`StateSaver::start_or_skip`] did.
pub enum SaveStart {
    /// The state was copied off the devices and uploads in the background.
    Started(Box<PendingSave>),
    /// The save of `running_step` is still uploading: this one was not taken.
    Skipped {
        /// The step whose save is uploading.
        running_step: u64,
        /// Its bytes uploaded so far.
        bytes_written: u64,
        /// Its bytes in total.
        bytes_total: u64,
    },
}

impl StateSaver {
    /// [`StateSaver::start`], with a save still uploading as an outcome rather than an error.
    pub fn start_or_skip(
        &self,
        trainer: &Trainer,
        step: u64,
        save_id: &str,
    ) -> Result<SaveStart, WorkerError> {
        match self.start(trainer, step, save_id) {
            Ok(pending) => Ok(SaveStart::Started(Box::new(pending))),
            Err(WorkerError::Checkpoint(CheckpointError::SaveInProgress {
                running_step,
                bytes_written,
                bytes_total,
                ..
            })) => Ok(SaveStart::Skipped { running_step, bytes_written, bytes_total }),
            Err(e) => Err(e),
        }
    }
}

type Upload = Pin<Box<dyn Future<Output = checkpoint::Result<HostReport>> + Send>>;

/// A save whose upload runs in the background.
pub struct PendingSave {
    spec: SaveSpec,
    bytes: u64,
    copy: Duration,
    started: Instant,
    upload: Upload,
    runtime: tokio::runtime::Handle,
}

/// Where a [`PendingSave`] is.
pub enum SavePoll {
    /// Still uploading.
    Running(PendingSave),
    /// Ended: this host's report, or why the upload failed.
    Done(Result<HostSave, WorkerError>),
}

/// One host's finished share of a save: what `ReportCheckpoint` carries
/// (`host_report_json`, `save_spec_json`) and what [`checkpoint::finalize`] takes.
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
    /// The save's spec.
    pub fn spec(&self) -> &SaveSpec {
        &self.spec
    }

    /// Bytes this host uploads.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The device -> host copy: how long training stood still.
    pub fn copy_seconds(&self) -> f64 {
        self.copy.as_secs_f64()
    }

    /// Checks without waiting whether the upload has ended.
    pub fn poll(mut self) -> SavePoll {
        match (&mut self.upload).now_or_never() {
            None => SavePoll::Running(self),
            Some(result) => SavePoll::Done(self.done(result)),
        }
    }

    /// Waits for the upload to end, blocking the thread (not for use inside an async task).
    pub fn wait(mut self) -> Result<HostSave, WorkerError> {
        let result = self.runtime.clone().block_on(&mut self.upload);
        self.done(result)
    }

    fn done(self, result: checkpoint::Result<HostReport>) -> Result<HostSave, WorkerError> {
        Ok(HostSave {
            report: result?,
            spec: self.spec,
            copy_seconds: self.copy.as_secs_f64(),
            upload_seconds: self.started.elapsed().as_secs_f64(),
        })
    }
}
