//! Hostile input and credentials (issue 10): oversized RPCs, one job's token against another
//! job's status, checkpoints, keys and reports, keys with `..`, and no token in any log or file.

use crate::common::*;
use crate::sim::{self, SimOptions};
use client::ClientTls;
use coordinator::Embedded;
use proto::v1::{CheckpointReport, StepReport};
use std::path::Path;
use std::time::Duration;
use tonic::Code;

#[tokio::test]
async fn an_oversized_rpc_is_refused_with_a_clear_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = local_config(&dir.path().join("raft"), None);
    config.max_message_bytes = 64 << 10;
    let node = Embedded::start(config).await.unwrap();
    let addr = node.addr().to_string();
    let admin = client(vec![addr.clone()], ADMIN, None);

    // A spec padded past the limit with a YAML comment: refused at decoding, before parsing.
    let mut huge = spec("huge", 1, 5, None, dir.path());
    huge.push('#');
    huge.push_str(&"x".repeat(100 << 10));
    let e = admin.submit(&submit_request(huge)).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e}");
    let text = e.to_string();
    assert!(text.contains("message length too large") && text.contains("65536"), "{text}");

    // The same on the worker-facing services.
    let job = admin.submit(&submit_request(spec("small", 1, 5, None, dir.path()))).await.unwrap();
    let worker = admin.with_token(&job.job_token).unwrap();
    let e = worker.kv_put(&job.job_id, "k", vec![7; 100 << 10], None).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e}");
    let e = worker
        .report_checkpoint(CheckpointReport {
            job_id: job.job_id.clone(),
            save_spec: Some(proto::v1::SaveSpec { rng_state: vec![7; 100 << 10], ..Default::default() }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e}");

    // The node is unharmed: an ordinary request still goes through.
    worker.kv_put(&job.job_id, "k", vec![7; 1 << 10], None).await.unwrap();
    assert_eq!(admin.list_jobs().await.unwrap().len(), 1);
    node.stop().await.unwrap();
}

#[tokio::test]
async fn job_b_cannot_read_or_write_job_a() {
    let dir = tempfile::tempdir().unwrap();
    let (_, files) = tls_dir(dir.path());
    let (node, addr) = embedded(dir.path(), Some(files.clone()), false).await;
    let ca = ClientTls::read(&files.ca, None).unwrap();
    let mtls = coordinator::tls::client_tls(&files).unwrap();
    let admin = client(vec![addr.clone()], ADMIN, Some(ca.clone()));
    let a_dir = dir.path().join("a");
    let a = admin.submit(&submit_request(spec("alpha", 1, 8, Some(4), &a_dir))).await.unwrap();
    let b = admin.submit(&submit_request(spec("beta", 1, 8, None, &dir.path().join("b")))).await.unwrap();

    // Job a runs to the end with checkpoints and a rendezvous key.
    let a_worker = client(vec![addr.clone()], &a.job_token, Some(mtls.clone()));
    a_worker.kv_put(&a.job_id, "secret-key", b"a's value".to_vec(), None).await.unwrap();
    // (The simulated worker may be stopped before it sees the last ack: ask the coordinator.)
    let report = sim::run(a_worker.clone(), a.job_id.clone(), "a0".into(), SimOptions::quick(8, 4)).await;
    assert!(report.stop_reason.contains("Completed"), "{report:?}");
    let listed = a_worker.checkpoints(&a.job_id).await.unwrap();
    assert_eq!(listed.iter().map(|c| c.step).collect::<Vec<_>>(), vec![4, 8]);

    let b_client = client(vec![addr.clone()], &b.job_token, Some(mtls.clone()));
    let denied = |what: &str, e: client::ClientError| {
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e}");
        assert!(e.to_string().contains(&format!("for job {}, not {}", b.job_id, a.job_id)), "{what}: {e}");
    };
    // Status, by id and by name.
    denied("get", b_client.get_job(&a.job_id).await.unwrap_err());
    denied("get by name", b_client.get_job("alpha").await.unwrap_err());
    let visible: Vec<String> = b_client.list_jobs().await.unwrap().into_iter().map(|j| j.job_id).collect();
    assert_eq!(visible, vec![b.job_id.clone()]);
    // Checkpoints, logs, watch, stop.
    denied("checkpoints", b_client.checkpoints(&a.job_id).await.unwrap_err());
    denied("logs", b_client.logs(&a.job_id, false, None, 0).await.unwrap_err());
    denied("watch", b_client.watch_job(&a.job_id, 0).await.map(drop).unwrap_err());
    denied("stop", b_client.stop_job(&a.job_id).await.unwrap_err());
    // Rendezvous keys, both ways.
    let e = b_client.kv_get(&a.job_id, "secret-key", Duration::ZERO).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "kv get: {e}");
    let e = b_client.kv_put(&a.job_id, "secret-key", b"b's".to_vec(), None).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "kv put: {e}");
    assert_eq!(
        a_worker.kv_get(&a.job_id, "secret-key", Duration::ZERO).await.unwrap(),
        b"a's value".to_vec()
    );
    // Reports into job a with b's token, naming a's worker.
    let a_worker_id = a_worker.get_job(&a.job_id).await.unwrap().slices.first().map(|s| s.worker_id.clone());
    let worker_id = a_worker_id.unwrap_or_else(|| "w-1".into());
    let e = b_client
        .report_step(StepReport {
            job_id: a.job_id.clone(),
            worker_id: worker_id.clone(),
            generation: 1,
            step: 9,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(e.code(), Code::PermissionDenied | Code::NotFound), "step report: {e}");
    let e = b_client
        .report_checkpoint(CheckpointReport {
            job_id: a.job_id.clone(),
            worker_id,
            generation: 1,
            step: 8,
            save_id: "forged".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(e.code(), Code::PermissionDenied | Code::NotFound), "checkpoint report: {e}");
    // Job a is as it was.
    let status = admin.get_job(&a.job_id).await.unwrap();
    assert_eq!(status.step, 8);
    assert_eq!(admin.checkpoints(&a.job_id).await.unwrap().len(), 2);
    node.stop().await.unwrap();
}

#[tokio::test]
async fn a_checkpoint_root_or_save_id_with_dot_dot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // The worker below never beats: a long lease keeps its generation in force while it reports.
    let mut config = local_config(&dir.path().join("raft"), None);
    config.timeouts.lease = Duration::from_secs(120);
    let node = Embedded::start(config).await.unwrap();
    let addr = node.addr().to_string();
    let admin = client(vec![addr.clone()], ADMIN, None);
    // A bucket prefix that climbs out of itself.
    let bad = format!(
        "{}checkpoint: {{ every: 2, keep: 2, uri: \"s3://bucket/jobs/../other-team\" }}\n",
        spec("climb", 1, 4, None, dir.path())
    );
    let e = admin.submit(&submit_request(bad)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.to_string().contains(".."), "{e}");

    // A worker's checkpoint report whose save id climbs out of the job's checkpoint root.
    let job = admin.submit(&submit_request(spec("reports", 1, 20, Some(2), dir.path()))).await.unwrap();
    let worker = admin.with_token(&job.job_token).unwrap();
    let worker_id = worker
        .register(proto::v1::RegisterRequest {
            job_id: job.job_id.clone(),
            host: "h".into(),
            data_addr: "127.0.0.1:1".into(),
            devices: 1,
            platform: "cpu".into(),
            slice: None,
            instance_id: "i".into(),
        })
        .await
        .unwrap()
        .worker_id;
    let generation = eventually("generation 1", Duration::from_secs(15), || async {
        let g = admin.get_job(&job.job_id).await.ok()?.generation;
        (g >= 1).then_some(g)
    })
    .await;
    let spec = proto::v1::SaveSpec {
        step: 2,
        save_id: "../../escape".into(),
        bundle: "00ff00ff".into(),
        topology: Some(proto::v1::Topology {
            dcn: 1,
            ici: vec![proto::v1::MeshAxis { name: "fsdp".into(), size: 1 }],
            hosts_per_slice: 1,
        }),
        data_position: Some(proto::v1::DataPosition { seed: 0, step: 2 }),
        ..Default::default()
    };
    let report = proto::v1::HostReport {
        host: 0,
        step: 2,
        save_id: "../../escape".into(),
        chunk_size: 1024,
        object: Some(proto::v1::StreamObject { name: "host-0.shards".into(), ..Default::default() }),
        shards: vec![],
    };
    let e = worker
        .report_checkpoint(CheckpointReport {
            job_id: job.job_id.clone(),
            worker_id: worker_id.clone(),
            generation,
            step: 2,
            save_id: "../../escape".into(),
            host_report: Some(report.clone()),
            save_spec: Some(spec.clone()),
        })
        .await
        .unwrap_err();
    assert!(matches!(e.code(), Code::InvalidArgument | Code::FailedPrecondition), "{e}");
    assert!(e.to_string().contains("save id"), "{e}");
    assert!(!dir.path().join("escape").exists() && !dir.path().parent().unwrap().join("escape").exists());

    // A spec whose array has no element type: refused at the edge, naming the field.
    let save_id = "typeless".to_string();
    let arrays = vec![proto::v1::ArraySpec { name: "w".into(), shape: vec![2], ..Default::default() }];
    let e = worker
        .report_checkpoint(CheckpointReport {
            job_id: job.job_id.clone(),
            worker_id,
            generation,
            step: 2,
            save_id: save_id.clone(),
            host_report: Some(proto::v1::HostReport { save_id: save_id.clone(), ..report }),
            save_spec: Some(proto::v1::SaveSpec { save_id, arrays, ..spec }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.to_string().contains("save_spec.arrays[0].dtype: 0 is not an element type"), "{e}");
    node.stop().await.unwrap();
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// A one-node `podctl-coordinator` process as [`Proc::start`] starts one, recording runs and
/// logging at debug level (the most a log ever says) into `node<id>.log`.
fn start_debug(id: u64, peers: &[(u64, u16)], data: &Path, tls_dir: &Path) -> Proc {
    use std::io::BufRead;
    let port = peers.iter().find(|(i, _)| *i == id).unwrap().1;
    let log = std::fs::File::create(data.join(format!("node{id}.log"))).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_podctl-coordinator"))
        .args(["--id", &id.to_string(), "--listen", &format!("127.0.0.1:{port}")])
        .args(["--peers", &format!("{id}=127.0.0.1:{port}"), "--record-runs"])
        .arg("--data-dir")
        .arg(data.join(format!("node{id}")))
        .arg("--tls-dir")
        .arg(tls_dir)
        .env("PODCTL_ADMIN_TOKEN", ADMIN)
        .env("RUST_LOG", "debug,h2=info,hyper=info,tower=info,rustls=info")
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on "), "node {id} printed {line:?}");
    Proc { child }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_appears_in_logs_or_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (tls, files) = tls_dir(dir.path());
    let port = free_port();
    let peers = [(1u64, port)];
    // Debug logging on every podctl module: the most a log ever says.
    let node = start_debug(1, &peers, dir.path(), &tls);
    let addr = format!("127.0.0.1:{port}");
    let admin = client(vec![addr.clone()], ADMIN, Some(ClientTls::read(&files.ca, None).unwrap()));
    let job = admin.submit(&submit_request(spec("quiet", 1, 6, Some(3), dir.path()))).await.unwrap();
    let worker =
        client(vec![addr.clone()], &job.job_token, Some(coordinator::tls::client_tls(&files).unwrap()));
    let report = sim::run(worker.clone(), job.job_id.clone(), "w0".into(), SimOptions::quick(6, 3)).await;
    assert!(report.stop_reason.contains("Completed"), "{report:?}");
    let listed = worker.checkpoints(&job.job_id).await.unwrap();
    assert_eq!(listed.iter().map(|c| c.step).collect::<Vec<_>>(), vec![3, 6]);
    // Refused tokens are not echoed either.
    let wrong = "wrong-token-0123456789abcdef";
    let e = client(vec![addr.clone()], wrong, Some(ClientTls::read(&files.ca, None).unwrap()))
        .get_job(&job.job_id)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(!e.to_string().contains(wrong), "{e}");
    drop(node);

    let log = std::fs::read_to_string(dir.path().join("node1.log")).unwrap();
    assert!(log.lines().count() > 10, "the node logged almost nothing at debug:\n{log}");
    assert!(log.contains(&job.job_id), "the log should name the job:\n{log}");
    let files = files_under(dir.path());
    assert!(files.len() > 5, "{files:?}");
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        for (what, secret) in
            [("admin token", ADMIN), ("job token", job.job_token.as_str()), ("wrong token", wrong)]
        {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "the {what} appears in {}", path.display());
        }
    }
}
