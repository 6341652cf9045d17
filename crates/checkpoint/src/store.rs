//! From a URL (`file://`, `s3://`, `gs://`) to an object store and a root prefix inside it.
//!
//! `file://` (or a plain path) is the default and fsyncs every object before a write returns, so
//! a checkpoint that counts as saved is on disk. `s3://` takes its endpoint and credentials from
//! [`StoreOptions`] or the usual `AWS_*` variables (`AWS_ENDPOINT`, `AWS_ALLOW_HTTP` for an
//! emulator). `gs://` uses Google's default credentials
//! (Workload Identity on GKE) unless [`StoreOptions::gcs_disable_oauth`] is set together with a
//! base URL, which is how tests reach an emulator without any client ever asking a metadata
//! server for a token.

use crate::error::{CheckpointError, Result};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How to reach a store; everything not set falls back to the backend's environment variables.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// S3 endpoint, e.g. `http://127.0.0.1:9000`; unset means AWS (or `AWS_ENDPOINT`).
    pub s3_endpoint: Option<String>,
    /// S3 region; unset means `AWS_REGION` or `us-east-1`.
    pub s3_region: Option<String>,
    /// S3 access key id; unset means `AWS_ACCESS_KEY_ID` or the instance's role.
    pub s3_access_key_id: Option<String>,
    /// S3 secret key; unset means `AWS_SECRET_ACCESS_KEY`.
    pub s3_secret_access_key: Option<String>,
    /// Allow plain `http://` endpoints (emulators in tests); never needed in production.
    pub allow_http: bool,
    /// GCS JSON/XML API base URL, e.g. `http://127.0.0.1:4443`; unset means Google's.
    pub gcs_base_url: Option<String>,
    /// Send no OAuth token to GCS (emulators only); requires `gcs_base_url`.
    pub gcs_disable_oauth: bool,
    /// Upper bound on one request, including the body.
    pub request_timeout: Duration,
    /// Upper bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Retries of a failed request (with exponential backoff) before the error surfaces.
    pub max_retries: usize,
    /// Fsync `file://` objects and their directories before a write returns.
    pub file_fsync: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            s3_endpoint: None,
            s3_region: None,
            s3_access_key_id: None,
            s3_secret_access_key: None,
            allow_http: false,
            gcs_base_url: None,
            gcs_disable_oauth: false,
            request_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_retries: 5,
            file_fsync: true,
        }
    }
}

impl StoreOptions {
    fn client_options(&self) -> ClientOptions {
        ClientOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.connect_timeout)
            .with_allow_http(self.allow_http)
    }

    fn retry(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: self.request_timeout.saturating_mul(2),
        }
    }
}

/// An object store and the root prefix checkpoints live under.
#[derive(Debug, Clone)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    root: Path,
    url: String,
    /// The root directory on disk for `file://`: multipart staging files of a killed writer are
    /// invisible to listings, so garbage collection sweeps them from here.
    local_dir: Option<PathBuf>,
}

