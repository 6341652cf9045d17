//! Checkpoints of the train state: one slice's share saved in the background, restore onto any
//! mesh, and the single-process loop's schedule (save every N steps and after the last, commit,
//! retention, resume).
//!
//! The state is the bundle's `init` outputs, parameters and AdamW moments, with the manifest's
//! names, shapes, dtypes and shardings. A save's topology is `dcn` slices, one host each, times
//! the slice's ICI mesh. The bundle's shardings never name `dcn`, so every slice holds a whole
//! replica and the checkpoint crate's write plan spreads the distinct shards over the hosts:
//! each host copies off its devices only the shards it writes, once.
//!
//! Everything else a resume needs is a function of the step: AdamW's step count is the step, the
//! learning rate is the schedule at the step, and a batch is a pure function of (seed, step,
//! micro-batch). So the manifest's data position is `(seed, step)` and its RNG state is empty,
//! and a run resumed at step `s` continues bitwise as if it had never stopped.
//!
//! - [`StateSaver`] starts a save at a step boundary (device -> host copy, then the upload in the
//!   background); its [`PendingSave`] yields the [`HostSave`] (host report and save spec) that
//!   the coordinator's `ReportCheckpoint` carries.
//! - [`restore`] and [`restore_newest`] read exactly the regions each device of the trainer's
//!   mesh holds, every chunk's CRC checked, and place them on the devices.
//! - [`LocalCheckpoints`] is the single-process loop's side: saves committed through the store's
//!   own markers ([`StoreCommitLog`]), retention, and resume.
//!
//! LoRA: the state saved at every checkpoint is the adapters and their moments only. The frozen
//! base is saved once, as a checkpoint of its own under `<root>/base/` ([`BASE_DIR`]), and
//! every adapter checkpoint names it in its metadata (`lora.base`, with rank, alpha and
//! targets), so a restore places both and `podctl ckpt merge` can fold the adapters into it.

