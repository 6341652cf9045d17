//! Reading a committed checkpoint back onto any mesh.
//!
//! For a target region of an array, [`Checkpoint::plan_region`] computes exactly which stored
//! bytes land where (row-major runs between each saved shard and the target), then widens them
//! to whole CRC chunks, the unit that can be verified. Reads are ranged GETs of those chunk
//! spans, split to at most [`ReadOptions::max_fetch_bytes`] each and at most
//! [`ReadOptions::max_fetches_in_flight`] at a time; every chunk is checked before a byte of it
//! is used.

use crate::commit::{CommitLog, CommitRecord, committed_newest_first};
use crate::error::{CheckpointError, Result};
use crate::layout::MANIFEST;
use crate::manifest::{Limits, Manifest};
use crate::store::Storage;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use mesh::{IciMesh, Region, Sharding};
use std::ops::Range;

/// Tuning of restore reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOptions {
    /// Largest single ranged read, in bytes (rounded down to whole chunks, at least one).
    pub max_fetch_bytes: u64,
    /// Ranged reads in flight at once.
    pub max_fetches_in_flight: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self { max_fetch_bytes: 16 << 20, max_fetches_in_flight: 4 }
    }
}

/// A byte run copied from a stored object into the target buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteCopy {
    /// Index of the object in the manifest.
    pub object: usize,
    /// Byte offset in the object.
    pub src: u64,
    /// Byte offset in the target buffer.
    pub dst: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A ranged read of whole chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// Index of the object in the manifest.
    pub object: usize,
    /// The byte range, chunk-aligned (the end may be the object's end).
    pub range: Range<u64>,
}

/// What restoring one region reads and copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionPlan {
    /// The target region.
    pub region: Region,
    /// The target buffer's length.
    pub len: u64,
    /// Exactly the bytes needed, sorted by object and offset.
    pub copies: Vec<ByteCopy>,
    /// The chunk-aligned reads covering them, sorted by object and offset.
    pub fetches: Vec<Fetch>,
}

impl RegionPlan {
    /// Bytes the target needs.
    pub fn needed_bytes(&self) -> u64 {
        self.copies.iter().map(|c| c.len).sum()
    }

    /// Bytes read from storage, whole chunks.
    pub fn fetched_bytes(&self) -> u64 {
        self.fetches.iter().map(|f| f.range.end - f.range.start).sum()
    }
}

/// One distinct piece of a restored array and the target devices that take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredShard {
    /// The piece, global coordinates.
    pub region: Region,
    /// Target devices whose shard this is, ascending.
    pub devices: Vec<usize>,
    /// Row-major bytes.
    pub data: Bytes,
}

/// What a full verification read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyReport {
    /// Objects read.
    pub objects: usize,
    /// Chunks whose CRC matched.
    pub chunks: u64,
    /// Bytes read.
    pub bytes: u64,
}

/// A committed checkpoint, its manifest checked and its objects' sizes confirmed.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    storage: Storage,
    commit: CommitRecord,
    manifest: Manifest,
    read: ReadOptions,
}

impl Checkpoint {
    /// Opens the checkpoint `commit` names: reads the manifest only if its stored size is the
    /// committed one and within `limits`, checks its CRC against the commit and its structure
    /// against `limits`, and confirms every object's length with the store.
    pub async fn open(storage: &Storage, commit: &CommitRecord, limits: &Limits) -> Result<Self> {
        let dir = commit.dir();
        let key = storage.key(&dir, MANIFEST);
        let bad = |reason: String| CheckpointError::manifest(&key, reason);
        let meta = storage.head(&key).await?;
        if meta.size != commit.manifest_size || meta.size > limits.max_manifest_bytes {
            return Err(bad(format!(
                "stored size {} differs from the committed {} or exceeds the limit of {}",
                meta.size, commit.manifest_size, limits.max_manifest_bytes
            )));
        }
        let bytes = storage.get(&key).await?;
        let crc = crc32c::crc32c(&bytes);
        if crc != commit.manifest_crc32c {
            return Err(bad(format!(
                "crc32c {crc:#010x} differs from the committed {:#010x}",
                commit.manifest_crc32c
            )));
        }
        let manifest = Manifest::parse(key.as_ref(), &bytes, limits)?;
        if manifest.step != commit.step
            || manifest.save_id != commit.save_id
            || manifest.bundle != commit.bundle
        {
            return Err(bad("step, save id or bundle differ from the commit record".into()));
        }
        for object in &manifest.objects {
            let object_key = storage.key(&dir, &object.name);
            let stored = storage.head(&object_key).await?.size;
            if stored != object.size {
                return Err(CheckpointError::SizeMismatch {
                    key: object_key.to_string(),
                    reason: format!("the manifest says {} bytes, the store holds {stored}", object.size),
                });
            }
        }
        Ok(Self { storage: storage.clone(), commit: commit.clone(), manifest, read: ReadOptions::default() })
    }

