//! Data files where they live: [`StoreFiles`] is the `data` crate's [`DataFiles`] for `s3://` and
//! `gs://` (plain paths and `file://` go to [`data::LocalFiles`]), through the checkpoint crate's
//! object-store clients, so data reads have the same credentials, timeouts and retries as
//! checkpoints.
//!
//! A remote file is read by the range, in blocks of [`BLOCK_BYTES`]: a reader that asks for a
//! Parquet row group or a token window gets the blocks that hold it, and nothing else, so each
//! host reads its share of the data. Every block read is kept in a cache on local disk, under a
//! directory named by the object's URI and its version (its ETag, else its modification time,
//! and its size): a worker started again reads nothing twice, and a file replaced in the bucket is
//! read afresh (the old version's blocks are removed). Reads of a version carry `If-Match` with
//! its ETag, so an object replaced in the middle of a run is an error, never a mix of two files.
//! Blocks are written to a temporary name and renamed, so workers sharing a cache directory (the
//! slices of a local run) and a worker killed mid-write leave only whole blocks.
//!
//! [`StoreFiles::reads`] says, per file, how many bytes came from the store and how many from the
//! cache: what the worker's data event reports.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use bytes::{Bytes, BytesMut};
use checkpoint::{Storage, StoreOptions};
use data::files::{DataFile, DataFiles, LocalFiles, check_range, is_local};
use data::{DataError, Result};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The unit of reading and caching a remote file.
pub const BLOCK_BYTES: u64 = 1 << 20;
/// Blocks kept in memory per file after they are read (a reader walking a row group reads the
/// same block many times).
const MEMORY_BLOCKS: usize = 8;
/// Ranged requests in flight at once for one prefetch.
const CONCURRENT_REQUESTS: usize = 8;

/// What went wrong between a data file and its bucket.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or refused (after the client's retries).
    #[error("{operation} failed: {source}")]
    Store {
        /// `head`, `get`, `list`.
        operation: &'static str,
        /// The backend's error.
        source: object_store::Error,
    },
    /// The object changed since it was opened (its ETag no longer matches).
    #[error(
        "the object changed while the job was reading it (it was version {etag}); data files must not \
         change during a run: upload a new version under a new name"
    )]
    Changed {
        /// The version that was opened.
        etag: String,
    },
    /// The store returned fewer or more bytes than asked for.
    #[error("a read of bytes {start}..{end} returned {got} bytes")]
    ShortRead {
        /// First byte asked for.
        start: u64,
        /// One past the last.
        end: u64,
        /// Bytes returned.
        got: usize,
    },
    /// The local cache could not be written or read.
    #[error("data cache {path}: {source}")]
    Cache {
        /// The cache file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A blocking read was asked for on a thread that drives the async runtime.
    #[error("data files are read from the trainer's thread, not from inside the async runtime")]
    InsideRuntime,
}

fn remote(uri: &str, error: impl Into<StoreError>) -> DataError {
    DataError::Remote { uri: uri.to_owned(), source: Box::new(error.into()) }
}

/// What was read of one file, since it was first opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileReads {
    /// The file's size.
    pub size: u64,
    /// Bytes fetched from the store (whole blocks).
    pub fetched: u64,
    /// Ranged requests made.
    pub requests: u64,
    /// Bytes of blocks found in the local cache instead.
    pub cached: u64,
}

/// The `data` crate's files, local or in a bucket. See the crate docs.
pub struct StoreFiles {
    options: StoreOptions,
    runtime: tokio::runtime::Handle,
    cache: PathBuf,
    block: u64,
    /// One client per bucket.
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    /// Open files by URI, so a file opened twice (the loader and the evaluation) shares blocks.
    files: Mutex<HashMap<String, Arc<RemoteFile>>>,
    reads: Arc<Mutex<BTreeMap<String, FileReads>>>,
}

impl std::fmt::Debug for StoreFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreFiles")
            .field("cache", &self.cache)
            .field("block", &self.block)
            .finish_non_exhaustive()
    }
}

