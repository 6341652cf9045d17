//! A GRPO job's rewards (`grpo.rewards`): the built-in functions (the numeric answer, a format,
//! a length) and Python functions in TRL's form, run in a [`RewardPool`] of Python processes. A
//! completion's reward is the weighted sum of the functions that score it (a Python function's
//! `None` leaves it out, as TRL's `nansum` does); each function's own rewards are kept for the
//! step's metrics. Given the same completions, the rewards and their sum are the same bits on
//! every run: the functions are called in the spec's order, on the same rows in the same order.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod pool;

pub use pool::{Call, PythonFunction, RewardError, RewardPool};

use data::{
    Example, FormatReward, LengthReward, LengthUnit, Message, Prompt, Prompter, Reward, RewardWeights,
};
use job::{GrpoSpec, RewardKind};
use serde_json::Value;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// One completion to score.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'a> {
    /// The example it answers (prompt, reference answer, columns).
    pub example: &'a Example,
    /// Its text, up to its stop token.
    pub text: &'a str,
    /// Its token ids, up to its stop token.
    pub ids: &'a [i32],
}

/// A step's rewards: each function's, and the weighted sums.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    /// `per_function[f][row]`: function `f`'s reward of row `row`, `None` where it does not apply.
    pub per_function: Vec<Vec<Option<f32>>>,
    /// Each row's reward: the weighted sum of the functions that score it; NaN for a row that
    /// none scores (TRL's "unscorable" completion: left out of its group's statistics, with an
    /// advantage of 0, never counted as a reward of 0).
    pub totals: Vec<f32>,
}

enum Scorer {
    Numeric,
    Format(FormatReward),
    Length(LengthReward),
    /// The pool's function `index`.
    Python(usize),
}

/// The job's reward functions. See the crate docs.
pub struct Rewards {
    functions: Vec<(String, f32, Scorer)>,
    weights: RewardWeights,
    pool: Option<Mutex<RewardPool>>,
}

impl std::fmt::Debug for Rewards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewards").field("functions", &self.names()).field("pool", &self.pool).finish()
    }
}

impl Rewards {
    /// The rewards of `spec`. Python functions start a pool of `spec.reward_workers` processes of
    /// `python` in `dir` (where relative module paths resolve), each module's file found by
    /// `module_file` (a remote module is fetched to a local file); a module that does not load is
    /// an error now, not at the first step.
    pub fn new(
        spec: &GrpoSpec,
        python: &Path,
        dir: &Path,
        module_file: impl Fn(&str) -> Result<std::path::PathBuf, RewardError>,
    ) -> Result<Self, RewardError> {
        let mut functions = Vec::new();
        let mut python_functions = Vec::new();
        for function in spec.reward_functions() {
            let scorer = match &function.kind {
                RewardKind::NumericAnswer => Scorer::Numeric,
                RewardKind::Format(pattern) => Scorer::Format(
                    FormatReward::new(pattern)
                        .map_err(|message| RewardError::Load { function: function.name.clone(), message })?,
                ),
                RewardKind::Length(length) => Scorer::Length(*length),
                RewardKind::Python { module, function: name } => {
                    python_functions
                        .push(PythonFunction { module: module_file(module)?, function: name.clone() });
                    Scorer::Python(python_functions.len() - 1)
                }
            };
            functions.push((function.name.clone(), function.weight, scorer));
        }
        let pool = if python_functions.is_empty() {
            None
        } else {
            Some(Mutex::new(RewardPool::start(
                python,
                dir,
                python_functions,
                spec.reward_workers as usize,
                Duration::from_secs_f64(spec.reward_timeout_seconds),
            )?))
        };
        Ok(Self { functions, weights: spec.reward.clone(), pool })
    }

    /// The functions' names, in order (their metrics are `reward_<name>`).
    pub fn names(&self) -> Vec<&str> {
        self.functions.iter().map(|(name, _, _)| name.as_str()).collect()
    }

    /// The numeric answer's terms of a completion (accuracy and format metrics, whether or not
    /// the numeric answer is among the rewards).
    pub fn numeric(&self, completion: &Completion<'_>) -> Reward {
        Reward::score(completion.text, &completion.example.answer, &self.weights)
    }