use crate::WorkerError;
use crate::run::Observer;
use crate::slice::DeviceArray;
use crate::trainer::Trainer;
use bytes::Bytes;
use checkpoint::layout::{dir_name, parse_dir_name};
use checkpoint::{
    ArraySpec, AsyncSaver, Checkpoint, CheckpointError, CommitLog, DataPosition, HostReport, Limits,
    Retention, SaveOptions, SaveSpec, SaverStatus, ShardBuffer, Storage, StoreCommitLog, StoreOptions,
    Topology, committed_newest_first, finalize, gc, save_host,
};
use futures::FutureExt;
use job::JobSpec;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where this host's share of a save sits in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveLayout {
    /// The job's slices (`mesh.dcn`), one host each.
    pub dcn: usize,
    /// This host's slice: its host id in the checkpoint's topology.
    pub slice: usize,
    /// The job seed: with the step, where the data order resumes.
    pub seed: u64,
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
        return Err(WorkerError::Mismatch(format!(
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

/// Where LoRA's frozen base is saved, relative to the checkpoint root (a root of its own,
/// which the root's retention never touches: `base` does not parse as a checkpoint directory).
pub const BASE_DIR: &str = "base";

/// The base's save id: a function of what `init` draws the base from (the frozen tensors'
/// names, shapes and dtypes, and the seed), so every save of a run, and a resumed run, name
/// the same base.
fn base_save_id(trainer: &Trainer, seed: u64) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for spec in trainer.frozen_specs() {
        hash.update(format!("{} {} {:?};", spec.name, spec.dtype, spec.shape));
    }
    hash.update(seed.to_le_bytes());
    let digest: String = hash.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("base-{digest}")
}

/// The storage of the base root under `root`.
fn base_storage(root: &Storage) -> Result<Storage, WorkerError> {
    let url = format!("{}/{BASE_DIR}", root.url().trim_end_matches('/'));
    Ok(Storage::open(&url, &StoreOptions::default())?)
}

/// Saves the LoRA base of `trainer` under `root`'s base root unless it is committed there
/// already; returns its directory relative to `root`. One host, whole: the base is written
/// once per run, not per step.
async fn ensure_base(trainer: &Trainer, root: &Storage, seed: u64) -> Result<String, WorkerError> {
    let storage = base_storage(root)?;
    let log = StoreCommitLog::new(storage.clone());
    let save_id = base_save_id(trainer, seed);
    let relative = format!("{BASE_DIR}/{}", dir_name(0, &save_id));
    if log.list().await?.iter().any(|c| c.step == 0 && c.save_id == save_id) {
        return Ok(relative);
    }
    let spec = SaveSpec {
        step: 0,
        save_id,
        topology: Topology::new(1, trainer.slice().mesh().clone(), 1)?,
        arrays: trainer
            .frozen_specs()
            .iter()
            .map(|t| ArraySpec::new(t.name.clone(), t.shape.clone(), t.dtype, t.sharding.clone()))
            .collect(),
        bundle: trainer.bundle_id().to_string(),
        data_position: DataPosition { seed, step: 0 },
        rng_state: Vec::new(),
        metadata: Default::default(),
    };
    let buffers = plan_buffers(&spec, 0, |array, device| trainer.download_frozen_shard(array, device))?;
    let report = save_host(&storage, &spec, 0, buffers, &SaveOptions::default()).await?;
    finalize(&storage, &spec, &[report], &log).await?;
    Ok(relative)
}

/// Places the frozen base a LoRA checkpoint names (`lora.base` of its metadata) on `trainer`.
async fn place_base(
    trainer: &mut Trainer,
    checkpoint: &Checkpoint,
    root: &Storage,
) -> Result<(), WorkerError> {
    let dir = checkpoint.commit().dir();
    let named =
        checkpoint.manifest().metadata.get("lora").and_then(|l| l.get("base")).and_then(|b| b.as_str());
    let Some((step, save_id)) =
        named.and_then(|b| b.strip_prefix(&format!("{BASE_DIR}/"))).and_then(parse_dir_name)
    else {
        return Err(WorkerError::Mismatch(format!(
            "checkpoint {dir} names no LoRA base (metadata lora.base = {named:?}); restore a checkpoint of a LoRA run"
        )));
    };
    let storage = base_storage(root)?;
    let commit = StoreCommitLog::new(storage.clone())
        .list()
        .await?
        .into_iter()
        .find(|c| c.step == step && c.save_id == save_id)
        .ok_or_else(|| CheckpointError::NotFound {
            what: format!("the LoRA base {BASE_DIR}/{} of checkpoint {dir}", dir_name(step, &save_id)),
            hint:
                "the base is saved with the first checkpoint of a LoRA run; it was removed or never committed"
                    .into(),
        })?;
    let base = Checkpoint::open(&storage, &commit, &Limits::default()).await?;
    let arrays = read_arrays(trainer, &base, trainer.frozen_specs()).await?;
    trainer.set_frozen(arrays)
}

/// Copies off the devices exactly the shards the write plan gives `host`: one copy of each,
/// nothing of what another host writes. `spec` lists the state in the trainer's order.
fn host_buffers(trainer: &Trainer, spec: &SaveSpec, host: usize) -> Result<Vec<ShardBuffer>, WorkerError> {
    plan_buffers(spec, host, |array, device| trainer.download_state_shard(array, device))
}

/// The shards the write plan gives `host`, each downloaded once with `download(array index,
/// device of the host)`.
fn plan_buffers(
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
            WorkerError::Mismatch(format!(
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

    /// Waits for the upload to end.
    pub async fn finish(mut self) -> Result<HostSave, WorkerError> {
        let result = (&mut self.upload).await;
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

/// A restored state: where training continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Steps done: training continues with step `step + 1`.
    pub step: u64,
    /// Where the data order resumes: `(seed, step)`.
    pub data_position: DataPosition,
    /// The checkpoint's directory, `<root>/<step:012>-<save_id>`.
    pub uri: String,
}

/// A committed checkpoint that [`restore_newest`] passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedOver {
    /// The checkpoint's directory.
    pub uri: String,
    /// The error that refused it, e.g. a chunk whose CRC does not match, naming the object and
    /// its byte range.
    pub reason: String,
}

/// Splits a checkpoint URI into its root and, when its last segment is a checkpoint directory
/// (`<step:012>-<save_id>`), that directory's step and save id.
pub fn split_uri(uri: &str) -> (&str, Option<(u64, String)>) {
    let trimmed = uri.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((root, last)) if !root.is_empty() && !root.ends_with(':') && !root.ends_with(":/") => {
            match parse_dir_name(last) {
                Some(dir) => (root, Some(dir)),
                None => (trimmed, None),
            }
        }
        _ => (trimmed, None),
    }
}

fn dir_uri(storage: &Storage, dir: &str) -> String {
    format!("{}/{dir}", storage.url().trim_end_matches('/'))
}

/// Restores the committed checkpoint at `uri`, a checkpoint directory
/// (`<root>/<step:012>-<save_id>`, as the coordinator's `FromCheckpoint` names it) whose step must
/// be `step`, onto `trainer`'s mesh: see [`restore_newest`] for what is read and checked.
pub async fn restore(
    trainer: &mut Trainer,
    uri: &str,
    step: u64,
    store: &StoreOptions,
) -> Result<Restored, WorkerError> {
    let (storage, checkpoint) = open_committed(uri, Some(step), store).await?;
    place(trainer, &checkpoint, &storage).await?;
    let manifest = checkpoint.manifest();
    Ok(Restored {
        step: manifest.step,
        data_position: manifest.data_position,
        uri: dir_uri(&storage, &checkpoint.commit().dir()),
    })
}

/// Opens the committed checkpoint at `uri`, a checkpoint directory (`<root>/<step:012>-<save_id>`)
/// whose step must be `step` when given.
async fn open_committed(
    uri: &str,
    step: Option<u64>,
    store: &StoreOptions,
) -> Result<(Storage, Checkpoint), WorkerError> {
    let (root, dir) = split_uri(uri);
    let Some((dir_step, save_id)) = dir else {
        return Err(WorkerError::Mismatch(format!(
            "'{uri}' names no checkpoint directory; pass <root>/<step:012>-<save_id>"
        )));
    };
    if let Some(step) = step
        && dir_step != step
    {
        return Err(WorkerError::Mismatch(format!(
            "checkpoint {uri} holds step {dir_step}, not the step {step} asked for"
        )));
    }
    let storage = Storage::open(root, store)?;
    let log = StoreCommitLog::new(storage.clone());
    let commit =
        log.list().await?.into_iter().find(|c| c.step == dir_step && c.save_id == save_id).ok_or_else(
            || CheckpointError::NotFound {
                what: format!("a commit of checkpoint {uri}"),
                hint: format!("it was never committed; `podctl ckpt list {root}` shows what is"),
            },
        )?;
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await?;
    Ok((storage, checkpoint))
}

/// Restores the newest committed checkpoint under `storage` that restores: its manifest checks
/// out against the commit and every chunk read has the CRC the manifest recorded. Each device of
/// the trainer's mesh gets exactly its region of every array, read once per distinct region with
/// ranged reads. Checkpoints that fail those checks are passed over (listed, with the error, e.g.
/// the corrupt object and byte range); `None` when nothing restores. A checkpoint of another
/// model is an error, not passed over. The trainer's state changes only once every array is on
/// the devices.
pub async fn restore_newest(
    trainer: &mut Trainer,
    storage: &Storage,
    log: &impl CommitLog,
) -> Result<(Option<Restored>, Vec<PassedOver>), WorkerError> {
    let mut passed_over = Vec::new();
    for commit in committed_newest_first(log).await? {
        let uri = dir_uri(storage, &commit.dir());
        let attempt = async {
            let checkpoint = Checkpoint::open(storage, &commit, &Limits::default()).await?;
            place(trainer, &checkpoint, storage).await?;
            Ok::<_, WorkerError>(checkpoint)
        };
        match attempt.await {
            Ok(checkpoint) => {
                let manifest = checkpoint.manifest();
                let restored = Restored { step: manifest.step, data_position: manifest.data_position, uri };
                return Ok((Some(restored), passed_over));
            }
            Err(WorkerError::Checkpoint(error)) => {
                tracing::warn!(checkpoint = %uri, %error, "passing over a checkpoint that does not restore");
                passed_over.push(PassedOver { uri, reason: error.to_string() });
            }
            Err(other) => return Err(other),
        }
    }
    Ok((None, passed_over))
}

/// Reads every state array's target regions and places them, and a LoRA run's base; replaces
/// the trainer's state only when all are on the devices.
async fn place(trainer: &mut Trainer, checkpoint: &Checkpoint, root: &Storage) -> Result<(), WorkerError> {
    let dir = checkpoint.commit().dir();
    let specs = trainer.state_specs();
    if checkpoint.manifest().arrays.len() != specs.len() {
        return Err(WorkerError::Mismatch(format!(
            "checkpoint {dir} holds {} arrays, this bundle's state has {}; restore a checkpoint of the same model",
            checkpoint.manifest().arrays.len(),
            specs.len()
        )));
    }
    let arrays = read_arrays(trainer, checkpoint, specs).await?;
    if !trainer.frozen_specs().is_empty() {
        place_base(trainer, checkpoint, root).await?;
    }
    trainer.set_state(arrays)
}

/// Reads `specs`' regions for each device of the trainer's mesh from `checkpoint` (shapes and
/// dtypes checked first) and uploads them.
async fn read_arrays(
    trainer: &Trainer,
    checkpoint: &Checkpoint,
    specs: &[bundle::TensorSpec],
) -> Result<Vec<DeviceArray>, WorkerError> {
    let manifest = checkpoint.manifest();
    let dir = checkpoint.commit().dir();
    for spec in specs {
        match manifest.array(&spec.name) {
            Some(saved) if saved.shape == spec.shape && saved.dtype == spec.dtype => {}
            Some(saved) => {
                return Err(WorkerError::Mismatch(format!(
                    "checkpoint {dir} holds '{}' as {}{:?}, this bundle's state has {}{:?}; restore a checkpoint of the same model and param_dtype",
                    spec.name, saved.dtype, saved.shape, spec.dtype, spec.shape
                )));
            }
            None => {
                return Err(WorkerError::Mismatch(format!(
                    "checkpoint {dir} has no array '{}'; restore a checkpoint of the same model",
                    spec.name
                )));
            }
        }
    }
    let mesh = trainer.slice().mesh().clone();
    let devices: Vec<usize> = (0..mesh.num_devices()).collect();
    // Batches of reads (chunks that small arrays share are read once), each at most
    // RESTORE_BATCH_BYTES of whole arrays, so host memory holds one batch beyond the placed state.
    let mut arrays = Vec::with_capacity(specs.len());
    let mut rest = specs;
    while !rest.is_empty() {
        let mut bytes = 0u64;
        let take = rest
            .iter()
            .take_while(|s| {
                bytes = bytes.saturating_add(s.num_bytes());
                bytes <= RESTORE_BATCH_BYTES
            })
            .count()
            .max(1);
        let (batch, later) = rest.split_at(take);
        rest = later;
        let wanted: Vec<(&str, &mesh::Sharding)> =
            batch.iter().map(|s| (s.name.as_str(), &s.sharding)).collect();
        let restored = checkpoint.restore_many(&wanted, &mesh, &devices).await?;
        for (spec, shards) in batch.iter().zip(restored) {
            arrays.push(upload_restored(trainer, spec, &shards, devices.len())?);
        }
    }
    Ok(arrays)
}

/// Whole-array bytes read per restore batch.
const RESTORE_BATCH_BYTES: u64 = 1 << 30;

fn upload_restored(
    trainer: &Trainer,
    spec: &bundle::TensorSpec,
    shards: &[checkpoint::RestoredShard],
    devices: usize,
) -> Result<crate::DeviceArray, WorkerError> {
    let mut pieces: Vec<&[u8]> = vec![&[]; devices];
    for shard in shards {
        for &d in &shard.devices {
            pieces[d] = &shard.data;
        }
    }
    trainer.slice().upload_shards(spec, &pieces)
}

/// The parameters (only) of the committed checkpoint at `uri`, a checkpoint directory
/// (`<root>/<step:012>-<save_id>`), placed on the trainer's devices beside its state: GRPO's
/// frozen reference. Every chunk read is CRC-checked, as a restore's are.
pub async fn read_params(
    trainer: &Trainer,
    uri: &str,
    store: &StoreOptions,
) -> Result<Vec<DeviceArray>, WorkerError> {
    let (_, checkpoint) = open_committed(uri, None, store).await?;
    let n = trainer.manifest().params.len();
    read_arrays(trainer, &checkpoint, &trainer.state_specs()[..n]).await
}

/// Where the single-process loop's state comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Resume {
    /// The newest committed checkpoint under the job's checkpoint root that restores; a fresh
    /// start when there is none (or the job saves no checkpoints).
    #[default]
    Newest,
    /// A checkpoint directory (`<root>/<step:012>-<save_id>`), or a root whose newest committed
    /// checkpoint that restores is taken. Nothing restorable there is an error.
    From(String),
}

/// What the single-process loop's checkpoints did, for its observer.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckpointEvent {
    /// The run starts from a checkpoint, after passing over newer ones that do not restore.
    Restored {
        /// What was restored.
        restored: Restored,
        /// Newer committed checkpoints refused, and why.
        passed_over: Vec<PassedOver>,
    },
    /// A save began: the state after `step` steps was copied off the devices in `copy_seconds`
    /// (the training stall) and uploads in the background.
    Started {
        /// Steps done.
        step: u64,
        /// Bytes to upload.
        bytes: u64,
        /// The device -> host copy.
        copy_seconds: f64,
    },
    /// A save was due after `step` steps while the one of `running_step` was still uploading:
    /// not taken (saves are never stacked).
    Skipped {
        /// The step whose save was due.
        step: u64,
        /// The step whose save is uploading.
        running_step: u64,
        /// Its bytes uploaded so far.
        bytes_written: u64,
        /// Its bytes in total.
        bytes_total: u64,
    },
    /// A save is committed and retention applied.
    Committed {
        /// Steps done.
        step: u64,
        /// The checkpoint's directory.
        uri: String,
        /// Bytes stored.
        bytes: u64,
        /// The background upload.
        upload_seconds: f64,
        /// Objects retention and orphan collection deleted.
        deleted_objects: usize,
    },
}

/// The single-process loop's checkpoints: resume, a save every `checkpoint.every` steps and after
/// the last, each committed through the store's `COMMITTED` markers, then retention.
///
/// The checkpoint root belongs to the job: uncommitted directories in it are orphans of a
/// stopped run of this job and are collected at once, not after the crate's default grace.
pub struct LocalCheckpoints {
    runtime: tokio::runtime::Runtime,
    saves: Option<LocalSaves>,
}

struct LocalSaves {
    storage: Storage,
    log: StoreCommitLog,
    saver: StateSaver,
    every: u64,
    retention: Retention,
    /// Unique to this process, so a rerun never writes into a directory of an earlier attempt.
    attempt: String,
    pending: Option<PendingSave>,
    /// The newest step committed under the root.
    committed: Option<u64>,
    /// The job seed (a LoRA base's identity).
    seed: u64,
    /// LoRA: whether the frozen base is known to be committed under the base root.
    base_saved: bool,
}

impl LocalCheckpoints {
    /// Opens the job's checkpoint root when the job saves checkpoints.
    pub fn for_job(job: &JobSpec) -> Result<Self, WorkerError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("podctl-ckpt")
            .enable_all()
            .build()
            .map_err(|e| WorkerError::Mismatch(format!("cannot start the checkpoint runtime: {e}")))?;
        let saves = match (&job.checkpoint, job.checkpoint_uri()) {
            (Some(spec), Some(uri)) => {
                let storage = Storage::open(&uri, &StoreOptions::default())?;
                let layout = SaveLayout { dcn: 1, slice: 0, seed: job.seed };
                let saver = StateSaver::new(
                    storage.clone(),
                    SaveOptions::default(),
                    layout,
                    runtime.handle().clone(),
                )?;
                let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                Some(LocalSaves {
                    log: StoreCommitLog::new(storage.clone()),
                    storage,
                    saver,
                    every: spec.every,
                    retention: Retention {
                        keep_last: spec.keep as usize,
                        keep_every: spec.keep_every,
                        min_orphan_age: Duration::ZERO,
                    },
                    attempt: format!("l{:x}", started.as_millis()),
                    pending: None,
                    committed: None,
                    seed: job.seed,
                    base_saved: false,
                })
            }
            _ => None,
        };
        Ok(Self { runtime, saves })
    }

    /// Restores the state the run starts from, per `resume`; returns the steps done, or `None`
    /// when the run starts fresh (the caller initializes the state).
    pub fn resume(
        &mut self,
        trainer: &mut Trainer,
        job: &JobSpec,
        resume: &Resume,
        observer: &mut dyn Observer,
    ) -> Result<Option<u64>, WorkerError> {
        let (restored, passed_over) = match resume {
            Resume::Newest => match &self.saves {
                Some(saves) => self.runtime.block_on(restore_newest(trainer, &saves.storage, &saves.log))?,
                None => (None, Vec::new()),
            },
            Resume::From(uri) => {
                let store = StoreOptions::default();
                let found = match split_uri(uri) {
                    (_, Some((step, _))) => {
                        (Some(self.runtime.block_on(restore(trainer, uri, step, &store))?), vec![])
                    }
                    (root, None) => {
                        let storage = Storage::open(root, &store)?;
                        let log = StoreCommitLog::new(storage.clone());
                        self.runtime.block_on(restore_newest(trainer, &storage, &log))?
                    }
                };
                if found.0.is_none() {
                    let reasons: Vec<String> =
                        found.1.iter().map(|p| format!("{}: {}", p.uri, p.reason)).collect();
                    return Err(WorkerError::Mismatch(format!(
                        "nothing to resume from under {uri}: no committed checkpoint restores{}",
                        if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join("; ")) }
                    )));
                }
                found
            }
        };
        let Some(restored) = restored else { return Ok(None) };
        let position = restored.data_position;
        if position.seed != job.seed {
            return Err(WorkerError::Mismatch(format!(
                "checkpoint {} continues the data order of seed {}, but the job's seed is {}; set `seed: {}` or start without it",
                restored.uri, position.seed, job.seed, position.seed
            )));
        }
        if restored.step > job.steps {
            return Err(WorkerError::Mismatch(format!(
                "checkpoint {} is at step {}, past the job's {} steps; raise `steps` or start without it",
                restored.uri, restored.step, job.steps
            )));
        }
        // Restored from this job's own root: that step needs no second save at the end.
        if let (Resume::Newest, Some(saves)) = (resume, &mut self.saves) {
            saves.committed = Some(restored.step);
        }
        let step = restored.step;
        observer.on_checkpoint(&CheckpointEvent::Restored { restored, passed_over });
        Ok(Some(step))
    }

    /// After `step` steps: commits a save that finished, and starts one when due.
    pub fn after_step(
        &mut self,
        trainer: &Trainer,
        step: u64,
        observer: &mut dyn Observer,
    ) -> Result<(), WorkerError> {
        let Some(saves) = &mut self.saves else { return Ok(()) };
        if let Some(pending) = saves.pending.take() {
            match pending.poll() {
                SavePoll::Running(pending) => saves.pending = Some(pending),
                SavePoll::Done(saved) => saves.commit(&self.runtime, saved?, observer)?,
            }
        }
        if step.is_multiple_of(saves.every) {
            saves.start(&self.runtime, trainer, step, observer)?;
        }
        Ok(())
    }

    /// At the end of the run, after `step` steps: waits for the save in flight and saves the
    /// state unless that step is committed already.
    pub fn finish(
        &mut self,
        trainer: &Trainer,
        step: u64,
        observer: &mut dyn Observer,
    ) -> Result<(), WorkerError> {
        let Some(saves) = &mut self.saves else { return Ok(()) };
        if let Some(pending) = saves.pending.take() {
            saves.commit(&self.runtime, pending.wait()?, observer)?;
        }
        if saves.committed != Some(step) {
            saves.ensure_base(&self.runtime, trainer)?;
            let pending = saves.saver.start(trainer, step, &saves.attempt)?;
            observer.on_checkpoint(&started(step, &pending));
            saves.commit(&self.runtime, pending.wait()?, observer)?;
        }
        Ok(())
    }
}