    /// Uses `read` for this checkpoint's reads.
    pub fn with_read_options(mut self, read: ReadOptions) -> Self {
        self.read = read;
        self
    }

    /// The checked manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The commit record it was opened from.
    pub fn commit(&self) -> &CommitRecord {
        &self.commit
    }

    fn array_index(&self, array: &str) -> Result<usize> {
        self.manifest.arrays.iter().position(|a| a.name == array).ok_or_else(|| CheckpointError::NotFound {
            what: format!("array '{array}' in checkpoint {}", self.commit.dir()),
            hint: "list the arrays with `show`".into(),
        })
    }

    /// Exactly which bytes restoring `region` of `array` needs, and the chunk reads covering them.
    pub fn plan_region(&self, array: &str, region: &Region) -> Result<RegionPlan> {
        let entry = &self.manifest.arrays[self.array_index(array)?];
        let full = Region::full(&entry.shape);
        if !full.contains(region) {
            return Err(CheckpointError::invalid(
                format!("region {:?} of array '{array}'", region.ranges()),
                format!("must lie inside its shape {:?}", entry.shape),
            ));
        }
        let elem = entry.dtype.size() as u64;
        let mut copies = Vec::new();
        for shard in &entry.shards {
            let saved = shard.region();
            let Some(overlap) = saved.intersect(region) else { continue };
            for_each_run(&saved, region, &overlap, elem, |src, dst, len| {
                let src = shard.offset + src;
                match copies.last_mut() {
                    Some(ByteCopy { object, src: s, dst: d, len: l })
                        if *object == shard.object && *s + *l == src && *d + *l == dst =>
                    {
                        *l += len
                    }
                    _ => copies.push(ByteCopy { object: shard.object, src, dst, len }),
                }
            });
        }
        copies.sort_by_key(|c| (c.object, c.src));
        let fetches = self.chunk_cover(&copies);
        Ok(RegionPlan { region: region.clone(), len: region.num_elements() * elem, copies, fetches })
    }

    /// Whole-chunk reads covering `copies`, merged where adjacent and split to the fetch bound.
    fn chunk_cover(&self, copies: &[ByteCopy]) -> Vec<Fetch> {
        let chunk = self.manifest.chunk_size;
        let mut spans: Vec<Fetch> = Vec::new();
        for c in copies {
            let size = self.manifest.objects[c.object].size;
            let start = c.src / chunk * chunk;
            let end = (c.src + c.len).div_ceil(chunk).saturating_mul(chunk).min(size);
            match spans.last_mut() {
                Some(f) if f.object == c.object && f.range.end >= start => f.range.end = f.range.end.max(end),
                _ => spans.push(Fetch { object: c.object, range: start..end }),
            }
        }
        let step = (self.read.max_fetch_bytes / chunk).max(1) * chunk;
        spans
            .into_iter()
            .flat_map(|f| {
                let pieces = (f.range.start..f.range.end).step_by(step as usize);
                pieces.map(move |s| Fetch { object: f.object, range: s..(s + step).min(f.range.end) })
            })
            .collect()
    }

    /// Reads one fetch and checks the CRC of every chunk in it.
    async fn fetch_verified(&self, fetch: &Fetch) -> Result<Bytes> {
        let object = &self.manifest.objects[fetch.object];
        let key = self.storage.key(&self.commit.dir(), &object.name);
        let bytes = self.storage.get_range(&key, fetch.range.clone()).await?;
        let chunk = self.manifest.chunk_size;
        let verify = {
            let bytes = bytes.clone();
            // Only this span's CRCs travel to the blocking thread.
            let first = (fetch.range.start / chunk) as usize;
            let last = fetch.range.end.div_ceil(chunk) as usize;
            let crcs = object.chunk_crc32c[first..last].to_vec();
            let (start, key) = (fetch.range.start, key.to_string());
            // CRCs of a large read are CPU work; keep it off the async workers.
            move || -> Result<()> {
                for (i, piece) in bytes.chunks(chunk as usize).enumerate() {
                    let offset = start + i as u64 * chunk;
                    let index = offset / chunk;
                    let actual = crc32c::crc32c(piece);
                    let expected = crcs[i];
                    if actual != expected {
                        return Err(CheckpointError::Corrupt {
                            key,
                            chunk: index,
                            bytes: offset..offset + piece.len() as u64,
                            expected,
                            actual,
                        });
                    }
                }
                Ok(())
            }
        };
        if bytes.len() as u64 > chunk {
            tokio::task::spawn_blocking(verify).await.map_err(|e| CheckpointError::Task {
                what: format!("crc32c check of {}", fetch.range.start),
                reason: e.to_string(),
            })??;
        } else {
            verify()?;
        }
        Ok(bytes)
    }

