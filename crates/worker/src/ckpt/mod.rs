//! Checkpoints of the train state: one host's share saved in the background, restore onto any
//! mesh, and the one save schedule every run follows.
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
//! - [`save`]: [`StateSaver`], the one [`Saver`] of a worker: copies this host's shards off the
//!   devices at a step boundary and uploads them in the background (`checkpoint::HostUpload`);
//!   its [`PendingSave`] yields the [`HostSave`] (host report and save spec) that is committed,
//!   or that the coordinator's `ReportCheckpoint` carries.
//! - [`restore`](mod@restore): [`restore`] and [`restore_newest`] read exactly the regions each device of
//!   the trainer's mesh holds, every chunk's CRC checked, and place them on the devices.
//! - [`schedule`]: [`Checkpoints`], the saves of a run (every `checkpoint.every` steps and after
//!   the last, never two uploading at once: it alone holds the save in flight), each finished
//!   upload handed to a [`Commit`]: the store's own markers without a coordinator
//!   ([`StoreCommit`]), a report to the coordinator under one. Two layers from the driver to the
//!   store: the schedule, then the saver (over the checkpoint crate's upload).
//! - [`lora`]: LoRA's frozen base. The state saved at every checkpoint is the adapters and their
//!   moments only; the base is saved once, as a checkpoint of its own under `<root>/base/`
//!   ([`BASE_DIR`]), and every adapter checkpoint names it in its metadata (`lora.base`, with
//!   rank, alpha and targets), so a restore places both and `podctl ckpt export` can fold the
//!   adapters into it.

mod lora;
mod restore;
mod save;
mod schedule;

pub use crate::error::PassedOver;
pub use lora::BASE_DIR;
pub use restore::{Restored, read_params, restore, restore_newest};
pub use save::{HostSave, PendingSave, SaveLayout, Saver, StateSaver};
pub use schedule::{CheckpointEvent, Checkpoints, Commit, StoreCommit};

use checkpoint::Storage;
use checkpoint::layout::parse_dir_name;

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

pub(crate) fn dir_uri(storage: &Storage, dir: &str) -> String {
    format!("{}/{dir}", storage.url().trim_end_matches('/'))
}