impl LocalSaves {
    /// LoRA: saves the frozen base once, before the first checkpoint that names it.
    fn ensure_base(
        &mut self,
        runtime: &tokio::runtime::Runtime,
        trainer: &Trainer,
    ) -> Result<(), WorkerError> {
        if !self.base_saved && !trainer.frozen_specs().is_empty() {
            let base = runtime.block_on(ensure_base(trainer, &self.storage, self.seed))?;
            tracing::info!(%base, "the LoRA base is committed");
            self.base_saved = true;
        }
        Ok(())
    }

    /// Starts a save, or reports that the previous one is still uploading.
    fn start(
        &mut self,
        runtime: &tokio::runtime::Runtime,
        trainer: &Trainer,
        step: u64,
        observer: &mut dyn Observer,
    ) -> Result<(), WorkerError> {
        self.ensure_base(runtime, trainer)?;
        match self.saver.start_or_skip(trainer, step, &self.attempt)? {
            SaveStart::Started(pending) => {
                observer.on_checkpoint(&started(step, &pending));
                self.pending = Some(*pending);
            }
            SaveStart::Skipped { running_step, bytes_written, bytes_total } => {
                observer.on_checkpoint(&CheckpointEvent::Skipped {
                    step,
                    running_step,
                    bytes_written,
                    bytes_total,
                });
            }
        }
        Ok(())
    }