    /// Executes a plan into a new buffer.
    pub async fn execute(&self, plan: &RegionPlan) -> Result<Vec<u8>> {
        let mut out = vec![
            0u8;
            usize::try_from(plan.len).map_err(|_| {
                CheckpointError::invalid("restore region", format!("{} bytes do not fit in memory", plan.len))
            })?
        ];
        let mut fetched = futures::stream::iter(&plan.fetches)
            .map(|f| async move { self.fetch_verified(f).await.map(|b| (f, b)) })
            .buffered(self.read.max_fetches_in_flight.max(1));
        while let Some((fetch, bytes)) = fetched.try_next().await? {
            let (a, b) = (fetch.range.start, fetch.range.end);
            let first = plan.copies.partition_point(|c| (c.object, c.src + c.len) <= (fetch.object, a));
            for c in plan.copies[first..].iter().take_while(|c| c.object == fetch.object && c.src < b) {
                let start = c.src.max(a);
                let end = (c.src + c.len).min(b);
                let dst = (c.dst + (start - c.src)) as usize;
                let len = (end - start) as usize;
                out[dst..dst + len].copy_from_slice(&bytes[(start - a) as usize..(end - a) as usize]);
            }
        }
        Ok(out)
    }

    /// The bytes of `region` of `array`, row-major, every chunk read verified.
    pub async fn read_region(&self, array: &str, region: &Region) -> Result<Vec<u8>> {
        let plan = self.plan_region(array, region)?;
        self.execute(&plan).await
    }

    /// Restores `array` for the target `devices` of `mesh` under `sharding`: each distinct
    /// region is read once and shared by the devices that hold it.
    pub async fn restore_shards(
        &self,
        array: &str,
        mesh: &IciMesh,
        sharding: &Sharding,
        devices: &[usize],
    ) -> Result<Vec<RestoredShard>> {
        let entry = &self.manifest.arrays[self.array_index(array)?];
        sharding.validate(&entry.shape, mesh).map_err(|e| {
            CheckpointError::invalid(format!("target sharding of array '{array}'"), e.to_string())
        })?;
        let mut wanted: Vec<(Region, Vec<usize>)> = Vec::new();
        for &d in devices {
            if d >= mesh.num_devices() {
                return Err(CheckpointError::invalid(
                    format!("target device {d}"),
                    format!("mesh {mesh} has {} devices", mesh.num_devices()),
                ));
            }
            let region = sharding.shard_region(&entry.shape, mesh, d);
            match wanted.iter_mut().find(|(r, _)| *r == region) {
                Some((_, ds)) => ds.push(d),
                None => wanted.push((region, vec![d])),
            }
        }
        let mut out = Vec::with_capacity(wanted.len());
        for (region, mut devices) in wanted {
            devices.sort_unstable();
            devices.dedup();
            let data = Bytes::from(self.read_region(array, &region).await?);
            out.push(RestoredShard { region, devices, data });
        }
        Ok(out)
    }

    /// Reads every chunk of every object and checks its CRC.
    pub async fn verify(&self) -> Result<VerifyReport> {
        let chunk = self.manifest.chunk_size;
        let step = (self.read.max_fetch_bytes / chunk).max(1) * chunk;
        let fetches: Vec<Fetch> = self
            .manifest
            .objects
            .iter()
            .enumerate()
            .flat_map(|(i, o)| {
                (0..o.size)
                    .step_by(step as usize)
                    .map(move |s| Fetch { object: i, range: s..(s + step).min(o.size) })
            })
            .collect();
        let bytes: u64 = futures::stream::iter(&fetches)
            .map(|f| async move { self.fetch_verified(f).await.map(|b| b.len() as u64) })
            .buffered(self.read.max_fetches_in_flight.max(1))
            .try_fold(0u64, |acc, n| async move { Ok(acc + n) })
            .await?;
        let chunks = self.manifest.objects.iter().map(|o| o.chunk_crc32c.len() as u64).sum();
        Ok(VerifyReport { objects: self.manifest.objects.len(), chunks, bytes })
    }
}

/// A committed checkpoint that was skipped and why.
#[derive(Debug)]
pub struct Skipped {
    /// The commit.
    pub commit: CommitRecord,
    /// Why it was passed over.
    pub error: CheckpointError,
}