    /// Scores `rows`, whole groups of `group` completions of one prompt each, at 0-based `step`
    /// of `steps`; `prompter` says whether prompts are conversations (as TRL hands them to
    /// reward functions) or text.
    pub fn score(
        &self,
        rows: &[Completion<'_>],
        group: usize,
        prompter: &Prompter,
        step: u64,
        steps: u64,
    ) -> Result<Scores, RewardError> {
        let mut per_function = Vec::with_capacity(self.functions.len());
        let mut calls: Option<Vec<Call>> = None;
        for (_, _, scorer) in &self.functions {
            let values: Vec<Option<f32>> = match scorer {
                Scorer::Numeric => rows.iter().map(|row| Some(self.numeric(row).total)).collect(),
                Scorer::Format(format) => rows.iter().map(|row| Some(format.score(row.text))).collect(),
                Scorer::Length(length) => rows
                    .iter()
                    .map(|row| {
                        Some(length.score(match length.unit {
                            LengthUnit::Tokens => row.ids.len() as u64,
                            LengthUnit::Chars => row.text.chars().count() as u64,
                        }))
                    })
                    .collect(),
                Scorer::Python(index) => {
                    let mut pool =
                        self.pool.as_ref().expect("a pool for Python functions").lock().map_err(|_| {
                            RewardError::Died {
                                function: self.functions[*index].0.clone(),
                                what: "was left broken by a reward call that panicked".into(),
                                stderr: String::new(),
                            }
                        })?;
                    let calls = calls.get_or_insert_with(|| split(rows, group, pool.processes(), prompter));
                    let replies = pool.call(*index, calls, step, steps)?;
                    replies.into_iter().flatten().map(|value| value.map(|v| v as f32)).collect()
                }
            };
            per_function.push(values);
        }
        // A fixed order of additions, so the sum is the same bits on every run.
        let totals = (0..rows.len())
            .map(|row| {
                let mut terms = self
                    .functions
                    .iter()
                    .zip(&per_function)
                    .filter_map(|((_, weight, _), values)| values[row].map(|value| weight * value))
                    .peekable();
                if terms.peek().is_none() { f32::NAN } else { terms.fold(0.0f32, |sum, term| sum + term) }
            })
            .collect();
        Ok(Scores { per_function, totals })
    }
}

/// The rows as calls, one per process: contiguous shares of whole groups (a function that
/// compares a prompt's completions sees all of them, as TRL's see a process's whole groups).
fn split(rows: &[Completion<'_>], group: usize, processes: usize, prompter: &Prompter) -> Vec<Call> {
    let groups = rows.len() / group.max(1);
    let shares = processes.clamp(1, groups.max(1));
    let columns: std::collections::BTreeSet<&String> =
        rows.iter().flat_map(|row| row.example.columns.keys()).collect();
    (0..shares)
        .map(|share| {
            let (first, last) = (share * groups / shares * group, (share + 1) * groups / shares * group);
            let rows = &rows[first..last.max(first)];
            let mut kwargs = serde_json::Map::new();
            for &column in &columns {
                let values =
                    rows.iter().map(|row| row.example.columns.get(column).cloned().unwrap_or(Value::Null));
                kwargs.insert(column.clone(), Value::Array(values.collect()));
            }
            kwargs.insert(
                "completion_ids".into(),
                Value::Array(rows.iter().map(|row| Value::from(row.ids.to_vec())).collect()),
            );
            Call {
                prompts: rows.iter().map(|row| prompt_value(prompter, &row.example.prompt)).collect(),
                completions: rows.iter().map(|row| completion_value(prompter, row.text)).collect(),
                kwargs,
            }
        })
        .collect()
}

/// A prompt as TRL hands it to a reward function: its text, or (chat-templated) its messages.
fn prompt_value(prompter: &Prompter, prompt: &Prompt) -> Value {
    match (prompt, prompter.is_chat()) {
        (Prompt::Text(text), false) => Value::from(text.as_str()),
        (prompt, _) => Value::Array(prompter.prompt_messages(prompt).iter().map(Message::to_json).collect()),
    }
}

/// A completion as TRL hands it over: its text, or (chat-templated) one assistant message.
fn completion_value(prompter: &Prompter, text: &str) -> Value {
    if prompter.is_chat() {
        serde_json::json!([{"role": "assistant", "content": text}])
    } else {
        Value::from(text)
    }
}
