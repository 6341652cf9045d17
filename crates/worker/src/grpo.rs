//! GRPO: the policy learns from its own samples, scored by verifiable rewards.
//!
//! One optimizer step, for each data-parallel rank this worker hosts (rank `r` of `D` owns the
//! step's prompts `r * P/D .. (r + 1) * P/D`, so every completion of a prompt stays with its
//! rank, hence on one slice):
//!
//! 1. **Rollout.** Each prompt is repeated over its group's `G` rows and `rollout` samples a
//!    completion per row with the policy's parameters. A row's sampling seed is a hash of (job
//!    seed, step, prompt index, generation): a pure function of the job, so reruns are bitwise
//!    equal and a row samples the same completion whichever slice, rank or micro-batch runs it.
//! 2. **Rewards** ([`rewards::Rewards`]): the job's `grpo.rewards`, weighed and summed per
//!    completion: the numeric answer (exact match of the number after `####`, partial credit,
//!    format terms; weights from `grpo.reward`), a format's regular expression, a length, and
//!    Python functions in TRL's form run by a pool of Python processes beside the worker, called
//!    once per step with the rank's rows. Each function's mean is a metric (`reward_<name>`).
//! 3. **Advantages**, per group: `(r - mean) / (std + 1e-4)` (or `r - mean` without
//!    `scale_rewards`), population statistics in f64, so they depend on the group only.
//! 4. **Log-probs.** The sampling policy's per-token log-probs are the rollout's own (float32
//!    compute; a bfloat16 bundle rescores with `logprobs`, whose full pass rounds like the grad
//!    step); the frozen reference's come from `logprobs` with its parameters, only when
//!    `kl_beta > 0`.
//! 5. **Gradients**: `grpo_grad_step` per micro-batch into the accumulator (clipped ratio, KL,
//!    token mask). Each rank's accumulator and a small vector of metric sums go through the
//!    all-reduce together, so every worker learns the step's global token count (the loss is a
//!    token mean: `grad_scale = 1 / tokens`) and the step's metrics without another round trip.
//! 6. **Apply**: AdamW, as for SFT.
//!
//! One optimizer step per batch of rollouts: the policy that sampled is the one being trained,
//! so the ratio starts at 1 (to float rounding) and clipping matters only for off-policy steps.

use crate::data_files::JobFiles;
use crate::error::{Part, WorkerError};
use crate::eval::{Completions, Decoding, HeldOut, PromptBatch};
use crate::grpo_stats::{GrpoMetrics, Tally, advantages};
use crate::objective::{EvalReport, Objective, RankShare, RankStep};
use crate::phases::Phases;
use crate::slice::{Arg, DeviceArray};
use crate::trainer::{GrpoPrograms, Trainer, not_initialized};
use data::{BatchSpec, Example, Loader, Prompter};
use job::{GrpoSpec, JobSpec};
use rewards::{Completion, RewardError, Rewards};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Domain tag of the sampling seeds.
const DOMAIN_SAMPLE: u64 = 0x6772_706f_5f73_6d70; // "grpo_smp"

/// A GRPO job's prompts, rewards and settings, for one bundle's micro-batch.
pub struct GrpoTask {
    spec: GrpoSpec,
    seed: u64,
    /// One prompt per "row" of a step of `prompts_per_step` rows: the loader's addressing of the
    /// data (and its epochs and permutations) applies to prompts.
    prompts: Loader,
    /// The rollout's buffers, stop and pad ids.
    decoding: Decoding,
    /// The held-out problems `evaluate` scores, if evaluation is on.
    held_out: Option<HeldOut>,
    /// How prompts are laid out (reward functions get conversations or text, as in TRL).
    prompter: Prompter,
    /// The job's reward functions.
    rewards: Rewards,
    /// Where the data is read (its reads are logged).
    files: Arc<JobFiles>,
    /// The job's steps (reward functions see `trainer_state.max_steps`).
    steps: u64,
    micro: usize,
    prompt_len: usize,
    max_new: usize,
    pad: i32,
    bfloat16_compute: bool,
}