/// The newest committed checkpoint whose manifest and every chunk verify, and the newer ones
/// passed over on the way (corrupt or unreadable). `None` when none verifies.
pub async fn newest_verified(
    storage: &Storage,
    log: &impl CommitLog,
    limits: &Limits,
) -> Result<(Option<Checkpoint>, Vec<Skipped>)> {
    let mut skipped = Vec::new();
    for commit in committed_newest_first(log).await? {
        let attempt = async {
            let checkpoint = Checkpoint::open(storage, &commit, limits).await?;
            checkpoint.verify().await?;
            Ok::<_, CheckpointError>(checkpoint)
        };
        match attempt.await {
            Ok(checkpoint) => return Ok((Some(checkpoint), skipped)),
            Err(error) => {
                tracing::warn!(step = commit.step, save_id = %commit.save_id, %error, "skipping a checkpoint that does not verify");
                skipped.push(Skipped { commit, error });
            }
        }
    }
    Ok((None, skipped))
}

/// Calls `f(src_offset, dst_offset, len)` (bytes) for every row-major run of `overlap` between a
/// buffer holding `src` and one holding `dst`. Trailing dimensions that all three span whole
/// merge into one run, so identical layouts give a single call.
fn for_each_run(src: &Region, dst: &Region, overlap: &Region, elem: u64, mut f: impl FnMut(u64, u64, u64)) {
    let rank = overlap.ranges().len();
    let (src_shape, dst_shape, shape) = (src.shape(), dst.shape(), overlap.shape());
    let mut run = elem;
    let mut outer = rank;
    while outer > 0 {
        let d = outer - 1;
        run *= shape[d];
        outer -= 1;
        if shape[d] != src_shape[d] || shape[d] != dst_shape[d] {
            break;
        }
    }
    let strides = |s: &[u64]| {
        let mut out = vec![elem; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            out[d] = out[d + 1] * s[d + 1];
        }
        out
    };
    let (src_strides, dst_strides) = (strides(&src_shape), strides(&dst_shape));
    let offset = |index: &[u64], buf: &Region, strides: &[u64]| -> u64 {
        (0..rank).map(|d| (index[d] - buf.ranges()[d].start) * strides[d]).sum()
    };
    let mut index: Vec<u64> = overlap.ranges().iter().map(|r| r.start).collect();
    loop {
        f(offset(&index, src, &src_strides), offset(&index, dst, &dst_strides), run);
        let mut dim = outer;
        loop {
            if dim == 0 {
                return;
            }
            dim -= 1;
            index[dim] += 1;
            if index[dim] < overlap.ranges()[dim].end {
                break;
            }
            index[dim] = overlap.ranges()[dim].start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::copy_region;

    fn runs(src: &Region, dst: &Region, elem: u64) -> Vec<(u64, u64, u64)> {
        let overlap = src.intersect(dst).unwrap();
        let mut out = Vec::new();
        for_each_run(src, dst, &overlap, elem, |s, d, l| out.push((s, d, l)));
        out
    }

    #[test]
    fn runs_match_copy_region() {
        // Row shards saved, column shards wanted, 3-d with a partial middle dimension.
        let shape = [4u64, 6, 5];
        let full = Region::full(&shape);
        let data: Vec<u8> = (0..full.num_elements() * 2).map(|i| (i * 13 % 256) as u8).collect();
        let src = Region::new(vec![2..4, 0..6, 0..5]);
        let dst = Region::new(vec![0..4, 2..5, 0..5]);
        let mut src_buf = vec![0u8; (src.num_elements() * 2) as usize];
        copy_region(&data, &full, &mut src_buf, &src, &src, 2);
        let overlap = src.intersect(&dst).unwrap();
        let mut expected = vec![0u8; (dst.num_elements() * 2) as usize];
        copy_region(&src_buf, &src, &mut expected, &dst, &overlap, 2);
        let mut got = vec![0u8; expected.len()];
        for (s, d, l) in runs(&src, &dst, 2) {
            got[d as usize..(d + l) as usize].copy_from_slice(&src_buf[s as usize..(s + l) as usize]);
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn identical_layouts_are_one_run_and_scalars_work() {
        let r = Region::new(vec![0..4, 0..6]);
        assert_eq!(runs(&r, &r, 4), vec![(0, 0, 96)]);
        let scalar = Region::full(&[]);
        assert_eq!(runs(&scalar, &scalar, 8), vec![(0, 0, 8)]);
        // Taking columns 3..6 of rows 0..2 from a 2x6 shard: one run per row.
        let src = Region::new(vec![0..2, 0..6]);
        let dst = Region::new(vec![0..2, 3..6]);
        assert_eq!(runs(&src, &dst, 1), vec![(3, 0, 3), (9, 3, 3)]);
    }
}
