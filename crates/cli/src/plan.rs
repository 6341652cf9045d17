//! `podctl plan`: which meshes, micro-batches and remat policies fit a job, and the fastest of
//! them, before anything is rented. The planner (crates/planner) does the work; this is glue:
//! the job as a workload and target, the exporter and compile child for exact mode, progress.

use crate::export::ensure_bundle;
use crate::toolchain::Toolchain;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use job::{JobSpec, MeshRequest};
use planner::{Accelerator, GIB, Plan, PlanOptions, Target, format_bytes, render_plan};
use planner_exact::{BundleRequest, DiskCache, ExactOracle, ProcessCompiler, Progress};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The hidden subcommand `podctl plan --exact` runs itself as, once per compile.
pub const COMPILE_CHILD: &str = "__compile-stats";

/// `podctl plan` arguments.
#[derive(clap::Args)]
pub struct PlanArgs {
    /// The job spec (YAML); SFT or GRPO (`grpo:` section).
    job: PathBuf,
    /// Also export and compile the candidates that decide the choice and the memory cliff
    /// (libtpu for TPU targets, the CPU plugin locally); results are cached by content.
    #[arg(long)]
    exact: bool,
    /// The kind of host: v6e-8, v6e-4, v6e-1 or cpu-N (default: the job's runtime).
    #[arg(long)]
    target: Option<String>,
    /// Hosts (slices) joined by the data-centre network (default: the job's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    hosts: Option<u64>,
    /// Show every candidate, not only the measured ones and the best of each mesh and remat.
    #[arg(long)]
    all: bool,
    /// With --exact, also compile the best candidate of every mesh, not only the ones the
    /// choice rests on (slower: a training-program compile per mesh).
    #[arg(long)]
    every_mesh: bool,
    /// Override a spec field, checked as the file is (repeatable): `--set batch.micro=8`.
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    set: Vec<String>,
    /// The plan as one JSON object (every candidate, the choice, the cliff, this job's verdict).
    #[arg(long)]
    json: bool,
}

pub fn run(args: &PlanArgs, runtime: &tokio::runtime::Handle) -> Result<()> {
    let started = Instant::now();
    let overrides = crate::overrides(&args.set)?;
    let job = JobSpec::load_overridden(&args.job, &overrides, &crate::models::HfReader(runtime.clone()))?;
    let workload = job.workload()?;
    let accelerator = match &args.target {
        Some(name) => {
            let memory = job.runtime.device_memory.map_or(job::DEFAULT_DEVICE_MEMORY, |m| m.0);
            Accelerator::parse(name, memory).map_err(|e| anyhow::anyhow!("--target {name}: {e}"))?
        }
        None => job.accelerator()?,
    };
    let hosts = args.hosts.map_or(job.mesh.dcn, |h| h as usize);
    let target = Target::new(accelerator, hosts);
    let options = PlanOptions { every_layout: args.every_mesh, ..PlanOptions::default() };
    let mut out = String::new();
    let plan = if args.exact {
        let (plan, summary) = exact_plan(&job, &workload, &target, &options)?;
        if !args.json {
            out.push_str(&summary);
        }
        plan
    } else {
        planner::plan_analytic(&workload, &target, &options)?
    };
    if args.json {
        let mut v = plan_json(&plan, &job);
        v["wall_seconds"] = started.elapsed().as_secs_f64().into();
        out = v.to_string() + "\n";
    } else {
        out.push_str(&render_plan(&plan, args.all));
        out.push_str(&this_job(&job, &plan));
        out.push_str(&format!("\nwall time {:.2} s\n", started.elapsed().as_secs_f64()));
    }
    // A reader that stops early (`| head`) is not an error.
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing the plan"),
        _ => Ok(()),
    }
}

fn exact_plan(
    job: &JobSpec,
    workload: &planner::Workload,
    target: &Target,
    options: &PlanOptions,
) -> Result<(Plan, String)> {
    let tools = Toolchain::discover()?;
    let plugin = match target.accelerator.topology {
        Some(_) => libtpu(&tools)?,
        None => tools.plugin(job.runtime.plugin.as_deref())?,
    };
    let exporter = |request: &BundleRequest| {
        ensure_bundle(&tools, &request.exporter_args(), || {}).map_err(|e| format!("{e:#}"))
    };
    let exe = std::env::current_exe().context("finding podctl's own executable for the compile child")?;
    let compiler = ProcessCompiler::new(exe, vec![COMPILE_CHILD.to_string()], plugin);
    // A qwen3-1.7b compile for v6e:2x4 peaks at about 6 GiB of host memory; local CPU compiles
    // of the small presets need far less.
    let per_compile = if target.accelerator.topology.is_some() { 6 * GIB } else { 2 * GIB };
    let parallelism = planner_exact::default_parallelism(per_compile);
    let display = CompileProgress::new();
    let progress = |event: &Progress| display.show(event);
    let oracle = ExactOracle::new(workload, target, &exporter, &compiler, parallelism)
        .with_cache(DiskCache::new(tools.cache.join("compiles")))
        .with_progress(&progress);
    let plan = planner::plan(workload, target, options, Some(&oracle));
    display.finish();
    let plan = plan?;
    let stats = oracle.stats();
    let summary = format!(
        "exact: {} bundles, {} compiles ({:.0} s of compiling, {parallelism} at a time), {} from the cache\n",
        stats.bundles, stats.compiles, stats.compile_seconds, stats.cached
    );
    Ok((plan, summary))
}

