//! The `grpo:` section of a job spec: rollout shapes, sampling, the objective's knobs, rewards,
//! and where the policy starts. (Held-out evaluation is the job's `eval:`, see `eval.rs`.)
//!
//! ```yaml
//! grpo:
//!   prompt_len: 112            # left-padded prompt buffer (tokens)
//!   max_new_tokens: 32         # completion buffer (decode steps at most)
//!   generations: 8             # completions per prompt (the group)
//!   init_from: examples/sft-arith.yaml   # or a checkpoint directory, or a checkpoint root
//!   temperature: 1.0
//!   kl_beta: 0.0
//!   reward: { exact_match: 1.0, partial_credit: 0.5 }
//! ```

use crate::JobError;
use data::{DataConfig, RewardWeights};
use serde::{Deserialize, Serialize};

/// GRPO's settings: each prompt is answered `generations` times; a row is the left-padded prompt
/// followed by the completion; rewards are normalized within each prompt's group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoSpec {
    /// Tokens of the left-padded prompt buffer. Longer prompts keep their last tokens.
    pub prompt_len: u64,
    /// Tokens of the completion buffer (decode steps at most).
    pub max_new_tokens: u64,
    /// Completions per prompt (the group); `batch.global` is prompts x this.
    pub generations: u64,
    /// Where the policy and the frozen reference start: a checkpoint directory
    /// (`<root>/<step:012>-<id>`), a checkpoint root (its newest committed checkpoint), or the
    /// spec of an SFT job (`*.yaml`) whose newest checkpoint is taken, trained first when it has
    /// none. Paths are relative to the working directory; `file://`, `s3://` and `gs://` URIs
    /// work too. Absent: the policy starts from `init(seed)`. Only the parameters are taken; the
    /// optimizer starts afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<String>,
    /// Sampling temperature of the rollouts (> 0); log-probs are taken at it too.
    #[serde(default = "one")]
    pub temperature: f32,
    /// Nucleus mass of the rollouts; 1 keeps every token.
    #[serde(default = "one")]
    pub top_p: f32,
    /// The importance ratio is clipped to `[1 - clip_low, 1 + clip_high]`.
    #[serde(default = "default_clip")]
    pub clip_low: f32,
    /// See `clip_low` (a larger upper bound is DAPO's clip-higher).
    #[serde(default = "default_clip")]
    pub clip_high: f32,
    /// Weight of the KL penalty to the reference (k3 estimator); 0 skips the reference's pass.
    #[serde(default)]
    pub kl_beta: f32,
    /// Divide each group's centred rewards by the group's standard deviation (GRPO); `false`
    /// keeps them centred only (Dr. GRPO).
    #[serde(default = "yes")]
    pub scale_rewards: bool,
    /// Weights of the reward's terms.
    #[serde(default)]
    pub reward: RewardWeights,
}

fn one() -> f32 {
    1.0
}

fn default_clip() -> f32 {
    0.2
}

fn yes() -> bool {
    true
}

impl GrpoSpec {
    /// Checks the section against the job's data; the error names the field and the fix.
    pub(crate) fn validate(&self, data: &DataConfig) -> Result<(), JobError> {
        let invalid = |field, reason: String| Err(JobError::Invalid { field, reason });
        for (field, value) in [
            ("grpo.prompt_len", self.prompt_len),
            ("grpo.max_new_tokens", self.max_new_tokens),
            ("grpo.generations", self.generations),
        ] {
            if value == 0 {
                return invalid(field, "is 0; use at least 1".into());
            }
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return invalid(
                "grpo.temperature",
                format!(
                    "{} must be a positive number (e.g. 1.0): GRPO learns from samples",
                    self.temperature
                ),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid("grpo.top_p", format!("{} must lie in (0, 1]; 1 keeps every token", self.top_p));
        }
        for (field, value) in [("grpo.clip_low", self.clip_low), ("grpo.clip_high", self.clip_high)] {
            if !(value.is_finite() && value > 0.0) {
                return invalid(field, format!("{value} must be a positive number, e.g. 0.2"));
            }
        }
        if self.clip_low >= 1.0 {
            return invalid(
                "grpo.clip_low",
                format!("{} would allow a ratio of 0 or below; use a value under 1, e.g. 0.2", self.clip_low),
            );
        }
        if !(self.kl_beta.is_finite() && self.kl_beta >= 0.0) {
            return invalid("grpo.kl_beta", format!("{} must be a non-negative number", self.kl_beta));
        }
        if self.generations == 1 && self.scale_rewards {
            return invalid(
                "grpo.generations",
                "is 1: a group of one has no spread to normalize by, so every advantage would be 0; \
                 use at least 2"
                    .into(),
            );
        }
        if let Some(from) = &self.init_from
            && from.trim().is_empty()
        {
            return invalid(
                "grpo.init_from",
                "is empty; name a checkpoint directory or root, or an SFT job spec, or drop the field".into(),
            );
        }
        if !data.has_examples() {
            return invalid(
                "data.kind",
                format!(
                    "{} files have no prompts to answer; GRPO needs kind arithmetic, jsonl or gsm8k",
                    data.kind()
                ),
            );
        }
        self.reward.validate()?;
        Ok(())
    }

    /// Whether `init_from` names a job spec (trained first when it has no checkpoint) rather than
    /// a checkpoint.
    pub fn init_from_job(&self) -> Option<&str> {
        self.init_from.as_deref().filter(|from| from.ends_with(".yaml") || from.ends_with(".yml"))
    }
}
