//! A launch of one slice on this machine's devices, in this process (no coordinator).

use crate::progress::Progress;
use crate::summary::{self, Launched};
use anyhow::Result;
use bundle::Bundle;
use job::JobSpec;
use record::RunRecord;
use std::time::Instant;
use worker::single::Resume;
use worker::{Ended, Slice, Trainer};

/// Compiles the bundle for this machine's devices and trains the job, with a progress bar and
/// the run record in the job's run directory.
pub fn run(
    job: &JobSpec,
    bundle: &Bundle,
    plugin: &'static pjrt::Plugin,
    resume: Resume,
    parameters: u64,
    runtime: &tokio::runtime::Handle,
) -> Result<()> {
    let (mut trainer, compile_seconds) = compile_trainer(job, bundle, plugin)?;
    if let Some(from) = worker::start::init_from(job) {
        println!("policy and reference start from {from}");
    } else if let Some(model) = worker::start::hf_weights(job) {
        println!("weights from the Hugging Face model {model}");
    }
    let record = RunRecord::create(job.output_dir())?;
    let mut progress = Progress::new(record, job.steps);
    let saving = match job.checkpoint {
        Some(_) => "Ctrl-C: stopping after this step, saving a checkpoint of it",
        None => "Ctrl-C: stopping after this step (the job saves no checkpoints)",
    };
    let ctrl_c = crate::interrupt::CtrlC::watch(saving, runtime)?;
    let outcome = worker::single::run(&mut trainer, job, &mut progress, &resume, &ctrl_c, runtime);
    let record = progress.finish()?;
    let run = outcome.map_err(crate::exit::Classified::failed)?;
    if let Ended::Interrupted = run.trained.ended {
        let step = run.trained.last.as_ref().map_or(run.trained.start, |last| last.step);
        record.plot()?;
        let resume = match job.checkpoint_uri() {
            Some(root) => {
                format!("its checkpoint is committed under {root}: launching it again resumes there")
            }
            None => {
                "the job saves no checkpoints (`checkpoint: { every: N }`): launching it again starts over"
                    .into()
            }
        };
        return Err(crate::exit::Classified::interrupted(anyhow::anyhow!(
            "interrupted (Ctrl-C) after step {step}; {resume}"
        )));
    }
    if run.trained.steps() == 0 {
        summary::print_nothing_to_train(run.trained.start);
        return Ok(());
    }
    summary::finish(&record, &Launched { job, bundle, parameters, compile_seconds }, &run)
}

/// Opens the job's slice on this machine's devices and compiles the bundle's programs, behind a
/// spinner; returns the trainer and the compile time.
fn compile_trainer(job: &JobSpec, bundle: &Bundle, plugin: &'static pjrt::Plugin) -> Result<(Trainer, f64)> {
    let manifest = bundle.manifest();
    let spinner = crate::progress::spinner(format!(
        "compiling for {} {} devices",
        job.ici_mesh().num_devices(),
        manifest.platform
    ));
    let compile_started = Instant::now();
    let slice = Slice::open(plugin, &manifest.platform, &job.ici_mesh())?;
    let trainer = Trainer::new(slice, bundle)?;
    let compile_seconds = compile_started.elapsed().as_secs_f64();
    spinner.finish_and_clear();
    println!("compiled in {compile_seconds:.1}s");
    Ok((trainer, compile_seconds))
}
