//! The soak's short variant (CI): every kind of failure the harness knows, 18 in all (each process
//! and network kind once per job, each disk and store kind once), on two 4-slice jobs (checkpoints on the harness's disk, then in its S3 bucket behind the fault
//! proxy), each checked against a calm run. Needs root (namespaces, the loop device, the block
//! I/O controller) and moto (`scripts/setup.sh --test`).

use podctl_chaos::schedule::Kind;
use podctl_chaos::{Harness, Setup, build_binaries, soak};
use std::path::Path;
use std::time::Duration;

#[test]
fn a_soak_of_every_kind_of_failure_recovers_each_loses_nothing_and_keeps_what_the_rule_says() {
    let home = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let bin_dir = build_binaries(&home, false).unwrap();
    let dir = std::env::temp_dir().join(format!("podctl-soak-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let setup = Setup {
        cache: home.join("target/test-cache"),
        home,
        bin_dir,
        dir: dir.clone(),
        slices: 4,
        storage_faults: true,
    };
    let mut harness = Harness::start(setup).unwrap();
    let options = soak::Options {
        seed: 2027,
        per_kind: 1,
        steps: 0,
        first: 8,
        gap: 4,
        steps_per_failure: 24,
        keep: 3,
        seq_len: 128,
        // Past it the harness stops the job and fails, so the test cannot hang.
        time_limit: Some(Duration::from_secs(480)),
        overlap: true,
    };
    let soak = soak::run(&mut harness, &options).unwrap();
    soak.print();

    let events: Vec<_> = soak.phases.iter().flat_map(|p| &p.run.events).collect();
    for kind in Kind::ALL {
        let expected = if Kind::PROCESSES.contains(&kind) { 2 } else { 1 };
        assert_eq!(events.iter().filter(|e| e.kind == kind).count(), expected, "{kind}");
    }
    for event in &events {
        assert!(event.recovered(), "recovered from {event:?}");
        // A replica always survives, and a failed save is tried again: nothing committed is
        // computed again.
        assert_eq!(event.steps_lost, Some(0), "{event:?}");
        if Kind::STORE.contains(&event.kind) || event.kind == Kind::DiskFull {
            assert!(event.faulted.is_some_and(|n| n > 0), "the fault met requests or saves: {event:?}");
        }
    }
    for phase in &soak.phases {
        assert_eq!(phase.verified.final_digest, soak.calm_digest, "{}", phase.run.name);
        assert!(phase.run.unexpected_exits.is_empty(), "{:?}", phase.run.unexpected_exits);
        assert_eq!(phase.committed().len(), options.keep as usize, "{}: {:?}", phase.root, phase.listed);
        // A finished job's failed saves can never commit: its last retention run collects them.
        assert_eq!(
            phase.listed.len(),
            options.keep as usize,
            "uncommitted left in {}: {:?}",
            phase.root,
            phase.listed
        );
    }
    let disk = &soak.phases[0].run;
    assert!(
        disk.failed_saves.1 > 0,
        "a full disk failed a checkpoint write with ENOSPC: {:?}",
        disk.failed_saves
    );
    // The harness first: its disk stays mounted while it lives.
    drop(harness);
    let _ = std::fs::remove_dir_all(&dir);
}
