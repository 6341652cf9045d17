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
//!   reward: { exact_match: 1.0, partial_credit: 0.5 }   # numeric_answer's terms
//!   rewards:                   # weighed and summed; [numeric_answer] when absent
//!     - numeric_answer
//!     - { format: '#### -?[0-9]+\s*$', weight: 0.5 }
//!     - { length: { max: 96, soft: 32 }, weight: 0.5 }
//!     - { python: my_rewards.py:brevity, weight: 0.1 }   # TRL's f(prompts, completions, **kw)
//! ```

use crate::JobError;
use data::{DataConfig, FormatReward, LengthReward, RewardWeights};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
    /// Weights of the numeric answer's terms (`numeric_answer` in `rewards`).
    #[serde(default)]
    pub reward: RewardWeights,
    /// The reward functions, each with a weight; a completion's reward is the weighted sum of
    /// those that score it. `[numeric_answer]` when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rewards: Vec<RewardFunction>,
    /// Python processes that run the Python reward functions, side by side on a step's rows.
    #[serde(default = "default_reward_workers")]
    pub reward_workers: u32,
    /// Seconds one call of a Python reward function may take before the step fails.
    #[serde(default = "default_reward_timeout")]
    pub reward_timeout_seconds: f64,
}

fn default_reward_workers() -> u32 {
    2
}

fn default_reward_timeout() -> f64 {
    60.0
}

/// Most Python processes a job may ask for.
const MAX_REWARD_WORKERS: u32 = 64;

/// One reward function of `grpo.rewards`: what it scores, its weight and the name its metrics
/// carry (`reward_<name>` in metrics.jsonl).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardFunction {
    /// What it scores.
    pub kind: RewardKind,
    /// Its weight in the sum.
    pub weight: f32,
    /// Its name in metrics: the kind's (`numeric_answer`, `format`, `length`), a Python
    /// function's own, or the spec's `name`.
    pub name: String,
}

/// The reward functions there are.
#[derive(Debug, Clone, PartialEq)]
pub enum RewardKind {
    /// The verifiable reward of the number after `####` (`grpo.reward`'s terms).
    NumericAnswer,
    /// 1 when the completion matches the regular expression, else 0.
    Format(String),
    /// DAPO's overlong shaping: 0 up to `max - soft`, down to -1 at `max`.
    Length(LengthReward),
    /// A Python function in TRL's form, `f(prompts, completions, **columns) -> list[float | None]`.
    Python {
        /// The module file: a path (relative to the working directory), `file://`, `s3://` or
        /// `gs://`.
        module: String,
        /// The function's name in it.
        function: String,
    },
}

impl RewardFunction {
    /// The default: the numeric answer alone.
    pub fn numeric_answer() -> Self {
        Self { kind: RewardKind::NumericAnswer, weight: 1.0, name: "numeric_answer".into() }
    }

    /// A function named in short form: `numeric_answer` or `module.py:function`.
    fn short(text: &str) -> Result<Self, String> {
        match text {
            "numeric_answer" => Ok(Self::numeric_answer()),
            "format" | "length" => Err(format!(
                "`{text}` needs its setting: write {{ {text}: {} }}",
                if text == "format" { "<regex>" } else { "{ max: <n>, soft: <n> }" }
            )),
            _ => Self::python(text, None, 1.0),
        }
    }

    fn python(text: &str, name: Option<String>, weight: f32) -> Result<Self, String> {
        let Some((module, function)) = text.rsplit_once(':').filter(|(module, _)| module.ends_with(".py"))
        else {
            return Err(format!(
                "{text:?} is not a reward function: use numeric_answer, {{ format: <regex> }}, \
                 {{ length: {{ max: <n> }} }} or a Python function as module.py:function"
            ));
        };
        let is_identifier = |s: &str| {
            s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_alphanumeric() || c == '_')
        };
        if !is_identifier(function) {
            return Err(format!("{function:?} in {text:?} is not a Python function name"));
        }
        Ok(Self {
            name: name.unwrap_or_else(|| function.to_owned()),
            weight,
            kind: RewardKind::Python { module: module.to_owned(), function: function.to_owned() },
        })
    }

    /// The Python module and function, for a Python reward.
    pub fn python_function(&self) -> Option<(&str, &str)> {
        match &self.kind {
            RewardKind::Python { module, function } => Some((module, function)),
            _ => None,
        }
    }
}

/// The map form of an entry: one kind, and its weight and name.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RewardEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    numeric_answer: Option<Empty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    length: Option<LengthReward>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    python: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    weight: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

/// `numeric_answer: {}`: a kind without settings.
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

