//! LoRA's frozen base: saved once per run as a checkpoint of its own under `<root>/base/`,
//! named in every adapter checkpoint's metadata (`lora.base`), placed beside the adapters on
//! restore.

use super::restore::read_arrays;
use super::save::plan_buffers;
use crate::error::{Part, WorkerError};
use crate::trainer::Trainer;
use checkpoint::layout::{dir_name, parse_dir_name};
use checkpoint::{
    ArraySpec, Checkpoint, CheckpointError, CommitLog, DataPosition, Limits, SaveOptions, SaveSpec, Storage,
    StoreCommitLog, StoreOptions, Topology, finalize, save_host,
};

/// Where LoRA's frozen base is saved, relative to the checkpoint root (a root of its own,
/// which the root's retention never touches: `base` does not parse as a checkpoint directory).
pub const BASE_DIR: &str = "base";

/// The base's save id: a function of what `init` draws the base from (the frozen tensors'
/// names, shapes and dtypes, and the seed), so every save of a run, and a resumed run, name
/// the same base.
pub(super) fn base_save_id(trainer: &Trainer, seed: u64) -> String {
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
pub(super) async fn ensure_base(trainer: &Trainer, root: &Storage, seed: u64) -> Result<String, WorkerError> {
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
pub(super) async fn place_base(
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
        return Err(WorkerError::incompatible(
            Part::Checkpoint,
            format!(
                "checkpoint {dir} names no LoRA base (metadata lora.base = {named:?}); restore a checkpoint of a LoRA run"
            ),
        ));
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
