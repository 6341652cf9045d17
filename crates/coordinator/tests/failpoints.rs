//! A coordinator node crashed at its Raft log append and at its state machine apply (`cargo
//! nextest run -p podctl-coordinator --features failpoints --test failpoints`).
//!
//! Three `podctl-coordinator` processes (built with the feature: they read `FAILPOINTS` and abort
//! on a panic) on loopback with mutual TLS. One of them, the leader or a follower, starts with
//! `FAILPOINTS` set to panic at the Nth call of one point; a client keeps writing KV keys (each
//! write acknowledged only once applied by the leader) until that node died of SIGABRT and more
//! writes went through without it. The node is restarted on the same data directory. Then:
//! - it catches up with the leader;
//! - every write acknowledged to the client, before, during and after the crash, reads back;
//! - stopped, each node's own durable state (snapshot, then its committed log applied on top)
//!   is the same at the same index on all three, and holds every acknowledged write.
//!
//! Fail points are process-global; here only the node processes configure any, and the tests
//! run one at a time.

// The workspace names this crate `coordinator` everywhere else; so do its tests.
extern crate podctl_coordinator as coordinator;

// The integration binary's fixtures (nodes, clients, specs); this binary uses a few of them.
#[allow(dead_code)]
#[path = "integration/common.rs"]
mod common;

use client::ClientTls;
use common::*;
use coordinator::store::{LogStore, StateMachine, StateMachineStore, open_database};
use openraft::RaftLogReader;
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// SIGABRT: what `std::process::abort` dies of.
const SIGABRT: i32 = 6;
/// Writes acknowledged after the victim died, before it is restarted.
const WRITES_WITHOUT_IT: usize = 10;
/// Writes acknowledged after it was restarted.
const WRITES_AFTER_RESTART: usize = 5;
/// Snapshots (and log purges) this often, so restarts rebuild from a snapshot plus the log.
const SNAPSHOT_EVERY: &str = "25";

/// A node's durable state as its next start rebuilds it: the stored snapshot, then the log
/// entries after it up to `up_to` (its persisted committed index when `None`) applied on top.
/// Returns the state and the index it reached.
async fn durable_state(data_dir: &Path, up_to: Option<u64>) -> (StateMachine, u64) {
    let db = open_database(data_dir).unwrap();
    let mut log = LogStore::new(db.clone());
    let mut machine = StateMachineStore::open(db).unwrap();
    let committed = log.read_committed().await.unwrap().map_or(0, |l| l.index);
    // The committed index a node saves is advisory (it learns the cluster's again on restart):
    // a target past it is read from the log, whose entries are durable once appended.
    let target = up_to.unwrap_or(committed);
    let (applied, _) = machine.applied_state().await.unwrap();
    let from = applied.map_or(0, |l| l.index) + 1;
    assert!(from <= target + 1, "{}: the snapshot is past index {target}", data_dir.display());
    let entries = log.try_get_log_entries(from..=target).await.unwrap();
    assert_eq!(entries.len() as u64, target + 1 - from, "{}: a gap in the log", data_dir.display());
    machine.apply(entries).await.unwrap();
    let state = machine.shared().machine.read().unwrap().clone();
    (state, target)
}

