//! Goodput under a failure every ~30 s for 5 minutes, for podctl's elastic recovery and, on the
//! same schedule, for the policy of XPK and JobSet (every failure restarts every worker from the
//! last committed checkpoint), side by side. Goodput is the uninterrupted run's time for the
//! job's steps over the time the run under failures took for them (first to last committed
//! step). Beside it, the phases of the elastic run's recoveries and the seconds each cost
//! ([`podctl_chaos::phases`]). Needs root (network namespaces).
//!
//! Paired (the default on 2 or more CPUs): each run under failures trains at the same time as
//! its own calm run, each with its own cluster and network, pinned to a CPU of its own. A shared
//! VM's pace drifts by ~10% between two 5-minute runs, more than the goodput to be measured;
//! side by side, the drift reaches both runs alike. `CHAOS_PAIRED=0` runs them one after the
//! other on every CPU instead.
//!
//! `cargo bench -p podctl-chaos --bench goodput` (env: CHAOS_SEED, CHAOS_EVERY_SECONDS,
//! CHAOS_DURATION_SECONDS, CHAOS_STEPS, CHAOS_ELASTIC_ONLY=1, CHAOS_PAIRED=0, CHAOS_KEEP=1).

use anyhow::{Context, Result};
use podctl_chaos::procs::pin_to_cpu;
use podctl_chaos::schedule::Event;
use podctl_chaos::{
    Harness, JobRun, JobSpec, Policy, Setup, build_binaries, phases, print_events, schedule, verify,
};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What the bench runs, the same in both modes.
#[derive(Clone)]
struct Plan {
    home: PathBuf,
    bin_dir: PathBuf,
    seed: u64,
    every: Duration,
    duration: Duration,
    policies: Vec<Policy>,
}

impl Plan {
    fn setup(&self, dir: PathBuf) -> Setup {
        Setup {
            cache: self.home.join(".cache/podctl"),
            home: self.home.clone(),
            bin_dir: self.bin_dir.clone(),
            dir,
            slices: 4,
            storage_faults: false,
        }
    }

    /// Steps enough for the failures' duration, from a short calm run's step time.
    fn steps(&self, harness: &mut Harness) -> Result<u64> {
        let probe = harness.run_job(&JobSpec::new("probe", 40, 256), &[], Policy::Elastic)?;
        let step_seconds = probe.wall_seconds / (probe.steps - 1) as f64;
        let steps = env(
            "CHAOS_STEPS",
            ((self.duration.as_secs_f64() + self.every.as_secs_f64()) / step_seconds) as u64 / 10 * 10,
        );
        println!(
            "goodput: {steps} steps of ~{step_seconds:.2}s, a failure every ~{:?} for {:?}, seed {}",
            self.every, self.duration, self.seed
        );
        Ok(steps)
    }

    fn events(&self) -> Vec<Event> {
        schedule::by_time(self.seed, self.every, self.duration, 4)
    }
}

fn label(policy: Policy) -> (&'static str, &'static str) {
    match policy {
        Policy::Elastic => ("elastic", "podctl elastic"),
        Policy::RestartAll => ("restart", "restart all from checkpoint"),
    }
}

/// One run under failures against its calm run.
struct Row {
    label: &'static str,
    run: JobRun,
    calm: JobRun,
    /// For the elastic run: where its missing seconds went.
    recoveries: String,
}

/// Checks `run` against `calm` and, for the elastic policy, places its missing seconds.
fn row(harness: &Harness, policy: Policy, run: JobRun, calm: JobRun) -> Result<Row> {
    print_events(&run);
    verify(harness, &calm, &run)?;
    let mut recoveries = String::new();
    if policy == Policy::Elastic {
        let (of_run, step) = phases::of_run(&run, &harness.setup().dir);
        let excess = [&run.run_dir, &calm.run_dir].map(|d| phases::excess(&phases::trained_steps(d)));
        recoveries = phases::render(&of_run, step, run.wall_seconds, calm.wall_seconds, excess);
    }
    Ok(Row { label: label(policy).1, run, calm, recoveries })
}

/// Every run one after the other on all CPUs, against one calm run.
fn sequential(plan: &Plan, dir: &Path) -> Result<Vec<Row>> {
    let mut harness = Harness::start(plan.setup(dir.to_path_buf()))?;
    let steps = plan.steps(&mut harness)?;
    let calm = harness.run_job(&JobSpec::new("calm", steps, 256), &[], Policy::Elastic)?;
    let events = plan.events();
    let mut rows = Vec::new();
    for &policy in &plan.policies {
        let run = harness.run_job(&JobSpec::new(label(policy).0, steps, 256), &events, policy)?;
        rows.push(row(&harness, policy, run, calm.clone())?);
    }
    Ok(rows)
}

