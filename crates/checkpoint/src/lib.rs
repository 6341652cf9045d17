//! Sharded checkpoints streamed to object storage, committed atomically, resharded on restore.
//!
//! # Layout
//! - [`topology`]: the `dcn x ici` mesh, its hosts, and the arrays on it ([`ArraySpec`]).
//! - [`plan`]: the pure assignment of every distinct shard to one writer host, balancing bytes;
//!   replicated shards are written once.
//! - [`save`]: one host's stream object, uploaded in bounded parts straight from the caller's
//!   buffers: [`save_host`] in the calling task, or a [`HostUpload`] whose progress can be
//!   watched while it runs in the background.
//! - [`commit`]: [`finalize`] writes `manifest.json` after every host report is in, records the
//!   commit through a [`CommitLog`], then writes the `COMMITTED` marker.
//! - [`restore`]: [`Checkpoint`] reads any region of any array with ranged GETs, verifying the
//!   CRC of every chunk it touches; [`newest_verified`] falls back past corrupt checkpoints.
//! - [`gc`]: retention, orphan collection, and the `list` / `remove` operations of the CLI.
//! - [`lineage`]: lines of checkpoints under one root: a run that starts afresh begins one,
//!   saves are named `<line>.<attempt>`, resuming takes the newest line, retention stays in it.
//! - [`export`]: a checkpoint's weights as a safetensors file, LoRA adapters merged into their
//!   base ([`export::export_weights`], `podctl ckpt export`).
//! - [`manifest`]: the format and the checks that make an untrusted manifest safe.
//! - [`store`]: `file://`, `s3://`, `gs://` URLs to an object store.
//! - [`mirror`]: a local directory copied into the store and back (bundles for a cluster).
//!
//! The on-storage format is documented in `docs/CHECKPOINTS.md`.
//!
//! **Architecture Invariant:** this crate knows nothing of the coordinator, PJRT or gRPC. It
//! takes host byte buffers and their place in a global array and streams them to an
//! [`object_store::ObjectStore`]; the coordinator plugs in by implementing [`CommitLog`].
//!
//! **Architecture Invariant:** a checkpoint is visible only once committed, and it is committed
//! only after all of its bytes and its manifest are durable. Nothing reads a manifest's numbers
//! before [`Manifest::check`] has bounded them.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod commit;
mod error;
pub mod export;
pub mod gc;
pub mod layout;
pub mod lineage;
pub mod manifest;
pub mod mirror;
pub mod plan;
pub mod restore;
pub mod save;
pub mod store;
pub mod topology;

pub use commit::{CommitLog, CommitRecord, StoreCommitLog, committed_newest_first, finalize};
pub use error::{CheckpointError, Result};
pub use gc::{ActiveSave, GcReport, Listing, OwnSaves, Retention, gc, list, remove};
pub use manifest::{DataPosition, Limits, Manifest};
pub use restore::{Checkpoint, ReadOptions, RestoredShard, VerifyReport, newest_verified};
pub use save::{HostReport, HostUpload, SaveOptions, SaveProgress, SaveSpec, ShardBuffer, save_host};
pub use store::{Storage, StoreOptions};
pub use topology::{ArraySpec, Topology};
