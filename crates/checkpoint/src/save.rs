//! Streaming one host's shards into its stream object, in the background, without copying them.
//!
//! The caller hands over the host buffers it copied off the devices (as [`Bytes`], which a
//! `Vec<u8>` becomes without a copy). Parts of the upload are built from slices of those buffers
//! ([`Bytes::slice`] shares, it does not copy), CRCs are computed as the parts go out, and at
//! most `max_parts_in_flight` parts are in the store's hands at once. So the save never holds a
//! second copy of the state: its memory beyond the caller's buffers is bounded by the parts in
//! flight in the backend's client.

use crate::error::{CheckpointError, Result};
use crate::layout::{dir_name, host_object_name, validate_save_id};
use crate::manifest::{CHUNK_SIZE_RANGE, DataPosition, ObjectEntry, check_bundle_id, region_to_wire};
use crate::plan::{WritePlan, plan_writes};
use crate::store::{Storage, local_error};
use crate::topology::{ArraySpec, Topology};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// S3 refuses multipart parts below 5 MiB (except the last), so no backend gets smaller ones.
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// S3's largest part.
pub const MAX_PART_SIZE: u64 = 5 << 30;

/// Everything about one save that every host and the finalizer agree on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaveSpec {
    /// The training step saved.
    pub step: u64,
    /// A unique id for this save attempt (`[A-Za-z0-9_.-]`, up to 64).
    pub save_id: String,
    /// The mesh and hosts the state lives on.
    pub topology: Topology,
    /// The arrays, in a fixed order.
    pub arrays: Vec<ArraySpec>,
    /// The bundle identity (hex).
    pub bundle: String,
    /// The data loader's position.
    pub data_position: DataPosition,
    /// The RNG state, opaque bytes.
    pub rng_state: Vec<u8>,
    /// Free-form metadata kept in the manifest.
    pub metadata: BTreeMap<String, serde_json::Value>,
}

impl SaveSpec {
    /// The checkpoint directory name, `<step:012>-<save_id>`.
    pub fn dir(&self) -> String {
        dir_name(self.step, &self.save_id)
    }

    /// Checks the spec and computes its write plan.
    pub fn plan(&self) -> Result<WritePlan> {
        validate_save_id(&self.save_id)?;
        check_bundle_id(&self.bundle)?;
        for a in &self.arrays {
            if a.shape.contains(&0) || a.shape.len() > crate::manifest::MAX_RANK {
                return Err(CheckpointError::invalid(
                    format!("shape {:?} of array '{}'", a.shape, a.name),
                    format!(
                        "needs rank <= {} and no zero dimension; leave empty arrays out",
                        crate::manifest::MAX_RANK
                    ),
                ));
            }
        }
        plan_writes(&self.topology, &self.arrays)
    }
}

/// Tuning of the upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveOptions {
    /// Bytes covered by one CRC32C; restore reads whole chunks, so smaller chunks mean less
    /// over-read when resharding.
    pub chunk_size: u64,
    /// Bytes per upload part (and the size above which multipart upload is used).
    pub part_size: u64,
    /// Parts uploading at once; bounds the memory the backend's client may buffer.
    pub max_parts_in_flight: usize,
}

impl Default for SaveOptions {
    fn default() -> Self {
        Self { chunk_size: 1 << 20, part_size: 16 << 20, max_parts_in_flight: 4 }
    }
}

impl SaveOptions {
    /// Checks the options against the backends' limits.
    pub fn validate(&self) -> Result<()> {
        if !CHUNK_SIZE_RANGE.contains(&self.chunk_size) {
            return Err(CheckpointError::invalid(
                format!("chunk_size {}", self.chunk_size),
                format!("must be within {CHUNK_SIZE_RANGE:?}"),
            ));
        }
        if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&self.part_size) {
            return Err(CheckpointError::invalid(
                format!("part_size {}", self.part_size),
                format!("must be within {MIN_PART_SIZE}..={MAX_PART_SIZE} (S3's part limits)"),
            ));
        }
        if !(1..=64).contains(&self.max_parts_in_flight) {
            return Err(CheckpointError::invalid(
                format!("max_parts_in_flight {}", self.max_parts_in_flight),
                "must be within 1..=64",
            ));
        }
        Ok(())
    }
}