/// libtpu from `PODCTL_LIBTPU` or podctl's Python environment (the wheel's `tpu` extra;
/// scripts/setup.sh --test installs it into a checkout's).
fn libtpu(tools: &Toolchain) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("PODCTL_LIBTPU") {
        return Ok(PathBuf::from(path));
    }
    match tools.find_installed(crate::toolchain::LIBTPU) {
        Some(path) => Ok(path),
        None => bail!(
            "no libtpu in podctl's Python environment; exact plans for TPU compile through it: install it with \
             `{}` or set PODCTL_LIBTPU",
            tools.pip_install(crate::toolchain::LIBTPU_REQUIREMENT)
        ),
    }
}

/// How the job's own configuration fares in the plan, and what `mesh: auto` makes of it.
fn this_job(job: &JobSpec, plan: &Plan) -> String {
    let candidate = match job.candidate() {
        Ok(candidate) => candidate,
        Err(error) => return format!("this job: {error}"),
    };
    let limit = plan.limit();
    let mut text = match plan.row(&candidate) {
        Some(row) => {
            let exact = row.exact_peak().map(|b| format!(", exact {}", format_bytes(b))).unwrap_or_default();
            let verdict = if row.fits(limit) { "fits" } else { "does NOT fit" };
            format!(
                "this job ({candidate}): analytic {}{exact}; {verdict}, margin {}",
                format_bytes(row.analytic.peak()),
                format_bytes(row.margin(limit))
            )
        }
        None => format!(
            "this job ({candidate}) is not a candidate on {} x {}",
            plan.target.slices, plan.target.accelerator.name
        ),
    };
    if let MeshRequest::Auto { .. } = job.mesh.request
        && plan.chosen().is_some_and(|row| row.candidate != candidate)
    {
        text.push_str(
            "\n  (mesh: auto resolves with the analytic model for the job's own runtime; write the choice \
             above into the job to run it)",
        );
    }
    text
}

/// One candidate for scripts: its levers, peak bytes (analytic, exact when measured, and the
/// best known), whether it fits and by how much, and the estimated step time.
fn row_json(row: &planner::Row, limit: u64, chosen: bool) -> serde_json::Value {
    let c = &row.candidate;
    let (exact, exact_error) = match &row.exact {
        planner::Exact::Measured(m) => (Some(m.peak()), None),
        planner::Exact::Failed(reason) => (None, Some(reason.as_str())),
        planner::Exact::NotMeasured => (None, None),
    };
    serde_json::json!({
        "mesh": { "dcn": c.layout.dcn, "fsdp": c.layout.fsdp, "tp": c.layout.tp },
        "micro_batch": c.micro_batch,
        "remat": c.remat.to_string(),
        "attention": c.attention.to_string(),
        "offload": c.offload,
        "analytic_peak_bytes": row.analytic.peak(),
        "exact_peak_bytes": exact,
        "exact_error": exact_error,
        "peak_bytes": row.peak(),
        "fits": row.fits(limit),
        "margin_bytes": row.margin(limit),
        "step_seconds": row.time.total(),
        "dcn_bytes_per_step": row.time.dcn_bytes,
        "chosen": chosen,
    })
}

/// `podctl plan --json`: the target, the choice, this job's own layout, every candidate (all
/// of them, not only those the table shows), the memory cliff and the layouts skipped.
fn plan_json(plan: &Plan, job: &JobSpec) -> serde_json::Value {
    let limit = plan.limit();
    let candidates: Vec<_> =
        plan.rows.iter().enumerate().map(|(i, row)| row_json(row, limit, plan.choice == Some(i))).collect();
    let this_job = match job.candidate() {
        Ok(candidate) => match plan.row(&candidate) {
            Some(row) => serde_json::json!({
                "candidate": candidate.to_string(),
                "considered": true,
                "fits": row.fits(limit),
                "peak_bytes": row.peak(),
                "margin_bytes": row.margin(limit),
            }),
            None => serde_json::json!({ "candidate": candidate.to_string(), "considered": false }),
        },
        Err(error) => serde_json::json!({ "error": error.to_string() }),
    };
    serde_json::json!({
        "target": {
            "accelerator": plan.target.accelerator.name,
            "slices": plan.target.slices,
            "memory_limit_bytes": limit,
        },
        "choice": plan.chosen().map(|row| row_json(row, limit, true)),
        "this_job": this_job,
        "candidates": candidates,
        "cliff": plan.cliff,
        "skipped": plan.skipped.iter().map(|(layout, why)| serde_json::json!({
            "mesh": { "dcn": layout.dcn, "fsdp": layout.fsdp, "tp": layout.tp },
            "reason": why,
        })).collect::<Vec<_>>(),
    })
}

/// The exact compiles as a progress bar on a terminal, one line per event otherwise.
struct CompileProgress {
    bar: ProgressBar,
    plain: bool,
    started: Instant,
}

impl CompileProgress {
    fn new() -> Self {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner:.green} [{elapsed_precise}] compiled {pos}/{len} {wide_msg}",
            )
            .expect("template parses"),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Self { bar, plain: !std::io::stderr().is_terminal(), started: Instant::now() }
    }

    fn show(&self, event: &Progress) {
        let (message, done) = match event {
            Progress::Exporting(candidate) => (format!("exporting {candidate}"), false),
            Progress::Compiling { candidate, program } => {
                self.bar.inc_length(1);
                (format!("compiling {candidate} {program}"), false)
            }
            Progress::Compiled { candidate, program, bytes, seconds } => {
                self.bar.inc(1);
                (format!("compiled {candidate} {program}: {} in {seconds:.0} s", format_bytes(*bytes)), true)
            }
        };
        if self.plain {
            eprintln!("[{:7.1} s] {message}", self.started.elapsed().as_secs_f64());
        } else if done {
            self.bar.println(message);
        } else {
            self.bar.set_message(message);
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
