//! `podctl launch`: run a job on this machine.

use crate::connect::ConnectArgs;
use crate::export::{ensure_bundle, export_args};
use crate::progress::{Progress, human_rate};
use crate::toolchain::Toolchain;
use anyhow::{Result, bail};
use bundle::Bundle;
use data::{BatchSpec, Loader};
use indicatif::ProgressBar;
use job::JobSpec;
use record::RunRecord;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use worker::ckpt::Resume;
use worker::{Slice, Trainer};

/// `summary.json`.
#[derive(Serialize)]
struct Summary<'a> {
    job: &'a str,
    model: &'a str,
    parameters: u64,
    mesh: String,
    bundle: &'a str,
    start_step: u64,
    steps: u64,
    first_loss: f64,
    final_loss: f64,
    compile_seconds: f64,
    train_seconds: f64,
    tokens_per_second: f64,
}

pub fn run(
    job_path: &Path,
    dry_run: bool,
    out: Option<PathBuf>,
    resume: Option<String>,
    connect: &ConnectArgs,
) -> Result<()> {
    let mut job = JobSpec::load(job_path)?;
    if out.is_some() {
        job.output = out;
    }
    let tools = Toolchain::discover()?;
    // The plugin is checked before the (slower) export so that a wrong path fails at once; a
    // cluster's workers bring their own.
    let plugin_path = tools.plugin(job.runtime.plugin.as_deref());
    let (plugin_path, plugin) = match connect.is_remote() {
        true => (plugin_path.unwrap_or_default(), None),
        false => {
            let path = plugin_path?;
            let plugin = pjrt::Plugin::load(&path)?;
            (path, Some(plugin))
        }
    };
    if job.train.offload() && !connect.is_remote() {
        bail!(
            "train.optimizer_offload keeps AdamW state in TPU host memory (pinned_host), and this launch runs on \
             the CPU plugin, which has none; drop optimizer_offload to run here, or launch on TPU hosts \
             with --coordinator"
        );
    }
    if !dry_run {
        crate::grpo::resolve_init_from(&mut job, connect)?;
    }
    let bundle = resolve_bundle(&tools, &job)?;
    let manifest = bundle.manifest();
    let count = |tensors: &[bundle::TensorSpec]| -> u64 {
        tensors.iter().map(|p| p.shape.iter().product::<u64>()).sum()
    };
    let parameters = count(&manifest.params) + count(&manifest.frozen);
    let trained = match &manifest.train.lora {
        Some(lora) => format!(
            ", LoRA rank {} on {} trains {}",
            lora.rank,
            lora.targets.join(","),
            human_count(count(&manifest.params))
        ),
        None => String::new(),
    };
    if job.train.attention == "pallas" && manifest.train.attention != "pallas" {
        println!(
            "note: Pallas flash attention lowers for TPUs only; on the {} plugin this run attends blockwise",
            manifest.platform
        );
    }
    println!(
        "job {}: {} ({} parameters{trained}) on {} x mesh {}, global batch {} = {} micro-batches of {} x {} tokens, {} steps",
        job.name,
        job.model,
        human_count(parameters),
        job.mesh.dcn,
        job.ici_mesh(),
        job.batch.global,
        job.micro_batches_per_step(),
        job.batch.micro,
        job.seq_len,
        job.steps,
    );
    if dry_run {
        println!("bundle {} ({})", bundle.dir().display(), &bundle.id()[..12]);
        print!("{}", job.describe_layout()?);
        return Ok(());
    }
    if job.mesh.dcn > 1 || connect.is_remote() {
        if resume.is_some() {
            bail!("--resume: a job under a coordinator resumes from its own checkpoint root; drop the flag");
        }
        let cluster = match connect.is_remote() {
            true => crate::local::Cluster::Remote(connect.clone()),
            false => crate::local::Cluster::Local {
                plugin: plugin_path,
                compile_cache: tools.cache.join("executables"),
            },
        };
        return crate::local::run(&job, &bundle, cluster);
    }
    let plugin = plugin.expect("loaded above: not remote");
    if job.grpo.is_some() {
        return crate::grpo::run_local(&job, &bundle, plugin, resume, parameters);
    }

    let (mut trainer, compile_seconds) = compile_trainer(&job, &bundle, plugin)?;

    let spec = BatchSpec::new(job.batch.global as usize, job.batch.micro as usize, job.seq_len as usize)?;
    let loader = Loader::from_config(&job.data, spec, job.seed)?;
    let run_dir = job.output_dir();
    let record = RunRecord::create(&run_dir)?;
    let mut progress = Progress::new(record, job.steps);
    let resume = resume.map_or(Resume::Newest, Resume::From);
    let outcome = worker::train(&mut trainer, &job, &loader, &mut progress, &resume);
    let record = progress.finish()?;
    let summary = outcome?;
    if summary.steps == 0 {
        print_nothing_to_train(summary.start_step);
        return Ok(());
    }

    record.summary(&Summary {
        job: &job.name,
        model: &job.model.name(),
        parameters,
        mesh: job.ici_mesh().to_string(),
        bundle: bundle.id(),
        start_step: summary.start_step,
        steps: summary.steps,
        first_loss: summary.first_loss,
        final_loss: summary.final_loss,
        compile_seconds,
        train_seconds: summary.seconds,
        tokens_per_second: summary.tokens_per_second,
    })?;
    let plots = record.plot()?;
    println!(
        "done: {} steps in {:.1}s ({}), loss {:.4} -> {:.4} ({:.1}% of the first)",
        summary.steps,
        summary.seconds,
        human_rate(summary.tokens_per_second),
        summary.first_loss,
        summary.final_loss,
        100.0 * summary.final_loss / summary.first_loss
    );
    let names: Vec<_> = plots.iter().filter_map(|p| p.file_name()?.to_str()).collect();
    println!("run record in {}: metrics.jsonl, summary.json, {}", run_dir.display(), names.join(", "));
    Ok(())
}