/// One device's piece of one array, as copied off the device.
#[derive(Debug, Clone)]
pub struct ShardBuffer {
    /// The array's name.
    pub array: String,
    /// The global device (position in [`Topology::mesh`]) it came from.
    pub device: usize,
    /// The piece, row-major, exactly the shard's size.
    pub data: Bytes,
}

/// Where one shard went in a host's stream object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedShard {
    /// The array's name.
    pub array: String,
    /// `[start, end)` per dimension.
    pub region: Vec<[u64; 2]>,
    /// Byte offset in the object.
    pub offset: u64,
    /// Byte length.
    pub length: u64,
}

/// What a host reports after its stream object is durably stored; the finalizer needs one from
/// every host. Serializable so it can travel through the coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    /// The reporting host.
    pub host: usize,
    /// The step saved.
    pub step: u64,
    /// The save's id.
    pub save_id: String,
    /// The CRC chunk size used.
    pub chunk_size: u64,
    /// The object written.
    pub object: ObjectEntry,
    /// The shards in it, in stream order.
    pub shards: Vec<ReportedShard>,
}

/// Live counters of a running save.
#[derive(Debug, Default)]
pub struct SaveProgress {
    bytes_total: AtomicU64,
    bytes_written: AtomicU64,
    finished: AtomicBool,
}

impl SaveProgress {
    /// Bytes the save uploads in total.
    pub fn bytes_total(&self) -> u64 {
        self.bytes_total.load(Ordering::Relaxed)
    }

    /// Bytes whose upload has completed.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }

    /// Whether the save has ended (successfully or not).
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }
}

/// A host's stream, resolved from its buffers before anything is uploaded.
struct HostStream {
    dir: String,
    host: usize,
    step: u64,
    save_id: String,
    segments: Vec<Bytes>,
    shards: Vec<ReportedShard>,
    total: u64,
}

/// Matches the caller's buffers to the shards the plan gives `host`, in stream order.
fn prepare(spec: &SaveSpec, host: usize, buffers: Vec<ShardBuffer>) -> Result<HostStream> {
    let plan = spec.plan()?;
    let topology = &spec.topology;
    if host >= topology.num_hosts() {
        return Err(CheckpointError::invalid(
            format!("host {host}"),
            format!("{topology} has {} hosts", topology.num_hosts()),
        ));
    }
    let local = topology.devices_of_host(host);
    let index: HashMap<&str, usize> =
        spec.arrays.iter().enumerate().map(|(i, a)| (a.name.as_str(), i)).collect();
    let mut by_key: HashMap<(usize, usize), Bytes> = HashMap::new();
    for b in buffers {
        let Some(&array) = index.get(b.array.as_str()) else {
            return Err(CheckpointError::invalid(
                format!("buffer for array '{}'", b.array),
                "the save spec has no such array",
            ));
        };
        if !local.contains(&b.device) {
            return Err(CheckpointError::invalid(
                format!("buffer of array '{}' from device {}", b.array, b.device),
                format!("host {host} holds devices {local:?}"),
            ));
        }
        let spec_array = &spec.arrays[array];
        let region = spec_array.sharding.shard_region(&spec_array.shape, topology.mesh(), b.device);
        let want = region.num_elements() * spec_array.dtype.size() as u64;
        if b.data.len() as u64 != want {
            return Err(CheckpointError::invalid(
                format!("buffer of array '{}' from device {}", b.array, b.device),
                format!(
                    "has {} bytes, its shard {:?} of {} needs {want}",
                    b.data.len(),
                    region.shape(),
                    spec_array.dtype
                ),
            ));
        }
        if by_key.insert((array, b.device), b.data).is_some() {
            return Err(CheckpointError::invalid(
                format!("buffer of array '{}' from device {}", b.array, b.device),
                "handed over twice",
            ));
        }
    }
    let mut segments = Vec::new();
    let mut shards = Vec::new();
    let mut offset = 0u64;
    for planned in plan.host_shards(host) {
        let array = &spec.arrays[planned.array];
        let data = planned
            .devices
            .iter()
            .filter(|d| local.contains(d))
            .find_map(|&d| by_key.get(&(planned.array, d)))
            .ok_or_else(|| {
                CheckpointError::invalid(
                    format!("buffers of host {host}"),
                    format!(
                        "array '{}' region {:?} is this host's to write but no buffer from devices {:?} was handed over",
                        array.name,
                        planned.region.ranges(),
                        planned.devices
                    ),
                )
            })?;
        shards.push(ReportedShard {
            array: array.name.clone(),
            region: region_to_wire(&planned.region),
            offset,
            length: planned.bytes,
        });
        offset += planned.bytes;
        segments.push(data.clone());
    }
    Ok(HostStream {
        dir: spec.dir(),
        host,
        step: spec.step,
        save_id: spec.save_id.clone(),
        segments,
        shards,
        total: offset,
    })
}

