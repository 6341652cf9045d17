//! Forming groups: generations, jobs, placements and timeouts, over real loopback sockets.

mod common;

use common::*;
use podctl_collective::{AbortHandle, Config, Endpoint, Error, FaultFilter, GroupSpec};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn quick() -> Config {
    Config { connect_timeout: Duration::from_secs(2), ..test_config() }
}

/// Forms `a` and `b` (two members) concurrently.
fn form_pair(
    endpoints: &[Endpoint],
    a: GroupSpec,
    b: GroupSpec,
    config: &Config,
) -> (Result<podctl_collective::Group, Error>, Result<podctl_collective::Group, Error>) {
    std::thread::scope(|s| {
        let ha = s.spawn(|| endpoints[0].form(&a, config, &AbortHandle::new()));
        let hb = s.spawn(|| endpoints[1].form(&b, config, &AbortHandle::new()));
        (ha.join().unwrap(), hb.join().unwrap())
    })
}

#[test]
fn a_member_from_an_older_generation_is_refused_and_the_current_one_joins() {
    let endpoints = endpoints(2);
    let current = |me| spec(&endpoints, &[0, 1], 5, me);
    let stale = spec(&endpoints, &[0, 1], 4, 1);
    let config = Config { connect_timeout: Duration::from_secs(10), ..test_config() };
    std::thread::scope(|s| {
        let waiting = s.spawn(|| endpoints[0].form(&current(0), &config, &AbortHandle::new()));
        let err = endpoints[1].form(&stale, &config, &AbortHandle::new()).err().unwrap();
        assert!(
            matches!(err, Error::StaleGeneration { ours: 4, current: 5, member: 0, .. }),
            "the stale member must learn it is stale: {err}"
        );
        assert!(err.to_string().contains("fetch the current group spec"), "{err}");
        // Member 0 kept waiting; the current member 1 now joins it.
        let joined = endpoints[1].form(&current(1), &config, &AbortHandle::new()).unwrap();
        let first = waiting.join().unwrap().unwrap();
        let sums = all_reduce_by_rank(&[first, joined], Ty::F32, 9, 777);
        assert!(sums.iter().all(|s| s == &Ty::F32.reference(9, 2, 777)));
    });
}

#[test]
fn a_member_that_only_sees_a_newer_generation_learns_it_is_stale() {
    let endpoints = endpoints(2);
    let (old, new) =
        form_pair(&endpoints, spec(&endpoints, &[0, 1], 7, 0), spec(&endpoints, &[0, 1], 8, 1), &quick());
    assert!(matches!(old, Err(Error::StaleGeneration { ours: 7, current: 8, .. })), "{:?}", old.err());
    // The newer member keeps retrying for its old peer to come back, then gives up naming it.
    let err = new.err().unwrap();
    assert!(matches!(err, Error::Timeout { rank: 0, member: 0, .. }), "{err}");
}

#[test]
fn another_job_or_placement_is_refused_with_the_reason() {
    let endpoints = endpoints(2);
    let mut other_job = spec(&endpoints, &[0, 1], 1, 1);
    other_job.job = "someone-else".into();
    let (mine, theirs) = form_pair(&endpoints, spec(&endpoints, &[0, 1], 1, 0), other_job, &quick());
    // Both members dial each other; whichever refusal lands first stops its receiver, which may then
    // quit before answering the other hello, so either side may be the one that hears the reason.
    let (mine, theirs) = (mine.err().unwrap(), theirs.err().unwrap());
    let names_the_job = |e: &Error, by: usize| matches!(e, Error::Refused { member, reason, .. } if *member == by && reason.contains("someone-else"));
    assert!(names_the_job(&theirs, 0) || names_the_job(&mine, 1), "{mine} / {theirs}");

    let endpoints = common::endpoints(2);
    let (a, b) = form_pair(
        &endpoints,
        spec(&endpoints, &[0, 1, 0, 1], 1, 0),
        spec(&endpoints, &[0, 1, 1, 0], 1, 1),
        &quick(),
    );
    let refused: Vec<Error> = [a, b].into_iter().filter_map(Result::err).collect();
    assert!(
        refused.iter().any(|e| matches!(e, Error::Refused { reason, .. } if reason.contains("placement"))),
        "{refused:?}"
    );
}

