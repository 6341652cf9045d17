//! Where a job's data files are read on this host: plain paths and `file://` from the local disk,
//! `s3://` and `gs://` through [`data_store::StoreFiles`] (ranged reads of only the blocks this
//! host's rows need, kept in a local cache that a restarted worker reads instead of the bucket),
//! with the same credentials, timeouts and retries as checkpoints (the `AWS_*` variables, Google's
//! default credentials). What each remote file gave is logged as it grows, so a job's logs show
//! every host reading its own share.
//!
//! The cache directory is `PODCTL_DATA_CACHE`, else `data/` in podctl's cache (`PODCTL_CACHE`,
//! `$XDG_CACHE_HOME/podctl`, `~/.cache/podctl`); `PODCTL_DATA_BLOCK_BYTES` sets the unit of a
//! ranged read (1 MiB).

use crate::error::WorkerError;
use data::DataFiles;
use data_store::{FileReads, StoreFiles};
use job::JobSpec;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A job's data files on this host. See the module docs.
pub struct JobFiles {
    /// Remote files, when the job names any.
    store: Option<StoreFiles>,
    /// What was last logged of each remote file.
    logged: Mutex<BTreeMap<String, FileReads>>,
}

impl std::fmt::Debug for JobFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobFiles").field("store", &self.store).finish()
    }
}

impl JobFiles {
    /// The files of `job`'s data section (and of its Python reward modules). Remote reads wait
    /// on `runtime`, the process's, from the trainer's thread (the data crate reads
    /// synchronously).
    pub fn for_job(job: &JobSpec, runtime: &tokio::runtime::Handle) -> Result<Arc<Self>, WorkerError> {
        let mut uris = job.data.uris();
        if let Some(grpo) = &job.grpo {
            uris.extend(grpo.rewards.iter().filter_map(|f| f.python_function()).map(|(module, _)| module));
        }
        let store = if uris.iter().all(|uri| data::files::is_local(uri)) {
            None
        } else {
            let mut files =
                StoreFiles::new(checkpoint::StoreOptions::default(), runtime.clone(), cache_dir()?);
            if let Some(bytes) = std::env::var("PODCTL_DATA_BLOCK_BYTES").ok().and_then(|b| b.parse().ok()) {
                files = files.with_block_bytes(bytes);
            }
            Some(files)
        };
        Ok(Arc::new(Self { store, logged: Mutex::new(BTreeMap::new()) }))
    }

    /// The files, as the data crate reads them.
    pub fn files(&self) -> &dyn DataFiles {
        match &self.store {
            Some(store) => store,
            None => &data::LocalFiles,
        }
    }

    /// A local file with the bytes of `uri` (a remote one is read whole into the cache).
    pub fn local_copy(&self, uri: &str) -> Result<PathBuf, WorkerError> {
        if data::files::is_local(uri) {
            return Ok(data::files::local_path(uri).to_path_buf());
        }
        let file = data::files::open_required(self.files(), uri, "a reward module")?;
        let bytes = file.read(0..file.len())?;
        // Named by its bytes: workers sharing the cache never overwrite a module another imports.
        let dir = cache_dir()?.join("modules").join(format!("{:016x}", fnv(&bytes)));
        let name = uri.rsplit('/').next().unwrap_or("module.py");
        let target = dir.join(name);
        std::fs::create_dir_all(&dir)
            .map_err(|source| WorkerError::Io { what: "writing a reward module", source })?;
        std::fs::write(&target, &bytes)
            .map_err(|source| WorkerError::Io { what: "writing a reward module", source })?;
        Ok(target)
    }

    /// Logs what each remote file gave since the last call: bytes from the bucket (and in how
    /// many ranged reads), bytes from the local cache, of the file's size.
    pub fn log_reads(&self) {
        let Some(store) = &self.store else { return };
        let Ok(mut logged) = self.logged.lock() else { return };
        for (uri, reads) in store.reads() {
            if logged.get(&uri) == Some(&reads) {
                continue;
            }
            tracing::info!(
                "data {uri}: {} of its {} bytes read from the bucket in {} ranged reads, {} bytes from the local \
                 cache ({} of {})",
                reads.fetched,
                reads.size,
                reads.requests,
                reads.cached,
                bytes(reads.fetched + reads.cached),
                bytes(reads.size)
            );
            logged.insert(uri, reads);
        }
    }
}

/// Where remote data files are cached. See the module docs.
fn cache_dir() -> Result<PathBuf, WorkerError> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("PODCTL_DATA_CACHE")
        .or_else(|| var("PODCTL_CACHE").map(|dir| dir.join("data")))
        .or_else(|| var("XDG_CACHE_HOME").map(|dir| dir.join("podctl/data")))
        .or_else(|| var("HOME").map(|dir| dir.join(".cache/podctl/data")))
        .ok_or_else(|| {
            WorkerError::incompatible(
                crate::error::Part::Job,
                "the job reads data from a bucket but this host has no cache directory: set PODCTL_DATA_CACHE",
            )
        })
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3))
}

/// `12.3 KiB`, `4.0 MiB`.
fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}
