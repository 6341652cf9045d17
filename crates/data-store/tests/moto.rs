//! Data files in an S3 bucket (moto's server on loopback, from the project's venv): ranged reads
//! of only the blocks asked for, a cache that a restart reads from instead of the bucket, a new
//! version read afresh, a version replaced mid-run refused, shards listed, and a loader whose
//! prefetch reads only its rows' row groups.

use checkpoint::{Storage, StoreOptions};
use data::files::{DataFiles, open_required};
use data::{BatchSpec, DataConfig, Loader};
use object_store::{ObjectStoreExt, PutPayload};
use podctl_data_store::StoreFiles;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use test_support::{Moto, root};

fn options(port: u16) -> StoreOptions {
    StoreOptions {
        s3_endpoint: Some(format!("http://127.0.0.1:{port}")),
        s3_region: Some("us-east-1".into()),
        s3_access_key_id: Some("testing".into()),
        s3_secret_access_key: Some("testing".into()),
        allow_http: true,
        request_timeout: Duration::from_secs(30),
        max_retries: 1,
        ..StoreOptions::default()
    }
}

struct Bucket {
    runtime: tokio::runtime::Runtime,
    storage: Storage,
    options: StoreOptions,
}

impl Bucket {
    fn new(server: &Moto) -> Self {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let options = options(server.port());
        let storage = Storage::open("s3://data", &options).unwrap();
        Self { runtime, storage, options }
    }

    fn put(&self, key: &str, bytes: Vec<u8>) {
        let path = object_store::path::Path::from(key);
        self.runtime.block_on(self.storage.object_store().put(&path, PutPayload::from(bytes))).unwrap();
    }

    fn files(&self, cache: &Path, block: u64) -> StoreFiles {
        StoreFiles::new(self.options.clone(), self.runtime.handle().clone(), cache).with_block_bytes(block)
    }
}

#[test]
fn ranged_reads_a_cache_a_restart_reads_from_and_versions() {
    let server = Moto::with_bucket("data");
    let bucket = Bucket::new(&server);
    let cache = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..10_000u32).flat_map(|i| (i as u16).to_le_bytes()).collect(); // 20,000 bytes
    bucket.put("tokens/corpus.bin", bytes.clone());
    let uri = "s3://data/tokens/corpus.bin";

    let files = bucket.files(cache.path(), 1024);
    let file = files.open(uri).unwrap().expect("the object exists");
    assert_eq!(file.len(), 20_000);
    assert_eq!(&file.read(1000..3100).unwrap()[..], &bytes[1000..3100]);
    assert_eq!(&file.read(19_990..20_000).unwrap()[..], &bytes[19_990..]);
    // Blocks 0..=3 and the last (19), five of twenty, in two ranged requests.
    let reads = files.reads()[uri];
    assert_eq!((reads.size, reads.fetched, reads.requests, reads.cached), (20_000, 4 * 1024 + 544, 2, 0));
    // Read again: memory and the disk cache, not the bucket.
    assert_eq!(&file.read(0..10).unwrap()[..], &bytes[..10]);
    assert_eq!(files.reads()[uri].fetched, reads.fetched);
    file.prefetch(&[5000..5100, 8000..9000]).unwrap();
    assert_eq!(files.reads()[uri].requests, 4, "blocks 4 and 7..=8: one request each");
    let error = file.read(19_000..20_001).unwrap_err().to_string();
    assert!(error.contains("past the end"), "{error}");

    // A restart: a new reader over the same cache reads nothing from the bucket.
    let restarted = bucket.files(cache.path(), 1024);
    let again = restarted.open(uri).unwrap().unwrap();
    assert_eq!(&again.read(1000..3100).unwrap()[..], &bytes[1000..3100]);
    again.prefetch(&[5000..5100, 8000..9000]).unwrap();
    let reads = restarted.reads()[uri];
    assert_eq!((reads.fetched, reads.requests), (0, 0), "{reads:?}");
    assert!(reads.cached >= 5 * 1024, "{reads:?}");

    // The object replaced while a reader has it open: a block it has not read is refused.
    let changed: Vec<u8> = bytes.iter().map(|b| b.wrapping_add(1)).collect();
    bucket.put("tokens/corpus.bin", changed.clone());
    let error = again.read(12_000..12_100).unwrap_err().to_string();
    assert!(error.contains(uri) && error.contains("changed while the job was reading it"), "{error}");
    // A new run sees the new version, reads it afresh and drops the old one's blocks.
    let fresh = bucket.files(cache.path(), 1024);
    let file = fresh.open(uri).unwrap().unwrap();
    assert_eq!(&file.read(1000..1100).unwrap()[..], &changed[1000..1100]);
    assert_eq!(fresh.reads()[uri].fetched, 2048, "blocks 0 and 1 hold bytes 1000..1100");
    let versions: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .flat_map(|dir| std::fs::read_dir(dir.unwrap().path()).unwrap())
        .filter(|entry| entry.as_ref().unwrap().file_type().unwrap().is_dir())
        .collect();
    assert_eq!(versions.len(), 1, "one version of the file is cached");

    // Missing objects and listings.
    assert!(fresh.open("s3://data/tokens/missing.bin").unwrap().is_none());
    let error = open_required(&fresh, "s3://data/tokens/missing.bin", "data.test").unwrap_err().to_string();
    assert!(error.contains("s3://data/tokens/missing.bin") && error.contains("data.test"), "{error}");
    bucket.put("shards/train-00001-of-00002.parquet", vec![1]);
    bucket.put("shards/train-00000-of-00002.parquet", vec![0]);
    bucket.put("shards/README.md", vec![2]);
    assert!(fresh.is_dir("s3://data/shards").unwrap() && !fresh.is_dir(uri).unwrap());
    assert_eq!(
        fresh.list("s3://data/shards/", ".parquet").unwrap(),
        ["s3://data/shards/train-00000-of-00002.parquet", "s3://data/shards/train-00001-of-00002.parquet"]
    );
}

