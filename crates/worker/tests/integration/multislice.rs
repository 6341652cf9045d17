//! Data parallelism across slices, in one process: each slice is its own PJRT client, ranks meet
//! in podctl's ring all-reduce over loopback. The loss matches a single slice with the same
//! global batch, and the parameters are bitwise the same however the logical ranks are placed.

use crate::{members, support};
use collective::{AbortHandle, Endpoint, GroupSpec};
use worker::sft::Sft;
use worker::{Reduce, Slice, Trainer, run_step};

const GLOBAL: usize = 16;
const MICRO: usize = 4;
const STEPS: u64 = 4;

fn loader() -> data::Loader {
    let config: data::DataConfig = serde_json::from_str(r#"{"kind": "arithmetic"}"#).unwrap();
    data::Loader::from_config(
        &config,
        data::BatchSpec::new(GLOBAL, MICRO, 128).unwrap(),
        11,
        &data::LocalFiles,
    )
    .unwrap()
}

struct Run {
    /// Per step, the loss over the global batch.
    losses: Vec<f64>,
    state: Vec<(String, Vec<u8>)>,
}

/// What a member process is told, through its environment.
#[derive(serde::Serialize, serde::Deserialize)]
struct MemberTask {
    bundle: std::path::PathBuf,
    spec: GroupSpec,
    out: std::path::PathBuf,
}

/// The member side: runs in a child process (the CPU plugin's in-process collectives allow one
/// SPMD client per process, as production has one worker per host).
#[test]
fn member_process() {
    let Ok(task) = std::env::var("PODCTL_TEST_MEMBER") else { return };
    let task: MemberTask = serde_json::from_str(&task).unwrap();
    let bundle = bundle::Bundle::load(&task.bundle).unwrap();
    let dp = task.spec.ranks();
    let accum = (GLOBAL / MICRO / dp) as u64;
    // Bind before compiling, so the port noted by the parent is held; the peers compile at
    // their own pace, so forming waits as long as the worker's does.
    let endpoint = Endpoint::bind(task.spec.members[task.spec.me]).unwrap();
    let slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    let mut trainer = Trainer::new(slice, &bundle).unwrap();
    trainer.init(5).unwrap();
    let group =
        (dp > 1).then(|| endpoint.form(&task.spec, &members::forming(), &AbortHandle::new()).unwrap());
    let ranks = task.spec.local_ranks();
    let sft = Sft::from_loader(loader());
    let mut sums = Vec::new();
    for step in 0..STEPS {
        let reduce = group.as_ref().map_or(Reduce::Alone, Reduce::Ring);
        let out = run_step(&mut trainer, &sft, step, &ranks, accum, 2e-3, reduce).unwrap();
        sums.push((out.loss_sum, out.token_count));
    }
    let state = trainer.download_state().unwrap();
    let file = std::fs::File::create(&task.out).unwrap();
    serde_json::to_writer(file, &(sums, state)).unwrap();
}

/// Trains `STEPS` steps with `dp` logical ranks placed on member processes by `placement`.
fn run(bundle: &bundle::Bundle, dp: usize, placement: &[usize]) -> Run {
    assert_eq!(placement.len(), dp);
    let member_count = placement.iter().max().unwrap() + 1;
    let addrs = members::free_addrs(member_count);
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..member_count)
        .map(|me| {
            let task = MemberTask {
                bundle: bundle.dir().to_path_buf(),
                spec: GroupSpec {
                    job: "multislice".into(),
                    generation: 1,
                    members: addrs.clone(),
                    placement: placement.to_vec(),
                    me,
                },
                out: dir.path().join(format!("{me}.json")),
            };
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["multislice::member_process", "--exact", "--nocapture"])
                .env("PODCTL_TEST_MEMBER", serde_json::to_string(&task).unwrap())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a member failed");
    }
    type Outcome = (Vec<(f64, f64)>, Vec<(String, Vec<u8>)>);
    let results: Vec<Outcome> = (0..member_count)
        .map(|me| {
            serde_json::from_reader(std::fs::File::open(dir.path().join(format!("{me}.json"))).unwrap())
                .unwrap()
        })
        .collect();
    let losses = (0..STEPS as usize)
        .map(|s| {
            let (loss, tokens) = results.iter().fold((0.0, 0.0), |(l, t), r| (l + r.0[s].0, t + r.0[s].1));
            loss / tokens
        })
        .collect();
    for other in &results[1..] {
        assert!(other.1 == results[0].1, "members of one group ended with different states");
    }
    Run { losses, state: results.into_iter().next().unwrap().1 }
}

#[test]
fn slices_match_one_slice_and_placement_does_not_change_the_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = support::export_tiny(tmp.path(), "fsdp=2,tp=1", MICRO as u64, 128);

    let one = run(&bundle, 1, &[0]);
    let two = run(&bundle, 2, &[0, 1]);
    for (step, (a, b)) in one.losses.iter().zip(&two.losses).enumerate() {
        let rel = (a - b).abs() / a.abs();
        println!("step {}: 1 slice {a:.6}, 2 slices {b:.6}, relative difference {rel:.2e}", step + 1);
        assert!(rel <= 1e-4, "step {}: {a} vs {b}", step + 1);
    }
    assert!(one.losses[STEPS as usize - 1] < one.losses[0], "the model trains: {:?}", one.losses);

    // Four logical ranks: on one member, and spread over two. Same bits.
    let packed = run(&bundle, 4, &[0, 0, 0, 0]);
    let spread = run(&bundle, 4, &[0, 1, 1, 0]);
    // The reported loss sums each member's ranks first, so its last bits follow the placement;
    // the parameters may not.
    for (a, b) in packed.losses.iter().zip(&spread.losses) {
        assert!((a - b).abs() <= 1e-12 * a.abs(), "{a} vs {b}");
    }
    for ((name, a), (_, b)) in packed.state.iter().zip(&spread.state) {
        assert!(a == b, "{name} differs between placements");
    }
}