impl Storage {
    /// Opens the store a URL names: `file:///abs/dir` or a plain path, `s3://bucket/prefix`,
    /// `gs://bucket/prefix`.
    pub fn open(url: &str, options: &StoreOptions) -> Result<Self> {
        let invalid = |reason: String| CheckpointError::InvalidStore { url: url.to_string(), reason };
        if !url.contains("://") {
            return Self::open_local(url, std::path::Path::new(url), options);
        }
        let parsed = url::Url::parse(url)
            .map_err(|e| invalid(format!("not a URL ({e}); write e.g. s3://bucket/prefix")))?;
        match parsed.scheme() {
            "file" => {
                if parsed.host_str().is_some_and(|h| !h.is_empty() && h != "localhost") {
                    return Err(invalid("file URLs name no host; write file:///absolute/path".into()));
                }
                let path = parsed
                    .to_file_path()
                    .map_err(|()| invalid("not an absolute file path; write file:///absolute/path".into()))?;
                Self::open_local(url, &path, options)
            }
            "s3" => {
                let (bucket, root) = bucket_and_root(url, &parsed).map_err(invalid)?;
                let mut builder = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_client_options(options.client_options())
                    .with_retry(options.retry());
                if let Some(endpoint) = &options.s3_endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                if let Some(region) = &options.s3_region {
                    builder = builder.with_region(region);
                }
                if let Some(key) = &options.s3_access_key_id {
                    builder = builder.with_access_key_id(key);
                }
                if let Some(secret) = &options.s3_secret_access_key {
                    builder = builder.with_secret_access_key(secret);
                }
                // The client options above replace those `from_env` read, AWS_ALLOW_HTTP included.
                if options.allow_http || std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v == "true") {
                    builder = builder.with_allow_http(true);
                }
                let store =
                    builder.build().map_err(|e| invalid(format!("cannot build the S3 client: {e}")))?;
                Self::from_store(Arc::new(store), &root, url, None)
            }
            "gs" => {
                let (bucket, root) = bucket_and_root(url, &parsed).map_err(invalid)?;
                let mut builder = GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(bucket)
                    .with_client_options(options.client_options())
                    .with_retry(options.retry());
                if let Some(base) = &options.gcs_base_url {
                    builder = builder.with_base_url(base);
                }
                if options.gcs_disable_oauth {
                    let Some(base) = &options.gcs_base_url else {
                        return Err(invalid(
                            "gcs_disable_oauth needs gcs_base_url (an emulator); against Google itself \
                             leave it off and use Workload Identity or GOOGLE_APPLICATION_CREDENTIALS"
                                .into(),
                        ));
                    };
                    // object_store turns OAuth off through a service-account document; it also
                    // carries the base URL so no token or metadata endpoint is ever contacted.
                    let key = serde_json::json!({
                        "private_key": "",
                        "private_key_id": "",
                        "client_email": "",
                        "disable_oauth": true,
                        "gcs_base_url": base,
                    });
                    builder = builder.with_service_account_key(key.to_string());
                }
                let store =
                    builder.build().map_err(|e| invalid(format!("cannot build the GCS client: {e}")))?;
                Self::from_store(Arc::new(store), &root, url, None)
            }
            other => Err(invalid(format!("unknown scheme '{other}'; use file://, s3:// or gs://"))),
        }
    }

    fn open_local(url: &str, path: &std::path::Path, options: &StoreOptions) -> Result<Self> {
        let invalid = |reason: String| CheckpointError::InvalidStore { url: url.to_string(), reason };
        std::fs::create_dir_all(path)
            .map_err(|e| invalid(format!("cannot create directory {}: {e}", path.display())))?;
        let dir =
            path.canonicalize().map_err(|e| invalid(format!("cannot resolve {}: {e}", path.display())))?;
        let store = LocalFileSystem::new_with_prefix(&dir)
            .map_err(|e| invalid(format!("cannot open {}: {e}", dir.display())))?
            .with_fsync(options.file_fsync)
            .with_automatic_cleanup(true);
        Self::from_store(Arc::new(store), "", url, Some(dir))
    }

    /// Wraps an existing store (e.g. one with throttling or extra middleware). `local_dir` is
    /// the directory a `file://` store is rooted at, if any; with it, restore reads go to the
    /// files directly, bypassing `store` (pass `None` to route every read through `store`).
    pub fn from_store(
        store: Arc<dyn ObjectStore>,
        root: &str,
        url: impl Into<String>,
        local_dir: Option<PathBuf>,
    ) -> Result<Self> {
        let url = url.into();
        let root = Path::parse(root.trim_matches('/')).map_err(|e| CheckpointError::InvalidStore {
            url: url.clone(),
            reason: format!("root prefix '{root}' is not a valid object path: {e}"),
        })?;
        Ok(Self { store, root, url, local_dir })
    }

    /// The URL the storage was opened from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The underlying object store.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The size of object `name` directly under the root, or `None` when there is none (a
    /// model directory's files, read by the Hugging Face import).
    pub async fn object_size(&self, name: &str) -> Result<Option<u64>> {
        let key = self.root.clone().join(name);
        match self.store.head(&key).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(CheckpointError::store("head", &key, e)),
        }
    }

    /// Bytes `range` of object `name` directly under the root, exactly that many.
    pub async fn read_object_range(&self, name: &str, range: Range<u64>) -> Result<Bytes> {
        self.get_range(&self.root.clone().join(name), range).await
    }

    /// The root prefix, under which every key of this storage lies.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The key of `name` inside the checkpoint directory `dir`.
    pub(crate) fn key(&self, dir: &str, name: &str) -> Path {
        self.root.clone().join(dir).join(name)
    }

    /// Whether this is a `file://` store.
    pub(crate) fn is_local(&self) -> bool {
        self.local_dir.is_some()
    }

    /// The file behind `key` for `file://`, whose reads skip the object-store layer: `pread`
    /// straight into the caller's buffer instead of a fresh buffer per range and a copy.
    pub(crate) fn local_path(&self, key: &Path) -> Option<PathBuf> {
        let base = self.local_dir.as_ref()?;
        // Checkpoint names need no escaping; anything escaped goes through object_store's mapping.
        if key.parts().any(|part| part.as_ref().contains('%')) {
            return None;
        }
        Some(key.parts().fold(base.clone(), |p, part| p.join(part.as_ref())))
    }

    /// The key relative to the root, as a directory name and a file name, when it is one level
    /// below a directory under the root.
    pub(crate) fn split_key(&self, key: &Path) -> Option<(String, String)> {
        let mut parts = key.prefix_match(&self.root)?;
        let dir = parts.next()?.as_ref().to_string();
        let name = parts.next()?.as_ref().to_string();
        parts.next().is_none().then_some((dir, name))
    }

    pub(crate) async fn put(&self, key: &Path, payload: PutPayload) -> Result<()> {
        self.store.put(key, payload).await.map(drop).map_err(|e| CheckpointError::store("put", key, e))
    }

    pub(crate) async fn get(&self, key: &Path) -> Result<Bytes> {
        let result = self.store.get(key).await.map_err(|e| CheckpointError::store("get", key, e))?;
        result.bytes().await.map_err(|e| CheckpointError::store("get", key, e))
    }

    /// Reads `range` and checks that exactly that many bytes came back.
    pub(crate) async fn get_range(&self, key: &Path, range: Range<u64>) -> Result<Bytes> {
        let want = range.end - range.start;
        let bytes = self
            .store
            .get_range(key, range.clone())
            .await
            .map_err(|e| CheckpointError::store("get", key, e))?;
        if bytes.len() as u64 != want {
            return Err(CheckpointError::SizeMismatch {
                key: key.to_string(),
                reason: format!(
                    "read of bytes {}..{} returned {} bytes",
                    range.start,
                    range.end,
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    pub(crate) async fn head(&self, key: &Path) -> Result<ObjectMeta> {
        self.store.head(key).await.map_err(|e| CheckpointError::store("head", key, e))
    }

    /// Deletes `key`; an object that is already gone is not an error.
    pub(crate) async fn delete(&self, key: &Path) -> Result<()> {
        match self.store.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(CheckpointError::store("delete", key, e)),
        }
    }

    /// Every object under the root.
    pub(crate) async fn list_all(&self) -> Result<Vec<ObjectMeta>> {
        let prefix = (!self.root.as_ref().is_empty()).then_some(&self.root);
        let mut objects: Vec<ObjectMeta> = self
            .store
            .list(prefix)
            .try_collect()
            .await
            .map_err(|e| CheckpointError::store("list", &self.root, e))?;
        objects.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(objects)
    }

    /// For `file://`: every directory under the root on disk with the newest modification time
    /// of its entries (seconds since the Unix epoch). A writer killed mid-upload can leave a
    /// directory holding only staging files, which no listing shows.
    pub(crate) fn local_dirs(&self) -> Result<Vec<(String, i64)>> {
        let Some(base) = &self.local_dir else { return Ok(Vec::new()) };
        let root = self.root.parts().fold(base.clone(), |p, part| p.join(part.as_ref()));
        let io = |path: &std::path::Path, e: std::io::Error| {
            CheckpointError::invalid(format!("directory {}", path.display()), e.to_string())
        };
        let entries = match std::fs::read_dir(&root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&root, e)),
        };
        let unix = |m: std::fs::Metadata| {
            m.modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs() as i64)
        };
        let mut dirs = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| io(&root, e))?;
            if !entry.file_type().map_err(|e| io(&entry.path(), e))?.is_dir() {
                continue;
            }
            let mut newest = unix(entry.metadata().map_err(|e| io(&entry.path(), e))?);
            for inner in std::fs::read_dir(entry.path()).map_err(|e| io(&entry.path(), e))? {
                let inner = inner.map_err(|e| io(&entry.path(), e))?;
                newest = newest.max(unix(inner.metadata().map_err(|e| io(&inner.path(), e))?));
            }
            dirs.push((entry.file_name().to_string_lossy().into_owned(), newest));
        }
        Ok(dirs)
    }

    /// Removes what a killed `file://` writer left in `dir` that listings do not show (staged
    /// multipart files), then the directory itself if it is empty.
    pub(crate) fn sweep_local_dir(&self, dir: &str) -> Result<()> {
        let Some(base) = &self.local_dir else { return Ok(()) };
        let path = self.root.parts().fold(base.clone(), |p, part| p.join(part.as_ref())).join(dir);
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(CheckpointError::invalid(format!("directory {}", path.display()), e.to_string()));
            }
        };
        let io = |e: std::io::Error| {
            CheckpointError::invalid(format!("directory {}", path.display()), e.to_string())
        };
        for entry in entries {
            let entry = entry.map_err(io)?;
            if entry.file_name().to_string_lossy().contains('#') && entry.file_type().map_err(io)?.is_file() {
                std::fs::remove_file(entry.path()).map_err(io)?;
            }
        }
        match std::fs::remove_dir(&path) {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(io(e)),
        }
    }
}

