//! Held-out evaluation, for SFT and GRPO jobs alike: greedy decoding of the job's held-out
//! problems through the bundle's `rollout` program, scored by exact match of the number after
//! `####` (and the job's reward, for comparison with training). Also how prompts are laid out
//! for `rollout` and completions read back ([`Decoding`]), which GRPO's sampling shares.

use crate::error::{Part, WorkerError};
use crate::objective::EvalReport;
use crate::phases::Phases;
use crate::slice::{Arg, DeviceArray, Program};
use crate::trainer::{Trainer, not_initialized};
use data::{Example, Prompter, Reward, RewardWeights};
use job::JobSpec;

/// The bundle's rollout buffers and the tokenizer's stop and pad ids: everything that turns
/// prompts into `rollout`'s inputs and its outputs into text.
pub struct Decoding {
    prompter: Prompter,
    /// Rows per `rollout` call (the bundle's micro-batch).
    pub(crate) micro: usize,
    pub(crate) prompt_len: usize,
    pub(crate) max_new: usize,
    /// The rollout's `sample/stop_ids`: the tokenizer's stop ids, unused slots -1.
    stop_ids: Vec<i32>,
    pub(crate) pad: i32,
}

impl Decoding {
    /// The decoding of `manifest`'s `rollout` with `prompter`'s tokenizer; refuses a bundle
    /// without one and a tokenizer with more stop ids than the program takes.
    pub fn new(manifest: &bundle::Manifest, prompter: Prompter) -> Result<Self, WorkerError> {
        let train = &manifest.train;
        let (Some(prompt_len), Some(max_new), Some(rollout)) =
            (train.prompt_len, train.max_new_tokens, manifest.programs.get("rollout"))
        else {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                "the bundle has no rollout program to decode with; export it again for the job's grpo: or eval: \
                 section",
            ));
        };
        let slots = rollout.inputs.iter().find(|t| t.name == "sample/stop_ids");
        let slots = slots.map_or(bundle::STOP_IDS as usize, |t| t.shape.iter().product::<u64>() as usize);
        let tokenizer = prompter.tokenizer();
        if tokenizer.stop_ids().len() > slots {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                format!(
                    "the tokenizer stops at {} ids ({:?}), but the bundle's rollout takes at most {slots}",
                    tokenizer.stop_ids().len(),
                    tokenizer.stop_ids()
                ),
            ));
        }
        let mut stop_ids = vec![-1; slots];
        for (slot, &id) in stop_ids.iter_mut().zip(tokenizer.stop_ids()) {
            *slot = id as i32;
        }
        Ok(Self {
            pad: tokenizer.pad_id() as i32,
            prompter,
            micro: train.micro_batch as usize,
            prompt_len: prompt_len as usize,
            max_new: max_new as usize,
            stop_ids,
        })
    }

    /// The prompt's ids ([`Prompter::prompt_ids`]), its last `prompt_len` tokens when longer
    /// (the question is at the end), and whether it was cut.
    pub(crate) fn encode_prompt(&self, prompt: &data::Prompt) -> Result<(Vec<i32>, bool), WorkerError> {
        let mut tokens: Vec<i32> =
            self.prompter.prompt_ids(prompt)?.into_iter().map(|id| id as i32).collect();
        let cut = tokens.len() > self.prompt_len;
        if cut {
            tokens.drain(..tokens.len() - self.prompt_len);
        }
        Ok((tokens, cut))
    }

    /// The text of a completion's tokens before its stop id ([`Prompter::completion_text`]).
    pub(crate) fn decode(&self, tokens: &[i32]) -> String {
        let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        self.prompter.completion_text(&ids)
    }

    /// Lays prompts out as `rollout` takes them: left-padded, with lengths and seeds.
    pub(crate) fn prompt_batch(&self, rows: &[(&[i32], u32)]) -> PromptBatch {
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

    /// The tokens of completion `row` up to its length.
    pub(crate) fn completion<'a>(&self, completions: &'a Completions, row: usize) -> &'a [i32] {
        let n = self.max_new;
        let length = completions.lengths[row].clamp(0, n as i32) as usize;
        &completions.tokens[row * n..row * n + length]
    }
}

/// Prompts laid out for `rollout`.
pub(crate) struct PromptBatch {
    pub(crate) tokens: Vec<i32>,
    pub(crate) lengths: Vec<i32>,
    pub(crate) seeds: Vec<u32>,
}

/// One micro-batch's completions, on the host.
pub(crate) struct Completions {
    pub(crate) tokens: Vec<i32>,
    pub(crate) lengths: Vec<i32>,
    pub(crate) logprobs: Vec<f32>,
}

impl Trainer {
    fn rollout_program(&self) -> Result<&Program, WorkerError> {
        self.rollout.as_ref().ok_or_else(|| {
            WorkerError::incompatible(
                Part::Bundle,
                "the bundle has no rollout program; export it again for the job's grpo: or eval: section",
            )
        })
    }