/// CRC32C over fixed-size chunks of a byte stream fed in arbitrary pieces.
struct ChunkHasher {
    chunk_size: u64,
    filled: u64,
    crc: u32,
    crcs: Vec<u32>,
}

impl ChunkHasher {
    fn new(chunk_size: u64) -> Self {
        Self { chunk_size, filled: 0, crc: 0, crcs: Vec::new() }
    }

    fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let take = ((self.chunk_size - self.filled) as usize).min(data.len());
            self.crc = crc32c::crc32c_append(self.crc, &data[..take]);
            self.filled += take as u64;
            data = &data[take..];
            if self.filled == self.chunk_size {
                self.crcs.push(self.crc);
                (self.crc, self.filled) = (0, 0);
            }
        }
    }

    fn finish(mut self) -> Vec<u32> {
        if self.filled > 0 {
            self.crcs.push(self.crc);
        }
        self.crcs
    }
}

/// Splits the stream into parts of `part_size` bytes made of shared slices of the segments.
fn parts(segments: &[Bytes], part_size: u64) -> impl Iterator<Item = Vec<Bytes>> + '_ {
    let mut seg = 0usize;
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let mut part = Vec::new();
        let mut room = part_size as usize;
        while room > 0 && seg < segments.len() {
            let s = &segments[seg];
            let take = (s.len() - pos).min(room);
            if take > 0 {
                part.push(s.slice(pos..pos + take));
            }
            pos += take;
            room -= take;
            if pos == s.len() {
                (seg, pos) = (seg + 1, 0);
            }
        }
        (!part.is_empty()).then_some(part)
    })
}

async fn upload(
    storage: &Storage,
    stream: HostStream,
    options: &SaveOptions,
    progress: &Arc<SaveProgress>,
) -> Result<HostReport> {
    let name = host_object_name(stream.host);
    let key = storage.key(&stream.dir, &name);
    if let Some(path) = storage.local_path(&key) {
        let (options, progress) = (*options, progress.clone());
        return tokio::task::spawn_blocking(move || {
            let crcs = write_local(&path, &key, &stream.segments, &options, &progress)?;
            Ok(report(stream, &options, name, crcs))
        })
        .await
        .map_err(|e| CheckpointError::Task {
            what: "local checkpoint write".into(),
            reason: e.to_string(),
        })?;
    }
    let mut hasher = ChunkHasher::new(options.chunk_size);
    if stream.total <= options.part_size {
        for s in &stream.segments {
            hasher.update(s);
        }
        let payload: PutPayload = stream.segments.iter().cloned().collect();
        fault::fail_point!("checkpoint::host_put");
        storage.put(&key, payload).await?;
        progress.bytes_written.fetch_add(stream.total, Ordering::Relaxed);
    } else {
        let store = storage.object_store();
        let mut upload =
            store.put_multipart(&key).await.map_err(|e| CheckpointError::store("put_multipart", &key, e))?;
        let mut in_flight = FuturesOrdered::new();
        let mut failure = None;
        for (index, part) in parts(&stream.segments, options.part_size).enumerate() {
            // Hash this part while earlier ones upload.
            let bytes: u64 = part.iter().map(|b| b.len() as u64).sum();
            for b in &part {
                hasher.update(b);
            }
            fault::fail_point!("checkpoint::host_part");
            // A task per part keeps every upload moving while this one hashes the next part.
            let part = tokio::spawn(upload.put_part(part.into_iter().collect()));
            in_flight.push_back(async move {
                let result = part.await.unwrap_or_else(|e| {
                    Err(object_store::Error::Generic { store: "checkpoint", source: Box::new(e) })
                });
                (index, bytes, result)
            });
            if in_flight.len() >= options.max_parts_in_flight
                && let Some(e) = drain_one(&mut in_flight, progress).await
            {
                failure = Some(e);
                break;
            }
        }
        while failure.is_none() && !in_flight.is_empty() {
            failure = drain_one(&mut in_flight, progress).await;
        }
        if let Some((index, e)) = failure {
            drop(in_flight);
            // Best effort: a store that cannot abort leaves an incomplete upload that garbage
            // collection or the bucket's lifecycle rule removes.
            if let Err(abort) = upload.abort().await {
                tracing::warn!(key = %key, error = %abort, "aborting a failed multipart upload failed");
            }
            return Err(CheckpointError::store("put_part", format!("{key} (part {index})"), e));
        }
        fault::fail_point!("checkpoint::host_complete");
        upload.complete().await.map_err(|e| CheckpointError::store("complete_multipart", &key, e))?;
    }
    Ok(report(stream, options, name, hasher.finish()))
}

