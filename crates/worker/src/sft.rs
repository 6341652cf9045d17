//! Supervised fine-tuning: the loss of the data's targets under the model.

use crate::data_files::JobFiles;
use crate::error::WorkerError;
use crate::eval::HeldOut;
use crate::objective::{EvalReport, Objective, RankShare, RankStep};
use crate::trainer::Trainer;
use data::{BatchSpec, Loader};
use job::JobSpec;
use std::sync::Arc;

/// Learns from the job's data: rank `r` of a step trains on the step's micro-batches
/// `r * A .. (r + 1) * A`, each a pure function of (seed, step, micro-batch).
pub struct Sft {
    loader: Loader,
    held_out: Option<HeldOut>,
    /// Where the data is read, when the loader was built from the job (its reads are logged).
    files: Option<Arc<JobFiles>>,
}

impl Sft {
    /// The objective of `job`'s data and batch shape, with its held-out evaluation; refuses a
    /// tokenizer whose ids the model cannot embed. Data in a bucket is read on `runtime`.
    pub fn new(
        trainer: &Trainer,
        job: &JobSpec,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Self, WorkerError> {
        let batch =
            BatchSpec::new(job.batch.global as usize, job.batch.micro as usize, job.seq_len as usize)?;
        let files = JobFiles::for_job(job, runtime)?;
        let loader = Loader::from_config(&job.data, batch, job.seed, files.files())?;
        let manifest = trainer.manifest();
        loader.check_model_vocab(manifest.model.vocab_size, &job.model.name())?;
        let held_out = HeldOut::new(job, manifest, loader.prompter(), Default::default(), files.files())?;
        files.log_reads();
        Ok(Self { loader, held_out, files: Some(files) })
    }

    /// The objective of `loader`'s batches, without evaluation.
    pub fn from_loader(loader: Loader) -> Self {
        Self { loader, held_out: None, files: None }
    }
}

impl Objective for Sft {
    fn rank_gradient(&self, trainer: &mut Trainer, at: RankStep) -> Result<RankShare, WorkerError> {
        let mut share = RankShare::default();
        let first = at.rank as u64 * at.accum;
        for micro in first..first + at.accum {
            let batch = share.phases.time("batches", || self.loader.micro_batch(at.step, micro))?;
            share.tokens += (batch.rows * batch.seq_len) as u64;
            share.truncated_rows += batch.truncated_rows as u64;
            share.phases.time("gradients", || trainer.grad_step(&batch))?;
        }
        if let Some(files) = &self.files {
            files.log_reads();
        }
        Ok(share)
    }

    /// Every worker derives the global token count from the data alone: no extra round trip.
    fn grad_scale(&self, step: u64, _sums: &[f32]) -> Result<f32, WorkerError> {
        match self.loader.step_token_count(step)? {
            0 => Err(WorkerError::NothingToLearn {
                step,
                what: "target tokens",
                fix: "check the data and seq_len",
            }),
            tokens => Ok(1.0 / tokens as f32),
        }
    }

    fn evaluate(&self, trainer: &Trainer) -> Result<Option<EvalReport>, WorkerError> {
        self.held_out.as_ref().map(|held_out| held_out.evaluate(trainer)).transpose()
    }

    fn eval_every(&self) -> u64 {
        self.held_out.as_ref().map_or(0, HeldOut::every)
    }
}
