//! Shared fixtures: a realistic sharded state, saving it from every host, the options of a moto
//! bucket (moto itself is `test_support::Moto`), and fake-gcs-server's process from the
//! project's venv on loopback.

use bytes::Bytes;
use checkpoint::{
    ArraySpec, CommitLog, CommitRecord, DataPosition, HostReport, SaveOptions, SaveSpec, ShardBuffer,
    Storage, StoreOptions, Topology, finalize, save_host,
};
use mesh::{DType, IciMesh, Region, Sharding, copy_region};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn ici(axes: &[(&str, usize)]) -> IciMesh {
    IciMesh::new(axes.iter().copied()).unwrap()
}

pub fn spec(dims: &[&[&str]]) -> Sharding {
    Sharding::new(dims.iter().map(|d| d.iter().map(|s| s.to_string()).collect()).collect())
}

/// dcn(2) x (fsdp 2, tp 2), one host per slice: HSDP as on two v6e hosts.
/// Every array's first dimension sharded over `fsdp`, the rest replicated (scalars whole).
pub fn first_dim_over_fsdp(arrays: &[ArraySpec]) -> Vec<Sharding> {
    arrays
        .iter()
        .map(|a| {
            let mut dims = vec![vec![]; a.shape.len()];
            if let Some(first) = dims.first_mut() {
                *first = vec!["fsdp".to_string()];
            }
            Sharding::new(dims)
        })
        .collect()
}

pub fn hsdp() -> Topology {
    Topology::new(2, ici(&[("fsdp", 2), ("tp", 2)]), 1).unwrap()
}

/// A small training state with every kind of sharding the trainer uses: 2-D weights over
/// (fsdp, tp) and (tp, fsdp), a vector over fsdp, a bf16 table over both axes on one
/// dimension, a replicated norm, a scalar step counter, and one array split across slices.
/// `scale` multiplies the row counts.
pub fn state(scale: u64) -> Vec<ArraySpec> {
    vec![
        ArraySpec::new("params/embed", vec![64 * scale, 24], DType::Bfloat16, spec(&[&["fsdp", "tp"], &[]])),
        ArraySpec::new("params/wq", vec![16 * scale, 12], DType::Float32, spec(&[&["fsdp"], &["tp"]])),
        ArraySpec::new("params/wo", vec![12, 16 * scale], DType::Float32, spec(&[&["tp"], &["fsdp"]])),
        ArraySpec::new("params/bias", vec![8 * scale], DType::Float32, spec(&[&["fsdp"]])),
        ArraySpec::new("params/norm", vec![24], DType::Float32, Sharding::replicated(1)),
        ArraySpec::new("opt/count", vec![], DType::Int32, Sharding::replicated(0)),
        ArraySpec::new("opt/mu", vec![16 * scale, 12], DType::Float32, spec(&[&["dcn", "fsdp"], &["tp"]])),
    ]
}