/// Each run under failures beside a calm run of its own: two harnesses on two threads, each
/// pinned (with every process it starts) to a CPU of its own.
fn paired(plan: &Plan, dir: &Path) -> Result<Vec<Row>> {
    let (steps_tx, steps_rx) = mpsc::channel::<u64>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (calm_tx, calm_rx) = mpsc::channel::<JobRun>();
    let pairs = plan.policies.len();
    std::thread::scope(|scope| {
        let calm_side = scope.spawn(move || -> Result<()> {
            pin_to_cpu(0)?;
            let mut harness = Harness::start(plan.setup(dir.join("calm")))?;
            let steps = plan.steps(&mut harness)?;
            steps_tx.send(steps)?;
            for pair in 0..pairs {
                go_rx.recv().context("the failing side ended")?;
                let calm = harness.run_job(
                    &JobSpec::new(&format!("calm{pair}"), steps, 256),
                    &[],
                    Policy::Elastic,
                )?;
                calm_tx.send(calm)?;
            }
            Ok(())
        });
        let failing_side = scope.spawn(move || -> Result<Vec<Row>> {
            pin_to_cpu(1)?;
            let mut harness = Harness::start(plan.setup(dir.join("failing")))?;
            let steps = steps_rx.recv().context("the calm side ended before its probe")?;
            let events = plan.events();
            let mut rows = Vec::new();
            for &policy in &plan.policies {
                go_tx.send(())?;
                let run = harness.run_job(&JobSpec::new(label(policy).0, steps, 256), &events, policy)?;
                let calm = calm_rx.recv().context("the calm side ended")?;
                rows.push(row(&harness, policy, run, calm)?);
            }
            Ok(rows)
        });
        let rows = failing_side.join().expect("the failing side panicked");
        // Its channels closed, the calm side ends too; an error of the failing side's comes first.
        let calm = calm_side.join().expect("the calm side panicked");
        let rows = rows?;
        calm?;
        Ok(rows)
    })
}

fn main() -> Result<()> {
    let home = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize()?;
    let bin_dir = build_binaries(&home, true)?;
    // CHAOS_ELASTIC_ONLY=1: podctl's policy alone (a quicker look at its recoveries).
    let policies = if env("CHAOS_ELASTIC_ONLY", 0) == 1 {
        vec![Policy::Elastic]
    } else {
        vec![Policy::Elastic, Policy::RestartAll]
    };
    let plan = Plan {
        home,
        bin_dir,
        seed: env("CHAOS_SEED", 1),
        every: Duration::from_secs(env("CHAOS_EVERY_SECONDS", 30)),
        duration: Duration::from_secs(env("CHAOS_DURATION_SECONDS", 300)),
        policies,
    };
    let dir = std::env::temp_dir().join(format!("podctl-chaos-bench-{}", std::process::id()));
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let pair = env("CHAOS_PAIRED", 1) == 1 && cpus >= 2;
    if pair {
        println!("goodput: paired, each run under failures beside its own calm run, one CPU each");
    } else {
        println!("goodput: one run after the other on {cpus} CPUs");
    }
    let rows = if pair { paired(&plan, &dir)? } else { sequential(&plan, &dir)? };

    println!("uptime: {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    println!(
        "{:<28} {:>8} {:>10} {:>10} {:>11} {:>9}",
        "policy", "failures", "wall", "calm wall", "steps lost", "goodput"
    );
    for Row { label, run, calm, .. } in &rows {
        let lost: u64 = run.events.iter().filter_map(|e| e.steps_lost).sum();
        println!(
            "{label:<28} {:>8} {:>9.1}s {:>9.1}s {lost:>11} {:>8.1}%",
            run.events.len(),
            run.wall_seconds,
            calm.wall_seconds,
            100.0 * calm.wall_seconds / run.wall_seconds
        );
    }
    // Where podctl elastic's missing percent goes.
    for row in &rows {
        print!("{}", row.recoveries);
    }
    // Each run's own pace: how much of the wall ratio is the machine's drift (large when the runs
    // are one after the other). Beyond the median: each generation's first steps (settling) and
    // the rest (steady), signed.
    println!(
        "{:<28} {:>12} {:>26} {:>24} {:>22}",
        "run", "median step", "share of wall at that pace", "settling (generations)", "steady (per step)"
    );
    for Row { label, run, calm, .. } in &rows {
        for (name, run_dir) in [(format!("{label}: calm"), &calm.run_dir), (label.to_string(), &run.run_dir)]
        {
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
    }
    // CHAOS_KEEP=1 keeps the logs (workers', nodes') for a look.
    if env("CHAOS_KEEP", 0) == 1 {
        println!("logs kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
