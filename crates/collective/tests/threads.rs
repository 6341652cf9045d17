//! Members as threads of this process, each with its own endpoint and real loopback sockets.

mod common;

use common::*;
use podctl_collective::{AbortHandle, Buffer, Config, Error, FaultFilter, Group};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The data really is order-sensitive, so matching the reference bit for bit means something.
#[test]
fn the_test_data_depends_on_summation_order() {
    let inputs: Vec<Vec<f32>> = (0..4).map(|r| gradient_f32(7, r, 10_000)).collect();
    let reference = reference_f32(&inputs);
    let left_to_right: Vec<f32> =
        (0..10_000).map(|i| ((inputs[0][i] + inputs[1][i]) + inputs[2][i]) + inputs[3][i]).collect();
    let differing = reference.iter().zip(&left_to_right).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert!(differing > 100, "only {differing} of 10000 sums depend on the order");
}

#[test]
fn sums_match_the_reference_bitwise_on_2_3_and_4_members() {
    let config = test_config();
    for members in [2, 3, 4] {
        let endpoints = endpoints(members);
        let placement: Vec<usize> = (0..members).collect();
        let groups = form_all(&endpoints, &placement, &config);
        // Lengths below, at and around the rank count and the chunk size, and many chunks.
        for (seed, len) in [(1, 0), (2, 1), (3, members - 1), (4, 1023), (5, 4096), (6, 100_003)] {
            for ty in [Ty::F32, Ty::Bf16] {
                let sums = all_reduce_by_rank(&groups, ty, seed, len);
                let expected = ty.reference(seed, members, len);
                for (rank, sum) in sums.iter().enumerate() {
                    assert!(
                        sum == &expected,
                        "{members} members, {ty:?}, len {len}: rank {rank} differs from the reference"
                    );
                }
            }
        }
    }
}

#[test]
fn four_logical_ranks_give_the_same_bits_on_1_2_3_and_4_members() {
    let config = test_config();
    let len = 50_001;
    let expected_f32 = Ty::F32.reference(11, 4, len);
    let expected_bf16 = Ty::Bf16.reference(11, 4, len);
    for placement in [
        vec![0, 0, 0, 0],
        vec![0, 1, 0, 1],
        vec![0, 0, 1, 1],
        vec![0, 1, 2, 0],
        vec![2, 0, 1, 2],
        vec![0, 1, 2, 3],
    ] {
        let members = placement.iter().max().unwrap() + 1;
        let endpoints = endpoints(members);
        let groups = form_all(&endpoints, &placement, &config);
        for (ty, expected) in [(Ty::F32, &expected_f32), (Ty::Bf16, &expected_bf16)] {
            let sums = all_reduce_by_rank(&groups, ty, 11, len);
            for (rank, sum) in sums.iter().enumerate() {
                assert!(sum == expected, "placement {placement:?}, {ty:?}: rank {rank} differs");
            }
        }
    }
}

/// Buckets submitted in a different order on every member, with pauses, and waited on in
/// different orders: the sums are still the reference.
#[test]
fn bucket_sums_do_not_depend_on_submission_order_or_timing() {
    let config = test_config();
    let endpoints = endpoints(3);
    let placement = [0, 1, 2, 0];
    let groups = form_all(&endpoints, &placement, &config);
    let lens = [5_000usize, 1, 70_000, 0, 12_345];
    let seed = |bucket: usize| 100 + bucket as u64;
    for round in 0..2 {
        let results = on_every_member(&groups, |g| {
            let me = g.spec().me;
            let mut order: Vec<usize> = (0..lens.len()).collect();
            order.rotate_left((me + round) % lens.len());
            if me == 1 {
                order.reverse();
            }
            let mut r = g.round(lens.len()).unwrap();
            for &bucket in &order {
                for &rank in g.local_ranks().iter().rev() {
                    r.submit(bucket, rank, Ty::F32.input(seed(bucket), rank, lens[bucket])).unwrap();
                }
                std::thread::sleep(Duration::from_millis(3 * me as u64));
            }
            if me == 0 {
                // Collect the last bucket first; the rest through finish.
                let last = r.wait(lens.len() - 1).unwrap();
                let mut all = r.finish().unwrap();
                all[lens.len() - 1] = last;
                all
            } else {
                r.finish().unwrap()
            }
        });
        for (g, buckets) in groups.iter().zip(&results) {
            for (bucket, sums) in buckets.iter().enumerate() {
                let expected = Ty::F32.reference(seed(bucket), 4, lens[bucket]);
                assert_eq!(sums.len(), g.local_ranks().len());
                for (i, sum) in sums.iter().enumerate() {
                    assert!(
                        sum.as_bytes() == expected,
                        "round {round} bucket {bucket} rank {} differs",
                        g.local_ranks()[i]
                    );
                }
            }
        }
    }
}