/// Deterministic bytes of a whole array: element bytes depend on the array's index and the
/// byte position, so a misplaced byte never matches by accident.
pub fn full_array(index: usize, array: &ArraySpec) -> Vec<u8> {
    let n = array.num_bytes().unwrap() as usize;
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (index as u64 + 1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn save_spec(step: u64, save_id: &str, topology: Topology, arrays: Vec<ArraySpec>) -> SaveSpec {
    SaveSpec {
        step,
        save_id: save_id.into(),
        topology,
        arrays,
        bundle: "5eedc0ffee".into(),
        data_position: DataPosition { seed: 17, step },
        rng_state: vec![0xde, 0xad, step as u8],
        metadata: BTreeMap::from([("run".to_string(), serde_json::json!("tests"))]),
    }
}

/// What `host` copies off its devices: every local device's shard of every array.
pub fn host_buffers(spec: &SaveSpec, fulls: &[Vec<u8>], host: usize) -> Vec<ShardBuffer> {
    let mesh = spec.topology.mesh();
    let mut out = Vec::new();
    for (array, full) in spec.arrays.iter().zip(fulls) {
        let whole = Region::full(&array.shape);
        for device in spec.topology.devices_of_host(host) {
            let region = array.sharding.shard_region(&array.shape, mesh, device);
            let mut buf = vec![0u8; (region.num_elements() * array.dtype.size() as u64) as usize];
            copy_region(full, &whole, &mut buf, &region, &region, array.dtype.size());
            out.push(ShardBuffer { array: array.name.clone(), device, data: Bytes::from(buf) });
        }
    }
    out
}

pub fn fulls(spec: &SaveSpec) -> Vec<Vec<u8>> {
    spec.arrays.iter().enumerate().map(|(i, a)| full_array(i, a)).collect()
}

pub async fn save_all(
    storage: &Storage,
    spec: &SaveSpec,
    fulls: &[Vec<u8>],
    options: &SaveOptions,
) -> Vec<HostReport> {
    let mut reports = Vec::new();
    for host in 0..spec.topology.num_hosts() {
        let buffers = host_buffers(spec, fulls, host);
        reports.push(save_host(storage, spec, host, buffers, options).await.unwrap());
    }
    reports
}

pub async fn save_and_commit(
    storage: &Storage,
    log: &impl CommitLog,
    spec: &SaveSpec,
    options: &SaveOptions,
) -> (CommitRecord, Vec<Vec<u8>>) {
    let fulls = fulls(spec);
    let reports = save_all(storage, spec, &fulls, options).await;
    (finalize(storage, spec, &reports, log).await.unwrap(), fulls)
}

/// Small chunks so shard boundaries fall inside chunks and reads span several of them.
pub fn small_chunks() -> SaveOptions {
    SaveOptions { chunk_size: 1024, ..SaveOptions::default() }
}

/// The venv the project's setup script fills (`PODCTL_VENV` overrides).
pub fn venv_file(relative: &str) -> PathBuf {
    let venv = std::env::var_os("PODCTL_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"));
    let path = venv.join(relative);
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup.sh --test (it installs scripts/requirements/objectstore.txt into the venv)",
        path.display()
    );
    path
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An emulator process on loopback, killed when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    pub fn start(mut command: Command, port: u16) -> Self {
        let child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start emulator");
        let mut server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("emulator on port {port} exited with {status} before accepting connections");
            }
            assert!(Instant::now() < deadline, "emulator on port {port} did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The store options of a bucket in moto's S3 server at `endpoint` (any credentials do).
pub fn s3_options(endpoint: &str) -> StoreOptions {
    StoreOptions {
        s3_endpoint: Some(endpoint.into()),
        s3_region: Some("us-east-1".into()),
        s3_access_key_id: Some("testing".into()),
        s3_secret_access_key: Some("testing".into()),
        allow_http: true,
        request_timeout: Duration::from_secs(60),
        max_retries: 1,
        ..StoreOptions::default()
    }
}

/// One HTTP/1.1 request to loopback, for the emulators' admin calls; returns status and body.
pub fn http(port: u16, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let text = String::from_utf8_lossy(&response);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body_at = response.windows(4).position(|w| w == b"\r\n\r\n").map_or(response.len(), |p| p + 4);
    (status, response[body_at..].to_vec())
}

/// Restores every array onto `mesh` under `shardings` (one per array) and checks each target
/// device's bytes against the original array.
pub async fn assert_restores(
    checkpoint: &checkpoint::Checkpoint,
    spec: &SaveSpec,
    fulls: &[Vec<u8>],
    mesh: &IciMesh,
    shardings: &[Sharding],
) {
    let devices: Vec<usize> = (0..mesh.num_devices()).collect();
    for ((array, full), sharding) in spec.arrays.iter().zip(fulls).zip(shardings) {
        let restored = checkpoint.restore_shards(&array.name, mesh, sharding, &devices).await.unwrap();
        let mut covered = 0;
        for shard in restored {
            let mut want = vec![0u8; shard.data.len()];
            copy_region(
                full,
                &Region::full(&array.shape),
                &mut want,
                &shard.region,
                &shard.region,
                array.dtype.size(),
            );
            assert!(shard.data[..] == want[..], "array {} region {:?} differs", array.name, shard.region);
            for &d in &shard.devices {
                assert_eq!(sharding.shard_region(&array.shape, mesh, d), shard.region);
            }
            covered += shard.devices.len();
        }
        assert_eq!(covered, devices.len(), "every target device of {} got its shard", array.name);
    }
}