impl GrpoTask {
    /// The task of `job`, for a bundle whose programs take `manifest.train.micro_batch` rows.
    /// Data and reward modules in a bucket are read on `runtime`.
    pub fn new(
        job: &JobSpec,
        manifest: &bundle::Manifest,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Self, WorkerError> {
        let spec = job.grpo.clone().ok_or_else(|| {
            WorkerError::incompatible(
                Part::Job,
                format!("job '{}' has no `grpo:` section; it trains with SFT", job.name),
            )
        })?;
        let train = &manifest.train;
        let (Some(prompt_len), Some(max_new)) = (train.prompt_len, train.max_new_tokens) else {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                "the bundle is not a GRPO bundle; export one for the job's grpo section",
            ));
        };
        if (prompt_len, max_new) != (spec.prompt_len, spec.max_new_tokens) {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                format!(
                    "the bundle was lowered for prompts of {prompt_len} and completions of {max_new} tokens, the job \
                 asks for {} and {}; export the bundle again",
                    spec.prompt_len, spec.max_new_tokens
                ),
            ));
        }
        if !manifest.frozen.is_empty() {
            return Err(WorkerError::incompatible(
                Part::Job,
                "GRPO with LoRA adapters is not supported yet; drop train.lora from the GRPO job",
            ));
        }
        let micro = train.micro_batch as usize;
        // Row r answers prompt r / generations, so a bundle that runs each prompt once for a
        // group of rows must group exactly the job's generations.
        if let Some(group) = train.prompt_group.filter(|&g| g != spec.generations) {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                format!(
                    "the bundle computes each prompt once for {group} rows, but the job samples {} generations per \
                 prompt; export the bundle again",
                    spec.generations
                ),
            ));
        }
        let prompts_per_step = job.batch.global / spec.generations;
        let seq_len = job.seq_len as usize;
        let files = JobFiles::for_job(job, runtime)?;
        let prompts = Loader::from_config(
            &job.data,
            BatchSpec::new(prompts_per_step as usize, 1, seq_len)?,
            job.seed,
            files.files(),
        )?;
        prompts.check_model_vocab(manifest.model.vocab_size, &job.model.name())?;
        let prompter =
            prompts.prompter().ok_or(data::DataError::NotAnExampleSource { operation: "GRPO" })?.clone();
        let decoding = Decoding::new(manifest, prompter.clone())?;
        let held_out = HeldOut::new(job, manifest, Some(&prompter), spec.reward.clone(), files.files())?;
        let dir = std::env::current_dir()
            .map_err(|source| WorkerError::Io { what: "finding the working directory", source })?;
        let rewards = Rewards::new(&spec, &python(), &dir, |module| {
            files.local_copy(module).map_err(|error| RewardError::Load {
                function: module.to_owned(),
                message: error.to_string(),
            })
        })?;
        files.log_reads();
        Ok(Self {
            pad: decoding.pad,
            decoding,
            prompter,
            rewards,
            files,
            steps: job.steps,
            spec,
            seed: job.seed,
            prompts,
            held_out,
            micro,
            prompt_len: prompt_len as usize,
            max_new: max_new as usize,
            bfloat16_compute: train.compute_dtype != mesh::DType::Float32,
        })
    }

    /// The job's GRPO settings.
    pub fn spec(&self) -> &GrpoSpec {
        &self.spec
    }

    fn seq_len(&self) -> usize {
        self.prompt_len + self.max_new
    }

    /// The sampling seed of generation `generation` of global prompt `prompt` of `step`.
    fn sample_seed(&self, step: u64, prompt: u64, generation: u64) -> u32 {
        data::hash_words(&[DOMAIN_SAMPLE, self.seed, step, prompt, generation]) as u32
    }

    /// Full rows (prompt buffer, then completion buffer) and what `grpo_grad_step` needs of them.
    fn train_batch(
        &self,
        prompts: &PromptBatch,
        completions: &Completions,
        advantages: Vec<f32>,
    ) -> TrainBatch {
        let (p, n, s) = (self.prompt_len, self.max_new, self.seq_len());
        let rows = prompts.lengths.len();
        let mut batch = TrainBatch {
            tokens: vec![self.pad; rows * s],
            targets: vec![self.pad; rows * s],
            prompt_lengths: prompts.lengths.clone(),
            loss_mask: vec![0.0; rows * s],
            advantages,
            old_logprobs: vec![0.0; rows * s],
        };
        for row in 0..rows {
            let tokens = &mut batch.tokens[row * s..(row + 1) * s];
            tokens[..p].copy_from_slice(&prompts.tokens[row * p..(row + 1) * p]);
            tokens[p..].copy_from_slice(&completions.tokens[row * n..(row + 1) * n]);
            batch.targets[row * s..(row + 1) * s - 1].copy_from_slice(&tokens[1..]);
            // Completion token t is the target of column p - 1 + t.
            for t in 0..completions.lengths[row].clamp(0, n as i32) as usize {
                batch.loss_mask[row * s + p - 1 + t] = 1.0;
                batch.old_logprobs[row * s + p - 1 + t] = completions.logprobs[row * n + t];
            }
        }
        batch
    }

    /// The examples of `step`'s global prompts `first .. first + count`.
    fn examples(&self, step: u64, first: u64, count: u64) -> Result<Vec<Example>, WorkerError> {
        (first..first + count).map(|p| Ok(self.prompts.prompts(step, p)?.remove(0))).collect()
    }
}

