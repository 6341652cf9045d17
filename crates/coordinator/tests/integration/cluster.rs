//! Three `podctl-coordinator` processes on loopback, mutual TLS, default Raft timeouts.

use crate::common::*;
use crate::sim::{self, SimOptions};
use client::ClientTls;
use client::JobState;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_survives_a_leader_sigkill_and_a_full_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (tls, files) = tls_dir(dir.path());
    let ca = ClientTls::read(&files.ca, None).unwrap();
    let mtls = coordinator::tls::client_tls(&files).unwrap();
    let peers: Vec<(u64, u16)> = (1..=3).map(|id| (id, free_port())).collect();
    // A low snapshot threshold: the killed node comes back behind a purged log.
    let extra = ["--snapshot-every", "20"];
    let mut nodes: Vec<Option<Proc>> =
        peers.iter().map(|(id, _)| Some(Proc::start(*id, &peers, dir.path(), &tls, &extra))).collect();
    let addrs: Vec<String> = peers.iter().map(|(_, p)| format!("127.0.0.1:{p}")).collect();
    let admin = client(addrs.clone(), ADMIN, Some(ca.clone()));

    let submitted = admin.submit(&submit_request(spec("ha", 3, 60, Some(10), dir.path()))).await.unwrap();
    let job = submitted.job_id.clone();
    let wc = client(addrs.clone(), &submitted.job_token, Some(mtls.clone()));
    let opts = SimOptions {
        step_time: Duration::from_millis(40),
        heartbeat: Duration::from_millis(500),
        total_steps: 60,
        checkpoint_every: 10,
        late_saves: Vec::new(),
    };
    let workers: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|n| tokio::spawn(sim::run(wc.clone(), job.clone(), n.into(), opts.clone())))
        .collect();
    eventually("step 15", Duration::from_secs(60), || async {
        (admin.get_job(&job).await.ok()?.step >= 15).then_some(())
    })
    .await;

    // SIGKILL the leader mid-run.
    let (old_leader, _) = leader_seen_by(&addrs[0], &ca).await.expect("a leader");
    let (_, applied_at_death) =
        leader_seen_by(&addrs[old_leader as usize - 1], &ca).await.expect("it answers");
    let killed_at = Instant::now();
    nodes[old_leader as usize - 1].as_mut().unwrap().sigkill();
    let survivors: Vec<&String> =
        addrs.iter().enumerate().filter(|(i, _)| *i as u64 + 1 != old_leader).map(|(_, a)| a).collect();
    let new_leader = eventually("a new leader", Duration::from_secs(20), || async {
        for addr in &survivors {
            if let Some((id, _)) = leader_seen_by(addr, &ca).await
                && id != old_leader
            {
                return Some(id);
            }
        }
        None
    })
    .await;
    let election = killed_at.elapsed();
    println!("leader {old_leader} SIGKILLed; node {new_leader} elected after {} ms", election.as_millis());

    let mut reports = Vec::new();
    for w in workers {
        reports.push(
            tokio::time::timeout(Duration::from_secs(120), w).await.expect("the job finishes").unwrap(),
        );
    }
    let status = admin.get_job(&job).await.unwrap();
    assert_eq!((status.state, status.step), (Some(JobState::Completed), 60));
    // A leader change is not a membership change: the workers kept generation 1 throughout,
    // and every step was committed once (the last commit is step 60's own report).
    assert_eq!(status.generation, 1, "{:?}", status.events);
    assert!((status.loss - sim::loss_of(60)).abs() < 1e-12, "{}", status.loss);
    assert_eq!(status.leader, format!("{new_leader}@{}", addrs[new_leader as usize - 1]));
    assert_eq!(status.slices.len(), 3, "{:?}", status.slices);
    assert!(status.slices.iter().all(|s| s.virtual_ranks.len() == 1 && !s.worker_id.is_empty()));
    for r in &reports {
        assert_eq!(r.generations, vec![1], "{r:?}");
        assert!(r.acks.iter().all(|(step, committed)| committed >= step));
        assert!(
            r.acks.windows(2).all(|w| w[0].0 < w[1].0),
            "each step reported in order, once acked: {:?}",
            r.acks
        );
        // Each member heard every save commit, those around the kill included (the final one's
        // answer may be cut short by the stop completion sends).
        assert!(r.checkpoints.starts_with(&[10, 20, 30, 40, 50]), "{r:?}");
    }
    let catalog = admin.checkpoints(&job).await.unwrap();
    assert_eq!(catalog.iter().map(|c| c.step).collect::<Vec<_>>(), vec![50, 60]);

    // The killed node restarts and catches up; the leader's log was purged past where the
    // killed node stopped, so it can only catch up from a snapshot.
    let leader_info = info_of(&addrs[new_leader as usize - 1], &ca).await.unwrap();
    let leader_index = leader_info.commit_index;
    assert!(
        leader_info.purged_index > applied_at_death,
        "purged {} <= {applied_at_death}: lower --snapshot-every",
        leader_info.purged_index
    );
    nodes[old_leader as usize - 1] = Some(Proc::start(old_leader, &peers, dir.path(), &tls, &extra));
    let caught_up = Instant::now();
    eventually("the restarted node to catch up", Duration::from_secs(30), || async {
        let (_, applied) = leader_seen_by(&addrs[old_leader as usize - 1], &ca).await?;
        (applied >= leader_index).then_some(())
    })
    .await;
    println!("node {old_leader} caught up to index {leader_index} in {} ms", caught_up.elapsed().as_millis());

    // Stop all three, start all three: the job, its step and its catalog come back from disk.
    for node in nodes.iter_mut() {
        node.as_mut().unwrap().sigterm();
    }
    drop(nodes);
    let _nodes: Vec<Proc> =
        peers.iter().map(|(id, _)| Proc::start(*id, &peers, dir.path(), &tls, &extra)).collect();
    let after = eventually("the job after a full restart", Duration::from_secs(30), || async {
        admin.get_job(&job).await.ok()
    })
    .await;
    assert_eq!((after.state, after.step, after.generation), (Some(JobState::Completed), 60, 1));
    assert_eq!(admin.checkpoints(&job).await.unwrap(), catalog);
    // The job token still works: its hash was restored too.
    assert_eq!(wc.get_job(&job).await.unwrap().job_id, job);
}

