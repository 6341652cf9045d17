//! Where a run's state starts when it resumes from nothing: the job's `init_from` parameters
//! with a fresh optimizer, else its Hugging Face model's weights (`model: { hf }`), else the
//! bundle's `init` from the job seed; and the frozen reference an objective compares the policy
//! with, from the same source; and so the objective of a job ([`objective`]), above the
//! objectives themselves.

use crate::ckpt;
use crate::error::WorkerError;
use crate::grpo::{Grpo, GrpoTask};
use crate::objective::Objective;
use crate::sft::Sft;
use crate::slice::DeviceArray;
use crate::trainer::Trainer;
use ::hf::HfModel;
use checkpoint::{Storage, StoreCommitLog, StoreOptions};
use job::JobSpec;

/// Seeds the bundle's `init` program from the job seed (the program takes 32 bits).
pub fn init_seed(job_seed: u64) -> u32 {
    (job_seed ^ (job_seed >> 32)) as u32
}

/// The checkpoint a fresh run of `job` takes its parameters from (`grpo.init_from`), if any.
pub fn init_from(job: &JobSpec) -> Option<&str> {
    job.grpo.as_ref().and_then(|g| g.init_from.as_deref())
}

/// The Hugging Face model whose weights a fresh run of `job` starts from: its `model: { hf }`,
/// unless `grpo.init_from` names a checkpoint (of that model, trained further).
pub fn hf_weights(job: &JobSpec) -> Option<&str> {
    init_from(job).is_none().then(|| job.model.hf_dir()).flatten()
}

fn open_hf(uri: &str, runtime: &tokio::runtime::Handle) -> Result<HfModel, WorkerError> {
    Ok(runtime.block_on(HfModel::open(uri, &StoreOptions::default()))?)
}

/// Puts the state a fresh run of `job` starts from on the trainer: [`init_from`]'s parameters
/// with AdamW's moments zeroed (the run's step count starts afresh, so does its optimizer),
/// [`hf_weights`] (each device reading its own regions; moments zero), or `init(seed)`. Returns
/// what it started from, when not `init`.
pub fn fresh(
    trainer: &mut Trainer,
    job: &JobSpec,
    runtime: &tokio::runtime::Handle,
) -> Result<Option<String>, WorkerError> {
    if let Some(uri) = hf_weights(job) {
        let loaded = crate::hf::load(trainer, &open_hf(uri, runtime)?, init_seed(job.seed), runtime)?;
        return Ok(Some(format!(
            "Hugging Face model {uri} ({} tensors, {:.1} MiB onto the devices in {:.1}s)",
            loaded.tensors,
            loaded.device_bytes as f64 / (1 << 20) as f64,
            loaded.seconds
        )));
    }
    let Some(uri) = init_from(job) else {
        trainer.init(init_seed(job.seed))?;
        return Ok(None);
    };
    let store = StoreOptions::default();
    let restored = match ckpt::split_uri(uri) {
        (_, Some((step, _))) => runtime.block_on(ckpt::restore(trainer, uri, step, &store))?,
        (root, None) => {
            let storage = Storage::open(root, &store)?;
            let log = StoreCommitLog::new(storage.clone());
            let (restored, passed_over) =
                runtime.block_on(ckpt::restore_newest(trainer, &storage, &log, None))?;
            restored.ok_or_else(|| WorkerError::NothingRestores {
                uri: uri.to_string(),
                asked_by: "grpo.init_from",
                passed_over,
            })?
        }
    };
    trainer.reset_optimizer()?;
    Ok(Some(restored.uri))
}

/// The frozen reference of `job`, when its objective needs one (GRPO with `kl_beta > 0`): the
/// parameters a fresh run starts from, read again from [`init_from`] or [`hf_weights`] or made
/// by `init(seed)`, beside the policy's on the devices.
pub fn reference(
    trainer: &Trainer,
    job: &JobSpec,
    runtime: &tokio::runtime::Handle,
) -> Result<Option<Vec<DeviceArray>>, WorkerError> {
    if !job.grpo.as_ref().is_some_and(|g| g.kl_beta > 0.0) {
        return Ok(None);
    }
    let params = match (init_from(job), hf_weights(job)) {
        (Some(uri), _) => runtime.block_on(ckpt::read_params(trainer, uri, &StoreOptions::default()))?,
        (None, Some(uri)) => {
            crate::hf::place_weights(trainer.slice(), trainer.manifest(), &open_hf(uri, runtime)?, runtime)?
        }
        (None, None) => trainer.init_params(init_seed(job.seed))?,
    };
    Ok(Some(params))
}

/// The objective of `job` on `trainer`'s bundle: GRPO's for a job with a `grpo:` section (its
/// frozen reference read now, when the objective needs one), SFT's otherwise.
pub fn objective(
    trainer: &Trainer,
    job: &JobSpec,
    runtime: &tokio::runtime::Handle,
) -> Result<Box<dyn Objective>, WorkerError> {
    Ok(match &job.grpo {
        None => Box::new(Sft::new(trainer, job, runtime)?),
        Some(_) => Box::new(Grpo::with_reference(
            GrpoTask::new(job, trainer.manifest(), runtime)?,
            reference(trainer, job, runtime)?,
        )?),
    })
}
