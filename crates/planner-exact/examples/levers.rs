//! What each memory lever buys, exactly: Qwen3-1.7B SFT on one v6e-8 at 2048 tokens, libtpu
//! compiles for `v6e:2x4` on this CPU-only machine. For each lever setting (attention xla,
//! blockwise or Pallas; full fine-tuning or LoRA rank 64 on every projection; AdamW state on
//! the chips or offloaded to host memory) it prints the step's exact peak per chip at one
//! micro-batch, the saving against plain attention with full fine-tuning and no offload, and the
//! memory cliff of the mesh: the largest micro-batch that fits and the next one, with both
//! margins, found by exact compiles (the planner's own cliff search, steered by its analytic
//! model). The analytic estimate is printed beside every exact number.
//!
//! ```text
//! cargo run -p podctl-planner-exact --release --example levers            # minutes per compile, cached
//! cargo run -p podctl-planner-exact --release --example levers -- --mesh 2,4 --micro-batch 32 --seq-len 4096
//! cargo run -p podctl-planner-exact --release --example levers -- --only xla,pallas+lora --cliffs pallas+lora
//! ```
//!
//! `--only` picks settings, `--cliffs` the settings whose cliff is searched (default: all; the
//! search compiles the micro-batches around each cliff, two minutes to ten per compile),
//! `--jobs` the compiles at once (default 2).
//!
//! Bundles and compiled statistics are cached under `target/planner-cache` (`PLANNER_CACHE`),
//! so a second run reprints the table from the cache in seconds.

#[path = "../tests/common/mod.rs"]
mod common;

use mesh::DType;
use planner::{
    Accelerator, Attention, Candidate, GIB, Kind, Layout, LoraShape, Oracle, PlanOptions, Remat, Target,
    Workload, estimate, format_bytes,
};
use planner_exact::{ExactOracle, ProcessCompiler, Progress};
use std::process::ExitCode;
use std::time::Instant;

const CHILD: &str = "--compile-child";

