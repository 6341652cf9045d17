//! The chaos harness's short variant (CI): one failure of every kind on a 4-slice job under a
//! 3-node coordinator cluster, then the checks of the acceptance run. Needs root (it creates
//! network namespaces).

use podctl_chaos::schedule::{self, Kind};
use podctl_chaos::{Harness, JobSpec, Policy, Setup, build_binaries, print_events, verify};
use std::path::Path;
use std::time::Duration;

#[test]
fn a_job_survives_one_failure_of_every_kind_and_ends_bitwise_as_without() {
    let home = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let bin_dir = build_binaries(&home, false).unwrap();
    let dir = tempfile_dir();
    let setup = Setup {
        cache: home.join("target/test-cache"),
        home,
        bin_dir,
        dir: dir.clone(),
        slices: 4,
        storage_faults: false,
    };
    let mut harness = Harness::start(setup).unwrap();
    // Each run takes ~25-60 s on 2 cores, a few minutes when the machine is overloaded; past the
    // limit the harness stops the job and fails, so the test cannot hang (it also has a nextest
    // timeout, .config/nextest.toml). The cut comes at step ~52 and heals 5-9 s later; with 110
    // steps of 0.14 s the job once ended before the healed worker was back (a cut is named in
    // 0.75 s now), so the steps after it outlast a heal and a rejoin.
    let spec =
        |name: &str| JobSpec { time_limit: Some(Duration::from_secs(420)), ..JobSpec::new(name, 150, 128) };
    let calm = harness.run_job(&spec("calm"), &[], Policy::Elastic).unwrap();
    let kinds = [Kind::Preempt, Kind::Kill, Kind::LeaderKill, Kind::Cut];
    let events = schedule::by_steps(2026, &kinds, 1, 4, 8, 12);
    let chaos = harness.run_job(&spec("chaos"), &events, Policy::Elastic).unwrap();
    print_events(&chaos);
    let verified = verify(&harness, &calm, &chaos).unwrap();
    for line in &verified.fencing {
        println!("fenced: {line}");
    }
    println!(
        "calm {:.1}s, chaos {:.1}s; {} checkpoints equal the calm run's; final state {}",
        calm.wall_seconds, chaos.wall_seconds, verified.checkpoints_equal, verified.final_digest
    );
    for kind in kinds {
        assert_eq!(chaos.events.iter().filter(|e| e.kind == kind).count(), 1, "{kind}");
    }
    for event in &chaos.events {
        assert!(event.next_step_after.is_some(), "training went on after event {event:?}");
        // A replica always survives: nothing committed is computed again.
        assert_eq!(event.steps_lost, Some(0), "{event:?}");
        if event.kind.hits_a_slice() {
            assert!(event.join_after.is_some(), "the slice rejoined after event {event:?}");
        }
    }
    assert_eq!(verified.fencing.len(), 1);
    assert!(chaos.unexpected_exits.is_empty(), "{:?}", chaos.unexpected_exits);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("podctl-chaos-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