impl StoreFiles {
    /// Files reached with `options` (credentials, endpoints, timeouts, retries), waited for on
    /// `runtime`, cached under `cache` (created when needed).
    pub fn new(options: StoreOptions, runtime: tokio::runtime::Handle, cache: impl Into<PathBuf>) -> Self {
        Self {
            options,
            runtime,
            cache: cache.into(),
            block: BLOCK_BYTES,
            stores: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
            reads: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// The same with blocks of `bytes` (tests use small ones on small files).
    pub fn with_block_bytes(mut self, bytes: u64) -> Self {
        self.block = bytes.max(1);
        self
    }

    /// What has been read of each remote file so far, by URI.
    pub fn reads(&self) -> BTreeMap<String, FileReads> {
        self.reads.lock().map(|reads| reads.clone()).unwrap_or_default()
    }

    /// Waits for `future` on the runtime; refused on one of the runtime's own threads, where
    /// blocking would deadlock it.
    fn wait<T>(&self, future: impl Future<Output = T>) -> std::result::Result<T, StoreError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(StoreError::InsideRuntime);
        }
        Ok(self.runtime.block_on(future))
    }

    /// The client of `uri`'s bucket and the object's key.
    fn locate(&self, uri: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
        let (scheme, rest) = uri.split_once("://").unwrap_or(("", uri));
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_url = format!("{scheme}://{bucket}");
        let mut stores = self.stores.lock().map_err(|_| poisoned(uri))?;
        let store = match stores.get(&bucket_url) {
            Some(store) => Arc::clone(store),
            None => {
                let storage = Storage::open(&bucket_url, &self.options).map_err(|error| {
                    DataError::InvalidConfig { field: "data.path", message: error.to_string() }
                })?;
                let store = Arc::clone(storage.object_store());
                stores.insert(bucket_url, Arc::clone(&store));
                store
            }
        };
        let key = ObjectPath::parse(key.trim_end_matches('/')).map_err(|error| DataError::InvalidConfig {
            field: "data.path",
            message: format!("{uri} is not a valid object key: {error}"),
        })?;
        Ok((store, key))
    }

    /// The cache directory of one version of `uri`, with the other versions of it removed.
    fn version_dir(&self, uri: &str, version: &str) -> std::result::Result<PathBuf, StoreError> {
        let hash = |text: &str| hex_prefix(&Sha256::digest(text.as_bytes()));
        let file_dir = self.cache.join(hash(uri));
        let dir = file_dir.join(hash(version));
        let io = |path: &Path, source| StoreError::Cache { path: path.to_path_buf(), source };
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        for entry in std::fs::read_dir(&file_dir).map_err(|e| io(&file_dir, e))? {
            let entry = entry.map_err(|e| io(&file_dir, e))?;
            if entry.path() != dir && entry.file_type().map_err(|e| io(&entry.path(), e))?.is_dir() {
                // Another process may be removing it too.
                match std::fs::remove_dir_all(entry.path()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(&entry.path(), e)),
                }
            }
        }
        let note = file_dir.join("source");
        if !note.exists() {
            write_atomically(&note, format!("{uri}\n").as_bytes())?;
        }
        Ok(dir)
    }
}

fn poisoned(uri: &str) -> DataError {
    DataError::Remote { uri: uri.to_owned(), source: "a reader panicked while holding the file table".into() }
}

fn hex_prefix(digest: &[u8]) -> String {
    digest.iter().take(10).map(|byte| format!("{byte:02x}")).collect()
}

impl DataFiles for StoreFiles {
    fn open(&self, uri: &str) -> Result<Option<Arc<dyn DataFile>>> {
        if is_local(uri) {
            return LocalFiles.open(uri);
        }
        if let Some(file) = self.files.lock().map_err(|_| poisoned(uri))?.get(uri) {
            return Ok(Some(Arc::clone(file) as Arc<dyn DataFile>));
        }
        let (store, key) = self.locate(uri)?;
        let meta = match self.wait(store.head(&key)).map_err(|e| remote(uri, e))? {
            Ok(meta) => meta,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(source) => return Err(remote(uri, StoreError::Store { operation: "head", source })),
        };
        let version = match &meta.e_tag {
            Some(etag) => format!("etag {etag} size {}", meta.size),
            None => format!("modified {} size {}", meta.last_modified.to_rfc3339(), meta.size),
        };
        let dir = self.version_dir(uri, &version).map_err(|e| remote(uri, e))?;
        let file = Arc::new(RemoteFile {
            uri: uri.to_owned(),
            store,
            key,
            size: meta.size,
            etag: meta.e_tag,
            dir,
            block: self.block,
            runtime: self.runtime.clone(),
            memory: Mutex::new(Vec::new()),
            reads: Arc::clone(&self.reads),
        });
        self.reads
            .lock()
            .map_err(|_| poisoned(uri))?
            .entry(uri.to_owned())
            .or_insert(FileReads { size: meta.size, ..FileReads::default() });
        self.files.lock().map_err(|_| poisoned(uri))?.insert(uri.to_owned(), Arc::clone(&file));
        Ok(Some(file))
    }