    /// Writes the manifest, records the commit (the marker), then applies retention; a failed
    /// collection leaves the commit standing and is only logged.
    fn commit(
        &mut self,
        runtime: &tokio::runtime::Runtime,
        saved: HostSave,
        observer: &mut dyn Observer,
    ) -> Result<(), WorkerError> {
        let reports = std::slice::from_ref(&saved.report);
        let commit = runtime.block_on(finalize(&self.storage, &saved.spec, reports, &self.log))?;
        self.committed = Some(commit.step);
        let deleted_objects = match runtime.block_on(gc(&self.storage, &self.log, &self.retention, &[])) {
            Ok(report) => report.objects_deleted,
            Err(error) => {
                tracing::warn!(%error, "checkpoint retention failed (the commit stands)");
                0
            }
        };
        observer.on_checkpoint(&CheckpointEvent::Committed {
            step: commit.step,
            uri: dir_uri(&self.storage, &commit.dir()),
            bytes: saved.report.object.size,
            upload_seconds: saved.upload_seconds,
            deleted_objects,
        });
        Ok(())
    }
}

fn started(step: u64, pending: &PendingSave) -> CheckpointEvent {
    CheckpointEvent::Started { step, bytes: pending.bytes(), copy_seconds: pending.copy_seconds() }
}
