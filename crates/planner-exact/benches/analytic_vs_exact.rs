//! Analytic vs exact peak bytes per device, program by program, for SFT and GRPO over several
//! models, meshes, micro-batches, remat policies and memory levers: the XLA:CPU plugin on
//! `small`, and libtpu compiling for v6e:2x4 on `qwen3-0.6b`/`qwen3-1.7b` (with seed 000's
//! candidates). Then the largest error, overall and per compiler.
//!
//! ```text
//! cargo bench -p podctl-planner-exact --bench analytic_vs_exact            # all (libtpu: long, cached)
//! cargo bench -p podctl-planner-exact --bench analytic_vs_exact -- --quick # the CPU ones only
//! cargo bench -p podctl-planner-exact --bench analytic_vs_exact -- --part 0/2 --jobs 1  # fill the
//! cargo bench -p podctl-planner-exact --bench analytic_vs_exact -- --part 1/2 --jobs 1  # cache in two
//! ```
//!
//! Bundles and compiled statistics are cached under `target/planner-cache`, so a second run
//! only recomputes the analytic side. Measured 2026-11-24 (all 21 from the cache, 0.25 s; cold,
//! the 15 libtpu configurations took 33 minutes in two processes under a load average of 3-15):
//!
//! ```text
//! relative error of the peak, analytic against exact: 21 configurations, largest +9.7%
//!   (qwen3-1.7b grpo v6e-8 (8,1) mb=64 seq=2304 remat full, attention xla), mean |error| 3.3%
//!   XLA:CPU: 6 configurations, largest -4.3% (small sft cpu-4 (2,2) mb=32 seq=256 remat none,
//!     attention xla), mean |error| 1.9%
//!   libtpu:  15 configurations, largest +9.7% (the same), mean |error| 3.8%
//! ```
//!
//! Every configuration's line is in docs/PLANNER.md ("How it is checked").

#[path = "../tests/common/mod.rs"]
mod common;

const CHILD: &str = env!("CARGO_BIN_EXE_podctl-compile-stats");

use mesh::DType;
use planner::{
    Accelerator, Attention, Candidate, GIB, Kind, Layout, Oracle, Remat, Target, Workload, estimate,
    format_bytes,
};
use planner_exact::ExactOracle;
use std::time::Instant;

struct Config {
    workload: Workload,
    accelerator: Accelerator,
    candidate: Candidate,
}

fn workload(preset: &str, kind: Kind, global_batch: u64, dtypes: (DType, DType), chunk: u64) -> Workload {
    Workload {
        model: bundle::preset(preset).unwrap(),
        kind,
        global_batch,
        param_dtype: dtypes.0,
        compute_dtype: dtypes.1,
        loss_chunk: chunk,
        lora: None,
        attention_block: 512,
    }
}

fn config(
    w: Workload,
    accelerator: Accelerator,
    (fsdp, tp): (usize, usize),
    micro_batch: u64,
    remat: Remat,
) -> Config {
    Config {
        workload: w,
        accelerator,
        candidate: Candidate::new(Layout { dcn: 1, fsdp, tp }, micro_batch, remat),
    }
}

/// `c` with other memory levers.
fn levers(mut c: Config, attention: Attention, offload: bool) -> Config {
    c.candidate.attention = attention;
    c.candidate.offload = offload;
    c
}

