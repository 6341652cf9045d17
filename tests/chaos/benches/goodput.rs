//! Goodput under a failure every ~30 s for 5 minutes, for podctl's elastic recovery and, on the
//! same schedule, for the policy of XPK and JobSet (every failure restarts every worker from the
//! last committed checkpoint), side by side. Goodput is the uninterrupted run's time for the
//! job's steps over the time the run under failures took for them (first to last committed
//! step). Beside it, the phases of the elastic run's recoveries and the seconds each cost
//! ([`podctl_chaos::phases`]). Needs root (network namespaces).
//!
//! `cargo bench -p podctl-chaos --bench goodput` (env: CHAOS_SEED, CHAOS_EVERY_SECONDS,
//! CHAOS_DURATION_SECONDS, CHAOS_STEPS, CHAOS_ELASTIC_ONLY=1, CHAOS_KEEP=1).

use podctl_chaos::{Harness, JobSpec, Policy, Setup, build_binaries, phases, print_events, schedule, verify};
use std::path::PathBuf;
use std::time::Duration;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let seed = env("CHAOS_SEED", 1);
    let every = Duration::from_secs(env("CHAOS_EVERY_SECONDS", 30));
    let duration = Duration::from_secs(env("CHAOS_DURATION_SECONDS", 300));
    let home = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize()?;
    let bin_dir = build_binaries(&home, true)?;
    let dir = std::env::temp_dir().join(format!("podctl-chaos-bench-{}", std::process::id()));
    let setup = Setup {
        cache: home.join(".cache/podctl"),
        home,
        bin_dir,
        dir: dir.clone(),
        slices: 4,
        storage_faults: false,
    };
    let mut harness = Harness::start(setup)?;
    // Long enough for the failures' duration, measured from a short calm run's step time.
    let probe = harness.run_job(&JobSpec::new("probe", 40, 256), &[], Policy::Elastic)?;
    let step_seconds = probe.wall_seconds / (probe.steps - 1) as f64;
    let steps =
        env("CHAOS_STEPS", ((duration.as_secs_f64() + every.as_secs_f64()) / step_seconds) as u64 / 10 * 10);
    let spec = |name: &str| JobSpec::new(name, steps, 256);
    println!(
        "goodput: {steps} steps of ~{step_seconds:.2}s, a failure every ~{every:?} for {duration:?}, seed {seed}"
    );
    let calm = harness.run_job(&spec("calm"), &[], Policy::Elastic)?;
    let mut run_dirs = vec![("calm (no failure)", calm.run_dir.clone())];
    let events = schedule::by_time(seed, every, duration, 4);
    let mut rows = Vec::new();
    let mut recoveries = String::new();
    // CHAOS_ELASTIC_ONLY=1: podctl's policy alone (a quicker look at its recoveries).
    let policies: &[Policy] = if env("CHAOS_ELASTIC_ONLY", 0) == 1 {
        &[Policy::Elastic]
    } else {
        &[Policy::Elastic, Policy::RestartAll]
    };
    for &policy in policies {
        let (name, label) = match policy {
            Policy::Elastic => ("elastic", "podctl elastic"),
            Policy::RestartAll => ("restart", "restart all from checkpoint"),
        };
        let run = harness.run_job(&spec(name), &events, policy)?;
        print_events(&run);
        let verified = verify(&harness, &calm, &run)?;
        if policy == Policy::Elastic {
            let (of_run, step) = phases::of_run(&run, &dir);
            let excess = [&run.run_dir, &calm.run_dir].map(|d| phases::excess(&phases::trained_steps(d)));
            recoveries = phases::render(&of_run, step, run.wall_seconds, calm.wall_seconds, excess);
        }
        let lost: u64 = run.events.iter().filter_map(|e| e.steps_lost).sum();
        run_dirs.push((label, run.run_dir.clone()));
        rows.push((label, run.events.len(), run.wall_seconds, lost, verified.checkpoints_equal));
    }
    println!("uptime: {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    println!("{:<28} {:>8} {:>10} {:>11} {:>9}", "policy", "failures", "wall", "steps lost", "goodput");
    println!("{:<28} {:>8} {:>9.1}s {:>11} {:>8.1}%", "calm (no failure)", 0, calm.wall_seconds, 0, 100.0);
    for (label, failures, wall, lost, _) in &rows {
        println!(
            "{label:<28} {failures:>8} {wall:>9.1}s {lost:>11} {:>8.1}%",
            100.0 * calm.wall_seconds / wall
        );
    }
    // Where podctl elastic's missing percent goes.
    print!("{recoveries}");
    // The wall ratio holds the machine's drift between runs: a shared VM's pace moves by several
    // percent within minutes. Each run's own pace says how far.
    // Beyond the median: each generation's first steps (settling) and the rest (steady), signed.
    println!(
        "{:<28} {:>12} {:>26} {:>24} {:>22}",
        "run", "median step", "share of wall at that pace", "settling (generations)", "steady (per step)"
    );
    for (name, run_dir) in &run_dirs {
        let (step, share) = phases::pace(run_dir);
        let e = phases::excess(&phases::trained_steps(run_dir));
        println!(
            "{name:<28} {step:>11.4}s {:>25.1}% {:>14.2}s ({:>3}) {:>11.2}s ({:>+6.1}ms)",
            100.0 * share,
            e.settling,
            e.generations,
            e.steady,
            1e3 * e.steady / e.steady_steps.max(1) as f64
        );
    }
    // CHAOS_KEEP=1 keeps the logs (workers', nodes') for a look.
    if env("CHAOS_KEEP", 0) == 1 {
        println!("logs kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
