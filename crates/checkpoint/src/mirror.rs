//! A local directory copied into the store and back: how a bundle exported on a laptop reaches
//! a cluster's workers (`podctl launch` puts it under `<checkpoint root>/bundles/<bundle id>/`).
//!
//! The directory's marker file (`manifest.json` for a bundle) goes up last, so a copy whose
//! marker is in the store is complete; a download writes into a staging directory and renames
//! it into place, so a reader never sees half a copy. Both are bounded ([`MAX_FILES`],
//! [`MAX_BYTES`]) and refuse any key that would leave the target directory.

use crate::error::{CheckpointError, Result};
use crate::layout::is_safe_segment;
use crate::store::Storage;
use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

/// Most files a copied directory may hold.
pub const MAX_FILES: usize = 10_000;
/// Most bytes a copied directory may hold (bundles are programs, not weights).
pub const MAX_BYTES: u64 = 8 << 30;

/// What was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Files copied (0 when the copy was already there).
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
}

fn prefix_key(storage: &Storage, prefix: &str) -> Result<Key> {
    let mut key = storage.root().clone();
    for part in prefix.split('/').filter(|p| !p.is_empty()) {
        if !is_safe_segment(part) {
            return Err(CheckpointError::invalid(
                format!("directory prefix '{prefix}'"),
                "use letters, digits, '-', '_' and '.' between slashes, no '..'",
            ));
        }
        key = key.join(part);
    }
    Ok(key)
}