/// An I/O error of a `file://` read or write done without the object-store layer, reported
/// like the store's own errors.
pub(crate) fn local_error(operation: &'static str, key: &Path, e: std::io::Error) -> CheckpointError {
    CheckpointError::store(
        operation,
        key,
        object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) },
    )
}

/// The bucket and root prefix of an `s3://` or `gs://` URL. `raw` is checked as written: URL
/// parsing would silently resolve a `..` segment instead of refusing it.
fn bucket_and_root(raw: &str, url: &url::Url) -> Result<(String, String), String> {
    let after_scheme = raw.split_once("://").map_or(raw, |(_, rest)| rest);
    if after_scheme.split(['/', '?', '#']).any(|s| s == "." || s == "..") {
        return Err("the root prefix may not contain '.' or '..' segments".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("a store URL takes no query or fragment; pass options separately".into());
    }
    let bucket = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("no bucket; write {}://bucket/prefix", url.scheme()))?;
    let root = url.path().trim_matches('/').to_string();
    Ok((bucket.to_string(), root))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str, options: &StoreOptions) -> String {
        Storage::open(url, options).unwrap_err().to_string()
    }

    #[test]
    fn urls_map_to_backends_and_roots() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/ckpts", dir.path().display());
        let s = Storage::open(&url, &StoreOptions::default()).unwrap();
        assert_eq!(s.key("000000000001-a", "manifest.json").as_ref(), "000000000001-a/manifest.json");
        assert!(dir.path().join("ckpts").is_dir(), "the directory is created");

        let plain = dir.path().join("plain");
        Storage::open(plain.to_str().unwrap(), &StoreOptions::default()).unwrap();

        let options = StoreOptions {
            s3_endpoint: Some("http://127.0.0.1:1".into()),
            s3_region: Some("us-east-1".into()),
            s3_access_key_id: Some("k".into()),
            s3_secret_access_key: Some("s".into()),
            allow_http: true,
            ..StoreOptions::default()
        };
        let s = Storage::open("s3://bucket/runs/a/", &options).unwrap();
        assert_eq!(s.key("d", "n").as_ref(), "runs/a/d/n");
        let key = Path::from("runs/a/000000000001-x/host-0.shards");
        assert_eq!(s.split_key(&key), Some(("000000000001-x".into(), "host-0.shards".into())));
        assert_eq!(s.split_key(&Path::from("runs/a/loose")), None);
        assert_eq!(s.split_key(&Path::from("runs/b/d/n")), None);
    }

    #[test]
    fn bad_urls_say_how_to_fix_them() {
        let o = StoreOptions::default();
        assert!(err("ftp://host/x", &o).contains("unknown scheme 'ftp'; use file://, s3:// or gs://"));
        assert!(err("s3:///prefix", &o).contains("no bucket"));
        assert!(err("s3://bucket/a/../b", &o).contains("'..'"), "{}", err("s3://bucket/a/../b", &o));
        assert!(err("file://remote/x", &o).contains("name no host"));
        let gcs = StoreOptions { gcs_disable_oauth: true, ..StoreOptions::default() };
        assert!(err("gs://bucket/x", &gcs).contains("needs gcs_base_url"));
    }

    #[test]
    fn gcs_without_oauth_needs_no_network_to_build() {
        let o = StoreOptions {
            gcs_base_url: Some("http://127.0.0.1:1".into()),
            gcs_disable_oauth: true,
            allow_http: true,
            ..StoreOptions::default()
        };
        let s = Storage::open("gs://bucket/root", &o).unwrap();
        assert_eq!(s.url(), "gs://bucket/root");
    }
}
