//! Tokens, client certificates, generation fencing and job isolation, over mutual TLS.

use crate::common::*;
use client::ClientTls;
use proto::v1::{Heartbeat, RegisterRequest, StepReport, WorkerEvent, directive, worker_event};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tonic::Code;

fn register(job_id: &str, instance: &str) -> RegisterRequest {
    RegisterRequest {
        job_id: job_id.into(),
        host: "h".into(),
        data_addr: "127.0.0.1:1".into(),
        devices: 1,
        platform: "cpu".into(),
        slice: None,
        instance_id: instance.into(),
    }
}

#[tokio::test]
async fn requests_without_the_right_token_or_certificate_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, files) = tls_dir(dir.path());
    let (node, addr) = embedded(dir.path(), Some(files.clone()), false).await;
    let mtls = coordinator::tls::client_tls(&files).unwrap();
    let ca_only = ClientTls::read(&files.ca, None).unwrap();

    // podctl: a bearer token over TLS, no client certificate needed.
    let admin = client(vec![addr.clone()], ADMIN, Some(ca_only.clone()));
    let a = admin.submit(&submit_request(spec("alpha", 1, 5, None, dir.path()))).await.unwrap();
    let b = admin.submit(&submit_request(spec("beta", 1, 5, None, dir.path()))).await.unwrap();

    let e = client(vec![addr.clone()], "", Some(ca_only.clone())).list_jobs().await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    let e = client(vec![addr.clone()], "not-a-token", Some(ca_only.clone()))
        .get_job(&a.job_id)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(e.to_string().contains("neither the admin token nor any job's token"), "{e}");

    // A job token reaches its own job only.
    let a_client = client(vec![addr.clone()], &a.job_token, Some(mtls.clone()));
    assert_eq!(a_client.get_job(&a.job_id).await.unwrap().job_id, a.job_id);
    let e = a_client.get_job(&b.job_id).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    assert!(e.to_string().contains(&format!("for job {}, not {}", a.job_id, b.job_id)), "{e}");
    assert_eq!(a_client.list_jobs().await.unwrap().len(), 1);
    let e = a_client.submit(&submit_request(spec("gamma", 1, 5, None, dir.path()))).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");

    // A worker of job a cannot join job b with a's token.
    let e = a_client.register(register(&b.job_id, "x")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");

    // Workers need a client certificate even with the right token.
    let no_cert = client(vec![addr.clone()], &a.job_token, Some(ca_only));
    let e = no_cert.register(register(&a.job_id, "y")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(e.to_string().contains("client certificate"), "{e}");
    assert!(a_client.register(register(&a.job_id, "y")).await.is_ok());

    // Plaintext to a TLS listener does not get through.
    let mut plain = client::ClientConfig::new(vec![addr.clone()], ADMIN, None);
    plain.retry_for = Duration::from_millis(500);
    let e = client::Client::new(plain).unwrap().list_jobs().await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    node.stop().await.unwrap();
}

#[test]
fn plaintext_needs_the_explicit_flag() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = local_config(dir.path(), None);
    config.insecure_plaintext = false;
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("--insecure-plaintext") && e.contains("--tls-dir"), "{e}");
}