struct Args {
    layout: Layout,
    micro_batch: u64,
    seq_len: u64,
    global_batch: u64,
    remat: Remat,
    only: Option<Vec<String>>,
    cliffs: Option<Vec<String>>,
    jobs: usize,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        layout: Layout { dcn: 1, fsdp: 4, tp: 2 },
        micro_batch: 16,
        seq_len: 2048,
        global_batch: 256,
        remat: Remat::Dots,
        only: None,
        cliffs: None,
        jobs: 2,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |text: String| text.parse::<u64>().map_err(|_| format!("{text} is not a number"));
        match flag.as_str() {
            "--mesh" => {
                let text = value()?;
                let (f, t) = text.split_once(',').ok_or(format!("--mesh {text}: write fsdp,tp e.g. 4,2"))?;
                a.layout =
                    Layout { dcn: 1, fsdp: number(f.into())? as usize, tp: number(t.into())? as usize };
            }
            "--micro-batch" => a.micro_batch = number(value()?)?,
            "--seq-len" => a.seq_len = number(value()?)?,
            "--global-batch" => a.global_batch = number(value()?)?,
            "--remat" => a.remat = Remat::parse(&value()?).map_err(|e| e.to_string())?,
            "--only" => a.only = Some(value()?.split(',').map(String::from).collect()),
            "--jobs" => a.jobs = number(value()?)?.max(1) as usize,
            "--cliffs" => a.cliffs = Some(value()?.split(',').map(String::from).collect()),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// One lever setting: a name, LoRA or not, the attention and offload.
struct Setting {
    name: &'static str,
    lora: bool,
    attention: Attention,
    offload: bool,
}

const SETTINGS: [Setting; 8] = [
    Setting { name: "xla", lora: false, attention: Attention::Xla, offload: false },
    Setting { name: "blockwise", lora: false, attention: Attention::Blockwise, offload: false },
    Setting { name: "pallas", lora: false, attention: Attention::Pallas, offload: false },
    Setting { name: "xla+offload", lora: false, attention: Attention::Xla, offload: true },
    Setting { name: "xla+lora", lora: true, attention: Attention::Xla, offload: false },
    Setting { name: "blockwise+lora", lora: true, attention: Attention::Blockwise, offload: false },
    Setting { name: "pallas+lora", lora: true, attention: Attention::Pallas, offload: false },
    Setting { name: "pallas+lora+offload", lora: true, attention: Attention::Pallas, offload: true },
];

fn workload(args: &Args, lora: bool) -> Workload {
    Workload {
        model: bundle::preset("qwen3-1.7b").expect("a preset"),
        kind: Kind::Sft { seq_len: args.seq_len },
        global_batch: args.global_batch,
        param_dtype: DType::Float32,
        compute_dtype: DType::Bfloat16,
        loss_chunk: 256,
        lora: lora.then(|| LoraShape {
            rank: 64,
            targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
                .map(String::from)
                .to_vec(),
            base_dtype: DType::Bfloat16,
        }),
        attention_block: 512,
    }
}

/// A side of the cliff as printed: `mb (exact, margin; analytic)`.
fn side(side: Option<planner::CliffSide>, analytic: impl Fn(u64) -> u64) -> String {
    match side {
        Some(s) => format!(
            "{} ({} {}; analytic {})",
            s.micro_batch,
            format_bytes(s.peak),
            if s.margin >= 0 {
                format!("{} spare", format_bytes(s.margin))
            } else {
                format!("over by {}", format_bytes(-s.margin))
            },
            format_bytes(analytic(s.micro_batch))
        ),
        None => "-".into(),
    }
}

fn run(args: Args) -> Result<(), String> {
    let started = Instant::now();
    let target = Target::new(Accelerator::v6e_8(), 1);
    let limit = target.accelerator.memory_limit;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let compiler = ProcessCompiler::new(exe, vec![CHILD.to_string()], common::libtpu());
    let exporter = common::export;
    let progress = |event: &Progress| {
        if let Progress::Compiled { candidate, program, bytes, seconds } = event {
            eprintln!(
                "[{:6.0} s] compiled {candidate} {program}: {} in {seconds:.0} s (load {})",
                started.elapsed().as_secs_f64(),
                format_bytes(*bytes),
                std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split(' ').next().unwrap_or("?")
            );
        }
    };
    let parallelism = planner_exact::default_parallelism(6 * GIB).min(args.jobs);
    let settings: Vec<&Setting> = SETTINGS
        .iter()
        .filter(|s| args.only.as_ref().is_none_or(|only| only.iter().any(|o| o == s.name)))
        .collect();

    struct Line {
        name: &'static str,
        exact: Option<u64>,
        analytic: u64,
        cliff: Option<planner::Cliff>,
        analytic_at: Box<dyn Fn(u64) -> u64>,
    }
    let at = |s: &Setting| Candidate {
        attention: s.attention,
        offload: s.offload,
        ..Candidate::new(args.layout, args.micro_batch, args.remat)
    };
    // Every setting's peak at the given micro-batch, one batch per workload (full fine-tuning,
    // LoRA): the compiles run in parallel, and identical modules (offload does not change
    // grad_step) compile once.
    let mut exact_at: Vec<Option<u64>> = vec![None; settings.len()];
    let mut compiles = 0;
    for lora in [false, true] {
        let ids: Vec<usize> = (0..settings.len()).filter(|&i| settings[i].lora == lora).collect();
        if ids.is_empty() {
            continue;
        }
        let w = workload(&args, lora);
        let oracle = ExactOracle::new(&w, &target, &exporter, &compiler, parallelism)
            .with_cache(common::compile_cache())
            .with_progress(&progress);
        let candidates: Vec<Candidate> = ids.iter().map(|&i| at(settings[i])).collect();
        for (&i, result) in ids.iter().zip(oracle.measure(&candidates)) {
            exact_at[i] = result.map(|m| m.peak()).map_err(|e| eprintln!("{}: {e}", settings[i].name)).ok();
        }
        compiles += oracle.stats().compiles;
    }

    let mut lines = Vec::new();
    for (s, exact) in settings.iter().zip(exact_at) {
        let w = workload(&args, s.lora);
        let oracle = ExactOracle::new(&w, &target, &exporter, &compiler, parallelism)
            .with_cache(common::compile_cache())
            .with_progress(&progress);
        let at = at(s);
        let options = PlanOptions {
            layouts: Some(vec![args.layout]),
            remats: vec![args.remat],
            attentions: vec![s.attention],
            offloads: vec![s.offload],
            ..PlanOptions::default()
        };
        let cliff = if args.cliffs.as_ref().is_none_or(|c| c.iter().any(|c| c == s.name)) {
            let plan = planner::plan(&w, &target, &options, Some(&oracle))
                .map_err(|e| format!("{}: {e}", s.name))?;
            compiles += oracle.stats().compiles;
            plan.cliff
        } else {
            None
        };
        let acc = target.accelerator.clone();
        let (w2, base) = (w.clone(), at);
        lines.push(Line {
            name: s.name,
            exact,
            analytic: estimate(&w, &at, &target.accelerator).peak(),
            cliff,
            analytic_at: Box::new(move |mb| {
                estimate(&w2, &Candidate { micro_batch: mb, ..base }, &acc).peak()
            }),
        });
    }

    println!(
        "qwen3-1.7b SFT, {} tokens, mesh {} on v6e-8 (limit {} per chip), remat {}, f32 params + AdamW, bf16 compute;\n\
         LoRA rank 64 on all seven projections with a bf16 base; offload = AdamW state in host memory",
        args.seq_len,
        args.layout,
        format_bytes(limit),
        args.remat
    );
    let plain = lines.iter().find(|l| l.name == "xla").and_then(|l| l.exact);
    println!(
        "{:<20} {:>22} {:>13}   {:<52} next, which does not",
        "setting",
        format!("peak @ mb {} (analytic)", args.micro_batch),
        "saving",
        "largest micro-batch that fits (exact peak; analytic)",
    );
    for l in &lines {
        let peak = match l.exact {
            Some(p) => format!("{} ({})", format_bytes(p), format_bytes(l.analytic)),
            None => format!("- ({})", format_bytes(l.analytic)),
        };
        let saving = match (plain, l.exact) {
            (Some(p), Some(e)) if l.name != "xla" => format_bytes(p as i128 - e as i128),
            _ => "-".into(),
        };
        let (fits, next) = match &l.cliff {
            Some(c) => (side(c.fits, &l.analytic_at), side(c.next, &l.analytic_at)),
            None => ("-".into(), "-".into()),
        };
        println!("{:<20} {:>22} {:>13}   {:<52} {}", l.name, peak, saving, fits, next);
    }
    println!(
        "{compiles} compiles ({parallelism} at a time), {:.0} s; exact = libtpu's own peak (less host-memory inputs), plus the \
         train state resident beside the program",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> ExitCode {
    common::example_main(CHILD, |args| parse(args).and_then(run))
}