/// One micro-batch as `grpo_grad_step` takes it (reference log-probs apart).
struct TrainBatch {
    tokens: Vec<i32>,
    targets: Vec<i32>,
    prompt_lengths: Vec<i32>,
    loss_mask: Vec<f32>,
    advantages: Vec<f32>,
    old_logprobs: Vec<f32>,
}

impl Trainer {
    fn grpo_programs(&self) -> Result<&GrpoPrograms, WorkerError> {
        self.grpo.as_ref().ok_or_else(|| {
            WorkerError::incompatible(
                Part::Bundle,
                "this is an SFT bundle; a GRPO job needs a GRPO bundle (train.kind grpo)",
            )
        })
    }

    fn policy(&self) -> Result<&[DeviceArray], WorkerError> {
        Ok(&self.state.as_ref().ok_or_else(not_initialized)?.params)
    }

    fn upload_input(&self, spec: &bundle::TensorSpec, host: &[u8]) -> Result<DeviceArray, WorkerError> {
        self.slice().upload(spec, host)
    }

    /// Per-target log-probs of full rows under `params` (the policy's when `None`). Phases:
    /// `transfers` and `phase` (the `logprobs` program).
    fn score(
        &self,
        params: Option<&[DeviceArray]>,
        batch: &TrainBatch,
        temperature: f32,
        phase: &'static str,
        phases: &mut Phases,
    ) -> Result<Vec<f32>, WorkerError> {
        let program = &self.grpo_programs()?.logprobs;
        let inputs = &program.spec().inputs;
        let n = self.manifest().params.len();
        let uploaded = phases.time("transfers", || -> Result<_, WorkerError> {
            Ok([
                self.upload_input(&inputs[n], bytemuck::cast_slice(&batch.tokens))?,
                self.upload_input(&inputs[n + 1], bytemuck::cast_slice(&batch.targets))?,
                self.upload_input(&inputs[n + 2], bytemuck::cast_slice(&batch.prompt_lengths))?,
                self.slice().scalar(&inputs[n + 3], temperature.to_le_bytes())?,
            ])
        })?;
        let params = match params {
            Some(params) => params,
            None => self.policy()?,
        };
        let mut args: Vec<Arg<'_>> = params.iter().map(Arg::Borrow).collect();
        args.extend(uploaded.iter().map(Arg::Borrow));
        let out = phases.time(phase, || program.run(args))?;
        phases.time("transfers", || {
            Ok(bytemuck::pod_collect_to_vec(&self.slice().download(&program.spec().outputs[0], &out[0])?))
        })
    }