    fn is_dir(&self, uri: &str) -> Result<bool> {
        if is_local(uri) {
            return LocalFiles.is_dir(uri);
        }
        if uri.ends_with('/') {
            return Ok(true);
        }
        Ok(!self.list(uri, "")?.is_empty())
    }

    fn list(&self, uri: &str, suffix: &str) -> Result<Vec<String>> {
        if is_local(uri) {
            return LocalFiles.list(uri, suffix);
        }
        let (store, key) = self.locate(uri)?;
        let prefix = (!key.as_ref().is_empty()).then_some(&key);
        let listed = self
            .wait(store.list_with_delimiter(prefix))
            .map_err(|e| remote(uri, e))?
            .map_err(|source| remote(uri, StoreError::Store { operation: "list", source }))?;
        let base = uri.trim_end_matches('/');
        let mut names: Vec<String> = listed
            .objects
            .iter()
            .filter_map(|object| object.location.filename().map(str::to_owned))
            .filter(|name| name.ends_with(suffix))
            .collect();
        names.sort();
        Ok(names.into_iter().map(|name| format!("{base}/{name}")).collect())
    }
}

/// One version of a remote file. See the crate docs.
struct RemoteFile {
    uri: String,
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    size: u64,
    etag: Option<String>,
    dir: PathBuf,
    block: u64,
    runtime: tokio::runtime::Handle,
    /// The last blocks read, most recent last.
    memory: Mutex<Vec<(u64, Bytes)>>,
    reads: Arc<Mutex<BTreeMap<String, FileReads>>>,
}

impl std::fmt::Debug for RemoteFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFile").field("uri", &self.uri).field("size", &self.size).finish_non_exhaustive()
    }
}

impl RemoteFile {
    fn blocks(&self, range: &Range<u64>) -> Range<u64> {
        if range.start >= range.end {
            return 0..0;
        }
        range.start / self.block..range.end.div_ceil(self.block)
    }

    fn block_range(&self, block: u64) -> Range<u64> {
        block * self.block..((block + 1) * self.block).min(self.size)
    }

    fn block_path(&self, block: u64) -> PathBuf {
        self.dir.join(format!("{block:010}"))
    }

    fn count(&self, update: impl FnOnce(&mut FileReads)) {
        if let Ok(mut reads) = self.reads.lock() {
            update(reads.entry(self.uri.clone()).or_default());
        }
    }