/// The files under `dir`, as paths relative to it, sorted.
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |path: &Path, e: std::io::Error| {
        CheckpointError::invalid(format!("directory {}", path.display()), e.to_string())
    };
    let mut files = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let here = dir.join(&relative);
        for entry in std::fs::read_dir(&here).map_err(|e| io(&here, e))? {
            let entry = entry.map_err(|e| io(&here, e))?;
            let kind = entry.file_type().map_err(|e| io(&entry.path(), e))?;
            let path = relative.join(entry.file_name());
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() {
                files.push(path);
            }
            if files.len() > MAX_FILES {
                return Err(CheckpointError::invalid(
                    format!("directory {}", dir.display()),
                    format!("more than {MAX_FILES} files"),
                ));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Copies the files under `dir` to `prefix` (relative to the storage root), `marker` last.
/// Nothing is copied when `prefix/marker` is already there: callers name copies by content.
pub async fn upload_dir(storage: &Storage, prefix: &str, dir: &Path, marker: &str) -> Result<Copied> {
    let base = prefix_key(storage, prefix)?;
    let marker_key = base.clone().join(marker);
    match storage.object_store().head(&marker_key).await {
        Ok(_) => return Ok(Copied { files: 0, bytes: 0 }),
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(CheckpointError::store("head", &marker_key, e)),
    }
    let mut files = walk(dir)?;
    let Some(at) = files.iter().position(|f| f.as_os_str() == marker) else {
        return Err(CheckpointError::invalid(
            format!("directory {}", dir.display()),
            format!("it has no {marker}"),
        ));
    };
    let last = files.remove(at);
    files.push(last);
    let mut copied = Copied { files: 0, bytes: 0 };
    for relative in files {
        let path = dir.join(&relative);
        let bytes = tokio::fs::read(&path)
            .await
            .map_err(|e| CheckpointError::invalid(format!("file {}", path.display()), e.to_string()))?;
        copied.bytes += bytes.len() as u64;
        if copied.bytes > MAX_BYTES {
            return Err(CheckpointError::invalid(
                format!("directory {}", dir.display()),
                format!("more than {MAX_BYTES} bytes"),
            ));
        }
        let key = relative.iter().fold(base.clone(), |key, part| key.join(part.to_string_lossy().as_ref()));
        storage.put(&key, PutPayload::from(bytes)).await?;
        copied.files += 1;
    }
    Ok(copied)
}

/// Copies what is under `prefix` into `dir` (which must not exist yet; its parent is created),
/// through a staging directory beside it. Refuses a copy without `marker` (an upload that
/// did not finish).
pub async fn download_dir(storage: &Storage, prefix: &str, dir: &Path, marker: &str) -> Result<Copied> {
    let base = prefix_key(storage, prefix)?;
    let objects: Vec<_> = storage
        .object_store()
        .list(Some(&base))
        .try_collect()
        .await
        .map_err(|e| CheckpointError::store("list", &base, e))?;
    let invalid = |reason: String| CheckpointError::invalid(format!("copy at {base}"), reason);
    if objects.len() > MAX_FILES {
        return Err(invalid(format!("more than {MAX_FILES} files")));
    }
    let total: u64 = objects.iter().map(|o| o.size).sum();
    if total > MAX_BYTES {
        return Err(invalid(format!("{total} bytes, more than {MAX_BYTES}")));
    }
    let mut relatives = Vec::with_capacity(objects.len());
    for object in &objects {
        let parts: Vec<String> = object
            .location
            .prefix_match(&base)
            .ok_or_else(|| invalid(format!("listing returned {} outside it", object.location)))?
            .map(|p| p.as_ref().to_string())
            .collect();
        if parts.is_empty() || !parts.iter().all(|p| is_safe_segment(p)) {
            return Err(invalid(format!("refusing key {}", object.location)));
        }
        relatives.push(parts.iter().collect::<PathBuf>());
    }
    if !relatives.iter().any(|r| r.as_os_str() == marker) {
        return Err(CheckpointError::NotFound {
            what: format!("{base}/{marker}"),
            hint: "the upload did not finish; launch the job again to upload it".into(),
        });
    }

    let parent = dir.parent().unwrap_or(Path::new("."));
    let io = |path: &Path, e: std::io::Error| {
        CheckpointError::invalid(format!("directory {}", path.display()), e.to_string())
    };
    tokio::fs::create_dir_all(parent).await.map_err(|e| io(parent, e))?;
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let staging = parent.join(format!(".{name}.{}", std::process::id()));
    let _ = tokio::fs::remove_dir_all(&staging).await;
    let mut copied = Copied { files: 0, bytes: 0 };
    let written = async {
        for (object, relative) in objects.iter().zip(&relatives) {
            let path = staging.join(relative);
            if let Some(parent) = path.parent() {
                tokio::fs::create_dir_all(parent).await.map_err(|e| io(parent, e))?;
            }
            let mut file = tokio::fs::File::create(&path).await.map_err(|e| io(&path, e))?;
            let mut stream = storage
                .object_store()
                .get(&object.location)
                .await
                .map_err(|e| CheckpointError::store("get", &object.location, e))?
                .into_stream();
            let mut bytes = 0u64;
            while let Some(chunk) =
                stream.try_next().await.map_err(|e| CheckpointError::store("get", &object.location, e))?
            {
                bytes += chunk.len() as u64;
                if bytes > object.size {
                    return Err(CheckpointError::SizeMismatch {
                        key: object.location.to_string(),
                        reason: format!("more than the {} bytes listed", object.size),
                    });
                }
                file.write_all(&chunk).await.map_err(|e| io(&path, e))?;
            }
            if bytes != object.size {
                return Err(CheckpointError::SizeMismatch {
                    key: object.location.to_string(),
                    reason: format!("{bytes} bytes read, {} listed", object.size),
                });
            }
            file.flush().await.map_err(|e| io(&path, e))?;
            copied.files += 1;
            copied.bytes += bytes;
        }
        tokio::fs::rename(&staging, dir).await.map_err(|e| io(dir, e))
    };
    if let Err(e) = written.await {
        let _ = tokio::fs::remove_dir_all(&staging).await;
        return Err(e);
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreOptions;

    #[tokio::test]
    async fn a_directory_goes_up_and_comes_back_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("bundle");
        std::fs::create_dir_all(source.join("programs")).unwrap();
        std::fs::write(source.join("manifest.json"), b"{}").unwrap();
        std::fs::write(source.join("programs/train.mlir"), vec![7u8; 100_000]).unwrap();
        let storage =
            Storage::open(tmp.path().join("store").to_str().unwrap(), &StoreOptions::default()).unwrap();

        let up = upload_dir(&storage, "bundles/abc", &source, "manifest.json").await.unwrap();
        assert_eq!(up, Copied { files: 2, bytes: 100_002 });
        // Named by content: a second upload copies nothing.
        let again = upload_dir(&storage, "bundles/abc", &source, "manifest.json").await.unwrap();
        assert_eq!(again.files, 0);

        let target = tmp.path().join("cache/abc");
        let down = download_dir(&storage, "bundles/abc", &target, "manifest.json").await.unwrap();
        assert_eq!(down, Copied { files: 2, bytes: 100_002 });
        assert_eq!(std::fs::read(target.join("programs/train.mlir")).unwrap(), vec![7u8; 100_000]);
        // No staging directory is left beside it.
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("cache")).unwrap().collect();
        assert_eq!(left.len(), 1);

        let e = download_dir(&storage, "bundles/nothing", &tmp.path().join("x"), "manifest.json")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("the upload did not finish"), "{e}");
        let e =
            upload_dir(&storage, "bundles/../up", &source, "manifest.json").await.unwrap_err().to_string();
        assert!(e.contains("no '..'"), "{e}");
    }
}
