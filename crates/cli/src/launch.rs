//! `podctl launch`: check the spec, resolve `init_from` and the bundle, then run the job here
//! (one slice in this process, or several slices under an embedded coordinator) or submit it to
//! a cluster.

use crate::connect::ConnectArgs;
use crate::export::{ensure_bundle, export_args};
use crate::init_from::{self, InitFrom};
use crate::toolchain::Toolchain;
use anyhow::{Result, bail};
use bundle::Bundle;
use job::JobSpec;
use std::path::{Path, PathBuf};
use worker::single::Resume;

#[allow(clippy::too_many_arguments)] // the launch's flags, one each
pub fn run(
    job_path: &Path,
    overrides: &[job::Override],
    dry_run: bool,
    detach: bool,
    out: Option<PathBuf>,
    resume: Resume,
    connect: &ConnectArgs,
    node: &dyn crate::StartNode,
    runtime: &tokio::runtime::Handle,
) -> Result<()> {
    let mut job = JobSpec::load_overridden(job_path, overrides, &crate::models::HfReader(runtime.clone()))?;
    if out.is_some() {
        job.output = out;
    }
    if detach && !connect.is_remote() {
        bail!(
            "--detach: a job on this machine lives with this process; name a cluster (--coordinator, \
             --kube-context or a saved context) or drop --detach"
        );
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
    if !dry_run && let InitFrom::TrainFirst { spec, root } = init_from::resolve(&mut job, connect, runtime)? {
        println!(
            "grpo.init_from {}: no checkpoint under {root} yet; training that job first",
            spec.display()
        );
        run(&spec, &[], false, false, None, Resume::Newest, connect, node, runtime)?;
        println!();
        if let InitFrom::TrainFirst { .. } = init_from::resolve(&mut job, connect, runtime)? {
            bail!("{} ran but left no committed checkpoint under {root}", spec.display());
        }
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
        if let Resume::From(_) = resume {
            bail!("--resume: a job under a coordinator resumes from its own checkpoint root; drop the flag");
        }
        let cluster = match connect.is_remote() {
            true => crate::local::Cluster::Remote { connect: connect.clone(), detach },
            false => crate::local::Cluster::Local {
                plugin: plugin_path,
                compile_cache: tools.cache.join("executables"),
                node,
            },
        };
        return crate::local::run(&job, &bundle, cluster, resume == Resume::StartOver, runtime);
    }
    let plugin = plugin.expect("loaded above: not remote");
    crate::single::run(&job, &bundle, plugin, resume, parameters, runtime)
}

/// `podctl launch --render`: the job as a declaration (a ConfigMap) for the install `release`,
/// its bundle uploaded under the job's checkpoint root first. Only the manifest goes to stdout.
pub fn render(
    job_path: &Path,
    overrides: &[job::Override],
    release: &str,
    runtime: &tokio::runtime::Handle,
) -> Result<()> {
    let job = JobSpec::load_overridden(job_path, overrides, &crate::models::HfReader(runtime.clone()))?;
    let tools = Toolchain::discover()?;
    let bundle = resolve_bundle(&tools, &job)?;
    let bundle_uri = runtime.block_on(crate::local::publish_bundle(&job, &bundle, true))?;
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
                spinner = Some(crate::progress::spinner(format!(
                    "exporting {} for mesh {}",
                    job.model,
                    job.ici_mesh()
                )))
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

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}
