//! Local launches of several slices: an embedded coordinator and one worker process per slice,
//! through the real `podctl` binary and the CPU PJRT plugin. Data parallelism across slices
//! keeps the math of one slice, reruns are bitwise identical, preempted or killed workers
//! change nothing in the parameters, and a job of several slices keeps exactly `checkpoint.keep`
//! of its own checkpoints.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{committed_listed, podctl};

/// A job of `dcn` slices of 4 CPU devices, the same global batch whatever `dcn` is, saving a
/// checkpoint every `every` steps and after the last.
fn job(dir: &Path, name: &str, dcn: u64, ici: &str, steps: u64, every: u64) -> PathBuf {
    let run = dir.join(name);
    let spec = format!(
        "name: {name}\nmodel: tiny\nmesh: {{ dcn: {dcn}, ici: {{ {ici} }} }}\n\
         batch: {{ global: 16, micro: 4 }}\nseq_len: 128\nsteps: {steps}\nseed: 3\n\
         optimizer: {{ lr: 3.0e-3, warmup_steps: 5 }}\ndata: {{ kind: arithmetic }}\n\
         checkpoint: {{ every: {every}, keep: 3 }}\noutput: {}\n",
        run.display()
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, spec).unwrap();
    path
}

fn start(spec: &Path) -> Child {
    podctl().arg("launch").arg(spec).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

fn finish(child: Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
}

fn launch(spec: &Path) {
    finish(start(spec), &spec.display().to_string());
}

fn run_dir(spec: &Path) -> PathBuf {
    spec.with_extension("")
}

fn jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Per-step loss from the run's `metrics.jsonl`.
fn losses(spec: &Path) -> Vec<f64> {
    jsonl(&run_dir(spec).join("metrics.jsonl")).iter().map(|l| l["loss"].as_f64().unwrap()).collect()
}

/// `podctl ckpt digest` of the final checkpoint: one hash of the whole state.
fn final_digest(spec: &Path, steps: u64) -> String {
    let root = run_dir(spec).join("checkpoints");
    let dir = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{steps:012}-")))
        .unwrap_or_else(|| panic!("no checkpoint of step {steps} under {}", root.display()));
    let out = podctl().args(["ckpt", "digest"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines().last().unwrap().split_whitespace().next().unwrap().to_string()
}

#[test]
fn slices_keep_the_math_of_one_slice_and_reruns_are_bitwise() {
    const STEPS: u64 = 50;
    let dir = tempfile::tempdir().unwrap();
    let ici = "fsdp: 2, tp: 2";
    let one = job(dir.path(), "one", 1, ici, STEPS, STEPS);
    let two = job(dir.path(), "two", 2, ici, STEPS, STEPS);
    let four = job(dir.path(), "four", 4, ici, STEPS, STEPS);
    let again = job(dir.path(), "two-again", 2, ici, STEPS, STEPS);
    for spec in [&one, &two, &four, &again] {
        let started = Instant::now();
        launch(spec);
        println!("{}: {:.1}s", spec.display(), started.elapsed().as_secs_f64());
    }
    let reference = losses(&one);
    assert_eq!(reference.len(), STEPS as usize);
    for spec in [&two, &four] {
        let other = losses(spec);
        assert_eq!(other.len(), STEPS as usize, "{}", spec.display());
        let worst = reference.iter().zip(&other).map(|(a, b)| (a - b).abs() / a.abs()).fold(0.0f64, f64::max);
        println!(
            "{}: largest relative loss difference to one slice over {STEPS} steps: {worst:.2e}",
            spec.display()
        );
        assert!(worst <= 1e-4, "{}: {worst:e}", spec.display());
    }
    assert!(reference[STEPS as usize - 1] < reference[0] * 0.7, "the model trains: {reference:?}");
    assert_eq!(losses(&two), losses(&again));
    assert_eq!(final_digest(&two, STEPS), final_digest(&again, STEPS), "two runs of one job differ");
}

fn pid_of(spec: &Path, slice: u32) -> Option<i32> {
    let path = run_dir(spec).join(format!("workers/slice-{slice}.pid"));
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn committed_steps(spec: &Path) -> usize {
    jsonl(&run_dir(spec).join("metrics.jsonl")).len()
}

fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn signal(pid: i32, signal: &str) {
    let status = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

#[test]
fn preempted_and_killed_workers_change_nothing_in_the_parameters() {
    const STEPS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let ici = "fsdp: 2, tp: 1";
    let calm = job(dir.path(), "calm", 2, ici, STEPS, 5);
    let chaos = job(dir.path(), "chaos", 2, ici, STEPS, 5);
    launch(&calm);

    let child = start(&chaos);
    let limit = Duration::from_secs(300);
    wait_for("step 8", limit, || committed_steps(&chaos) >= 8);
    // A spot preemption: SIGTERM, the notice goes to the coordinator at once.
    let first = pid_of(&chaos, 1).unwrap();
    signal(first, "TERM");
    let at = committed_steps(&chaos);
    wait_for("the replacement of slice 1", limit, || pid_of(&chaos, 1).is_some_and(|p| p != first));
    wait_for("5 more steps", limit, || committed_steps(&chaos) >= at + 5);
    // A silent loss: SIGKILL, found by the lease.
    let second = pid_of(&chaos, 0).unwrap();
    signal(second, "KILL");
    let at = committed_steps(&chaos);
    wait_for("the replacement of slice 0", limit, || pid_of(&chaos, 0).is_some_and(|p| p != second));
    wait_for("5 more steps", limit, || committed_steps(&chaos) >= at + 5);
    // A checkpoint newer than the failures, so that the restart below has one to restore.
    let checkpoint_after = |step: usize| {
        jsonl(&run_dir(&chaos).join("events.jsonl"))
            .iter()
            .filter(|e| e["kind"] == "checkpoint")
            .filter_map(|e| e["step"].as_u64())
            .any(|s| s as usize > step)
    };
    wait_for("a checkpoint after the failures", limit, || checkpoint_after(at));
    // Total loss: every worker at once. The launcher starts new ones, which restore the last
    // committed checkpoint; the steps after it are computed again, to the same bits.
    let pids: Vec<i32> = (0..2).map(|s| pid_of(&chaos, s).unwrap()).collect();
    let total_loss_at = committed_steps(&chaos) as u64;
    for &pid in &pids {
        signal(pid, "KILL");
    }
    wait_for("both replacements", limit, || {
        (0..2).all(|s| pid_of(&chaos, s).is_some_and(|p| !pids.contains(&p)))
    });
    finish(child, "the chaos run");

    // A step computed again after the restore is recorded again: compare each step's last line.
    // A step carried into a new generation (a survivor finished it, but a member died before
    // reporting it) is committed with the reports that came: fewer reporters than members, and
    // a partial loss or none. Members are at most a step apart, so each of the three failures
    // carries at most two such steps.
    let mut by_step = std::collections::BTreeMap::new();
    let mut incomplete = std::collections::BTreeSet::new();
    for line in jsonl(&run_dir(&chaos).join("metrics.jsonl")) {
        let step = line["step"].as_u64().unwrap();
        if line["reporters"] == line["members"] {
            by_step.insert(step, line["loss"].as_f64().unwrap());
        } else {
            incomplete.insert(step);
        }
    }
    println!("steps carried with a member's report missing: {incomplete:?}");
    assert!(incomplete.len() <= 6, "{incomplete:?}");
    assert!((1..=STEPS).all(|s| by_step.contains_key(&s) || incomplete.contains(&s)), "a step has no line");
    // The reported loss sums each worker's ranks first, so its last bits may follow the
    // placement; the parameters (the digest below) may not.
    let calm_losses = losses(&calm);
    assert_eq!(calm_losses.len() as u64, STEPS);
    for (step, a) in &by_step {
        let b = calm_losses[*step as usize - 1];
        assert!((a - b).abs() <= 1e-12 * b.abs(), "step {step}: {a} vs {b}");
    }
    assert_eq!(final_digest(&calm, STEPS), final_digest(&chaos, STEPS), "the final states differ");
    let events = jsonl(&run_dir(&chaos).join("events.jsonl"));
    for e in &events {
        println!("event at step {}: {} {}", e["step"], e["kind"], e["detail"]);
    }
    let generations: Vec<_> = events.iter().filter(|e| e["kind"] == "generation").collect();
    assert!(generations.len() >= 4, "a generation for the start and for each failure: {generations:?}");
    // What an operator reads afterwards: each failure, how long until the job re-formed, and
    // how many committed steps it cost. The SIGKILL is found by its lease or, sooner, by a
    // peer whose all-reduce broke off; which comes first depends on timing.
    let reasons: Vec<String> = events
        .iter()
        .filter(|e| ["preemption", "lease_expired", "recovery"].contains(&e["kind"].as_str().unwrap()))
        .map(|e| e["detail"]["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(reasons.iter().any(|r| r.contains("preempted")), "no preemption in events.jsonl: {reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("lease expired") || r.contains("named lost")),
        "no silent loss found in events.jsonl: {reasons:?}"
    );
    for (i, failure) in events.iter().enumerate() {
        let kind = failure["kind"].as_str().unwrap();
        if !["preemption", "lease_expired", "recovery"].contains(&kind) {
            continue;
        }
        let next = events[i..].iter().find(|e| e["kind"] == "generation").expect("a generation follows");
        println!(
            "{kind} at step {}: re-formed after {:.2}s from step {} ({} steps lost)",
            failure["step"],
            next["t"].as_f64().unwrap() - failure["t"].as_f64().unwrap(),
            next["detail"]["start_step"],
            failure["step"].as_u64().unwrap().saturating_sub(next["detail"]["start_step"].as_u64().unwrap())
        );
    }
    for plot in ["loss.png", "step_time.png", "timeline.png"] {
        assert!(run_dir(&chaos).join(plot).exists(), "no {plot} in the run directory");
    }
    // Retention under the embedded coordinator: 8 saves, `keep: 3`, whether the saves came from
    // one generation (calm: all under one save id) or from several, a total loss among them.
    for spec in [&calm, &chaos] {
        let listed = committed_listed(&run_dir(spec).join("checkpoints"));
        assert_eq!(listed, vec![30, 35, 40], "{}: `podctl ckpt list` shows {listed:?}", spec.display());
    }
    // After the total loss the job re-formed from a checkpoint (a replacement that joins later
    // may form further generations from a live peer, at any step).
    let restored = generations.iter().any(|g| {
        let start = g["detail"]["start_step"].as_u64().unwrap();
        g["step"].as_u64().unwrap() >= total_loss_at && start > 0 && start % 5 == 0
    });
    assert!(restored, "no generation after step {total_loss_at} resumed from a checkpoint: {generations:?}");
}
