//! Fail points in the middle of the ring (`cargo test -p podctl-collective --features failpoints
//! --test failpoints`). Fail points are process-global, so the tests run one at a time.

mod common;

use common::*;
use podctl_collective::{Config, Error, Group};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn fast_failing() -> Config {
    Config { io_timeout: Duration::from_secs(1), ..test_config() }
}

fn reduce_everywhere(groups: &[Group], len: usize) -> Vec<Result<Vec<podctl_collective::Buffer>, Error>> {
    on_every_member(groups, |g| {
        let inputs = g.local_ranks().iter().map(|&r| Ty::F32.input(8, r, len)).collect();
        g.all_reduce(inputs)
    })
}

#[test]
fn a_connection_that_breaks_mid_send_fails_every_member() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let scenario = fault::fail::FailScenario::setup();
    let groups = form_all(&endpoints(3), &[0, 1, 2], &fast_failing());
    // The third chunk any sender sends breaks its connection.
    fault::fail::cfg("collective::send_chunk", "2*off->1*return").unwrap();
    let started = Instant::now();
    let results = reduce_everywhere(&groups, 100_000);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let errors: Vec<Error> = results.into_iter().map(|r| r.unwrap_err()).collect();
    assert!(errors.iter().all(is_peer_failure), "{errors:?}");
    assert!(
        errors.iter().any(|e| matches!(e, Error::PeerLost { detail, .. } if detail.contains("fail point"))),
        "{errors:?}"
    );
    scenario.teardown();
}

#[test]
fn a_receiver_stuck_mid_ring_makes_its_peers_time_out() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let scenario = fault::fail::FailScenario::setup();
    let groups = form_all(&endpoints(3), &[0, 1, 2], &fast_failing());
    fault::fail::cfg("collective::recv_chunk", "3*off->1*pause").unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        let healthy = s.spawn(|| reduce_everywhere(&groups, 100_000));
        // Release the stuck receiver only after the others had ample time to give up on it.
        std::thread::sleep(Duration::from_secs(4));
        fault::fail::remove("collective::recv_chunk");
        let errors: Vec<Error> = healthy.join().unwrap().into_iter().map(|r| r.unwrap_err()).collect();
        assert!(errors.iter().all(is_peer_failure), "{errors:?}");
        assert!(errors.iter().any(|e| matches!(e, Error::Timeout { .. })), "{errors:?}");
    });
    assert!(started.elapsed() < Duration::from_secs(15));
    scenario.teardown();
}

#[test]
fn slow_receives_change_no_bits() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let scenario = fault::fail::FailScenario::setup();
    let groups = form_all(&endpoints(3), &[0, 1, 2, 1], &test_config());
    fault::fail::cfg("collective::recv_chunk", "sleep(1)").unwrap();
    let sums = all_reduce_by_rank(&groups, Ty::Bf16, 12, 40_000);
    fault::fail::remove("collective::recv_chunk");
    let expected = Ty::Bf16.reference(12, 4, 40_000);
    assert!(sums.iter().all(|s| s == &expected));
    scenario.teardown();
}