#[tokio::test]
async fn a_report_from_an_older_generation_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, files) = tls_dir(dir.path());
    let (node, addr) = embedded(dir.path(), Some(files.clone()), false).await;
    let admin = client(vec![addr.clone()], ADMIN, Some(ClientTls::read(&files.ca, None).unwrap()));
    let job = admin.submit(&submit_request(spec("fence", 1, 50, None, dir.path()))).await.unwrap();
    let worker =
        client(vec![addr.clone()], &job.job_token, Some(coordinator::tls::client_tls(&files).unwrap()));
    let worker_id = worker.register(register(&job.job_id, "old")).await.unwrap().worker_id;
    let beat = {
        let worker_id = worker_id.clone();
        move |generation| WorkerEvent {
            event: Some(worker_event::Event::Heartbeat(Heartbeat {
                worker_id: worker_id.clone(),
                generation,
                ..Default::default()
            })),
        }
    };
    let mut session = worker.session(beat(0), Duration::from_secs(10)).await.unwrap();
    // Beat, in the generation last assigned, until the test cuts the worker off: a loaded
    // machine may take longer than one lease to form the group and commit the report.
    let assigned = Arc::new(AtomicU64::new(0));
    let beating = {
        let (events, beat, assigned) = (session.events.clone(), beat.clone(), assigned.clone());
        tokio::spawn(async move {
            while events.send(beat(assigned.load(Ordering::Relaxed))).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let assignment = loop {
        let d = tokio::time::timeout(Duration::from_secs(10), session.directives.message())
            .await
            .unwrap()
            .unwrap();
        if let Some(directive::Directive::Assignment(a)) = d.and_then(|d| d.directive) {
            break a;
        }
    };
    assert_eq!(assignment.generation, 1);
    assigned.store(1, Ordering::Relaxed);
    let report = |generation| StepReport {
        job_id: job.job_id.clone(),
        worker_id: worker_id.clone(),
        generation,
        step: 1,
        token_count: 1.0,
        ..Default::default()
    };
    assert_eq!(worker.report_step(report(1)).await.unwrap().committed_step, 1);
    // The worker goes silent (a partition): after a lease the job moves to generation 2.
    beating.abort();
    let _ = beating.await;
    drop(session);
    eventually("generation 2", Duration::from_secs(15), || async {
        (admin.get_job(&job.job_id).await.ok()?.generation == 2).then_some(())
    })
    .await;
    let e = worker.report_step(report(1)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.to_string().contains("stale generation 1, current 2"), "{e}");
    let e = worker.kv_put(&job.job_id, "k", vec![1], Some(1)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    // Its new session is told it was removed.
    let mut session = worker.session(beat(1), Duration::from_secs(10)).await.unwrap();
    let stop = loop {
        let d = tokio::time::timeout(Duration::from_secs(10), session.directives.message())
            .await
            .unwrap()
            .unwrap();
        if let Some(directive::Directive::Stop(s)) = d.and_then(|d| d.directive) {
            break s;
        }
    };
    assert!(stop.reason.contains("removed"), "{}", stop.reason);
    node.stop().await.unwrap();
}

/// A leader that hangs with its port open (stopped, or stuck in the kernel while it is killed:
/// the soak met one for 10 s) holds a worker's new session no longer than the time it gives
/// one to open; the next node answers. Before, the attempt waited the client's call timeout
/// (10 s) while the new leader counted the worker's lease (3 s) and removed it.
#[tokio::test]
async fn a_session_opens_past_a_node_that_hangs_with_its_port_open() {
    let dir = tempfile::tempdir().unwrap();
    let (_, files) = tls_dir(dir.path());
    let (node, addr) = embedded(dir.path(), Some(files.clone()), false).await;
    let admin = client(vec![addr.clone()], ADMIN, Some(ClientTls::read(&files.ca, None).unwrap()));
    let job = admin.submit(&submit_request(spec("hung", 1, 50, None, dir.path()))).await.unwrap();
    let worker_tls = || Some(coordinator::tls::client_tls(&files).unwrap());
    let registrar = client(vec![addr.clone()], &job.job_token, worker_tls());
    let worker_id = registrar.register(register(&job.job_id, "w")).await.unwrap().worker_id;
    // The kernel completes the handshake into the backlog; nobody ever reads or answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let worker =
        client(vec![hung.local_addr().unwrap().to_string(), addr.clone()], &job.job_token, worker_tls());
    let beat = WorkerEvent {
        event: Some(worker_event::Event::Heartbeat(Heartbeat { worker_id, ..Default::default() })),
    };
    let started = std::time::Instant::now();
    let session = worker.session(beat, Duration::from_millis(500)).await.unwrap();
    let took = started.elapsed();
    println!("the session opened on the live node after {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "{took:?}: an attempt waited on the hung node for the call timeout"
    );
    assert_eq!(worker.leader_address(), addr);
    drop(session);
    drop(hung);
    node.stop().await.unwrap();
}

/// The acceptance of issue 29: over mutual TLS with one CA, a worker's certificate is refused by
/// the Raft service and accepted by the worker services; a coordinator peer's is accepted by
/// both.
#[tokio::test]
async fn only_the_peer_certificate_speaks_raft() {
    use proto::v1::RaftPayload;
    use proto::v1::raft_client::RaftClient;

    let dir = tempfile::tempdir().unwrap();
    let (_, files) = tls_dir(dir.path());
    let (node, addr) = embedded(dir.path(), Some(files.clone()), false).await;
    let worker_tls = coordinator::tls::client_tls(&files).unwrap();
    let peer_tls = coordinator::tls::peer_tls(&files).unwrap();
    let admin = client(vec![addr.clone()], ADMIN, Some(ClientTls::read(&files.ca, None).unwrap()));
    let job = admin.submit(&submit_request(spec("tls", 1, 5, None, dir.path()))).await.unwrap();

    let raft = |tls: ClientTls| {
        let addr = addr.clone();
        async move {
            let endpoint = client::tls::endpoint(&addr, Some(&tls), Duration::from_secs(5)).unwrap();
            let mut raft = RaftClient::new(endpoint.connect().await.unwrap());
            // Not a Raft message: a service that admits the caller answers that it cannot read
            // it, one that does not refuses the caller first.
            raft.vote(RaftPayload { data: b"{}".to_vec() }).await.unwrap_err()
        }
    };
    let refused = raft(worker_tls.clone()).await;
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
    assert!(
        refused
            .message()
            .contains("admits only the coordinators' peer certificate (common name podctl-peer)")
            && refused.message().contains("\"podctl-worker\""),
        "{refused}"
    );
    let admitted = raft(peer_tls.clone()).await;
    assert_eq!(admitted.code(), Code::InvalidArgument, "{admitted}");
    assert!(admitted.message().contains("not a Raft Vote message"), "{admitted}");
    // No client certificate at all: refused as before.
    let anonymous = raft(ClientTls::read(&files.ca, None).unwrap()).await;
    assert_eq!(anonymous.code(), Code::Unauthenticated, "{anonymous}");

    // The worker services take either certificate, with the job's token.
    for (who, tls) in [("worker", worker_tls), ("peer", peer_tls)] {
        let worker = client(vec![addr.clone()], &job.job_token, Some(tls));
        let registered = worker.register(register(&job.job_id, who)).await;
        assert!(registered.is_ok(), "the {who} certificate: {registered:?}");
    }
    node.stop().await.unwrap();
}