    /// Adds one micro-batch's GRPO gradient to the accumulator. Phases: `transfers` (the
    /// batch up) and `gradients` (the program).
    fn grpo_grad_step(
        &mut self,
        batch: &TrainBatch,
        reference: &[f32],
        spec: &GrpoSpec,
        phases: &mut Phases,
    ) -> Result<(), WorkerError> {
        let inputs = &self.grad_step.spec().inputs;
        let n = self.manifest().params.len();
        let uploaded = phases.time("transfers", || -> Result<_, WorkerError> {
            Ok([
                self.upload_input(&inputs[2 * n], bytemuck::cast_slice(&batch.tokens))?,
                self.upload_input(&inputs[2 * n + 1], bytemuck::cast_slice(&batch.targets))?,
                self.upload_input(&inputs[2 * n + 2], bytemuck::cast_slice(&batch.prompt_lengths))?,
                self.upload_input(&inputs[2 * n + 3], bytemuck::cast_slice(&batch.loss_mask))?,
                self.upload_input(&inputs[2 * n + 4], bytemuck::cast_slice(&batch.advantages))?,
                self.upload_input(&inputs[2 * n + 5], bytemuck::cast_slice(&batch.old_logprobs))?,
                self.upload_input(&inputs[2 * n + 6], bytemuck::cast_slice(reference))?,
                self.slice().scalar(&inputs[2 * n + 7], spec.temperature.to_le_bytes())?,
                self.slice().scalar(&inputs[2 * n + 8], spec.clip_low.to_le_bytes())?,
                self.slice().scalar(&inputs[2 * n + 9], spec.clip_high.to_le_bytes())?,
                self.slice().scalar(&inputs[2 * n + 10], spec.kl_beta.to_le_bytes())?,
            ])
        })?;
        self.grpo_programs()?;
        let state = self.state.as_mut().ok_or_else(not_initialized)?;
        let mut args: Vec<Arg<'_>> = state.params.iter().map(Arg::Borrow).collect();
        args.extend(std::mem::take(&mut state.grads).into_iter().map(Arg::Donate));
        args.extend(uploaded.iter().map(Arg::Borrow));
        let mut out = phases.time("gradients", || self.grad_step.run(args))?;
        let metrics = out.split_off(n);
        state.grads = out;
        state.pending.push(metrics);
        Ok(())
    }
}