/// `GET /readyz` of one node's HTTP listener: whether it answered 200, and what it said.
fn readyz(port: u16) -> Option<(bool, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: podctl\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.starts_with("HTTP/1.1 200 "), body.trim().to_string()))
}

/// Waits until node `port` answers ready (or not, per `ready`); what it said last.
async fn readiness_becomes(port: u16, ready: bool, what: &str) -> String {
    eventually(what, Duration::from_secs(30), || async {
        readyz(port).and_then(|(is, said)| (is == ready).then_some(said))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_ready_when_it_has_joined_the_cluster_not_when_its_port_opens() {
    let dir = tempfile::tempdir().unwrap();
    let (tls, _) = tls_dir(dir.path());
    let peers: Vec<(u64, u16)> = (1..=3).map(|id| (id, free_port())).collect();
    let http: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let start = |id: u64| {
        let listen = format!("127.0.0.1:{}", http[id as usize - 1]);
        Proc::start(id, &peers, dir.path(), &tls, &["--metrics-listen", &listen])
    };

    // Node 2 listens, but nobody has initialized a cluster: its gRPC port is open, it is not ready.
    let mut two = start(2);
    let said = readiness_becomes(http[1], false, "node 2 answers /readyz").await;
    assert!(said.contains("no cluster yet"), "{said}");
    // Node 1 initializes the cluster; with two of three a leader is elected and both are ready.
    let mut one = start(1);
    let said = readiness_becomes(http[0], true, "node 1 ready").await;
    assert!(said.starts_with("node 1 "), "{said}");
    readiness_becomes(http[1], true, "node 2 ready").await;
    // Node 3 joins late and becomes ready once it hears the leader.
    let _three = start(3);
    let said = readiness_becomes(http[2], true, "node 3 ready").await;
    assert!(said.contains("voter") || said.contains("leads"), "{said}");
    // Without a majority there is no leader: node 3 is alive (`/healthz`) but no longer ready.
    one.sigkill();
    two.sigkill();
    let said = readiness_becomes(http[2], false, "node 3 not ready without a majority").await;
    assert!(said.contains("knows no leader") || said.contains("no quorum"), "{said}");
}
