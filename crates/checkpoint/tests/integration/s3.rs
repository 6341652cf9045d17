//! The S3 backend against moto's server: multipart streaming writes, ranged reads, listing,
//! deletes; the same code paths a real bucket sees.

use crate::common::*;
use checkpoint::manifest::Limits;
use checkpoint::{Checkpoint, CommitLog, Retention, SaveOptions, Storage, StoreCommitLog, gc};
use std::time::Duration;
use test_support::Moto;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_multipart_save_commit_restore_and_gc_through_moto() {
    let server = Moto::with_bucket("ckpt");
    let storage = Storage::open("s3://ckpt/runs/exp1", &s3_options(&server.endpoint())).unwrap();
    let log = StoreCommitLog::new(storage.clone());

    // 24 MiB replicated across the slices: each host streams ~12 MiB in three 5 MiB parts.
    let mut arrays = state(2);
    arrays.push(checkpoint::ArraySpec::new(
        "params/big",
        vec![6144, 1024],
        mesh::DType::Float32,
        spec(&[&["fsdp"], &["tp"]]),
    ));
    let save_options = SaveOptions { chunk_size: 64 << 10, part_size: 5 << 20, max_parts_in_flight: 2 };
    let first = save_spec(100, "a", hsdp(), arrays.clone());
    let (c1, fulls) = save_and_commit(&storage, &log, &first, &save_options).await;
    let checkpoint = Checkpoint::open(&storage, &c1, &Limits::default()).await.unwrap();
    let sizes: Vec<u64> = checkpoint.manifest().objects.iter().map(|o| o.size).collect();
    assert!(sizes.iter().all(|&s| s > 2 * (5 << 20)), "both hosts used multipart: {sizes:?}");
    let report = checkpoint.verify().await.unwrap();
    assert_eq!(report.bytes, sizes.iter().sum::<u64>());

    let fsdp4 = ici(&[("fsdp", 4)]);
    let shardings = first_dim_over_fsdp(&first.arrays);
    assert_restores(&checkpoint, &first, &fulls, &fsdp4, &shardings).await;

    let second = save_spec(200, "b", hsdp(), arrays);
    let (c2, _) = save_and_commit(&storage, &log, &second, &save_options).await;
    let mut listed = log.list().await.unwrap();
    listed.sort_by_key(|c| c.step);
    assert_eq!(listed, vec![c1.clone(), c2.clone()]);

    let retention = Retention { keep_last: 1, min_orphan_age: Duration::ZERO, ..Default::default() };
    let report = gc(&storage, &log, &retention, &[]).await.unwrap();
    assert_eq!(report.plan.expire, vec![c1]);
    let left = checkpoint::list(&storage, &log).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!((left[0].step, left[0].committed), (200, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_a_clear_error_not_a_hang() {
    let server = Moto::start();
    let storage = Storage::open("s3://nope/x", &s3_options(&server.endpoint())).unwrap();
    let spec = save_spec(1, "a", hsdp(), state(1));
    let buffers = host_buffers(&spec, &fulls(&spec), 0);
    let e =
        checkpoint::save_host(&storage, &spec, 0, buffers, &small_chunks()).await.unwrap_err().to_string();
    assert!(e.contains("put of x/000000000001-a/host-0.shards failed"), "{e}");
}