fn configs(quick: bool) -> Vec<Config> {
    let f32s = (DType::Float32, DType::Float32);
    let mixed = (DType::Float32, DType::Bfloat16);
    let cpu = |devices| Accelerator::cpu(devices, 64 * GIB);
    let sft = |seq_len| Kind::Sft { seq_len };
    let grpo = |prompt_len, max_new_tokens| Kind::Grpo { prompt_len, max_new_tokens, generations: 8 };
    let mut all = vec![
        config(workload("small", sft(512), 64, f32s, 64), cpu(4), (2, 2), 16, Remat::None),
        config(workload("small", sft(256), 64, f32s, 64), cpu(4), (2, 2), 32, Remat::None),
        config(workload("small", sft(1024), 64, f32s, 128), cpu(4), (4, 1), 16, Remat::Dots),
        config(workload("small", sft(512), 64, f32s, 128), cpu(4), (1, 4), 8, Remat::Full),
        config(workload("small", grpo(64, 192), 64, f32s, 64), cpu(4), (2, 2), 8, Remat::Dots),
        config(workload("small", grpo(128, 384), 64, f32s, 128), cpu(4), (4, 1), 16, Remat::Full),
    ];
    if !quick {
        let v6e = Accelerator::v6e_8;
        all.extend([
            config(workload("qwen3-0.6b", sft(1024), 64, mixed, 64), v6e(), (4, 2), 8, Remat::None),
            config(workload("qwen3-0.6b", sft(1024), 64, mixed, 64), v6e(), (4, 2), 8, Remat::Dots),
            config(workload("qwen3-0.6b", sft(1024), 64, mixed, 64), v6e(), (4, 2), 8, Remat::Full),
            config(workload("qwen3-0.6b", grpo(128, 896), 64, mixed, 64), v6e(), (4, 2), 8, Remat::Dots),
            config(workload("qwen3-1.7b", sft(2048), 64, mixed, 256), v6e(), (8, 1), 16, Remat::Dots),
            config(workload("qwen3-1.7b", grpo(256, 2048), 256, mixed, 256), v6e(), (4, 2), 16, Remat::Dots),
            config(workload("qwen3-1.7b", grpo(256, 2048), 256, mixed, 256), v6e(), (2, 4), 8, Remat::Full),
            // The candidates exact mode measured for seed 000's target (examples/plan.rs).
            config(workload("qwen3-1.7b", grpo(256, 2048), 256, mixed, 256), v6e(), (8, 1), 64, Remat::Full),
            config(workload("qwen3-1.7b", grpo(256, 2048), 256, mixed, 256), v6e(), (4, 2), 64, Remat::Full),
            config(workload("qwen3-1.7b", grpo(256, 2048), 256, mixed, 256), v6e(), (2, 4), 64, Remat::Full),
            config(workload("qwen3-1.7b", grpo(256, 2048), 256, mixed, 256), v6e(), (1, 8), 32, Remat::Full),
        ]);
        // What the seed-000 plan compiled (docs/PLANNER.md, "Seed 000, measured"): its choice,
        // the far side of its cliff, and the other levers at that micro-batch.
        let seed = || workload("qwen3-1.7b", grpo(256, 2048), 256, mixed, 256);
        all.extend([
            levers(config(seed(), v6e(), (2, 4), 64, Remat::Full), Attention::Pallas, false),
            levers(config(seed(), v6e(), (2, 4), 128, Remat::Full), Attention::Pallas, false),
            levers(config(seed(), v6e(), (2, 4), 128, Remat::Full), Attention::Pallas, true),
            levers(config(seed(), v6e(), (2, 4), 128, Remat::Full), Attention::Blockwise, true),
        ]);
    }
    all
}

fn describe(c: &Config) -> String {
    let w = &c.workload;
    format!(
        "{} {} {} {} mb={} seq={} {}",
        w.model.preset,
        w.kind_name(),
        c.accelerator.name,
        c.candidate.layout,
        c.candidate.micro_batch,
        w.seq_len(),
        c.candidate.levers()
    )
}