/// Samples, scores and accumulates the gradient of logical rank `rank`'s share of `step` (`accum`
/// micro-batches); returns the rank's host-side tally (the device sums are added by the caller).
/// Its time goes into `phases` (see [`Grpo`]).
fn rank_step(
    trainer: &mut Trainer,
    task: &GrpoTask,
    reference: Option<&[DeviceArray]>,
    step: u64,
    rank: usize,
    accum: u64,
    phases: &mut Phases,
) -> Result<(Tally, Vec<f32>), WorkerError> {
    let g = task.spec.generations;
    let rows = accum * task.micro as u64;
    if !rows.is_multiple_of(g) {
        return Err(WorkerError::incompatible(
            Part::Job,
            format!(
                "a rank's {rows} rows are not whole groups of {g} generations; use a global batch of whole groups per slice"
            ),
        ));
    }
    let first_prompt = rank as u64 * rows / g;
    let mut tally = Tally::default();
    let (examples, encoded) = phases.time("prompts", || -> Result<_, WorkerError> {
        let examples = task.examples(step, first_prompt, rows / g)?;
        let mut encoded = Vec::with_capacity(examples.len());
        for example in &examples {
            let (tokens, cut) = task.decoding.encode_prompt(&example.prompt)?;
            tally.truncated_prompts += if cut { 1.0 } else { 0.0 };
            encoded.push(tokens);
        }
        Ok((examples, encoded))
    })?;
    // Row r of the rank: prompt r / g, generation r % g.
    let row_input = |r: u64| {
        let prompt = (r / g) as usize;
        (encoded[prompt].as_slice(), task.sample_seed(step, first_prompt + r / g, r % g))
    };
    let micro = task.micro as u64;
    let mut sampled = Vec::with_capacity(accum as usize);
    for m in 0..accum {
        let prompts = phases.time("prompts", || {
            let inputs: Vec<_> = (m * micro..(m + 1) * micro).map(row_input).collect();
            task.decoding.prompt_batch(&inputs)
        });
        let completions =
            trainer.rollout(&prompts, (task.spec.temperature, task.spec.top_p), &task.decoding, phases)?;
        sampled.push((prompts, completions));
    }
    let n = task.max_new;
    let (advantages, spread, per_function) = phases.time("rewards", || -> Result<_, WorkerError> {
        let mut texts = Vec::with_capacity(rows as usize);
        for (_, completions) in &sampled {
            for row in 0..task.micro {
                let tokens = task.decoding.completion(completions, row);
                texts.push((task.decoding.decode(tokens), tokens));
            }
        }
        let completions: Vec<Completion<'_>> = texts
            .iter()
            .enumerate()
            .map(|(r, (text, ids))| Completion { example: &examples[r / g as usize], text, ids })
            .collect();
        let scores = task.rewards.score(&completions, g as usize, &task.prompter, step, task.steps)?;
        for (completion, &total) in completions.iter().zip(&scores.totals) {
            tally.count_row(&task.rewards.numeric(completion), total, completion.ids.len() as i32, n);
        }
        let (advantages, spread) = advantages(&scores.totals, g as usize, task.spec.scale_rewards);
        Ok((advantages, spread, function_sums(&scores.per_function)))
    })?;
    tally.groups += (rows / g) as f32;
    tally.groups_with_spread += spread as f32;
    for (m, (prompts, completions)) in sampled.iter().enumerate() {
        let mut batch = phases.time("train_batches", || {
            let chunk = advantages[m * task.micro..(m + 1) * task.micro].to_vec();
            task.train_batch(prompts, completions, chunk)
        });
        if task.bfloat16_compute {
            batch.old_logprobs =
                trainer.score(None, &batch, task.spec.temperature, "old_logprobs", phases)?;
        }
        let reference_logprobs = match reference {
            Some(params) if task.spec.kl_beta > 0.0 => {
                trainer.score(Some(params), &batch, task.spec.temperature, "ref_logprobs", phases)?
            }
            // KL weighted by 0: the reference's log-probs are never read into the loss, and
            // equal to the policy's they make the (reported) KL exactly 0.
            _ => batch.old_logprobs.clone(),
        };
        trainer.grpo_grad_step(&batch, &reference_logprobs, &task.spec, phases)?;
    }
    Ok((tally, per_function))
}

/// Each function's (sum, count) over the rows it scores, flat: what the step's all-reduce adds up
/// across ranks after the [`Tally`].
fn function_sums(per_function: &[Vec<Option<f32>>]) -> Vec<f32> {
    per_function
        .iter()
        .flat_map(|values| {
            let scored = values.iter().flatten();
            [scored.clone().sum::<f32>(), scored.count() as f32]
        })
        .collect()
}

/// The Python that runs Python reward functions: `PODCTL_PYTHON`, else the checkout's `.venv`
/// (`PODCTL_HOME`), else `python3` on the PATH.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("PODCTL_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    std::env::var_os("PODCTL_HOME")
        .map(|home| PathBuf::from(home).join(".venv/bin/python"))
        .filter(|python| python.exists())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Scores the policy with greedy decoding on the job's held-out problems (`eval.problems`);
