//! Where a data file's bytes come from. The sources of this crate read through [`DataFile`]
//! and find files through [`DataFiles`], so the same code reads a local file (memory-mapped,
//! [`LocalFiles`]) or an object in a bucket (the worker's `data_store`: ranged reads into a
//! local cache). This crate itself only ever opens local files.
//!
//! A read asks for exactly the bytes it needs: a Parquet source reads a file's footer and then
//! only the row groups that hold the rows asked for, a token file only the windows asked for,
//! so a host reads its share of the data and not the rest. [`DataFile::prefetch`] lets a caller
//! that knows what is coming (the rows of a run's remaining steps) ask for it all at once.

use crate::mapped::map_readonly;
use crate::{DataError, Result};
use bytes::Bytes;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The bytes of one data file, wherever it lives. Implementations are read-only views of an
/// immutable file: the same range always gives the same bytes.
pub trait DataFile: Send + Sync + std::fmt::Debug {
    /// The path or URI, for messages.
    fn name(&self) -> &str;

    /// Size in bytes.
    fn len(&self) -> u64;

    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Exactly the bytes of `range` (within `0..len`).
    fn read(&self, range: Range<u64>) -> Result<Bytes>;

    /// Reads `ranges` ahead of their use, all at once (the default does nothing: local files
    /// need no warning).
    fn prefetch(&self, _ranges: &[Range<u64>]) -> Result<()> {
        Ok(())
    }
}

/// How the paths and URIs of a job's `data:` section become files.
pub trait DataFiles: Send + Sync {
    /// The file at `uri`, or `None` when there is none.
    fn open(&self, uri: &str) -> Result<Option<Arc<dyn DataFile>>>;

    /// Whether `uri` names a directory (a local directory, or a prefix ending in `/`, or a
    /// prefix with objects under it).
    fn is_dir(&self, uri: &str) -> Result<bool>;

    /// The files directly in directory `uri` whose names end in `suffix`, sorted by name, as URIs
    /// `open` takes.
    fn list(&self, uri: &str, suffix: &str) -> Result<Vec<String>>;
}

/// The file at `uri`; a missing file is an error that names it and what it was for.
pub fn open_required(files: &dyn DataFiles, uri: &str, what: &str) -> Result<Arc<dyn DataFile>> {
    files.open(uri)?.ok_or_else(|| DataError::Io {
        path: PathBuf::from(uri),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, format!("no such file ({what})")),
    })
}

/// Whether `uri` is read by this crate directly: a plain path or `file://`.
pub fn is_local(uri: &str) -> bool {
    !uri.contains("://") || uri.starts_with("file://")
}

/// The local path of a plain path or `file://` URI.
pub fn local_path(uri: &str) -> &Path {
    Path::new(uri.strip_prefix("file://").unwrap_or(uri))
}

/// Local files (plain paths and `file://`), memory-mapped; any other URI is refused with the
/// fix (a worker reads `s3://` and `gs://` through the object store).
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalFiles;

impl DataFiles for LocalFiles {
    fn open(&self, uri: &str) -> Result<Option<Arc<dyn DataFile>>> {
        let path = local_only(uri)?;
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => Ok(Some(Arc::new(LocalFile::open(path)?))),
            Ok(_) => Err(DataError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other("is a directory, not a file"),
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(DataError::Io { path: path.to_path_buf(), source }),
        }
    }

    fn is_dir(&self, uri: &str) -> Result<bool> {
        Ok(local_only(uri)?.is_dir())
    }

    fn list(&self, uri: &str, suffix: &str) -> Result<Vec<String>> {
        let dir = local_only(uri)?;
        let io = |source| DataError::Io { path: dir.to_path_buf(), source };
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(suffix) && entry.file_type().map_err(io)?.is_file() {
                names.push(name);
            }
        }
        names.sort();
        let base = uri.trim_end_matches('/');
        Ok(names.into_iter().map(|name| format!("{base}/{name}")).collect())
    }
}

fn local_only(uri: &str) -> Result<&Path> {
    if !is_local(uri) {
        return Err(DataError::InvalidConfig {
            field: "data.path",
            message: format!(
                "{uri} is not a local file; s3:// and gs:// data is read by the worker through the object \
                 store (this reader takes plain paths and file:// only)"
            ),
        });
    }
    Ok(local_path(uri))
}

/// A local file, memory-mapped: reads are slices of the map, no copy.
#[derive(Debug)]
pub struct LocalFile {
    name: String,
    bytes: Bytes,
}

impl LocalFile {
    /// Maps `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = map_readonly(path)?.map_or_else(Bytes::new, Bytes::from_owner);
        Ok(Self { name: path.display().to_string(), bytes })
    }

    /// A file of `bytes` named `name` (tests, fuzzing, and bytes already in memory).
    pub fn from_bytes(name: impl Into<String>, bytes: impl Into<Bytes>) -> Self {
        Self { name: name.into(), bytes: bytes.into() }
    }
}

impl DataFile for LocalFile {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read(&self, range: Range<u64>) -> Result<Bytes> {
        check_range(self, &range)?;
        Ok(self.bytes.slice(range.start as usize..range.end as usize))
    }
}

/// An error unless `range` lies within `file`.
pub fn check_range(file: &dyn DataFile, range: &Range<u64>) -> Result<()> {
    if range.start > range.end || range.end > file.len() {
        return Err(DataError::Io {
            path: PathBuf::from(file.name()),
            source: std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "bytes {}..{} are past the end of the file ({} bytes)",
                    range.start,
                    range.end,
                    file.len()
                ),
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_files_read_ranges_list_and_refuse_buckets() {
        let dir = tempfile::tempdir().expect("dir");
        for name in ["b.parquet", "a.parquet", "c.jsonl"] {
            std::fs::write(dir.path().join(name), name).expect("write");
        }
        std::fs::create_dir(dir.path().join("d.parquet")).expect("a directory named like a shard");
        let uri = dir.path().display().to_string();
        let listed = LocalFiles.list(&uri, ".parquet").expect("list");
        assert_eq!(listed, [format!("{uri}/a.parquet"), format!("{uri}/b.parquet")]);
        assert!(LocalFiles.is_dir(&format!("file://{uri}/")).expect("dir"));
        let file = LocalFiles.open(&listed[1]).expect("open").expect("exists");
        assert_eq!((file.len(), &file.read(2..5).expect("read")[..]), (9, &b"par"[..]));
        let error = file.read(5..10).expect_err("past the end").to_string();
        assert!(error.contains("past the end") && error.contains("b.parquet"), "{error}");
        assert!(LocalFiles.open(&format!("{uri}/missing.parquet")).expect("no error").is_none());
        let error = open_required(&LocalFiles, &format!("{uri}/missing.parquet"), "data.test")
            .expect_err("missing")
            .to_string();
        assert!(error.contains("missing.parquet") && error.contains("data.test"), "{error}");
        let error = LocalFiles.open("s3://bucket/train.parquet").expect_err("remote").to_string();
        assert!(error.contains("object store"), "{error}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").expect("write");
        assert!(LocalFile::open(&empty).expect("an empty file opens").is_empty());
    }
}
