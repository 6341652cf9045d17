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
//! 2. **Rewards** ([`data::Reward`]): exact match of the number after `####`, partial credit for
//!    the digits right, and small format terms; weights from the job's `grpo.reward`.
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

use crate::WorkerError;
use crate::ckpt::{self, LocalCheckpoints, Resume};
use crate::dp::Reduce;
use crate::run::{Observer, StepMetrics, init_seed};
use crate::slice::{Arg, DeviceArray};
use crate::trainer::{AppliedStep, GrpoPrograms, Trainer, not_initialized};
use checkpoint::{Storage, StoreCommitLog, StoreOptions};
use collective::Buffer;
use data::{BatchSpec, Example, Loader, Prompter, Reward};
use job::{GrpoSpec, JobSpec};
use std::collections::BTreeMap;
use std::time::Instant;

/// Domain tag of the sampling seeds.
const DOMAIN_SAMPLE: u64 = 0x6772_706f_5f73_6d70; // "grpo_smp"
/// Added to a group's standard deviation before dividing: a group whose rewards all agree gets
/// advantages of 0, not a division by 0.
const STD_EPS: f64 = 1e-4;

/// A GRPO job's prompts, rewards and settings, for one bundle's micro-batch.
pub struct GrpoTask {
    spec: GrpoSpec,
    seed: u64,
    /// One prompt per "row" of a step of `prompts_per_step` rows: the loader's addressing of the
    /// data (and its epochs and permutations) applies to prompts.
    prompts: Loader,
    /// The held-out problems `evaluate` scores (empty: evaluation is off), and how often.
    held_out: Vec<Example>,
    eval_every: u64,
    micro: usize,
    prompt_len: usize,
    max_new: usize,
    /// The rollout's `sample/stop_ids`: the tokenizer's stop ids, unused slots -1.
    stop_ids: Vec<i32>,
    pad: i32,
    bfloat16_compute: bool,
}

