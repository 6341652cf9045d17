//! `podctl plan` without the CLI: plans a workload analytically and, with `--exact`, by
//! exporting and compiling candidates (the project's Python exporter, this example running
//! itself as the compile child). Prints the table, the choice and the wall time.
//!
//! ```text
//! # seed 000's target: Qwen3-1.7B GRPO on one v6e-8, 32 prompts x 8 generations,
//! # prompts up to 256 tokens, up to 2048 generated
//! cargo run -p podctl-planner-exact --release --example plan -- --model qwen3-1.7b --grpo \
//!     --prompts 32 --generations 8 --prompt-len 256 --max-new-tokens 2048 --exact
//! # two v6e-8 hosts
//! cargo run -p podctl-planner-exact --release --example plan -- --model qwen3-1.7b --grpo --slices 2
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use mesh::DType;
use planner::{Accelerator, GIB, Kind, PlanOptions, Target, Workload, format_bytes, render_plan};
use planner_exact::{ExactOracle, ProcessCompiler, Progress};
use std::process::ExitCode;
use std::time::Instant;

const CHILD: &str = "--compile-child";

struct Args {
    model: String,
    grpo: bool,
    seq_len: u64,
    global_batch: u64,
    prompts: u64,
    generations: u64,
    prompt_len: u64,
    max_new_tokens: u64,
    chunk: u64,
    accelerator: String,
    cpu_limit: u64,
    slices: usize,
    exact: bool,
    every_mesh: bool,
    all: bool,
    param_dtype: DType,
    compute_dtype: DType,
}

fn dtype(text: &str) -> Result<DType, String> {
    match text {
        "float32" => Ok(DType::Float32),
        "bfloat16" => Ok(DType::Bfloat16),
        other => Err(format!("dtype {other} is not float32 or bfloat16")),
    }
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        model: "qwen3-1.7b".into(),
        grpo: false,
        seq_len: 2048,
        global_batch: 64,
        prompts: 32,
        generations: 8,
        prompt_len: 256,
        max_new_tokens: 2048,
        chunk: 256,
        accelerator: "v6e-8".into(),
        cpu_limit: 4 * GIB,
        slices: 1,
        exact: false,
        every_mesh: false,
        all: false,
        param_dtype: DType::Float32,
        compute_dtype: DType::Bfloat16,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |text: String| text.parse::<u64>().map_err(|_| format!("{text} is not a number"));
        match flag.as_str() {
            "--model" => a.model = value()?,
            "--grpo" => a.grpo = true,
            "--seq-len" => a.seq_len = number(value()?)?,
            "--global-batch" => a.global_batch = number(value()?)?,
            "--prompts" => a.prompts = number(value()?)?,
            "--generations" => a.generations = number(value()?)?,
            "--prompt-len" => a.prompt_len = number(value()?)?,
            "--max-new-tokens" => a.max_new_tokens = number(value()?)?,
            "--chunk" => a.chunk = number(value()?)?,
            "--accelerator" => a.accelerator = value()?,
            "--cpu-limit-mib" => a.cpu_limit = number(value()?)? << 20,
            "--slices" => a.slices = number(value()?)? as usize,
            "--param-dtype" => a.param_dtype = dtype(&value()?)?,
            "--compute-dtype" => a.compute_dtype = dtype(&value()?)?,
            "--exact" => a.exact = true,
            "--every-mesh" => a.every_mesh = true,
            "--all" => a.all = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn run(args: Args) -> Result<(), String> {
    let started = Instant::now();
    let model = bundle::preset(&args.model)?;
    let (kind, global_batch) = if args.grpo {
        let kind = Kind::Grpo {
            prompt_len: args.prompt_len,
            max_new_tokens: args.max_new_tokens,
            generations: args.generations,
        };
        (kind, args.prompts * args.generations)
    } else {
        (Kind::Sft { seq_len: args.seq_len }, args.global_batch)
    };
    let workload = Workload {
        model,
        kind,
        global_batch,
        param_dtype: args.param_dtype,
        compute_dtype: args.compute_dtype,
        loss_chunk: args.chunk,
        lora: None,
        attention_block: 512,
    };
    let accelerator = Accelerator::parse(&args.accelerator, args.cpu_limit).map_err(|e| e.to_string())?;
    let plugin = if accelerator.topology.is_some() { common::libtpu() } else { common::cpu_plugin() };
    let target = Target::new(accelerator, args.slices);
    let options = PlanOptions { every_layout: args.every_mesh, ..PlanOptions::default() };
    let plan = if args.exact {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let compiler = ProcessCompiler::new(exe, vec![CHILD.to_string()], plugin);
        let exporter = common::export;
        let progress = |event: &Progress| match event {
            Progress::Exporting(c) => eprintln!("[{:6.1} s] export  {c}", started.elapsed().as_secs_f64()),
            Progress::Compiling { candidate, program } => {
                eprintln!("[{:6.1} s] compile {candidate} {program}", started.elapsed().as_secs_f64())
            }
            Progress::Compiled { candidate, program, bytes, seconds } => eprintln!(
                "[{:6.1} s] done    {candidate} {program}: {} in {seconds:.0} s",
                started.elapsed().as_secs_f64(),
                format_bytes(*bytes)
            ),
        };
        let parallelism = planner_exact::default_parallelism(6 * GIB);
        let oracle = ExactOracle::new(&workload, &target, &exporter, &compiler, parallelism)
            .with_cache(common::compile_cache())
            .with_progress(&progress);
        let plan = planner::plan(&workload, &target, &options, Some(&oracle)).map_err(|e| e.to_string())?;
        let stats = oracle.stats();
        println!(
            "exact: {} bundles, {} compiles ({:.0} s of compiling, {parallelism} at a time), {} from the cache",
            stats.bundles, stats.compiles, stats.compile_seconds, stats.cached
        );
        plan
    } else {
        planner::plan_analytic(&workload, &target, &options).map_err(|e| e.to_string())?
    };
    print!("{}", render_plan(&plan, args.all));
    println!("wall time {:.2} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn main() -> ExitCode {
    common::example_main(CHILD, |args| parse(args).and_then(run))
}
