//! Restoring the state: exactly the regions each device of the trainer's mesh holds, every
//! chunk's CRC checked, placed on the devices only once all of it is read.

use super::lora::place_base;
use super::{dir_uri, split_uri};
use crate::error::{Part, PassedOver, WorkerError};
use crate::slice::DeviceArray;
use crate::trainer::Trainer;
use checkpoint::lineage::{identity_difference, line_of};
use checkpoint::{
    Checkpoint, CheckpointError, CommitLog, DataPosition, Limits, Storage, StoreCommitLog, StoreOptions,
    committed_newest_first,
};

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

/// Restores the committed checkpoint at `uri`, a checkpoint directory
/// (`<root>/<step:012>-<save_id>`, as the coordinator's `FromCheckpoint` names it) whose step must
/// be `step`, onto `trainer`'s mesh: see [`restore_newest`] for what is read and checked.
/// Failures are [`WorkerError::Restore`], naming the checkpoint.
pub async fn restore(
    trainer: &mut Trainer,
    uri: &str,
    step: u64,
    store: &StoreOptions,
) -> Result<Restored, WorkerError> {
    let restored = async {
        let (storage, checkpoint) = open_committed(uri, Some(step), store).await?;
        place(trainer, &checkpoint, &storage).await?;
        let manifest = checkpoint.manifest();
        Ok(Restored {
            step: manifest.step,
            data_position: manifest.data_position,
            uri: dir_uri(&storage, &checkpoint.commit().dir()),
        })
    };
    restored.await.map_err(WorkerError::restore(uri))
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
        return Err(CheckpointError::InvalidInput {
            what: format!("checkpoint '{uri}'"),
            reason: "it names no checkpoint directory; pass <root>/<step:012>-<save_id>".into(),
        }
        .into());
    };
    if let Some(step) = step
        && dir_step != step
    {
        return Err(CheckpointError::InvalidInput {
            what: format!("checkpoint {uri}"),
            reason: format!("it holds step {dir_step}, not the step {step} asked for"),
        }
        .into());
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

/// Restores the newest committed checkpoint under `storage` that restores (the newest line
/// first, see `checkpoint::lineage`): its manifest checks out against the commit and every chunk
/// read has the CRC the manifest recorded. Each device of the trainer's mesh gets exactly its
/// region of every array, read once per distinct region with ranged reads. Checkpoints that
/// fail those checks are passed over (listed, with the error, e.g. the corrupt object and byte
/// range); `None` when nothing restores. The trainer's state changes only once every array is
/// on the devices.
///
/// With `identity` (what the resuming job records in its saves), a checkpoint recording another
/// is another job's: one in the root's newest line is refused with [`WorkerError::ForeignRoot`]
/// (the root belongs to another job), one in an older line is passed over.
pub async fn restore_newest(
    trainer: &mut Trainer,
    storage: &Storage,
    log: &impl CommitLog,
    identity: Option<&serde_json::Value>,
) -> Result<(Option<Restored>, Vec<PassedOver>), WorkerError> {
    let mut passed_over = Vec::new();
    let commits = committed_newest_first(log).await?;
    let newest_line = commits.first().map(|c| line_of(&c.save_id).to_string());
    for commit in commits {
        let uri = dir_uri(storage, &commit.dir());
        let checkpoint = match Checkpoint::open(storage, &commit, &Limits::default()).await {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                tracing::warn!(checkpoint = %uri, %error, "passing over a checkpoint that does not open");
                passed_over.push(PassedOver { uri, reason: error.to_string() });
                continue;
            }
        };
        if let Some(difference) =
            identity.and_then(|wanted| identity_difference(checkpoint.manifest(), wanted))
        {
            if newest_line.as_deref() == Some(line_of(&commit.save_id)) {
                let root = storage.url().to_string();
                return Err(checkpoint::lineage::ForeignRoot { root, checkpoint: uri, difference }.into());
            }
            passed_over.push(PassedOver { uri, reason: format!("another job's checkpoint ({difference})") });
            continue;
        }
        match place(trainer, &checkpoint, storage).await {
            Ok(()) => {
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
        return Err(WorkerError::incompatible(
            Part::Checkpoint,
            format!(
                "checkpoint {dir} holds {} arrays, this bundle's state has {}; restore a checkpoint of the same model",
                checkpoint.manifest().arrays.len(),
                specs.len()
            ),
        ));
    }
    let arrays = read_arrays(trainer, checkpoint, specs).await?;
    if !trainer.frozen_specs().is_empty() {
        place_base(trainer, checkpoint, root).await?;
    }
    trainer.set_state(arrays)
}

/// Reads `specs`' regions for each device of the trainer's mesh from `checkpoint` (shapes and
/// dtypes checked first) and uploads them.
pub(super) async fn read_arrays(
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
                return Err(WorkerError::incompatible(
                    Part::Checkpoint,
                    format!(
                        "checkpoint {dir} holds '{}' as {}{:?}, this bundle's state has {}{:?}; restore a checkpoint of the same model and param_dtype",
                        spec.name, saved.dtype, saved.shape, spec.dtype, spec.shape
                    ),
                ));
            }
            None => {
                return Err(WorkerError::incompatible(
                    Part::Checkpoint,
                    format!(
                        "checkpoint {dir} has no array '{}'; restore a checkpoint of the same model",
                        spec.name
                    ),
                ));
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
) -> Result<DeviceArray, WorkerError> {
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
    let read = async {
        let (_, checkpoint) = open_committed(uri, None, store).await?;
        let n = trainer.manifest().params.len();
        read_arrays(trainer, &checkpoint, &trainer.state_specs()[..n]).await
    };
    read.await.map_err(WorkerError::restore(uri))
}