    /// Block `block` from memory or the disk cache, `None` when neither has it.
    fn cached(&self, block: u64) -> std::result::Result<Option<Bytes>, StoreError> {
        if let Some(bytes) = self
            .memory
            .lock()
            .ok()
            .and_then(|memory| memory.iter().find(|(b, _)| *b == block).map(|(_, bytes)| bytes.clone()))
        {
            return Ok(Some(bytes));
        }
        let path = self.block_path(block);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => Bytes::from(bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StoreError::Cache { path, source }),
        };
        let range = self.block_range(block);
        if bytes.len() as u64 != range.end - range.start {
            // Only whole blocks are ever renamed into place; anything else is not ours to trust.
            return Ok(None);
        }
        self.count(|reads| reads.cached += bytes.len() as u64);
        self.remember(block, bytes.clone());
        Ok(Some(bytes))
    }

    fn remember(&self, block: u64, bytes: Bytes) {
        if let Ok(mut memory) = self.memory.lock() {
            memory.retain(|(b, _)| *b != block);
            if memory.len() == MEMORY_BLOCKS {
                memory.remove(0);
            }
            memory.push((block, bytes));
        }
    }

    /// Fetches `blocks` (sorted, none cached) from the store, contiguous blocks in one ranged
    /// request, several requests at once, and stores each block in the cache.
    fn fetch(&self, blocks: &[u64]) -> std::result::Result<Vec<(u64, Bytes)>, StoreError> {
        let mut runs: Vec<Range<u64>> = Vec::new();
        for &block in blocks {
            match runs.last_mut() {
                Some(run) if run.end == block => run.end = block + 1,
                _ => runs.push(block..block + 1),
            }
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(StoreError::InsideRuntime);
        }
        let fetched: Vec<(Range<u64>, Bytes)> = self.runtime.block_on(
            futures::stream::iter(runs.into_iter().map(|run| {
                let bytes = self.block_range(run.start).start..self.block_range(run.end - 1).end;
                async move { self.get(bytes).await.map(|data| (run, data)) }
            }))
            .buffer_unordered(CONCURRENT_REQUESTS)
            .try_collect(),
        )?;
        let mut out = Vec::with_capacity(blocks.len());
        for (run, data) in fetched {
            self.count(|reads| {
                reads.fetched += data.len() as u64;
                reads.requests += 1;
            });
            let first = self.block_range(run.start).start;
            for block in run {
                let range = self.block_range(block);
                let bytes = data.slice((range.start - first) as usize..(range.end - first) as usize);
                write_atomically(&self.block_path(block), &bytes)?;
                out.push((block, bytes));
            }
        }
        Ok(out)
    }

    async fn get(&self, range: Range<u64>) -> std::result::Result<Bytes, StoreError> {
        let options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            if_match: self.etag.clone(),
            ..GetOptions::default()
        };
        let result = match self.store.get_opts(&self.key, options).await {
            Ok(result) => result.bytes().await,
            Err(error) => Err(error),
        };
        let bytes = match result {
            Ok(bytes) => bytes,
            Err(object_store::Error::Precondition { .. }) => {
                return Err(StoreError::Changed { etag: self.etag.clone().unwrap_or_default() });
            }
            Err(source) => return Err(StoreError::Store { operation: "get", source }),
        };
        if bytes.len() as u64 != range.end - range.start {
            return Err(StoreError::ShortRead { start: range.start, end: range.end, got: bytes.len() });
        }
        Ok(bytes)
    }

    /// The blocks of `ranges`, from the cache or fetched.
    fn load(&self, ranges: &[Range<u64>]) -> std::result::Result<BTreeMap<u64, Bytes>, StoreError> {
        let wanted: BTreeSet<u64> = ranges.iter().flat_map(|range| self.blocks(range)).collect();
        let mut have = BTreeMap::new();
        let mut missing = Vec::new();
        for block in wanted {
            match self.cached(block)? {
                Some(bytes) => {
                    have.insert(block, bytes);
                }
                None => missing.push(block),
            }
        }
        for (block, bytes) in self.fetch(&missing)? {
            self.remember(block, bytes.clone());
            have.insert(block, bytes);
        }
        Ok(have)
    }
}

impl DataFile for RemoteFile {
    fn name(&self) -> &str {
        &self.uri
    }

    fn len(&self) -> u64 {
        self.size
    }

    fn read(&self, range: Range<u64>) -> Result<Bytes> {
        check_range(self, &range)?;
        let blocks = self.load(std::slice::from_ref(&range)).map_err(|e| remote(&self.uri, e))?;
        if blocks.len() == 1 {
            let (&block, bytes) = blocks.iter().next().expect("one block");
            let first = self.block_range(block).start;
            return Ok(bytes.slice((range.start - first) as usize..(range.end - first) as usize));
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        for (block, bytes) in &blocks {
            let span = self.block_range(*block);
            let (from, to) = (range.start.max(span.start), range.end.min(span.end));
            out.extend_from_slice(&bytes[(from - span.start) as usize..(to - span.start) as usize]);
        }
        Ok(out.freeze())
    }

    fn prefetch(&self, ranges: &[Range<u64>]) -> Result<()> {
        for range in ranges {
            check_range(self, range)?;
        }
        let wanted: BTreeSet<u64> = ranges.iter().flat_map(|range| self.blocks(range)).collect();
        let mut missing = Vec::new();
        for block in wanted {
            if self.cached(block).map_err(|e| remote(&self.uri, e))?.is_none() {
                missing.push(block);
            }
        }
        self.fetch(&missing).map_err(|e| remote(&self.uri, e))?;
        Ok(())
    }
}

/// Writes `path` whole or not at all: a temporary file beside it, renamed over it.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::result::Result<(), StoreError> {
    let temporary =
        path.with_extension(format!("partial-{}-{:?}", std::process::id(), std::thread::current().id()));
    let io = |source| StoreError::Cache { path: path.to_path_buf(), source };
    std::fs::write(&temporary, bytes).map_err(io)?;
    std::fs::rename(&temporary, path).map_err(io)
}