#[test]
fn different_chunk_sizes_are_refused() {
    let endpoints = endpoints(2);
    let small = quick();
    let big = Config { chunk_bytes: 8192, ..quick() };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| endpoints[0].form(&spec(&endpoints, &[0, 1], 1, 0), &small, &AbortHandle::new()));
        let b = s.spawn(|| endpoints[1].form(&spec(&endpoints, &[0, 1], 1, 1), &big, &AbortHandle::new()));
        (a.join().unwrap(), b.join().unwrap())
    });
    let errors: Vec<String> = [a, b].into_iter().filter_map(|r| r.err()).map(|e| e.to_string()).collect();
    assert!(errors.iter().any(|e| e.contains("chunk_bytes") && e.contains("differs")), "{errors:?}");
}

#[test]
fn a_missing_peer_times_out_naming_it() {
    let endpoints = endpoints(2);
    let started = Instant::now();
    let err =
        endpoints[0].form(&spec(&endpoints, &[0, 1], 1, 0), &quick(), &AbortHandle::new()).err().unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2));
    let addr = endpoints[1].local_addr();
    match err {
        Error::Timeout { rank: 1, member: 1, addr: a, .. } => assert_eq!(a, addr),
        other => panic!("expected a timeout naming rank 1, got {other}"),
    }
}

#[test]
fn a_partitioned_peer_cannot_be_reached_while_forming() {
    let mut endpoints = endpoints(2);
    let filter = Arc::new(FaultFilter::new());
    filter.partition(1);
    endpoints[0].set_filter(filter);
    let (a, b) =
        form_pair(&endpoints, spec(&endpoints, &[0, 1], 1, 0), spec(&endpoints, &[0, 1], 1, 1), &quick());
    let a = a.err().unwrap();
    assert!(a.to_string().contains("dropped by the transport filter"), "{a}");
    assert!(matches!(b, Err(Error::Timeout { rank: 0, .. })));
}

#[test]
fn an_abort_stops_forming() {
    let endpoints = endpoints(2);
    let abort = AbortHandle::new();
    let config = Config { connect_timeout: Duration::from_secs(60), ..test_config() };
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            abort.abort();
        });
        let err = endpoints[0].form(&spec(&endpoints, &[0, 1], 1, 0), &config, &abort).err();
        assert_eq!(err, Some(Error::Aborted));
    });
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_stray_client_does_not_disturb_forming() {
    use std::io::Write;
    let endpoints = endpoints(2);
    let mut stray = std::net::TcpStream::connect(endpoints[0].local_addr()).unwrap();
    stray.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let groups = form_all(&endpoints, &[0, 1], &test_config());
    let sums = all_reduce_by_rank(&groups, Ty::Bf16, 4, 999);
    assert!(sums.iter().all(|s| s == &Ty::Bf16.reference(4, 2, 999)));
}

#[test]
fn invalid_specs_and_configs_are_rejected_before_any_connection() {
    let endpoints = endpoints(1);
    let mut bad = spec(&endpoints, &[0, 1], 1, 0);
    let err = endpoints[0].form(&bad, &test_config(), &AbortHandle::new()).err().unwrap();
    assert!(err.to_string().contains("rank 1 on member 1"), "{err}");
    bad.placement = vec![0];
    let config = Config { chunk_bytes: 3, ..test_config() };
    let err = endpoints[0].form(&bad, &config, &AbortHandle::new()).err().unwrap();
    assert!(matches!(err, Error::InvalidConfig { field: "chunk_bytes", .. }), "{err}");
}