/// `podctl launch --render`: the job as a declaration (a ConfigMap) for the install `release`,
/// its bundle uploaded under the job's checkpoint root first. Only the manifest goes to stdout.
pub fn render(job_path: &Path, release: &str) -> Result<()> {
    let job = JobSpec::load(job_path)?;
    let tools = Toolchain::discover()?;
    let bundle = resolve_bundle(&tools, &job)?;
    let bundle_uri = crate::status::runtime()?.block_on(crate::local::publish_bundle(&job, &bundle, true))?;
    let declaration =
        controller::Declaration { spec_yaml: job.to_yaml(), bundle_uri, bundle_id: bundle.id().to_string() };
    let config_map = declaration.config_map(&format!("{release}-job-{}", job.name), None, release);
    println!("{}", serde_json::to_string_pretty(&config_map)?);
    Ok(())
}

/// The job's bundle: the one it names, or the cached export of its model and shapes.
fn resolve_bundle(tools: &Toolchain, job: &JobSpec) -> Result<Bundle> {
    let dir = match &job.bundle {
        Some(dir) => dir.clone(),
        None => {
            // A cluster of TPU hosts (`runtime.accelerator: v6e-8`) runs a bundle lowered for TPU.
            let platform = match job.accelerator()?.platform {
                planner::Platform::Tpu => "tpu",
                _ => "cpu",
            };
            let args = export_args(job, platform);
            let mut spinner = None;
            let dir = ensure_bundle(tools, &args, || {
                spinner = Some(self::spinner(format!("exporting {} for mesh {}", job.model, job.ici_mesh())))
            })?;
            if let Some(s) = spinner {
                s.finish_and_clear();
            }
            dir
        }
    };
    let bundle = Bundle::load(&dir)?;
    bundle.check_mesh(&job.ici_mesh())?;
    let train = &bundle.manifest().train;
    if train.micro_batch != job.batch.micro || train.seq_len != job.seq_len {
        bail!(
            "bundle {} was lowered for micro-batch {} x seq_len {}, but the job asks for {} x {}; \
             drop `bundle:` from the job to export a matching one",
            dir.display(),
            train.micro_batch,
            train.seq_len,
            job.batch.micro,
            job.seq_len
        );
    }
    Ok(bundle)
}

/// Opens the job's slice on this machine's devices and compiles the bundle's programs, behind a
/// spinner; returns the trainer and the compile time.
pub(crate) fn compile_trainer(
    job: &JobSpec,
    bundle: &Bundle,
    plugin: &'static pjrt::Plugin,
) -> Result<(Trainer, f64)> {
    let manifest = bundle.manifest();
    let spinner =
        spinner(format!("compiling for {} {} devices", job.ici_mesh().num_devices(), manifest.platform));
    let compile_started = Instant::now();
    let slice = Slice::open(plugin, &manifest.platform, &job.ici_mesh())?;
    let trainer = Trainer::new(slice, bundle)?;
    let compile_seconds = compile_started.elapsed().as_secs_f64();
    spinner.finish_and_clear();
    println!("compiled in {compile_seconds:.1}s");
    Ok((trainer, compile_seconds))
}

/// What a launch says when the checkpoint it resumed from is already at the job's last step.
pub(crate) fn print_nothing_to_train(start_step: u64) {
    println!("nothing to train: the checkpoint restored is at step {start_step}, the job's last");
}

pub(crate) fn spinner(message: String) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}