    /// Samples one micro-batch's completions with the policy (greedy at temperature 0).
    /// Phases: `transfers` (prompts up, completions down) and `rollout` (the program: prefill
    /// and decode).
    pub(crate) fn rollout(
        &self,
        prompts: &PromptBatch,
        (temperature, top_p): (f32, f32),
        decoding: &Decoding,
        phases: &mut Phases,
    ) -> Result<Completions, WorkerError> {
        let program = self.rollout_program()?;
        let inputs = &program.spec().inputs;
        let n = self.manifest().params.len();
        let slice = self.slice();
        let uploaded: [DeviceArray; 7] = phases.time("transfers", || -> Result<_, WorkerError> {
            Ok([
                slice.upload(&inputs[n], bytemuck::cast_slice(&prompts.tokens))?,
                slice.upload(&inputs[n + 1], bytemuck::cast_slice(&prompts.lengths))?,
                slice.upload(&inputs[n + 2], bytemuck::cast_slice(&prompts.seeds))?,
                slice.scalar(&inputs[n + 3], temperature.to_le_bytes())?,
                slice.scalar(&inputs[n + 4], top_p.to_le_bytes())?,
                slice.upload(&inputs[n + 5], bytemuck::cast_slice(&decoding.stop_ids))?,
                slice.scalar(&inputs[n + 6], decoding.pad.to_le_bytes())?,
            ])
        })?;
        let params = &self.state.as_ref().ok_or_else(not_initialized)?.params;
        let mut args: Vec<Arg<'_>> = params.iter().map(Arg::Borrow).collect();
        args.extend(uploaded.iter().map(Arg::Borrow));
        let out = phases.time("rollout", || program.run(args))?;
        let outputs = &program.spec().outputs;
        let download = |i: usize| slice.download(&outputs[i], &out[i]);
        phases.time("transfers", || {
            Ok(Completions {
                tokens: bytemuck::pod_collect_to_vec(&download(0)?),
                lengths: bytemuck::pod_collect_to_vec(&download(1)?),
                logprobs: bytemuck::pod_collect_to_vec(&download(2)?),
            })
        })
    }
}

/// A job's held-out problems and how they are decoded and scored.
pub struct HeldOut {
    examples: Vec<Example>,
    every: u64,
    weights: RewardWeights,
    decoding: Decoding,
}

impl HeldOut {
    /// The evaluation of `job` (`None` when its `eval:` is off), its problems read through
    /// `files`, decoding with `prompter` through the `rollout` of `manifest`'s bundle; `weights`
    /// score the completions besides exact match (GRPO: its reward; SFT: the default weights).
    pub fn new(
        job: &JobSpec,
        manifest: &bundle::Manifest,
        prompter: Option<&Prompter>,
        weights: RewardWeights,
        files: &dyn data::DataFiles,
    ) -> Result<Option<Self>, WorkerError> {
        let Some(eval) = job.evaluation() else { return Ok(None) };
        let prompter = prompter.ok_or(data::DataError::NotAnExampleSource { operation: "evaluation" })?;
        Ok(Some(Self {
            examples: data::held_out_examples(&job.data, eval.problems, job.seed, files)?,
            every: eval.every,
            weights,
            decoding: Decoding::new(manifest, prompter.clone())?,
        }))
    }

    /// Evaluate after every this many steps too (0: before and after training only).
    pub fn every(&self) -> u64 {
        self.every
    }

    /// Scores the policy with greedy decoding on the held-out problems.
    pub fn evaluate(&self, trainer: &Trainer) -> Result<EvalReport, WorkerError> {
        let decoding = &self.decoding;
        let problems = self.examples.len() as u64;
        let encoded: Vec<Vec<i32>> = self
            .examples
            .iter()
            .map(|e| Ok(decoding.encode_prompt(&e.prompt)?.0))
            .collect::<Result<_, WorkerError>>()?;
        let mut report = EvalReport { problems, correct: 0, reward: 0.0, samples: Vec::new() };
        let micro = decoding.micro;
        for first in (0..encoded.len()).step_by(micro) {
            // The last batch is filled up with the first problem; those rows are not scored.
            let rows: Vec<(&[i32], u32)> = (first..first + micro)
                .map(|i| (encoded.get(i).unwrap_or(&encoded[0]).as_slice(), 0))
                .collect();
            let prompts = decoding.prompt_batch(&rows);
            let completions = trainer.rollout(&prompts, (0.0, 1.0), decoding, &mut Phases::new())?;
            for (row, example) in self.examples.iter().enumerate().skip(first).take(micro) {
                let text = decoding.decode(decoding.completion(&completions, row - first));
                let reward = Reward::score(&text, &example.answer, &self.weights);
                report.correct += reward.exact_match as u64;
                report.reward += reward.total as f64 / problems as f64;
                if report.samples.len() < 3 {
                    report.samples.push((example.prompt.display(), text, example.answer.clone()));
                }
            }
        }
        Ok(report)
    }
}