/// The value after `flag`, parsed.
fn flag<T: std::str::FromStr>(args: &[String], flag: &str) -> Option<T> {
    let at = args.iter().position(|a| a == flag)?;
    let value = args.get(at + 1).unwrap_or_else(|| panic!("{flag} needs a value"));
    Some(value.parse().unwrap_or_else(|_| panic!("{flag} {value} is not valid")))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--part i/n` measures every n-th configuration from the i-th (to fill the cache from
    // several processes), `--only TEXT` those whose description contains TEXT; `--jobs` caps
    // the compiles at once.
    let part: Option<String> = flag(&args, "--part");
    let (index, parts) = part.map_or((0, 1), |p| {
        let (i, n) = p.split_once('/').expect("--part i/n");
        (i.parse::<usize>().expect("--part i/n"), n.parse::<usize>().expect("--part i/n"))
    });
    let started = Instant::now();
    let only: Option<String> = flag(&args, "--only");
    let configs: Vec<Config> = configs(quick)
        .into_iter()
        .skip(index)
        .step_by(parts)
        .filter(|c| only.as_ref().is_none_or(|o| describe(c).contains(o.as_str())))
        .collect();
    let cache = common::compile_cache();
    let cpu = common::compiler(CHILD, common::cpu_plugin());
    let tpu = common::compiler(CHILD, common::libtpu());
    let parallelism = flag(&args, "--jobs").unwrap_or_else(|| planner_exact::default_parallelism(6 * GIB));
    println!(
        "{} configurations, {parallelism} compiles at a time, cache {}",
        configs.len(),
        cache.dir().display()
    );

    // Relative error of the step peak per configuration, and whether libtpu compiled it.
    let mut errors: Vec<(f64, String, bool)> = Vec::new();
    let error = |guess: u64, exact: u64| guess as f64 / exact as f64 - 1.0;
    for config in &configs {
        let target = Target::new(config.accelerator.clone(), 1);
        let tpu_config = config.accelerator.topology.is_some();
        let compiler: &dyn planner_exact::Compiler = if tpu_config { &tpu } else { &cpu };
        let exporter = common::export;
        let oracle = ExactOracle::new(&config.workload, &target, &exporter, compiler, parallelism)
            .with_cache(cache.clone());
        let t0 = Instant::now();
        let measured = oracle.measure(&[config.candidate]).remove(0);
        let analytic = estimate(&config.workload, &config.candidate, &config.accelerator);
        println!("\n{}  ({:.0} s)", describe(config), t0.elapsed().as_secs_f64());
        let measured = match measured {
            Ok(measured) => measured,
            Err(message) => {
                println!("  failed: {message}");
                continue;
            }
        };
        let mut rows: Vec<(String, u64, u64)> = measured
            .programs
            .iter()
            .map(|(program, exact)| {
                (program.clone(), analytic.program(program).map_or(0, |p| p.bytes()), *exact)
            })
            .collect();
        rows.push(("PEAK".into(), analytic.peak(), measured.peak()));
        for (program, guess, exact) in &rows {
            println!(
                "  {program:<15} analytic {:>11}  exact {:>11}  error {:+6.1}%",
                format_bytes(*guess),
                format_bytes(*exact),
                100.0 * error(*guess, *exact),
            );
        }
        if measured.compiler_out_of_memory {
            println!("  (compiler: out of memory; exact is its count of what the program needs)");
        }
        let peak_error = error(analytic.peak(), measured.peak());
        errors.push((peak_error, describe(config), tpu_config));
    }
    let summary = |tpu: Option<bool>| {
        let errors: Vec<&(f64, String, bool)> =
            errors.iter().filter(|e| tpu.is_none_or(|tpu| e.2 == tpu)).collect();
        let worst = errors.iter().max_by(|a, b| a.0.abs().total_cmp(&b.0.abs()));
        let mean = errors.iter().map(|e| e.0.abs()).sum::<f64>() / errors.len().max(1) as f64;
        match worst {
            Some((worst, name, _)) => format!(
                "{} configurations, largest {:+.1}% ({name}), mean |error| {:.1}%",
                errors.len(),
                100.0 * worst,
                100.0 * mean
            ),
            None => "none".into(),
        }
    };
    println!(
        "\n{} of {} configurations measured in {:.0} s",
        errors.len(),
        configs.len(),
        started.elapsed().as_secs_f64()
    );
    println!("relative error of the peak, analytic against exact: {}", summary(None));
    println!("  XLA:CPU: {}", summary(Some(false)));
    println!("  libtpu:  {}", summary(Some(true)));
}