fn report(stream: HostStream, options: &SaveOptions, name: String, chunk_crc32c: Vec<u32>) -> HostReport {
    HostReport {
        host: stream.host,
        step: stream.step,
        save_id: stream.save_id,
        chunk_size: options.chunk_size,
        object: ObjectEntry { name, host: stream.host, size: stream.total, chunk_crc32c },
        shards: stream.shards,
    }
}

/// Writes a `file://` stream object without the object-store layer, so that its flush to disk
/// overlaps the writing: the bytes go to a staging file (`<name>#<n>`, the name object_store's
/// multipart uses, which garbage collection sweeps after a killed writer), a second thread keeps
/// calling `fdatasync` on it while parts are written (otherwise the kernel starts writing back
/// only when a tenth of memory is dirty, and the final fsync waits for all of it), a third
/// computes the chunk CRCs; then the file is synced, renamed into place and its directory synced.
fn write_local(
    path: &std::path::Path,
    key: &object_store::path::Path,
    segments: &[Bytes],
    options: &SaveOptions,
    progress: &SaveProgress,
) -> Result<Vec<u32>> {
    use std::io::Write;
    let io = |operation: &'static str| move |e: std::io::Error| local_error(operation, key, e);
    let dir = path.parent().expect("an object key has a directory");
    std::fs::create_dir_all(dir).map_err(io("create directory"))?;
    if let Some(root) = dir.parent() {
        sync_dir(root).map_err(io("sync directory"))?;
    }
    let (mut file, staging) = (1..)
        .find_map(|n| {
            let staging = std::path::PathBuf::from(format!("{}#{n}", path.display()));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&staging) {
                Ok(file) => Some(Ok((file, staging))),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                Err(e) => Some(Err(io("create")(e))),
            }
        })
        .expect("an unbounded search ends")?;
    let written = std::thread::scope(|scope| -> Result<Vec<u32>> {
        let crcs = scope.spawn(|| {
            let mut hasher = ChunkHasher::new(options.chunk_size);
            segments.iter().for_each(|s| hasher.update(s));
            hasher.finish()
        });
        let flusher = file.try_clone().map_err(io("open"))?;
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        let flushes = scope.spawn(move || -> std::io::Result<()> {
            while woken.recv().is_ok() {
                flusher.sync_data()?;
            }
            Ok(())
        });
        let mut result = Ok(());
        for part in parts(segments, options.part_size) {
            let bytes: u64 = part.iter().map(|b| b.len() as u64).sum();
            fault::fail_point!("checkpoint::host_part");
            if let Err(e) = part.iter().try_for_each(|b| file.write_all(b)) {
                result = Err(io("write")(e));
                break;
            }
            progress.bytes_written.fetch_add(bytes, Ordering::Relaxed);
            // A full channel means a flush is pending, which will cover this part too.
            let _ = wake.try_send(());
        }
        drop(wake);
        let flushed =
            flushes.join().unwrap_or_else(|_| Err(std::io::Error::other("the flush thread panicked")));
        let crcs = crcs.join().map_err(|_| CheckpointError::Task {
            what: format!("crc32c of {key}"),
            reason: "panicked".into(),
        })?;
        result?;
        // An error an early fdatasync saw is not reported again by a later one.
        flushed.map_err(io("sync"))?;
        Ok(crcs)
    });
    let finished = written.and_then(|crcs| {
        fault::fail_point!("checkpoint::host_complete");
        file.sync_all().map_err(io("sync"))?;
        std::fs::rename(&staging, path).map_err(io("rename"))?;
        sync_dir(dir).map_err(io("sync directory"))?;
        Ok(crcs)
    });
    if finished.is_err() {
        let _ = std::fs::remove_file(&staging);
    }
    finished
}

fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

async fn drain_one<F>(
    in_flight: &mut FuturesOrdered<F>,
    progress: &SaveProgress,
) -> Option<(usize, object_store::Error)>
where
    F: std::future::Future<Output = (usize, u64, object_store::Result<()>)>,
{
    match in_flight.next().await? {
        (_, bytes, Ok(())) => {
            progress.bytes_written.fetch_add(bytes, Ordering::Relaxed);
            None
        }
        (index, _, Err(e)) => Some((index, e)),
    }
}

/// Saves `host`'s share of the state and returns its report, in the calling task.
pub async fn save_host(
    storage: &Storage,
    spec: &SaveSpec,
    host: usize,
    buffers: Vec<ShardBuffer>,
    options: &SaveOptions,
) -> Result<HostReport> {
    HostUpload::new(spec, host, buffers)?.run(storage, options).await
}

/// One host's share of a save, checked against the write plan and ready to upload: a bad
/// hand-over fails in [`HostUpload::new`], before anything is written. Its [`SaveProgress`] can
/// be watched while [`HostUpload::run`] uploads (in a task of the caller's, in the background).
/// Whether another save may start meanwhile is the caller's to decide: this crate never queues.
pub struct HostUpload {
    stream: HostStream,
    progress: FinishGuard,
}

impl HostUpload {
    /// Matches `buffers` to the shards the plan of `spec` gives `host`.
    pub fn new(spec: &SaveSpec, host: usize, buffers: Vec<ShardBuffer>) -> Result<Self> {
        let stream = prepare(spec, host, buffers)?;
        let progress = Arc::new(SaveProgress::default());
        progress.bytes_total.store(stream.total, Ordering::Relaxed);
        Ok(Self { stream, progress: FinishGuard(progress) })
    }

    /// The live counters, finished however the upload ends (or is dropped unrun).
    pub fn progress(&self) -> Arc<SaveProgress> {
        self.progress.0.clone()
    }

    /// Uploads the share to `storage` and returns the host's report.
    pub async fn run(self, storage: &Storage, options: &SaveOptions) -> Result<HostReport> {
        let Self { stream, progress } = self;
        options.validate()?;
        upload(storage, stream, options, &progress.0).await
    }
}

/// Marks the save finished however its upload ends (success, error, panic, cancellation).
struct FinishGuard(Arc<SaveProgress>);

impl Drop for FinishGuard {
    fn drop(&mut self) {
        self.0.finished.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_crcs_do_not_depend_on_how_the_stream_is_cut() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut whole = ChunkHasher::new(1024);
        whole.update(&data);
        let whole = whole.finish();
        assert_eq!(whole.len(), 10);
        let mut pieces = ChunkHasher::new(1024);
        for piece in data.chunks(333) {
            pieces.update(piece);
        }
        assert_eq!(pieces.finish(), whole);
        assert_eq!(whole[9], crc32c::crc32c(&data[9216..]));
    }

    #[test]
    fn parts_share_the_buffers_and_cover_the_stream() {
        let segments = vec![Bytes::from(vec![1u8; 7]), Bytes::from(vec![2u8; 3]), Bytes::from(vec![3u8; 9])];
        let cut: Vec<Vec<Bytes>> = parts(&segments, 5).collect();
        let sizes: Vec<usize> = cut.iter().map(|p| p.iter().map(|b| b.len()).sum()).collect();
        assert_eq!(sizes, vec![5, 5, 5, 4]);
        let flat: Vec<u8> = cut.iter().flatten().flat_map(|b| b.to_vec()).collect();
        let original: Vec<u8> = segments.iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(flat, original);
        assert_eq!(cut[0][0].as_ptr(), segments[0].as_ptr(), "slices point into the caller's buffer");
    }

    #[test]
    fn options_are_bounded() {
        assert!(SaveOptions::default().validate().is_ok());
        let e = SaveOptions { part_size: 1 << 20, ..SaveOptions::default() }.validate().unwrap_err();
        assert!(e.to_string().contains("S3's part limits"), "{e}");
        assert!(SaveOptions { chunk_size: 7, ..SaveOptions::default() }.validate().is_err());
        assert!(SaveOptions { max_parts_in_flight: 0, ..SaveOptions::default() }.validate().is_err());
    }
}
