//! Members as separate `collective-peer` processes on loopback.

mod common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// Runs one all-reduce over `placement` with one process per member; returns the sums by rank.
fn all_reduce_in_processes(placement: &[usize], ty: Ty, seed: u64, len: usize) -> Vec<Vec<u8>> {
    let members = placement.iter().max().unwrap() + 1;
    let dir = tempfile::tempdir().unwrap();
    let mut peers: Vec<Peer> = (0..members).map(|_| Peer::spawn()).collect();
    let ranks_of = |m: usize| (0..placement.len()).filter(move |&r| placement[r] == m);
    for m in 0..members {
        let inputs: Vec<String> = ranks_of(m)
            .map(|r| {
                let path = dir.path().join(format!("in-{r}"));
                std::fs::write(&path, ty.input(seed, r, len).as_bytes()).unwrap();
                path.display().to_string()
            })
            .collect();
        let outputs: Vec<String> =
            ranks_of(m).map(|r| dir.path().join(format!("out-{r}")).display().to_string()).collect();
        let task = json!({
            "spec": peer_spec(&peers, placement, m),
            "config": config_json(&test_config()),
            "work": { "all_reduce": { "dtype": ty.dtype(), "inputs": inputs, "outputs": outputs } },
        });
        peers[m].send(&task);
    }
    for (m, peer) in peers.iter_mut().enumerate() {
        let line = peer.next().unwrap_or_else(|| panic!("member {m} exited without a result"));
        assert_eq!(line["done"], true, "member {m}: {line}");
    }
    (0..placement.len()).map(|r| std::fs::read(dir.path().join(format!("out-{r}"))).unwrap()).collect()
}

#[test]
fn sums_match_the_reference_bitwise_across_2_3_and_4_processes() {
    for members in [2, 3, 4] {
        let placement: Vec<usize> = (0..members).collect();
        for ty in [Ty::F32, Ty::Bf16] {
            let len = 300_007;
            let sums = all_reduce_in_processes(&placement, ty, 31, len);
            let expected = ty.reference(31, members, len);
            for (rank, sum) in sums.iter().enumerate() {
                assert!(
                    sum == &expected,
                    "{members} processes, {ty:?}: rank {rank} differs from the reference"
                );
            }
        }
    }
}

#[test]
fn four_logical_ranks_on_2_3_and_4_processes_give_identical_bits() {
    let len = 123_457;
    for ty in [Ty::F32, Ty::Bf16] {
        let expected = ty.reference(47, 4, len);
        for placement in [[0, 1, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3]] {
            let sums = all_reduce_in_processes(&placement, ty, 47, len);
            for (rank, sum) in sums.iter().enumerate() {
                assert!(sum == &expected, "placement {placement:?}, {ty:?}: rank {rank} differs");
            }
        }
    }
}

#[test]
fn a_killed_process_makes_every_survivor_fail_within_the_timeout() {
    let io_timeout = Duration::from_secs(5);
    let config = podctl_collective::Config { io_timeout, ..test_config() };
    let placement = [0, 1, 2];
    let mut peers: Vec<Peer> = (0..3).map(|_| Peer::spawn()).collect();
    for m in 0..3 {
        let task = json!({
            "spec": peer_spec(&peers, &placement, m),
            "config": config_json(&config),
            "work": { "loop": { "elems": 2_000_000, "iterations": 1_000_000 } },
        });
        peers[m].send(&task);
    }
    // Wait until the ring is running, then kill member 1 while the next all-reduce is in flight.
    for peer in peers.iter_mut() {
        let line = peer.next().expect("progress");
        assert!(line.get("iteration").is_some(), "{line}");
    }
    peers[1].child.kill().unwrap();
    let killed = Instant::now();
    for m in [0, 2] {
        let report = loop {
            let line = peers[m].next().unwrap_or_else(|| panic!("member {m} exited without reporting"));
            if let Some(error) = line.get("error") {
                break error.clone();
            }
        };
        let took = killed.elapsed();
        assert!(took < io_timeout + Duration::from_secs(5), "member {m} took {took:?}");
        assert_eq!(report["kind"], "PeerLost", "member {m}: {report}");
        assert_eq!(report["rank"], 1, "member {m} must name the killed rank: {report}");
        let status = peers[m].child.wait().unwrap();
        assert_eq!(status.code(), Some(3));
    }
}