/// `None` when evaluation is off.
pub fn evaluate(trainer: &Trainer, task: &GrpoTask) -> Result<Option<EvalReport>, WorkerError> {
    task.held_out.as_ref().map(|held_out| held_out.evaluate(trainer)).transpose()
}

/// GRPO's objective: the job's prompts, rewards and settings, and the frozen reference.
pub struct Grpo {
    task: GrpoTask,
    /// The reference's parameters, when `kl_beta > 0`.
    reference: Option<Vec<DeviceArray>>,
}

impl Grpo {
    /// The objective of `task` with `reference`'s parameters (needed when `kl_beta > 0`).
    pub fn with_reference(task: GrpoTask, reference: Option<Vec<DeviceArray>>) -> Result<Self, WorkerError> {
        if task.spec.kl_beta > 0.0 && reference.is_none() {
            return Err(WorkerError::broken("grpo.kl_beta > 0 needs the reference's parameters"));
        }
        Ok(Self { task, reference })
    }

    /// The job's prompts, rewards and settings.
    pub fn task(&self) -> &GrpoTask {
        &self.task
    }
}

impl Objective for Grpo {
    /// The tally, then each reward function's sum and count.
    fn sums_len(&self) -> usize {
        Tally::LEN + 2 * self.task.rewards.names().len()
    }

    /// Samples, scores and accumulates the rank's gradient; its tally adds the grad steps'
    /// device-side sums to the host-side ones.
    fn rank_gradient(&self, trainer: &mut Trainer, at: RankStep) -> Result<RankShare, WorkerError> {
        let done = trainer.state.as_ref().ok_or_else(not_initialized)?.pending.len();
        let RankStep { step, rank, accum } = at;
        let mut phases = Phases::new();
        let (mut tally, per_function) =
            rank_step(trainer, &self.task, self.reference.as_deref(), step, rank, accum, &mut phases)?;
        for outputs in &phases.time("reduce", || trainer.pending_outputs())?[done..] {
            // loss_sum, token_count, kl_sum, clipped_count, ratio_sum, ratio_min, ratio_max
            tally.loss_sum += outputs[0];
            tally.token_count += outputs[1];
            tally.kl_sum += outputs[2];
            tally.clipped += outputs[3];
            tally.ratio_sum += outputs[4];
        }
        self.task.files.log_reads();
        let mut sums = tally.to_vec();
        sums.extend(per_function);
        Ok(RankShare {
            sums,
            tokens: accum * (self.task.micro * self.task.seq_len()) as u64,
            truncated_rows: tally.truncated_prompts as u64,
            phases,
        })
    }

    /// The loss is a mean over the step's completion tokens, which only the reduced tally knows.
    fn grad_scale(&self, step: u64, sums: &[f32]) -> Result<f32, WorkerError> {
        let tokens = Tally::from_slice(sums).token_count;
        if tokens <= 0.0 {
            return Err(WorkerError::NothingToLearn {
                step,
                what: "completion tokens",
                fix: "sample longer completions (grpo.max_new_tokens) or check the prompts",
            });
        }
        Ok(1.0 / tokens)
    }

    /// GRPO's metrics, and each reward function's mean over the completions it scored
    /// (`reward_<name>`; absent at a step where it scored none).
    fn metrics(&self, sums: &[f32]) -> BTreeMap<String, f64> {
        let mut metrics = GrpoMetrics::from_tally(Tally::from_slice(sums)).to_map();
        for (name, pair) in self.task.rewards.names().into_iter().zip(sums[Tally::LEN..].chunks(2)) {
            if let [sum, count] = *pair
                && count > 0.0
            {
                metrics.insert(format!("reward_{name}"), f64::from(sum) / f64::from(count));
            }
        }
        metrics
    }

    fn evaluate(&self, trainer: &Trainer) -> Result<Option<EvalReport>, WorkerError> {
        evaluate(trainer, &self.task)
    }

    fn eval_every(&self) -> u64 {
        self.task.held_out.as_ref().map_or(0, HeldOut::every)
    }
}