#[test]
fn a_loader_in_a_bucket_reads_only_its_rows_row_groups() {
    let server = Moto::with_bucket("data");
    let bucket = Bucket::new(&server);
    // Parquet and JSONL written by `datasets` (the data crate's reference script).
    let written = tempfile::tempdir().unwrap();
    let out = Command::new(root().join(".venv/bin/python"))
        .arg(root().join("crates/data/tests/datasets_parquet.py"))
        .arg(written.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for name in ["gsm8k.parquet", "gsm8k.jsonl"] {
        bucket.put(&format!("gsm8k/{name}"), std::fs::read(written.path().join(name)).unwrap());
    }
    let cache = tempfile::tempdir().unwrap();
    let config = |path: &str| -> DataConfig {
        serde_json::from_value(serde_json::json!({
            "kind": "gsm8k", "path": path,
            // A real BPE tokenizer: the rows carry characters the character tokenizer refuses.
            "tokenizer": {"kind": "hf", "path": root().join("tests/fixtures/hf-gsm8k/model")},
        }))
        .unwrap()
    };
    let spec = BatchSpec::new(4, 1, 512).unwrap();
    let files = bucket.files(cache.path(), 4096);
    let remote = Loader::from_config(&config("s3://data/gsm8k/gsm8k.parquet"), spec, 5, &files).unwrap();
    // The footer only, so far: the last blocks of 4 KiB.
    let footer = files.reads()["s3://data/gsm8k/gsm8k.parquet"];
    assert!(footer.fetched <= 3 * 4096 && footer.fetched < footer.size / 3, "{footer:?}");
    // Two micro-batches of one step: 2 rows of 144, in at most 2 of 9 row groups.
    let read = remote.prefetch([(0, 0), (0, 1)]).unwrap();
    assert_eq!(read.examples, 2);
    assert!(read.parts <= 2 && read.parts_total == 9, "{read:?}");
    let reads = files.reads()["s3://data/gsm8k/gsm8k.parquet"];
    assert!(reads.fetched < reads.size * 2 / 3, "only some row groups: {reads:?}");
    // The same batches as the JSONL form, read locally.
    let local = Loader::from_config(
        &config(&written.path().join("gsm8k.jsonl").display().to_string()),
        spec,
        5,
        &data::LocalFiles,
    )
    .unwrap();
    for micro in 0..4 {
        assert_eq!(remote.micro_batch(0, micro).unwrap(), local.micro_batch(0, micro).unwrap());
    }
    // JSONL from the bucket too (read whole: its lines need every byte).
    let jsonl = Loader::from_config(&config("s3://data/gsm8k/gsm8k.jsonl"), spec, 5, &files).unwrap();
    assert_eq!(jsonl.micro_batch(3, 2).unwrap(), local.micro_batch(3, 2).unwrap());
}