impl RewardEntry {
    fn into_function(self) -> Result<RewardFunction, String> {
        let weight = self.weight.unwrap_or(1.0);
        let named = |kind: RewardKind, default: &str| RewardFunction {
            kind,
            weight,
            name: self.name.clone().unwrap_or_else(|| default.to_owned()),
        };
        let kinds = [
            self.numeric_answer.is_some(),
            self.format.is_some(),
            self.length.is_some(),
            self.python.is_some(),
        ];
        match kinds.iter().filter(|&&given| given).count() {
            1 => {}
            0 => {
                return Err(
                    "names no reward function: give one of numeric_answer, format, length, python".into()
                );
            }
            _ => return Err("names more than one reward function; write each as an entry of its own".into()),
        }
        if let Some(pattern) = &self.format {
            return Ok(named(RewardKind::Format(pattern.clone()), "format"));
        }
        if let Some(length) = self.length {
            return Ok(named(RewardKind::Length(length), "length"));
        }
        if let Some(python) = &self.python {
            return RewardFunction::python(python, self.name.clone(), weight);
        }
        Ok(named(RewardKind::NumericAnswer, "numeric_answer"))
    }
}

impl Serialize for RewardFunction {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut entry =
            RewardEntry { weight: Some(self.weight), name: Some(self.name.clone()), ..Default::default() };
        match &self.kind {
            RewardKind::NumericAnswer => entry.numeric_answer = Some(Empty {}),
            RewardKind::Format(pattern) => entry.format = Some(pattern.clone()),
            RewardKind::Length(length) => entry.length = Some(*length),
            RewardKind::Python { module, function } => entry.python = Some(format!("{module}:{function}")),
        }
        entry.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RewardFunction {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> Visitor<'de> for Entry {
            type Value = RewardFunction;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a reward function: numeric_answer, module.py:function, or a map such as { format: <regex>, weight: 0.5 }")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<RewardFunction, E> {
                RewardFunction::short(text).map_err(E::custom)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RewardFunction, A::Error> {
                let entry = RewardEntry::deserialize(de::value::MapAccessDeserializer::new(map))?;
                entry.into_function().map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(Entry)
    }
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
        self.validate_rewards()
    }

    /// The reward functions, `[numeric_answer]` when the spec names none.
    pub fn reward_functions(&self) -> Vec<RewardFunction> {
        if self.rewards.is_empty() { vec![RewardFunction::numeric_answer()] } else { self.rewards.clone() }
    }

    fn validate_rewards(&self) -> Result<(), JobError> {
        let invalid = |reason: String| Err(JobError::Invalid { field: "grpo.rewards", reason });
        for (i, function) in self.rewards.iter().enumerate() {
            let at = format!("entry {} ({})", i + 1, function.name);
            if !function.weight.is_finite() {
                return invalid(format!(
                    "{at}: weight {} is not a finite number; use e.g. 0.5",
                    function.weight
                ));
            }
            let name_ok = !function.name.is_empty()
                && function.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !name_ok {
                return invalid(format!(
                    "{at}: the name {:?} must be letters, digits and _ (it names the metric reward_<name>)",
                    function.name
                ));
            }
            if let Some(first) = self.rewards[..i].iter().position(|other| other.name == function.name) {
                return invalid(format!(
                    "{at}: entry {} has the same name; give one of them a `name:` of its own",
                    first + 1
                ));
            }
            match &function.kind {
                RewardKind::Format(pattern) => FormatReward::new(pattern).map(drop),
                RewardKind::Length(length) => length.validate(),
                RewardKind::NumericAnswer | RewardKind::Python { .. } => Ok(()),
            }
            .or_else(|reason| invalid(format!("{at}: {reason}")))?;
        }
        if self.reward_workers == 0 || self.reward_workers > MAX_REWARD_WORKERS {
            return Err(JobError::Invalid {
                field: "grpo.reward_workers",
                reason: format!("{} is out of range; use 1..={MAX_REWARD_WORKERS}", self.reward_workers),
            });
        }
        if !(self.reward_timeout_seconds.is_finite() && self.reward_timeout_seconds > 0.0) {
            return Err(JobError::Invalid {
                field: "grpo.reward_timeout_seconds",
                reason: format!(
                    "{} must be a positive number of seconds, e.g. 60",
                    self.reward_timeout_seconds
                ),
            });
        }
        Ok(())
    }

    /// Whether `init_from` names a job spec (trained first when it has no checkpoint) rather than
    /// a checkpoint.
    pub fn init_from_job(&self) -> Option<&str> {
        self.init_from.as_deref().filter(|from| from.ends_with(".yaml") || from.ends_with(".yml"))
    }
}
