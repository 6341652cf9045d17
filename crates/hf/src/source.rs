//! Where a model directory is, and reading its files: whole (small files, bounded) or by byte
//! range (tensor data).
//!
//! A local directory (a plain path or `file://`) is read with the file system (tensor data
//! through a memory map, see `model.rs`); `s3://` and `gs://` through the checkpoint crate's
//! [`Storage`], the same object-store clients, timeouts and retries as checkpoints.

use crate::{HfError, Result};
use bytes::Bytes;
use checkpoint::{Storage, StoreOptions};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A model directory.
#[derive(Debug, Clone)]
pub struct Location {
    uri: String,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Local(PathBuf),
    Store(Storage),
}

impl Location {
    /// A local path, `file:///abs/dir`, `s3://bucket/prefix` or `gs://bucket/prefix`. A local
    /// directory must exist.
    pub fn parse(uri: &str, options: &StoreOptions) -> Result<Self> {
        let local = match uri.strip_prefix("file://") {
            Some(path) => Some(PathBuf::from(path)),
            None => (!uri.contains("://")).then(|| PathBuf::from(uri)),
        };
        let kind = match local {
            Some(dir) => {
                if !dir.is_dir() {
                    return Err(HfError::Missing {
                        file: dir.display().to_string(),
                        hint: "a model directory (config.json and safetensors weights) is expected there"
                            .into(),
                    });
                }
                Kind::Local(dir)
            }
            None if uri.starts_with("s3://") || uri.starts_with("gs://") => {
                Kind::Store(Storage::open(uri, options)?)
            }
            None => {
                return Err(HfError::invalid(
                    uri,
                    "is not a model directory; use a local path, file:///dir, s3://bucket/prefix or gs://bucket/prefix",
                ));
            }
        };
        Ok(Self { uri: uri.trim_end_matches('/').to_string(), kind })
    }

    /// The URI as given (without a trailing `/`).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The directory's last path segment (`Qwen3-1.7B`), which names the model.
    pub fn name(&self) -> &str {
        self.uri.rsplit('/').find(|s| !s.is_empty() && !s.ends_with(':')).unwrap_or("model")
    }

    /// The path of `file` in a local directory.
    pub fn local_path(&self, file: &str) -> Option<PathBuf> {
        match &self.kind {
            Kind::Local(dir) => Some(dir.join(file)),
            Kind::Store(_) => None,
        }
    }

    /// `file`'s full URI, for messages.
    pub fn describe(&self, file: &str) -> String {
        format!("{}/{file}", self.uri)
    }

    /// `file`'s size, or `None` when it does not exist.
    pub async fn size(&self, file: &str) -> Result<Option<u64>> {
        match &self.kind {
            Kind::Local(dir) => match std::fs::metadata(dir.join(file)) {
                Ok(meta) if meta.is_file() => Ok(Some(meta.len())),
                Ok(_) => Err(HfError::invalid(self.describe(file), "is not a regular file")),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(HfError::io(self.describe(file), e)),
            },
            Kind::Store(storage) => Ok(storage.object_size(file).await?),
        }
    }

    /// `file` whole, or `None` when it does not exist; a file over `limit` bytes is refused
    /// before it is read.
    pub async fn read_small(&self, file: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        let Some(size) = self.size(file).await? else { return Ok(None) };
        if size > limit {
            return Err(HfError::invalid(
                self.describe(file),
                format!("{size} bytes is more than such a file holds (the limit is {limit})"),
            ));
        }
        Ok(Some(self.read_range(file, 0..size).await?.to_vec()))
    }

    /// Bytes `range` of `file`, exactly that many.
    pub async fn read_range(&self, file: &str, range: Range<u64>) -> Result<Bytes> {
        match &self.kind {
            Kind::Local(dir) => read_local(&dir.join(file), range).map(Bytes::from),
            Kind::Store(storage) => Ok(storage.read_object_range(file, range).await?),
        }
    }

    /// Whether files are local (read through memory maps).
    pub fn is_local(&self) -> bool {
        matches!(self.kind, Kind::Local(_))
    }
}

fn read_local(path: &Path, range: Range<u64>) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| HfError::io(path.display(), e))?;
    let mut buffer = vec![0u8; (range.end - range.start) as usize];
    file.read_exact_at(&mut buffer, range.start).map_err(|e| HfError::io(path.display(), e))?;
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_name_their_model_and_refuse_what_they_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("Qwen3-1.7B");
        std::fs::create_dir(&model).unwrap();
        let uri = format!("file://{}/", model.display());
        let location = Location::parse(&uri, &StoreOptions::default()).unwrap();
        assert_eq!(location.name(), "Qwen3-1.7B");
        assert!(location.is_local());
        let e = Location::parse("ftp://host/x", &StoreOptions::default()).unwrap_err().to_string();
        assert!(e.contains("use a local path, file:///dir, s3://bucket/prefix or gs://bucket/prefix"), "{e}");
        let e = Location::parse("/no/such/dir", &StoreOptions::default()).unwrap_err().to_string();
        assert!(e.starts_with("/no/such/dir: missing; a model directory"), "{e}");
    }

    #[tokio::test]
    async fn small_files_are_bounded_and_ranges_exact() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.json"), b"0123456789").unwrap();
        let location = Location::parse(dir.path().to_str().unwrap(), &StoreOptions::default()).unwrap();
        assert_eq!(location.read_small("a.json", 10).await.unwrap().unwrap(), b"0123456789");
        assert_eq!(location.read_small("b.json", 10).await.unwrap(), None);
        let e = location.read_small("a.json", 9).await.unwrap_err().to_string();
        assert!(e.contains("10 bytes is more than such a file holds (the limit is 9)"), "{e}");
        assert_eq!(&location.read_range("a.json", 3..6).await.unwrap()[..], b"345");
        assert!(location.read_range("a.json", 8..12).await.is_err());
    }
}
