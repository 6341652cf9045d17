//! A model directory in an S3 bucket (moto's server on loopback, from the project's venv): the
//! ranged-read path gives the same parameter bytes as the local memory-mapped one.

use crate::common::{all_params, fixture, open};
use checkpoint::{Storage, StoreOptions};
use object_store::{ObjectStoreExt, PutPayload};
use std::time::Duration;
use test_support::Moto;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_model_reads_the_same_bytes_as_the_local_one() {
    let server = Moto::with_bucket("models");
    let options = StoreOptions {
        s3_endpoint: Some(server.endpoint()),
        s3_region: Some("us-east-1".into()),
        s3_access_key_id: Some("testing".into()),
        s3_secret_access_key: Some("testing".into()),
        allow_http: true,
        request_timeout: Duration::from_secs(60),
        max_retries: 1,
        ..StoreOptions::default()
    };
    let bucket = Storage::open("s3://models", &options).unwrap();
    let local = fixture("untied-bf16");
    for entry in std::fs::read_dir(&local).unwrap() {
        let path = entry.unwrap().path();
        let key = object_store::path::Path::from(format!(
            "qwen3-tiny/{}",
            path.file_name().unwrap().to_str().unwrap()
        ));
        bucket.object_store().put(&key, PutPayload::from(std::fs::read(&path).unwrap())).await.unwrap();
    }

    let remote = hf::HfModel::open("s3://models/qwen3-tiny", &options).await.unwrap();
    let local = open(&local).await.unwrap();
    assert!(!remote.location().is_local());
    assert_eq!(remote.model().preset, "hf:qwen3-tiny");
    assert_eq!(remote.identity(), local.identity(), "the same config and headers");
    for dtype in [mesh::DType::Float32, mesh::DType::Bfloat16] {
        assert_eq!(all_params(&remote, dtype).await, all_params(&local, dtype).await);
    }
    // Regions of a (2, 2) mesh, all at once (each byte fetched once) and one by one.
    let mesh = mesh::IciMesh::new([("fsdp", 2), ("tp", 2)]).unwrap();
    for p in local.model().params() {
        let regions: Vec<mesh::Region> =
            (0..4).map(|d| p.sharding.shard_region(&p.shape, &mesh, d)).collect();
        let together = remote.read_regions(p.path, &p.shape, mesh::DType::Float32, &regions).await.unwrap();
        for (region, bytes) in regions.iter().zip(&together) {
            let alone = local
                .read_regions(p.path, &p.shape, mesh::DType::Float32, std::slice::from_ref(region))
                .await
                .unwrap();
            assert!(alone[0] == *bytes, "{} region {:?}", p.path, region.ranges());
        }
    }
    let e = hf::HfModel::open("s3://models/nothing-here", &options).await.unwrap_err().to_string();
    assert!(e.contains("s3://models/nothing-here/config.json: missing"), "{e}");
}
