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
use crate::store::{Storage, local_error};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use mesh::{IciMesh, Region, Sharding, for_each_run};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
    manifest: Arc<Manifest>,
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
        Ok(Self {
            storage: storage.clone(),
            commit: commit.clone(),
            manifest: Arc::new(manifest),
            read: ReadOptions::default(),
        })
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

    /// Whole-chunk reads covering `copies` (sorted by object and offset): adjacent spans merged,
    /// then cut where a run of chunks that one copy covers whole begins or ends (those reads land
    /// straight in the target buffer), and split to the fetch bound.
    fn chunk_cover(&self, copies: &[ByteCopy]) -> Vec<Fetch> {
        let chunk = self.manifest.chunk_size;
        // (span, copies touching it) for adjacent or overlapping whole-chunk spans.
        let mut spans: Vec<(Fetch, Range<usize>)> = Vec::new();
        for (i, c) in copies.iter().enumerate() {
            let size = self.manifest.objects[c.object].size;
            let start = c.src / chunk * chunk;
            let end = (c.src + c.len).div_ceil(chunk).saturating_mul(chunk).min(size);
            match spans.last_mut() {
                Some((f, touching)) if f.object == c.object && f.range.end >= start => {
                    f.range.end = f.range.end.max(end);
                    touching.end = i + 1;
                }
                _ => spans.push((Fetch { object: c.object, range: start..end }, i..i + 1)),
            }
        }
        let step = (self.read.max_fetch_bytes / chunk).max(1) * chunk;
        let mut fetches = Vec::new();
        for (span, touching) in spans {
            let first = span.range.start / chunk;
            let chunks = (span.range.end - span.range.start).div_ceil(chunk) as usize;
            // Per chunk of the span: how many copies touch it, and the one that covers it whole.
            let mut touched = vec![0u32; chunks];
            let mut whole = vec![usize::MAX; chunks];
            for i in touching {
                let c = &copies[i];
                let (a, b) = (c.src / chunk - first, (c.src + c.len - 1) / chunk - first);
                for k in a..=b {
                    let k_start = (first + k) * chunk;
                    let k_end = (k_start + chunk).min(span.range.end);
                    touched[k as usize] += 1;
                    if c.src <= k_start && c.src + c.len >= k_end {
                        whole[k as usize] = i;
                    }
                }
            }
            let class = |k: usize| if touched[k] == 1 { whole[k] } else { usize::MAX };
            let mut k = 0;
            while k < chunks {
                let mut end = k + 1;
                while end < chunks && class(end) == class(k) {
                    end += 1;
                }
                let (a, b) = ((first + k as u64) * chunk, ((first + end as u64) * chunk).min(span.range.end));
                fetches.extend(
                    (a..b)
                        .step_by(step as usize)
                        .map(|s| Fetch { object: span.object, range: s..(s + step).min(b) }),
                );
                k = end;
            }
        }
        fetches
    }

    /// Checks the CRC of every chunk in `data`, the bytes of `range` of object `object`.
    fn check_chunks(&self, object: usize, range: &Range<u64>, data: &[u8]) -> Result<()> {
        let entry = &self.manifest.objects[object];
        let chunk = self.manifest.chunk_size;
        for (i, piece) in data.chunks(chunk as usize).enumerate() {
            let offset = range.start + i as u64 * chunk;
            let index = offset / chunk;
            let (actual, expected) = (crc32c::crc32c(piece), entry.chunk_crc32c[index as usize]);
            if actual != expected {
                return Err(CheckpointError::Corrupt {
                    key: self.object_key(object).to_string(),
                    chunk: index,
                    bytes: offset..offset + piece.len() as u64,
                    expected,
                    actual,
                });
            }
        }
        Ok(())
    }

    fn object_key(&self, object: usize) -> object_store::path::Path {
        self.storage.key(&self.commit.dir(), &self.manifest.objects[object].name)
    }

    /// Executes a plan into a new buffer.
    pub async fn execute(&self, plan: &RegionPlan) -> Result<Vec<u8>> {
        let mut out = self.execute_many(std::slice::from_ref(plan)).await?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Executes several plans into new buffers, one per plan, reading every chunk once even when
    /// several plans need it (small arrays share chunks). On `file://` the reads are `pread`s
    /// straight into the target buffers, with only chunks shared between targets (or with bytes
    /// no target needs) going through a scratch buffer; other stores get ranged GETs.
    pub async fn execute_many(&self, plans: &[RegionPlan]) -> Result<Vec<Vec<u8>>> {
        let mut outs = Vec::with_capacity(plans.len());
        for plan in plans {
            let len = usize::try_from(plan.len).map_err(|_| {
                CheckpointError::invalid("restore region", format!("{} bytes do not fit in memory", plan.len))
            })?;
            outs.push(vec![0u8; len]);
        }
        let mut targets: Vec<(ByteCopy, usize)> = plans
            .iter()
            .enumerate()
            .flat_map(|(out, plan)| plan.copies.iter().map(move |c| (*c, out)))
            .collect();
        targets.sort_by_key(|(c, _)| (c.object, c.src));
        let copies: Vec<ByteCopy> = targets.iter().map(|(c, _)| *c).collect();
        let fetches = self.chunk_cover(&copies);
        // Every piece of a target that one fetch supplies; pieces never overlap in the targets.
        let mut pieces: Vec<Piece> = Vec::new();
        for (c, out) in &targets {
            let end = c.src + c.len;
            let first = fetches.partition_point(|f| (f.object, f.range.end) <= (c.object, c.src));
            for (i, f) in fetches.iter().enumerate().skip(first) {
                if f.object != c.object || f.range.start >= end {
                    break;
                }
                let (a, b) = (c.src.max(f.range.start), end.min(f.range.end));
                pieces.push(Piece { fetch: i, out: *out, dst: c.dst + (a - c.src), src: a, len: b - a });
            }
        }
        self.run(fetches, pieces, outs).await
    }

    /// Reads `fetches`, checks every chunk, and copies each piece into its target in `outs`.
    async fn run(
        &self,
        fetches: Vec<Fetch>,
        pieces: Vec<Piece>,
        mut outs: Vec<Vec<u8>>,
    ) -> Result<Vec<Vec<u8>>> {
        if self.storage.is_local() {
            let this = self.clone();
            return tokio::task::spawn_blocking(move || {
                let jobs = split_targets(&fetches, &pieces, &mut outs)?;
                this.run_local(jobs)?;
                Ok(outs)
            })
            .await
            .map_err(|e| CheckpointError::Task { what: "restore reads".into(), reason: e.to_string() })?;
        }
        let jobs = split_targets(&fetches, &pieces, &mut outs)?;
        futures::stream::iter(jobs)
            .map(|job| self.run_remote(job))
            .buffer_unordered(self.read.max_fetches_in_flight.max(1))
            .try_collect::<()>()
            .await?;
        Ok(outs)
    }

    /// One ranged GET, its chunks checked off the async workers, then copied into its targets.
    async fn run_remote(&self, job: Job<'_>) -> Result<()> {
        let key = self.object_key(job.fetch.object);
        let bytes = self.storage.get_range(&key, job.fetch.range.clone()).await?;
        let (this, checked, fetch) = (self.clone(), bytes.clone(), job.fetch.clone());
        tokio::task::spawn_blocking(move || this.check_chunks(fetch.object, &fetch.range, &checked))
            .await
            .map_err(|e| CheckpointError::Task {
            what: format!("crc32c check of {key} at {}", job.fetch.range.start),
            reason: e.to_string(),
        })??;
        for (src, dst) in job.pieces {
            let at = (src - job.fetch.range.start) as usize;
            dst.copy_from_slice(&bytes[at..at + dst.len()]);
        }
        Ok(())
    }

    /// `file://` reads on up to `max_fetches_in_flight` threads; the caller is a blocking thread.
    fn run_local(&self, jobs: Vec<Job<'_>>) -> Result<()> {
        let mut files: Vec<Option<std::fs::File>> = (0..self.manifest.objects.len()).map(|_| None).collect();
        for job in &jobs {
            let slot = &mut files[job.fetch.object];
            if slot.is_none() {
                let key = self.object_key(job.fetch.object);
                let path = self.storage.local_path(&key).ok_or_else(|| {
                    CheckpointError::invalid(format!("object key {key}"), "does not map to a local file")
                })?;
                *slot = Some(std::fs::File::open(&path).map_err(|e| local_error("open", &key, e))?);
            }
        }
        let threads = self.read.max_fetches_in_flight.clamp(1, jobs.len().max(1));
        let queue = std::sync::Mutex::new(jobs.into_iter());
        let failed = AtomicBool::new(false);
        let work = || -> Result<()> {
            let mut scratch = Vec::new();
            loop {
                if failed.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let Some(job) = queue.lock().unwrap_or_else(|p| p.into_inner()).next() else { return Ok(()) };
                let file = files[job.fetch.object].as_ref().expect("opened above");
                let result = self.read_local(file, job, &mut scratch);
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                    return result;
                }
            }
        };
        if threads == 1 {
            return work();
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads).map(|_| scope.spawn(work)).collect();
            handles.into_iter().try_for_each(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CheckpointError::Task {
                        what: "a restore read thread".into(),
                        reason: "panicked".into(),
                    })
                })
            })
        })
    }

    fn read_local(&self, file: &std::fs::File, job: Job<'_>, scratch: &mut Vec<u8>) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let Fetch { object, range } = job.fetch;
        let key = || self.object_key(*object);
        let len = (range.end - range.start) as usize;
        let mut pieces = job.pieces;
        // The common case: the whole fetch is one piece of one target; read it in place.
        if let [(src, dst)] = &mut pieces[..]
            && *src == range.start
            && dst.len() == len
        {
            file.read_exact_at(dst, range.start).map_err(|e| local_error("read", &key(), e))?;
            return self.check_chunks(*object, range, dst);
        }
        scratch.resize(len, 0);
        file.read_exact_at(scratch, range.start).map_err(|e| local_error("read", &key(), e))?;
        self.check_chunks(*object, range, scratch)?;
        for (src, dst) in pieces {
            let at = (src - range.start) as usize;
            dst.copy_from_slice(&scratch[at..at + dst.len()]);
        }
        Ok(())
    }

    /// The bytes of `region` of `array`, row-major, every chunk read verified.
    pub async fn read_region(&self, array: &str, region: &Region) -> Result<Vec<u8>> {
        let plan = self.plan_region(array, region)?;
        self.execute(&plan).await
    }

    /// The bytes of several regions at once (see [`Checkpoint::execute_many`]), in order.
    pub async fn read_regions(&self, wanted: &[(&str, Region)]) -> Result<Vec<Vec<u8>>> {
        let plans = wanted
            .iter()
            .map(|(array, region)| self.plan_region(array, region))
            .collect::<Result<Vec<_>>>()?;
        self.execute_many(&plans).await
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
        let mut all = self.restore_many(&[(array, sharding)], mesh, devices).await?;
        Ok(all.pop().unwrap_or_default())
    }

    /// [`Checkpoint::restore_shards`] for several arrays in one batch of reads (a whole state:
    /// chunks that small arrays share are read once), one list of shards per array, in order.
    pub async fn restore_many(
        &self,
        arrays: &[(&str, &Sharding)],
        mesh: &IciMesh,
        devices: &[usize],
    ) -> Result<Vec<Vec<RestoredShard>>> {
        if let Some(&d) = devices.iter().find(|&&d| d >= mesh.num_devices()) {
            return Err(CheckpointError::invalid(
                format!("target device {d}"),
                format!("mesh {mesh} has {} devices", mesh.num_devices()),
            ));
        }
        let mut wanted: Vec<Vec<(Region, Vec<usize>)>> = Vec::with_capacity(arrays.len());
        let mut plans = Vec::new();
        for &(array, sharding) in arrays {
            let entry = &self.manifest.arrays[self.array_index(array)?];
            sharding.validate(&entry.shape, mesh).map_err(|e| {
                CheckpointError::invalid(format!("target sharding of array '{array}'"), e.to_string())
            })?;
            let mut regions: Vec<(Region, Vec<usize>)> = Vec::new();
            for &d in devices {
                let region = sharding.shard_region(&entry.shape, mesh, d);
                match regions.iter_mut().find(|(r, _)| *r == region) {
                    Some((_, ds)) => ds.push(d),
                    None => regions.push((region, vec![d])),
                }
            }
            for (region, _) in &regions {
                plans.push(self.plan_region(array, region)?);
            }
            wanted.push(regions);
        }
        let mut data = self.execute_many(&plans).await?.into_iter();
        Ok(wanted
            .into_iter()
            .map(|regions| {
                regions
                    .into_iter()
                    .zip(data.by_ref())
                    .map(|((region, mut devices), data)| {
                        devices.sort_unstable();
                        devices.dedup();
                        RestoredShard { region, devices, data: Bytes::from(data) }
                    })
                    .collect()
            })
            .collect())
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
        let bytes = fetches.iter().map(|f| f.range.end - f.range.start).sum();
        self.run(fetches, Vec::new(), Vec::new()).await?;
        let chunks = self.manifest.objects.iter().map(|o| o.chunk_crc32c.len() as u64).sum();
        Ok(VerifyReport { objects: self.manifest.objects.len(), chunks, bytes })
    }
}