impl GrpoTask {
    /// The task of `job`, for a bundle whose programs take `manifest.train.micro_batch` rows.
    pub fn new(job: &JobSpec, manifest: &bundle::Manifest) -> Result<Self, WorkerError> {
        let spec = job.grpo.clone().ok_or_else(|| {
            WorkerError::Mismatch(format!("job '{}' has no `grpo:` section; it trains with SFT", job.name))
        })?;
        let train = &manifest.train;
        let (Some(prompt_len), Some(max_new)) = (train.prompt_len, train.max_new_tokens) else {
            return Err(WorkerError::Mismatch(
                "the bundle is not a GRPO bundle; export one for the job's grpo section".into(),
            ));
        };
        if (prompt_len, max_new) != (spec.prompt_len, spec.max_new_tokens) {
            return Err(WorkerError::Mismatch(format!(
                "the bundle was lowered for prompts of {prompt_len} and completions of {max_new} tokens, the job \
                 asks for {} and {}; export the bundle again",
                spec.prompt_len, spec.max_new_tokens
            )));
        }
        if !manifest.frozen.is_empty() {
            return Err(WorkerError::Mismatch(
                "GRPO with LoRA adapters is not supported yet; drop train.lora from the GRPO job".into(),
            ));
        }
        let micro = train.micro_batch as usize;
        let prompts_per_step = job.batch.global / spec.generations;
        let seq_len = job.seq_len as usize;
        let prompts =
            Loader::from_config(&job.data, BatchSpec::new(prompts_per_step as usize, 1, seq_len)?, job.seed)?;
        prompts.check_model_vocab(manifest.model.vocab_size, &job.model)?;
        let held_out = match job.evaluation() {
            Some(eval) => data::held_out_examples(&job.data, eval.problems, job.seed)?,
            None => Vec::new(),
        };
        let tokenizer =
            prompts.tokenizer().ok_or(data::DataError::NotAnExampleSource { operation: "GRPO" })?;
        let slots = manifest
            .programs
            .get("rollout")
            .and_then(|p| p.inputs.iter().find(|t| t.name == "sample/stop_ids"));
        let slots = slots.map_or(bundle::STOP_IDS as usize, |t| t.shape.iter().product::<u64>() as usize);
        if tokenizer.stop_ids().len() > slots {
            return Err(WorkerError::Mismatch(format!(
                "the tokenizer stops at {} ids ({:?}), but the bundle's rollout takes at most {slots}",
                tokenizer.stop_ids().len(),
                tokenizer.stop_ids()
            )));
        }
        let mut stop_ids = vec![-1; slots];
        for (slot, &id) in stop_ids.iter_mut().zip(tokenizer.stop_ids()) {
            *slot = id as i32;
        }
        Ok(Self {
            stop_ids,
            pad: tokenizer.pad_id() as i32,
            eval_every: job.evaluation().map_or(0, |eval| eval.every),
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

    fn prompter(&self) -> &Prompter {
        self.prompts.prompter().expect("checked in new")
    }

    fn seq_len(&self) -> usize {
        self.prompt_len + self.max_new
    }

    /// The prompt's ids ([`Prompter::prompt_ids`]), its last `prompt_len` tokens when longer
    /// (the question is at the end), and whether it was cut.
    fn encode_prompt(&self, text: &str) -> Result<(Vec<i32>, bool), WorkerError> {
        let mut tokens: Vec<i32> =
            self.prompter().prompt_ids(text)?.into_iter().map(|id| id as i32).collect();
        let cut = tokens.len() > self.prompt_len;
        if cut {
            tokens.drain(..tokens.len() - self.prompt_len);
        }
        Ok((tokens, cut))
    }

    /// The text of a completion's tokens before its stop id ([`Prompter::completion_text`]).
    fn decode(&self, tokens: &[i32]) -> String {
        let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        self.prompter().completion_text(&ids)
    }

    /// The sampling seed of generation `generation` of global prompt `prompt` of `step`.
    fn sample_seed(&self, step: u64, prompt: u64, generation: u64) -> u32 {
        data::hash_words(&[DOMAIN_SAMPLE, self.seed, step, prompt, generation]) as u32
    }

    /// Lays prompts out as `rollout` takes them: left-padded, with lengths and seeds.
    fn prompt_batch(&self, rows: &[(&[i32], u32)]) -> PromptBatch {
        let p = self.prompt_len;
        let mut batch = PromptBatch {
            tokens: vec![self.pad; rows.len() * p],
            lengths: Vec::with_capacity(rows.len()),
            seeds: Vec::with_capacity(rows.len()),
        };
        for (row, (tokens, seed)) in rows.iter().enumerate() {
            batch.tokens[row * p + p - tokens.len()..(row + 1) * p].copy_from_slice(tokens);
            batch.lengths.push(tokens.len() as i32);
            batch.seeds.push(*seed);
        }
        batch
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

/// Prompts laid out for `rollout`.
struct PromptBatch {
    tokens: Vec<i32>,
    lengths: Vec<i32>,
    seeds: Vec<u32>,
}

/// One micro-batch's completions, on the host.
struct Completions {
    tokens: Vec<i32>,
    lengths: Vec<i32>,
    logprobs: Vec<f32>,
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

/// Sums over a step's rows (host side) and grad steps (device side). One rank's tally is
/// reduced with the other ranks' in the gradients' all-reduce, as float32 values in this order.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    rows: f32,
    reward: f32,
    reward_squares: f32,
    correct: f32,
    digits_right: f32,
    has_marker: f32,
    well_formed: f32,
    stops_cleanly: f32,
    completion_tokens: f32,
    stopped: f32,
    truncated_prompts: f32,
    groups: f32,
    groups_with_spread: f32,
    loss_sum: f32,
    token_count: f32,
    kl_sum: f32,
    clipped: f32,
    ratio_sum: f32,
}

impl Tally {
    const LEN: usize = 18;

    fn to_vec(self) -> Vec<f32> {
        vec![
            self.rows,
            self.reward,
            self.reward_squares,
            self.correct,
            self.digits_right,
            self.has_marker,
            self.well_formed,
            self.stops_cleanly,
            self.completion_tokens,
            self.stopped,
            self.truncated_prompts,
            self.groups,
            self.groups_with_spread,
            self.loss_sum,
            self.token_count,
            self.kl_sum,
            self.clipped,
            self.ratio_sum,
        ]
    }

    fn from_slice(v: &[f32]) -> Self {
        Self {
            rows: v[0],
            reward: v[1],
            reward_squares: v[2],
            correct: v[3],
            digits_right: v[4],
            has_marker: v[5],
            well_formed: v[6],
            stops_cleanly: v[7],
            completion_tokens: v[8],
            stopped: v[9],
            truncated_prompts: v[10],
            groups: v[11],
            groups_with_spread: v[12],
            loss_sum: v[13],
            token_count: v[14],
            kl_sum: v[15],
            clipped: v[16],
            ratio_sum: v[17],
        }
    }

    fn add(self, other: Self) -> Self {
        let (a, b) = (self.to_vec(), other.to_vec());
        Self::from_slice(&a.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>())
    }

    fn count_row(&mut self, reward: &Reward, length: i32, max_new: usize) {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        self.rows += 1.0;
        self.reward += reward.total;
        self.reward_squares += reward.total * reward.total;
        self.correct += flag(reward.exact_match);
        self.digits_right += reward.digits_right;
        self.has_marker += flag(reward.has_marker);
        self.well_formed += flag(reward.well_formed);
        self.stops_cleanly += flag(reward.stops_cleanly);
        self.completion_tokens += length as f32;
        self.stopped += flag((length as usize) < max_new);
    }
}

/// A GRPO step's metrics over the global batch (every worker computes the same).
#[derive(Debug, Clone, PartialEq)]
pub struct GrpoMetrics {
    /// Mean reward per completion.
    pub reward: f64,
    /// Standard deviation of the rewards over the batch.
    pub reward_std: f64,
    /// Completions whose final answer is right.
    pub accuracy: f64,
    /// Mean fraction of the answer's digits right.
    pub digits_right: f64,
    /// Completions with a `####` marker.
    pub has_marker: f64,
    /// Completions whose final answer is a well-formed number.
    pub well_formed: f64,
    /// Completions with nothing after the answer's line.
    pub stops_cleanly: f64,
    /// Mean completion length in tokens (with the EOS).
    pub completion_length: f64,
    /// Completions that ended with EOS within the buffer.
    pub stopped: f64,
    /// Prompts cut to `grpo.prompt_len`.
    pub truncated_prompts: f64,
    /// Groups whose rewards differ (the others carry no policy gradient).
    pub groups_with_spread: f64,
    /// Mean GRPO loss per completion token.
    pub loss: f64,
    /// Completion tokens the loss counted.
    pub tokens: f64,
    /// Mean KL to the reference per token (k3); 0 when `kl_beta` is 0 (not computed).
    pub kl: f64,
    /// Fraction of tokens whose ratio was clipped.
    pub clip_fraction: f64,
    /// Mean importance ratio.
    pub ratio: f64,
}

impl GrpoMetrics {
    fn from_tally(t: Tally) -> Self {
        let f = |x: f32| x as f64;
        let rows = f(t.rows).max(1.0);
        let tokens = f(t.token_count).max(1.0);
        let reward = f(t.reward) / rows;
        Self {
            reward,
            reward_std: (f(t.reward_squares) / rows - reward * reward).max(0.0).sqrt(),
            accuracy: f(t.correct) / rows,
            digits_right: f(t.digits_right) / rows,
            has_marker: f(t.has_marker) / rows,
            well_formed: f(t.well_formed) / rows,
            stops_cleanly: f(t.stops_cleanly) / rows,
            completion_length: f(t.completion_tokens) / rows,
            stopped: f(t.stopped) / rows,
            truncated_prompts: f(t.truncated_prompts),
            groups_with_spread: f(t.groups_with_spread) / f(t.groups).max(1.0),
            loss: f(t.loss_sum) / tokens,
            tokens: f(t.token_count),
            kl: f(t.kl_sum) / tokens,
            clip_fraction: f(t.clipped) / tokens,
            ratio: f(t.ratio_sum) / tokens,
        }
    }

    /// The metrics by name, as `metrics.jsonl` and step reports carry them.
    pub fn to_map(&self) -> BTreeMap<String, f64> {
        [
            ("reward", self.reward),
            ("reward_std", self.reward_std),
            ("accuracy", self.accuracy),
            ("digits_right", self.digits_right),
            ("has_marker", self.has_marker),
            ("well_formed", self.well_formed),
            ("stops_cleanly", self.stops_cleanly),
            ("completion_length", self.completion_length),
            ("stopped", self.stopped),
            ("truncated_prompts", self.truncated_prompts),
            ("groups_with_spread", self.groups_with_spread),
            ("kl", self.kl),
            ("clip_fraction", self.clip_fraction),
            ("ratio", self.ratio),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// What one GRPO step did.
#[derive(Debug, Clone, PartialEq)]
pub struct GrpoStep {
    /// The optimizer step; `loss_sum` and `token_count` cover this worker's ranks.
    pub applied: AppliedStep,
    /// Tokens processed by this worker's ranks (rows x row length).
    pub tokens: u64,
    /// The step's metrics over the global batch.
    pub metrics: GrpoMetrics,
}

impl Trainer {
    fn grpo_programs(&self) -> Result<&GrpoPrograms, WorkerError> {
        self.grpo.as_ref().ok_or_else(|| {
            WorkerError::Mismatch(
                "this is an SFT bundle; a GRPO job needs a GRPO bundle (train.kind grpo)".into(),
            )
        })
    }

    fn policy(&self) -> Result<&[DeviceArray], WorkerError> {
        Ok(&self.state.as_ref().ok_or_else(not_initialized)?.params)
    }

    fn upload_input(&self, spec: &bundle::TensorSpec, host: &[u8]) -> Result<DeviceArray, WorkerError> {
        self.slice().upload(spec, host)
    }

    /// Samples one micro-batch's completions with the policy.
    fn rollout(
        &self,
        prompts: &PromptBatch,
        temperature: f32,
        task: &GrpoTask,
    ) -> Result<Completions, WorkerError> {
        let program = &self.grpo_programs()?.rollout;
        let inputs = &program.spec().inputs;
        let n = self.manifest().params.len();
        let uploaded = [
            self.upload_input(&inputs[n], bytemuck::cast_slice(&prompts.tokens))?,
            self.upload_input(&inputs[n + 1], bytemuck::cast_slice(&prompts.lengths))?,
            self.upload_input(&inputs[n + 2], bytemuck::cast_slice(&prompts.seeds))?,
            self.slice().scalar(&inputs[n + 3], temperature.to_le_bytes())?,
            self.slice().scalar(&inputs[n + 4], task.spec.top_p.to_le_bytes())?,
            self.upload_input(&inputs[n + 5], bytemuck::cast_slice(&task.stop_ids))?,
            self.slice().scalar(&inputs[n + 6], task.pad.to_le_bytes())?,
        ];
        let mut args: Vec<Arg<'_>> = self.policy()?.iter().map(Arg::Borrow).collect();
        args.extend(uploaded.iter().map(Arg::Borrow));
        let out = program.run(args)?;
        let outputs = &program.spec().outputs;
        let download = |i: usize| self.slice().download(&outputs[i], &out[i]);
        Ok(Completions {
            tokens: bytemuck::pod_collect_to_vec(&download(0)?),
            lengths: bytemuck::pod_collect_to_vec(&download(1)?),
            logprobs: bytemuck::pod_collect_to_vec(&download(2)?),
        })
    }

    /// Per-target log-probs of full rows under `params` (the policy's when `None`).
    fn score(
        &self,
        params: Option<&[DeviceArray]>,
        batch: &TrainBatch,
        temperature: f32,
    ) -> Result<Vec<f32>, WorkerError> {
        let program = &self.grpo_programs()?.logprobs;
        let inputs = &program.spec().inputs;
        let n = self.manifest().params.len();
        let uploaded = [
            self.upload_input(&inputs[n], bytemuck::cast_slice(&batch.tokens))?,
            self.upload_input(&inputs[n + 1], bytemuck::cast_slice(&batch.targets))?,
            self.upload_input(&inputs[n + 2], bytemuck::cast_slice(&batch.prompt_lengths))?,
            self.slice().scalar(&inputs[n + 3], temperature.to_le_bytes())?,
        ];
        let params = match params {
            Some(params) => params,
            None => self.policy()?,
        };
        let mut args: Vec<Arg<'_>> = params.iter().map(Arg::Borrow).collect();
        args.extend(uploaded.iter().map(Arg::Borrow));
        let out = program.run(args)?;
        Ok(bytemuck::pod_collect_to_vec(&self.slice().download(&program.spec().outputs[0], &out[0])?))
    }

    /// Adds one micro-batch's GRPO gradient to the accumulator.
    fn grpo_grad_step(
        &mut self,
        batch: &TrainBatch,
        reference: &[f32],
        spec: &GrpoSpec,
    ) -> Result<(), WorkerError> {
        let inputs = &self.grad_step.spec().inputs;
        let n = self.manifest().params.len();
        let uploaded = [
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
        ];
        self.grpo_programs()?;
        let state = self.state.as_mut().ok_or_else(not_initialized)?;
        let mut args: Vec<Arg<'_>> = state.params.iter().map(Arg::Borrow).collect();
        args.extend(std::mem::take(&mut state.grads).into_iter().map(Arg::Donate));
        args.extend(uploaded.iter().map(Arg::Borrow));
        let mut out = self.grad_step.run(args)?;
        let metrics = out.split_off(n);
        state.grads = out;
        state.pending.push(metrics);
        Ok(())
    }
}

/// Group-normalized advantages of `rewards`, `generations` consecutive rows per group; also the
/// number of groups whose rewards are not all equal.
fn advantages(rewards: &[f32], generations: usize, scale: bool) -> (Vec<f32>, usize) {
    let mut out = Vec::with_capacity(rewards.len());
    let mut spread = 0;
    for group in rewards.chunks(generations) {
        let n = group.len() as f64;
        let mean = group.iter().map(|&r| r as f64).sum::<f64>() / n;
        let var = group.iter().map(|&r| (r as f64 - mean).powi(2)).sum::<f64>() / n;
        if group.iter().any(|&r| r != group[0]) {
            spread += 1;
        }
        let denominator = if scale { var.sqrt() + STD_EPS } else { 1.0 };
        out.extend(group.iter().map(|&r| ((r as f64 - mean) / denominator) as f32));
    }
    (out, spread)
}

/// Samples, scores and accumulates the gradient of logical rank `rank`'s share of `step` (`accum`
/// micro-batches); returns the rank's host-side tally (the device sums are added by the caller).
fn rank_step(
    trainer: &mut Trainer,
    task: &GrpoTask,
    reference: Option<&[DeviceArray]>,
    step: u64,
    rank: usize,
    accum: u64,
) -> Result<Tally, WorkerError> {
    let g = task.spec.generations;
    let rows = accum * task.micro as u64;
    if !rows.is_multiple_of(g) {
        return Err(WorkerError::Mismatch(format!(
            "a rank's {rows} rows are not whole groups of {g} generations; use a global batch of whole groups per slice"
        )));
    }
    let first_prompt = rank as u64 * rows / g;
    let examples = task.examples(step, first_prompt, rows / g)?;
    let mut tally = Tally::default();
    let mut encoded = Vec::with_capacity(examples.len());
    for example in &examples {
        let (tokens, cut) = task.encode_prompt(&example.prompt)?;
        tally.truncated_prompts += if cut { 1.0 } else { 0.0 };
        encoded.push(tokens);
    }
    // Row r of the rank: prompt r / g, generation r % g.
    let row_input = |r: u64| {
        let prompt = (r / g) as usize;
        (encoded[prompt].as_slice(), task.sample_seed(step, first_prompt + r / g, r % g))
    };
    let micro = task.micro as u64;
    let mut sampled = Vec::with_capacity(accum as usize);
    for m in 0..accum {
        let inputs: Vec<_> = (m * micro..(m + 1) * micro).map(row_input).collect();
        let prompts = task.prompt_batch(&inputs);
        let completions = trainer.rollout(&prompts, task.spec.temperature, task)?;
        sampled.push((prompts, completions));
    }
    let n = task.max_new;
    let mut rewards = Vec::with_capacity(rows as usize);
    for (m, (_, completions)) in sampled.iter().enumerate() {
        for row in 0..task.micro {
            let r = m as u64 * micro + row as u64;
            let length = completions.lengths[row].clamp(0, n as i32);
            let tokens = &completions.tokens[row * n..row * n + length as usize];
            let text = task.decode(tokens);
            let reward = Reward::score(&text, &examples[(r / g) as usize].answer, &task.spec.reward);
            tally.count_row(&reward, length, n);
            rewards.push(reward.total);
        }
    }
    let (advantages, spread) = advantages(&rewards, g as usize, task.spec.scale_rewards);
    tally.groups += (rows / g) as f32;
    tally.groups_with_spread += spread as f32;
    for (m, (prompts, completions)) in sampled.iter().enumerate() {
        let chunk = advantages[m * task.micro..(m + 1) * task.micro].to_vec();
        let mut batch = task.train_batch(prompts, completions, chunk);
        if task.bfloat16_compute {
            batch.old_logprobs = trainer.score(None, &batch, task.spec.temperature)?;
        }
        let reference_logprobs = match reference {
            Some(params) if task.spec.kl_beta > 0.0 => {
                trainer.score(Some(params), &batch, task.spec.temperature)?
            }
            // KL weighted by 0: the reference's log-probs are never read into the loss, and
            // equal to the policy's they make the (reported) KL exactly 0.
            _ => batch.old_logprobs.clone(),
        };
        trainer.grpo_grad_step(&batch, &reference_logprobs, &task.spec)?;
    }
    Ok(tally)
}

/// Runs 0-based GRPO step `step` for `ranks` (ascending) with `accum` micro-batches per rank,
/// then applies the summed gradient at `learning_rate`. `reference` is the frozen reference's
/// parameters (needed when `kl_beta > 0`).
#[allow(clippy::too_many_arguments)]
pub fn run_step(
    trainer: &mut Trainer,
    task: &GrpoTask,
    reference: Option<&[DeviceArray]>,
    step: u64,
    ranks: &[usize],
    accum: u64,
    learning_rate: f64,
    reduce: Reduce<'_>,
) -> Result<GrpoStep, WorkerError> {
    if task.spec.kl_beta > 0.0 && reference.is_none() {
        return Err(WorkerError::Mismatch("grpo.kl_beta > 0 needs the reference's parameters".into()));
    }
    let n = trainer.grad_specs().len();
    let mut round = match reduce {
        Reduce::Alone => None,
        Reduce::Ring(group) => Some(group.round(n + 1)?),
    };
    let mut total = Tally::default();
    let mut tokens = 0u64;
    for (i, &rank) in ranks.iter().enumerate() {
        if i > 0 && round.is_some() {
            trainer.zero_grads()?;
        }
        let done = trainer.state.as_ref().ok_or_else(not_initialized)?.pending.len();
        let mut tally = rank_step(trainer, task, reference, step, rank, accum)?;
        tokens += accum * (task.micro * task.seq_len()) as u64;
        for outputs in &trainer.pending_outputs()?[done..] {
            // loss_sum, token_count, kl_sum, clipped_count, ratio_sum, ratio_min, ratio_max
            tally.loss_sum += outputs[0];
            tally.token_count += outputs[1];
            tally.kl_sum += outputs[2];
            tally.clipped += outputs[3];
            tally.ratio_sum += outputs[4];
        }
        match &mut round {
            None => total = total.add(tally),
            Some(round) => {
                for bucket in 0..n {
                    let dtype = trainer.grad_specs()[bucket].dtype;
                    round.submit(bucket, rank, Buffer::from_vec(dtype, trainer.download_grad(bucket)?)?)?;
                }
                round.submit(n, rank, Buffer::from_f32(&tally.to_vec()))?;
            }
        }
    }
    if let Some(round) = round {
        let mut sums = round.finish()?;
        let tally = sums.pop().expect("n + 1 buckets").swap_remove(0).to_f32()?;
        if tally.len() != Tally::LEN {
            return Err(WorkerError::Mismatch(format!(
                "a step's tally has {} values, not {}",
                tally.len(),
                Tally::LEN
            )));
        }
        total = Tally::from_slice(&tally);
        let grads: Vec<Vec<u8>> =
            sums.into_iter().map(|mut per_rank| per_rank.swap_remove(0).into_vec()).collect();
        trainer.upload_grads(&grads)?;
    }
    if total.token_count <= 0.0 {
        return Err(WorkerError::Mismatch(format!(
            "step {} sampled no completion tokens to learn from",
            step + 1
        )));
    }
    let applied = trainer.apply(step + 1, learning_rate as f32, 1.0 / total.token_count)?;
    Ok(GrpoStep { applied, tokens, metrics: GrpoMetrics::from_tally(total) })
}

/// Greedy decoding on the held-out problems.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// Problems scored.
    pub problems: u64,
    /// Problems answered exactly.
    pub correct: u64,
    /// Mean reward (the job's reward weights).
    pub reward: f64,
    /// The first problems: `(prompt, completion, reference answer)`, for people.
    pub samples: Vec<(String, String, String)>,
}

impl EvalReport {
    /// Fraction answered exactly.
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.problems.max(1) as f64
    }
}

/// Scores the policy with greedy decoding on the job's held-out problems (`eval.problems`);
/// `None` when evaluation is off.
pub fn evaluate(trainer: &Trainer, task: &GrpoTask) -> Result<Option<EvalReport>, WorkerError> {
    if task.held_out.is_empty() {
        return Ok(None);
    }
    let examples = &task.held_out;
    let problems = examples.len() as u64;
    let encoded: Vec<Vec<i32>> =
        examples.iter().map(|e| Ok(task.encode_prompt(&e.prompt)?.0)).collect::<Result<_, WorkerError>>()?;
    let mut report = EvalReport { problems, correct: 0, reward: 0.0, samples: Vec::new() };
    let n = task.max_new;
    for first in (0..encoded.len()).step_by(task.micro) {
        // The last batch is filled up with the first problem; those rows are not scored.
        let rows: Vec<(&[i32], u32)> = (first..first + task.micro)
            .map(|i| (encoded.get(i).unwrap_or(&encoded[0]).as_slice(), 0))
            .collect();
        let completions = trainer.rollout(&task.prompt_batch(&rows), 0.0, task)?;
        for (row, example) in examples.iter().enumerate().skip(first).take(task.micro) {
            let row = row - first;
            let length = completions.lengths[row].clamp(0, n as i32) as usize;
            let tokens = &completions.tokens[row * n..row * n + length];
            let text = task.decode(tokens);
            let reward = Reward::score(&text, &example.answer, &task.spec.reward);
            report.correct += reward.exact_match as u64;
            report.reward += reward.total as f64 / problems as f64;
            if report.samples.len() < 3 {
                report.samples.push((example.prompt.clone(), text, example.answer.clone()));
            }
        }
    }
    Ok(Some(report))
}

/// Puts the parameters of the checkpoint at `uri` (a checkpoint directory, or a root whose
/// newest committed checkpoint that restores is taken) into the trainer, with AdamW's moments
/// zeroed: where a GRPO run starts. Returns the checkpoint's directory.
pub fn start_from(
    trainer: &mut Trainer,
    uri: &str,
    runtime: &tokio::runtime::Handle,
) -> Result<String, WorkerError> {
    let store = StoreOptions::default();
    let restored = match ckpt::split_uri(uri) {
        (_, Some((step, _))) => runtime.block_on(ckpt::restore(trainer, uri, step, &store))?,
        (root, None) => {
            let storage = Storage::open(root, &store)?;
            let log = StoreCommitLog::new(storage.clone());
            let (restored, passed_over) = runtime.block_on(ckpt::restore_newest(trainer, &storage, &log))?;
            restored.ok_or_else(|| {
                let reasons: Vec<String> =
                    passed_over.iter().map(|p| format!("{}: {}", p.uri, p.reason)).collect();
                WorkerError::Mismatch(format!(
                    "grpo.init_from {uri}: no committed checkpoint restores there{}",
                    if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join("; ")) }
                ))
            })?
        }
    };
    trainer.reset_optimizer()?;
    Ok(restored.uri)
}

/// A worker's steps of either kind, for drivers that run both (the agent): SFT's batches from
/// the data, or GRPO's rollouts with the task and the frozen reference.
pub enum JobSteps {
    /// Supervised fine-tuning.
    Sft(Loader),
    /// GRPO.
    Grpo {
        /// Prompts, rewards and settings.
        task: Box<GrpoTask>,
        /// The reference's parameters, when `kl_beta > 0`.
        reference: Option<Vec<DeviceArray>>,
    },
}

/// What a step of either kind reports: the applied step (this worker's loss sums), the tokens
/// this worker's ranks processed, and further metrics by name.
pub type StepDone = (AppliedStep, u64, BTreeMap<String, f64>);

impl JobSteps {
    /// The steps of `job` on `trainer`'s bundle (a GRPO job reads its reference now).
    pub fn new(
        trainer: &Trainer,
        job: &JobSpec,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Self, WorkerError> {
        match &job.grpo {
            None => {
                let batch = BatchSpec::new(
                    job.batch.global as usize,
                    job.batch.micro as usize,
                    job.seq_len as usize,
                )?;
                let loader = Loader::from_config(&job.data, batch, job.seed)?;
                loader.check_model_vocab(trainer.manifest().model.vocab_size, &job.model)?;
                Ok(JobSteps::Sft(loader))
            }
            Some(_) => Ok(JobSteps::Grpo {
                task: Box::new(GrpoTask::new(job, trainer.manifest())?),
                reference: load_reference(trainer, job, runtime)?,
            }),
        }
    }

    /// Runs 0-based step `step` for `ranks` (see [`crate::run_step`] and [`run_step`]).
    pub fn run(
        &self,
        trainer: &mut Trainer,
        step: u64,
        ranks: &[usize],
        accum: u64,
        learning_rate: f64,
        reduce: Reduce<'_>,
    ) -> Result<StepDone, WorkerError> {
        match self {
            JobSteps::Sft(loader) => {
                crate::run_step(trainer, loader, step, ranks, accum, learning_rate, reduce)
                    .map(|o| (o.applied, o.tokens, BTreeMap::new()))
            }
            JobSteps::Grpo { task, reference } => {
                run_step(trainer, task, reference.as_deref(), step, ranks, accum, learning_rate, reduce)
                    .map(|o| (o.applied, o.tokens, o.metrics.to_map()))
            }
        }
    }

    /// Held-out evaluation of a GRPO job (`None` for SFT or when it is off).
    pub fn evaluate(&self, trainer: &Trainer) -> Result<Option<EvalReport>, WorkerError> {
        match self {
            JobSteps::Sft(_) => Ok(None),
            JobSteps::Grpo { task, .. } => evaluate(trainer, task),
        }
    }

    /// Whether a held-out evaluation is due after `steps` of `total` steps.
    pub fn eval_due(&self, steps: u64, total: u64) -> bool {
        let JobSteps::Grpo { task, .. } = self else { return false };
        let every = task.eval_every;
        steps == total || (every > 0 && steps.is_multiple_of(every))
    }
}

/// Where a GRPO policy starts in a fresh generation: `grpo.init_from`'s parameters with a fresh
/// optimizer, or `init(seed)`. Returns the checkpoint directory it started from.
pub fn start_policy(
    trainer: &mut Trainer,
    job: &JobSpec,
    runtime: &tokio::runtime::Handle,
) -> Result<Option<String>, WorkerError> {
    match job.grpo.as_ref().and_then(|g| g.init_from.as_deref()) {
        Some(uri) => Ok(Some(start_from(trainer, uri, runtime)?)),
        None => {
            trainer.init(init_seed(job.seed))?;
            Ok(None)
        }
    }
}

/// GRPO's frozen reference, when the objective needs it (`kl_beta > 0`): the parameters the
/// policy started from, read again from `grpo.init_from` (a checkpoint directory) or made by
/// `init(seed)`, beside the policy's on the devices.
pub fn load_reference(
    trainer: &Trainer,
    job: &JobSpec,
    runtime: &tokio::runtime::Handle,
) -> Result<Option<Vec<DeviceArray>>, WorkerError> {
    let Some(spec) = job.grpo.as_ref().filter(|g| g.kl_beta > 0.0) else { return Ok(None) };
    let params = match &spec.init_from {
        Some(uri) => runtime.block_on(ckpt::read_params(trainer, uri, &StoreOptions::default()))?,
        None => trainer.init_params(init_seed(job.seed))?,
    };
    Ok(Some(params))
}

/// Receives a GRPO run's evaluations (its steps go to [`Observer::on_step`]).
pub trait EvalObserver: Observer {
    /// Called after each held-out evaluation, `step` the steps done (0: before training).
    fn on_eval(&mut self, step: u64, report: &EvalReport);
}

/// A GRPO run at a glance.
#[derive(Debug, Clone, PartialEq)]
pub struct GrpoSummary {
    /// Steps done before this run (a restored checkpoint of the run itself), or 0.
    pub start_step: u64,
    /// Steps run.
    pub steps: u64,
    /// The checkpoint the policy and the reference started from, if any.
    pub init_from: Option<String>,
    /// Held-out evaluation before the first step this run took.
    pub eval_before: Option<EvalReport>,
    /// Held-out evaluation after the last step.
    pub eval_after: Option<EvalReport>,
    /// Mean reward of the first and last steps.
    pub first_reward: f64,
    /// See `first_reward`.
    pub final_reward: f64,
    /// Wall time of the training loop (evaluations excluded).
    pub seconds: f64,
    /// Tokens per second over the loop.
    pub tokens_per_second: f64,
}

/// Trains a GRPO job on one slice: the policy starts from `grpo.init_from` (else from the job
/// seed), or from the run's own newest checkpoint as `resume` says; the reference is the
/// starting policy; held-out evaluation before, every `eval.every` steps and after.
pub fn train(
    trainer: &mut Trainer,
    job: &JobSpec,
    task: &GrpoTask,
    observer: &mut dyn EvalObserver,
    resume: &Resume,
) -> Result<GrpoSummary, WorkerError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
        WorkerError::Mismatch(format!("cannot start a runtime for the checkpoint reads: {e}"))
    })?;
    let init_from = start_policy(trainer, job, runtime.handle())?;
    let reference = load_reference(trainer, job, runtime.handle())?;
    let mut checkpoints = LocalCheckpoints::for_job(job)?;
    let start = checkpoints.resume(trainer, job, resume, observer)?.unwrap_or(0);
    let eval_before = evaluate(trainer, task)?;
    if let Some(report) = &eval_before {
        observer.on_eval(start, report);
    }
    let every = task.eval_every;
    let started = Instant::now();
    let mut eval_seconds = 0.0;
    let (mut first_reward, mut final_reward, mut tokens, mut eval_after) = (f64::NAN, f64::NAN, 0u64, None);
    for step in start..job.steps {
        let step_started = Instant::now();
        let learning_rate = job.optimizer.learning_rate(step, job.steps);
        let outcome = run_step(
            trainer,
            task,
            reference.as_deref(),
            step,
            &[0],
            job.micro_batches_per_step(),
            learning_rate,
            Reduce::Alone,
        )?;
        let seconds = step_started.elapsed().as_secs_f64();
        if step == start {
            first_reward = outcome.metrics.reward;
        }
        final_reward = outcome.metrics.reward;
        tokens += outcome.tokens;
        let mut extra = outcome.metrics.to_map();
        let last = step + 1 == job.steps;
        if last || (every > 0 && (step + 1) % every == 0) {
            let eval_started = Instant::now();
            if let Some(report) = evaluate(trainer, task)? {
                extra.insert("eval_accuracy".into(), report.accuracy());
                extra.insert("eval_reward".into(), report.reward);
                observer.on_eval(step + 1, &report);
                eval_after = Some(report);
            }
            eval_seconds += eval_started.elapsed().as_secs_f64();
        }
        let applied = outcome.applied;
        observer.on_step(&StepMetrics {
            step: step + 1,
            loss: applied.loss_sum / applied.token_count,
            target_tokens: applied.token_count as u64,
            tokens: outcome.tokens,
            learning_rate,
            grad_norm: applied.grad_norm,
            seconds,
            truncated_rows: outcome.metrics.truncated_prompts as u64,
            extra,
        });
        checkpoints.after_step(trainer, step + 1, observer)?;
    }
    let seconds = started.elapsed().as_secs_f64() - eval_seconds;
    checkpoints.finish(trainer, job.steps, observer)?;
    Ok(GrpoSummary {
        start_step: start,
        steps: job.steps - start,
        init_from,
        eval_before,
        eval_after,
        first_reward,
        final_reward,
        seconds,
        tokens_per_second: tokens as f64 / seconds.max(1e-9),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantages_are_normalized_within_each_group() {
        let (a, spread) = advantages(&[1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5], 4, true);
        assert_eq!(spread, 1);
        let expected = 0.5 / (0.5 + STD_EPS);
        for (got, want) in a[..4].iter().zip([expected, -expected, expected, -expected]) {
            assert!((*got as f64 - want).abs() < 1e-6, "{a:?}");
        }
        assert_eq!(&a[4..], &[0.0; 4], "a group that agrees carries no advantage");
        let (centred, _) = advantages(&[3.0, 1.0], 2, false);
        assert_eq!(centred, [1.0, -1.0]);
    }

    #[test]
    fn tallies_add_up_field_by_field_in_a_fixed_layout() {
        let a = Tally::from_slice(&(0..Tally::LEN).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(a.to_vec().len(), Tally::LEN);
        assert_eq!(Tally::from_slice(&a.to_vec()), a);
        let sum = a.add(a);
        assert_eq!(sum.to_vec(), (0..Tally::LEN).map(|i| 2.0 * i as f32).collect::<Vec<_>>());
    }
}
