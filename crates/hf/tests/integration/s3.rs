//! A model directory in an S3 bucket (moto's server on loopback, from the project's venv): the
//! ranged-read path gives the same parameter bytes as the local memory-mapped one.

use crate::common::{all_params, fixture, open, root};
use checkpoint::{Storage, StoreOptions};
use object_store::{ObjectStoreExt, PutPayload};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Moto(Child, u16);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn moto() -> Moto {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let binary = root().join(".venv/bin/moto_server");
    assert!(binary.exists(), "{} is missing: run scripts/setup.sh --test", binary.display());
    let child = Command::new(binary)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Moto(child, port);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto did not listen within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_model_reads_the_same_bytes_as_the_local_one() {
    let server = moto();
    let options = StoreOptions {
        s3_endpoint: Some(format!("http://127.0.0.1:{}", server.1)),
        s3_region: Some("us-east-1".into()),
        s3_access_key_id: Some("testing".into()),
        s3_secret_access_key: Some("testing".into()),
        allow_http: true,
        request_timeout: Duration::from_secs(60),
        max_retries: 1,
        ..StoreOptions::default()
    };
    let bucket = Storage::open("s3://models", &options).unwrap();
    // Create the bucket (moto accepts an unsigned PUT), then upload the directory.
    let mut stream = TcpStream::connect(("127.0.0.1", server.1)).unwrap();
    use std::io::{Read, Write};
    write!(
        stream,
        "PUT /models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
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
