//! Compiled programs kept on disk, so that a worker process started again (a replacement after
//! a preemption, a restart from a checkpoint) loads its programs instead of compiling them.
//!
//! An entry is keyed by everything the compiled code depends on: the plugin (its path, size,
//! modification time and API version), the platform, the program's bytes, the compile options,
//! the device ids and `XLA_FLAGS`. Its file is `PODX`, the SHA-256 of the payload, then the payload that
//! the plugin serialized; the hash is checked before the plugin sees the bytes, so a truncated
//! or damaged file is recompiled, never loaded. Files are written under a temporary name and
//! renamed, so concurrent workers never read a half-written entry. Nothing is evicted: the
//! directory holds one file per (program, plugin, mesh) ever compiled.

use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"PODX";
/// The environment variable XLA's plugins read compiler flags from.
const XLA_FLAGS: &str = "XLA_FLAGS";
/// Entries larger than this are neither written nor read.
const MAX_ENTRY_BYTES: u64 = 4 << 30;

/// A directory of compiled programs.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
}

/// What a cached program depends on.
pub struct CacheKey<'a> {
    /// The plugin that compiles and loads it.
    pub plugin: &'a pjrt::Plugin,
    /// The platform the client reported.
    pub platform: &'a str,
    /// The program (StableHLO bytes).
    pub program: &'a [u8],
    /// The encoded compile options.
    pub options: &'a [u8],
    /// The device ids it is compiled for, in order.
    pub devices: &'a [i64],
}

impl CacheKey<'_> {
    fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"podctl compiled program v1\0");
        h.update(self.plugin.path().as_os_str().as_encoded_bytes());
        h.update(b"\0");
        if let Ok(meta) = std::fs::metadata(self.plugin.path()) {
            h.update(meta.len().to_le_bytes());
            let modified = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
            h.update(modified.map_or(0, |d| d.as_nanos()).to_le_bytes());
        }
        let (major, minor) = self.plugin.api_version();
        h.update(major.to_le_bytes());
        h.update(minor.to_le_bytes());
        for part in [self.platform.as_bytes(), self.program, self.options] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        for id in self.devices {
            h.update(id.to_le_bytes());
        }
        // The plugin reads compiler flags from the environment too.
        let flags = std::env::var_os(XLA_FLAGS).unwrap_or_default();
        h.update((flags.len() as u64).to_le_bytes());
        h.update(flags.as_encoded_bytes());
        hex::encode(h.finalize())
    }
}

impl CompileCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> CompileCache {
        CompileCache { dir: dir.into() }
    }

    /// Where the cache lives.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `key`'s program is kept: the key is hashed once, for the lookup and the store.
    pub fn entry(&self, key: &CacheKey<'_>) -> Entry {
        Entry { path: self.dir.join(format!("{}.pjrt", key.digest())) }
    }
}

/// One compiled program's file in the cache.
pub struct Entry {
    path: PathBuf,
}

impl Entry {
    /// The serialized program stored here, if there is an intact one.
    pub fn get(&self) -> Option<Vec<u8>> {
        let path = &self.path;
        let size = std::fs::metadata(path).ok()?.len();
        if size > MAX_ENTRY_BYTES {
            return None;
        }
        let bytes = std::fs::read(path).ok()?;
        let payload = bytes.get(36..)?;
        if &bytes[..4] != MAGIC || bytes[4..36] != Sha256::digest(payload)[..] {
            tracing::warn!(path = %path.display(), "a damaged compiled program in the cache; compiling again");
            return None;
        }
        Some(payload.to_vec())
    }

    /// Stores a serialized program here; a failure only costs a compile next time.
    pub fn put(&self, payload: &[u8]) {
        if payload.len() as u64 > MAX_ENTRY_BYTES {
            return;
        }
        let path = &self.path;
        let dir = path.parent().unwrap_or(Path::new("."));
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            let mut file = tempfile::NamedTempFile::new_in(dir)?;
            file.write_all(MAGIC)?;
            file.write_all(&Sha256::digest(payload))?;
            file.write_all(payload)?;
            file.as_file().sync_all()?;
            file.persist(path).map_err(|e| e.error)?;
            Ok(())
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), "could not keep a compiled program: {e}");
        }
    }
}
