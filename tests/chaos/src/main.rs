//! `podctl-chaos`: the acceptance run of the chaos harness. Trains the job once without
//! failures, then again under a seeded schedule of failures (by default 6 of every kind), prints
//! what each failure cost, and checks every committed checkpoint and the final state against the
//! uninterrupted run. Needs root (network namespaces).
//!
//! `cargo run --release -p podctl-chaos -- --seed 1` (add `--restart-policy` to run the same
//! schedule under the restart-everything-from-a-checkpoint policy as well).
//!
//! With `--soak`, the soak instead ([`podctl_chaos::soak`]): every kind of failure, disk and
//! object store included, `--per-kind` times each (the process and network kinds twice as often),
//! e.g. `cargo run --release -p podctl-chaos -- --soak --per-kind 63` for 1,134 failures.
#![forbid(unsafe_code)]

use anyhow::{Context, Result, bail};
use podctl_chaos::schedule::Kind;
use podctl_chaos::{Harness, JobSpec, Policy, Setup, build_binaries, print_events, schedule, soak, verify};
use std::path::PathBuf;

struct Args {
    seed: u64,
    per_kind: usize,
    steps: u64,
    first: u64,
    gap: u64,
    dir: Option<PathBuf>,
    restart_policy: bool,
    soak: bool,
    serial: bool,
    keep: u32,
}

fn parse() -> Result<Args> {
    let mut args = Args {
        seed: 1,
        per_kind: 6,
        steps: 0,
        first: 10,
        gap: 9,
        dir: None,
        restart_policy: false,
        soak: false,
        serial: false,
        keep: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--seed" => args.seed = value()?.parse()?,
            "--per-kind" => args.per_kind = value()?.parse()?,
            "--steps" => args.steps = value()?.parse()?,
            "--first" => args.first = value()?.parse()?,
            "--gap" => args.gap = value()?.parse()?,
            "--dir" => args.dir = Some(PathBuf::from(value()?)),
            "--restart-policy" => args.restart_policy = true,
            "--soak" => args.soak = true,
            "--keep" => args.keep = value()?.parse()?,
            "--serial" => args.serial = true,
            "--help" | "-h" => {
                println!(
                    "podctl-chaos [--seed N] [--per-kind N] [--steps N] [--first STEP] [--gap STEPS] [--dir DIR] \
                     [--restart-policy | --soak [--keep K] [--serial]]\n  a 4-slice job under 3 coordinators; N failures of every \
                     kind (SIGTERM, SIGKILL, leader SIGKILL, network cut), the first at STEP, then every GAP steps \
                     once settled\n  --soak: two such jobs, one checkpointing to a disk the harness fills and slows, \
                     one to an S3 bucket (moto) behind a proxy that throttles, fails, drops and delays requests; N \
                     failures of each of those kinds and 2N of SIGTERM, SIGKILL, leader SIGKILL, leader hang (SIGSTOP), \
                     network cut and node restart, each job against a calm run, its checkpoints kept by `keep: K` (default 3); failures \
                     overlap (a slice fails while another rejoins, the leader or the store fails meanwhile) unless \
                     --serial"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}; see --help"),
        }
    }
    if args.steps == 0 && !args.soak {
        // Room for every event, its recovery and its join, and a tail.
        args.steps = args.first + (4 * args.per_kind as u64 + 2) * (args.gap + 4) + 20;
    }
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse()?;
    let home = std::env::var_os("PODCTL_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .canonicalize()?;
    let release = !cfg!(debug_assertions);
    let bin_dir = build_binaries(&home, release)?;
    let dir = match args.dir.clone() {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("podctl-chaos-{}", std::process::id())),
    };
    let setup = Setup {
        cache: home.join(".cache/podctl"),
        home,
        bin_dir,
        dir: dir.clone(),
        slices: 4,
        storage_faults: args.soak,
    };
    if args.soak {
        return run_soak(setup, &args);
    }
    println!(
        "podctl-chaos: seed {}, {} per kind, {} steps, files in {}",
        args.seed,
        args.per_kind,
        args.steps,
        dir.display()
    );
    let mut harness = Harness::start(setup)?;
    let spec = |name: &str| JobSpec::new(name, args.steps, 128);
    let calm = harness.run_job(&spec("calm"), &[], Policy::Elastic)?;
    println!("calm run: {} steps in {:.1}s", calm.steps, calm.wall_seconds);
    let kinds = [Kind::Preempt, Kind::Kill, Kind::LeaderKill, Kind::Cut];
    let events = schedule::by_steps(args.seed, &kinds, args.per_kind, 4, args.first, args.gap);
    let mut policies = vec![Policy::Elastic];
    if args.restart_policy {
        policies.push(Policy::RestartAll);
    }
    for policy in policies {
        let name = if policy == Policy::Elastic { "chaos" } else { "chaos-restart" };
        let chaos = harness.run_job(&spec(name), &events, policy)?;
        print_events(&chaos);
        let verified = verify(&harness, &calm, &chaos)?;
        for line in &verified.fencing {
            println!("fenced: {line}");
        }
        println!(
            "{name} ({policy:?}): completed {} steps in {:.1}s (calm {:.1}s: goodput {:.1}%); {} committed checkpoints \
             restore and equal the calm run's; final state {} is bitwise the calm run's; {} unexpected worker exits",
            chaos.steps,
            chaos.wall_seconds,
            calm.wall_seconds,
            100.0 * calm.wall_seconds / chaos.wall_seconds,
            verified.checkpoints_equal,
            &verified.final_digest[..16],
            chaos.unexpected_exits.len()
        );
    }
    Ok(())
}

fn run_soak(setup: Setup, args: &Args) -> Result<()> {
    let options = soak::Options {
        seed: args.seed,
        per_kind: args.per_kind,
        steps: args.steps,
        first: args.first,
        gap: args.gap,
        // Steps take ~0.1-0.15 s in a release build, ~0.45 s in a debug one. One failure after
        // another, each takes ~5 s; overlapping, one starts every ~2 s (~13 steps of a release
        // build measured, with 16 failures at load average 6-9). The store's faults come one at a
        // time, each 3-7 s and then a commit: at 20 steps a failure the bucket job of the
        // 1,008-failure soak ran out of steps with 507 of its 567 injected (steps of 0.12 s).
        steps_per_failure: match (cfg!(debug_assertions), args.serial) {
            (true, _) => 24,
            (false, true) => 48,
            (false, false) => 24,
        },
        keep: args.keep,
        seq_len: 128,
        time_limit: None,
        overlap: !args.serial,
    };
    let failures: usize = options.jobs().iter().map(|(_, kinds)| kinds.len() * args.per_kind).sum();
    println!(
        "podctl-chaos soak: seed {}, {failures} failures ({} of every disk and store kind, {} of the others), \
         {} steps per job, files in {}",
        args.seed,
        args.per_kind,
        2 * args.per_kind,
        options.steps(),
        setup.dir.display()
    );
    let mut harness = Harness::start(setup)?;
    let started = std::time::Instant::now();
    let soak = soak::run(&mut harness, &options)?;
    soak.print();
    println!(
        "soak wall time {:.0}s; load average {}",
        started.elapsed().as_secs_f64(),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    Ok(())
}
