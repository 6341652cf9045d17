//! Compiled memory statistics on disk, one JSON file per compile, named by the hash of what
//! determines the result: the program's bytes, the partition count, the topology and the
//! compiler (plugin) identity. A second plan of the same job reads them back in milliseconds.

use super::CompileOutcome;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// What a cache file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheEntry {
    /// The compile's result.
    pub outcome: CompileOutcome,
    /// Seconds the compile took, for the report of what the cache saved.
    pub compile_seconds: f64,
    /// The program name, for people reading the cache.
    pub program: String,
}

/// The key of one compile: hex SHA-256 over its inputs, each length-prefixed.
pub fn cache_key(program: &[u8], partitions: u32, topology: &str, compiler: &str) -> String {
    let mut hash = Sha256::new();
    for part in [program, &partitions.to_le_bytes(), topology.as_bytes(), compiler.as_bytes()] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hex::encode(hash.finalize())
}

/// A directory of cache entries.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// A cache in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// The entry for `key`; an unreadable or corrupt file counts as absent (it is rewritten).
    pub fn get(&self, key: &str) -> Option<CacheEntry> {
        let text = std::fs::read(self.path(key)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Stores `entry` under `key`, atomically: a reader sees the old file or the new one.
    pub fn put(&self, key: &str, entry: &CacheEntry) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec_pretty(entry).expect("cache entries serialize"))?;
        std::fs::rename(&tmp, self.path(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Inputs, ProgramStats};
    use planner::Platform;

    #[test]
    fn entries_round_trip_and_keys_separate_their_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path().join("compiles"));
        let key = cache_key(b"module", 8, "v6e:2x4", "libtpu");
        assert_ne!(key, cache_key(b"module8", 0, "v6e:2x4", "libtpu"));
        assert_ne!(key, cache_key(b"module", 8, "v6e:2x4", "libtpu2"));
        assert!(cache.get(&key).is_none());
        let entry = CacheEntry {
            outcome: CompileOutcome::Compiled(ProgramStats {
                argument: 1,
                output: 2,
                alias: 1,
                temp: 7,
                generated_code: 3,
                reported_peak: 5,
            }),
            compile_seconds: 1.5,
            program: "grad_step".into(),
        };
        cache.put(&key, &entry).unwrap();
        assert_eq!(cache.get(&key), Some(entry.clone()));
        if let CompileOutcome::Compiled(stats) = entry.outcome {
            // XLA:CPU's own peak is its arguments: the fields' sum is the allocation there.
            assert_eq!(stats.peak(Platform::Cpu, &Inputs::default()), 1 + 2 - 1 + 7 + 3);
            assert_eq!(stats.peak(Platform::Tpu, &Inputs::default()), 5);
            // libtpu's peak counts inputs in host memory, which take no HBM.
            assert_eq!(stats.peak(Platform::Tpu, &Inputs { device: 1, host: 2 }), 3);
            let silent = ProgramStats { reported_peak: 0, ..stats };
            assert_eq!(silent.peak(Platform::Tpu, &Inputs::default()), silent.sum());
        }
        std::fs::write(cache.dir().join(format!("{key}.json")), b"{not json").unwrap();
        assert!(cache.get(&key).is_none());
    }
}