/// Starts three nodes, `victim` with `FAILPOINTS=<failpoints>`, writes until it crashed and
/// more, restarts it, and checks that nothing acknowledged is lost and all three agree.
async fn crash_and_restart(victim: u64, victim_leads: bool, failpoints: &str) {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (tls, files) = tls_dir(dir.path());
    let ca = ClientTls::read(&files.ca, None).unwrap();
    let mtls = ClientTls::read(&files.ca, Some((&files.client_cert, &files.client_key))).unwrap();
    let peers: Vec<(u64, u16)> = (1..=3).map(|id| (id, free_port())).collect();
    let extra = ["--snapshot-every", SNAPSHOT_EVERY];
    let mut nodes: BTreeMap<u64, Proc> = peers
        .iter()
        .map(|&(id, _)| {
            let env: &[(&str, &str)] = if id == victim { &[("FAILPOINTS", failpoints)] } else { &[] };
            (id, Proc::start_with_env(id, &peers, dir.path(), &tls, &extra, env))
        })
        .collect();
    let addrs: Vec<String> = peers.iter().map(|(_, p)| format!("127.0.0.1:{p}")).collect();
    let addr_of = |id: u64| addrs[id as usize - 1].clone();

    // Node 1 initializes the cluster, and nodes without a log never stand for election, so node
    // 1 leads first.
    let (leader, _) =
        eventually("a leader", Duration::from_secs(30), || leader_seen_by(&addrs[0], &ca)).await;
    assert_eq!(
        leader == victim,
        victim_leads,
        "node {leader} leads; the test wants node {victim} to lead: {victim_leads}"
    );

    let admin = client(addrs.clone(), ADMIN, Some(ca.clone()));
    let job = admin.submit(&submit_request(spec("fp", 1, 10, None, dir.path()))).await.unwrap();
    let writer = client(addrs.clone(), &job.job_token, Some(mtls.clone()));
    let mut acked: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let write = |i: usize| {
        let (key, value) = (format!("k{i:04}"), format!("value {i}").into_bytes());
        let writer = &writer;
        let job = &job.job_id;
        async move { writer.kv_put(job, &key, value.clone(), None).await.map(|()| (key, value)) }
    };

    // Write until the victim died and the others took WRITES_WITHOUT_IT more.
    let started = Instant::now();
    let mut i = 0;
    let mut since_death = None;
    let mut last_error = None;
    while since_death.is_none_or(|n| n < WRITES_WITHOUT_IT) {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "node {victim} with FAILPOINTS={failpoints}: {i} writes, {} acknowledged, crashed: {}, \
             in 180 s; last error: {last_error:?}",
            acked.len(),
            since_death.is_some()
        );
        // A write that fails (the leader died under it) is simply not acknowledged.
        match write(i).await {
            Ok((key, value)) => {
                acked.insert(key, value);
                since_death = since_death.map(|n| n + 1);
            }
            Err(e) => last_error = Some(e.to_string()),
        }
        i += 1;
        if since_death.is_none()
            && let Some(status) = nodes.get_mut(&victim).unwrap().child.try_wait().unwrap()
        {
            assert_eq!(
                status.signal(),
                Some(SIGABRT),
                "node {victim} died of {status}, not at the fail point"
            );
            let log = std::fs::read_to_string(dir.path().join(format!("node{victim}.log"))).unwrap();
            assert!(log.contains("failpoint") && log.contains("panic"), "node {victim}'s log: {log}");
            println!("node {victim} crashed at {failpoints} after {i} writes, {} acknowledged", acked.len());
            since_death = Some(0);
        }
    }

    // Restarted on the same data directory, without fail points, it catches up.
    nodes.insert(victim, Proc::start(victim, &peers, dir.path(), &tls, &extra));
    for _ in 0..WRITES_AFTER_RESTART {
        let (key, value) = write(i).await.unwrap_or_else(|e| panic!("a write with all three nodes up: {e}"));
        acked.insert(key, value);
        i += 1;
    }
    // Every acknowledged write is committed, so the highest commit index any node reports now
    // covers them all (a node that only thinks it leads may report an older one).
    let mut leader_applied = 0;
    for addr in &addrs {
        if let Some(info) = info_of(addr, &ca).await {
            leader_applied = leader_applied.max(info.commit_index);
        }
    }
    for id in 1..=3 {
        eventually(
            &format!("node {id} to apply index {leader_applied}"),
            Duration::from_secs(60),
            || async { (info_of(&addr_of(id), &ca).await?.commit_index >= leader_applied).then_some(()) },
        )
        .await;
    }

    // Nothing acknowledged is lost.
    for (key, value) in &acked {
        assert_eq!(&writer.kv_get(&job.job_id, key, Duration::ZERO).await.unwrap(), value, "key {key}");
    }

    // Each node's durable state: the same on all three at the same index, with every write.
    for node in nodes.values_mut() {
        node.sigterm();
    }
    drop(nodes);
    // Every node had committed `leader_applied` before it stopped, so its log up to there is
    // the cluster's committed log, whatever index it last saved as committed.
    let mut committed = Vec::new();
    for id in 1..=3 {
        committed.push(durable_state(&dir.path().join(format!("node{id}")), None).await.1);
    }
    let common_index = leader_applied;
    let mut states = Vec::new();
    for id in 1..=3 {
        let (state, _) = durable_state(&dir.path().join(format!("node{id}")), Some(common_index)).await;
        let kv = state.state.kv.get(&job.job_id).cloned().unwrap_or_default();
        assert!(
            acked.iter().all(|(k, v)| kv.get(k) == Some(v)),
            "node {id} at index {common_index} lacks acknowledged writes (committed: {committed:?})"
        );
        states.push(state);
    }
    assert!(states.windows(2).all(|w| w[0] == w[1]), "the nodes' states differ at index {common_index}");
    println!("{} writes, {} acknowledged; all three nodes equal at index {common_index}", i, acked.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_crashes_mid_log_append() {
    crash_and_restart(1, true, "coordinator::raft_log_append=15*off->panic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_crashes_mid_log_append() {
    crash_and_restart(3, false, "coordinator::raft_log_append=15*off->panic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_crashes_mid_apply() {
    crash_and_restart(1, true, "coordinator::state_machine_apply=15*off->panic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_crashes_mid_apply() {
    crash_and_restart(3, false, "coordinator::state_machine_apply=15*off->panic").await;
}