#[test]
fn an_abort_returns_promptly_and_peers_learn_it() {
    let config = Config { io_timeout: Duration::from_secs(60), ..test_config() };
    let endpoints = endpoints(2);
    let groups = form_all(&endpoints, &[0, 1], &config);
    let handle = groups[0].abort_handle();
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            handle.abort();
        });
        // Member 1 never submits, so member 0's bucket is stuck mid-ring until the abort. The
        // bucket is small enough for its first step to fit in the socket buffers, so member 0's
        // sender is between frames and can tell member 1 why.
        let err = groups[0].all_reduce(vec![Ty::F32.input(1, 0, 1 << 16)]).unwrap_err();
        assert_eq!(err, Error::Aborted);
    });
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "abort took {took:?} with a 60 s io timeout");
    assert!(handle.is_aborted());
    // The peer reads the abort frame instead of waiting out its timeout.
    let err = groups[1].all_reduce(vec![Ty::F32.input(1, 1, 1 << 16)]).unwrap_err();
    assert!(matches!(err, Error::PeerAborted { rank: 0, member: 0, .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn an_abort_handle_tripped_before_forming_refuses_to_form() {
    let endpoints = endpoints(1);
    let abort = AbortHandle::new();
    abort.abort();
    let spec = spec(&endpoints, &[0], 1, 0);
    assert_eq!(endpoints[0].form(&spec, &test_config(), &abort).err(), Some(Error::Aborted));
}

#[test]
fn a_partition_fails_every_member_within_the_timeout() {
    let config = Config { io_timeout: Duration::from_millis(800), ..test_config() };
    let mut endpoints = endpoints(3);
    let filter = Arc::new(FaultFilter::new());
    endpoints[0].set_filter(filter.clone());
    let groups = form_all(&endpoints, &[0, 1, 2], &config);
    filter.partition(1);
    let started = Instant::now();
    let errors = on_every_member(&groups, |g: &Group| {
        let inputs = g.local_ranks().iter().map(|&r| Ty::F32.input(3, r, 200_000)).collect();
        g.all_reduce(inputs).unwrap_err()
    });
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    // Member 1 usually times out first. If member 2's timeout fires first (its read can start
    // before member 1's thread runs), member 0 hears of it and closes, and member 1 loses it.
    match &errors[1] {
        Error::Timeout { rank: 0, member: 0, awaited, .. } => {
            assert!(awaited.contains("from rank 0"), "{awaited}")
        }
        Error::PeerLost { rank: 0, member: 0, .. } => {}
        other => panic!("member 1 should fail waiting for rank 0, got {other}"),
    }
    let timed_out = |e: &Error| match e {
        Error::Timeout { .. } => true,
        Error::PeerFailed { detail, .. } => detail.contains("timed out"),
        _ => false,
    };
    assert!(errors.iter().any(timed_out), "nobody timed out: {errors:?}");
    for e in &errors {
        assert!(is_peer_failure(e), "{e}");
    }
}

#[test]
fn delayed_links_change_no_bits() {
    let config = test_config();
    let mut endpoints = endpoints(3);
    let filter = Arc::new(FaultFilter::new());
    filter.delay(2, Duration::from_millis(1));
    endpoints[1].set_filter(filter);
    let groups = form_all(&endpoints, &[0, 1, 2], &config);
    let sums = all_reduce_by_rank(&groups, Ty::Bf16, 21, 30_000);
    let expected = Ty::Bf16.reference(21, 3, 30_000);
    assert!(sums.iter().all(|s| s == &expected));
}

#[test]
fn a_dropped_group_is_reported_to_its_peers() {
    let config = test_config();
    let endpoints = endpoints(3);
    let mut groups = form_all(&endpoints, &[0, 1, 2], &config);
    let sums = all_reduce_by_rank(&groups, Ty::F32, 5, 1000);
    assert!(sums.iter().all(|s| s == &Ty::F32.reference(5, 3, 1000)));
    drop(groups.remove(2));
    let errors =
        on_every_member(&groups, |g: &Group| g.all_reduce(vec![Buffer::from_f32(&[1.0; 1000])]).unwrap_err());
    for e in errors {
        assert!(matches!(e, Error::PeerAborted { rank: 2, .. } | Error::PeerLost { rank: 2, .. }), "{e}");
    }
}