/// The part of one target that one fetch supplies.
struct Piece {
    fetch: usize,
    out: usize,
    dst: u64,
    src: u64,
    len: u64,
}

/// One fetch and the target slices it fills, each with its offset in the object.
struct Job<'a> {
    fetch: &'a Fetch,
    pieces: Vec<(u64, &'a mut [u8])>,
}

/// Cuts the target buffers into the disjoint slices the pieces fill, grouped by fetch, so the
/// fetches can fill them in parallel.
fn split_targets<'a>(
    fetches: &'a [Fetch],
    pieces: &[Piece],
    outs: &'a mut [Vec<u8>],
) -> Result<Vec<Job<'a>>> {
    let mut jobs: Vec<Job<'a>> = fetches.iter().map(|fetch| Job { fetch, pieces: Vec::new() }).collect();
    let mut order: Vec<&Piece> = pieces.iter().collect();
    order.sort_by_key(|p| (p.out, p.dst));
    let mut order = order.into_iter().peekable();
    for (index, out) in outs.iter_mut().enumerate() {
        let mut rest: &'a mut [u8] = out.as_mut_slice();
        let mut at = 0u64;
        while let Some(p) = order.next_if(|p| p.out == index) {
            let skip = p.dst.checked_sub(at).filter(|s| s.saturating_add(p.len) <= rest.len() as u64);
            let Some(skip) = skip else {
                return Err(CheckpointError::invalid(
                    format!("restore plan target {index}"),
                    format!(
                        "bytes {}..{} overlap another piece or lie outside the buffer",
                        p.dst,
                        p.dst + p.len
                    ),
                ));
            };
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip as usize);
            let (mine, tail) = tail.split_at_mut(p.len as usize);
            rest = tail;
            at = p.dst + p.len;
            jobs[p.fetch].pieces.push((p.src, mine));
        }
    }
    Ok(jobs)
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
