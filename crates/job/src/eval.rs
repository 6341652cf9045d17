//! The `eval:` section of a job spec: greedy held-out evaluation, for SFT and GRPO jobs alike.
//!
//! ```yaml
//! eval: { problems: 256, every: 10 }                               # GRPO: decodes as grpo: does
//! eval: { problems: 256, every: 100, prompt_len: 256, max_new_tokens: 512 }   # SFT
//! ```
//!
//! The problems come from the data (`data::held_out_examples`): the arithmetic task's held-out
//! split, or a JSONL kind's `data.test` file (GSM8K's `test.jsonl`); the score is exact match of
//! the number after `####`, before training, every `every` steps and after the last.

use crate::JobError;
use data::DataConfig;
use serde::{Deserialize, Serialize};

/// Greedy decoding on held-out problems, before training, every `every` steps and after the last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// Held-out problems scored each time, the first ones of the held-out set (all of a test
    /// file that has fewer); 0 turns evaluation off.
    #[serde(default = "default_problems")]
    pub problems: u64,
    /// Also evaluate after every this many steps (0: only before and after training).
    #[serde(default)]
    pub every: u64,
    /// Tokens of the left-padded prompt buffer the problems are decoded from (SFT jobs; a GRPO
    /// job decodes with `grpo.prompt_len`). Longer prompts keep their end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_len: Option<u64>,
    /// Tokens decoded at most per problem (SFT jobs; a GRPO job uses `grpo.max_new_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u64>,
}

impl Default for EvalSpec {
    fn default() -> Self {
        Self { problems: default_problems(), every: 0, prompt_len: None, max_new_tokens: None }
    }
}

fn default_problems() -> u64 {
    256
}

impl EvalSpec {
    /// Checks the section against the job's data and kind; the error names the field and the fix.
    pub(crate) fn validate(&self, data: &DataConfig, grpo: bool) -> Result<(), JobError> {
        let invalid = |field, reason: String| Err(JobError::Invalid { field, reason });
        if self.problems == 0 {
            return Ok(());
        }
        if !data.has_held_out() {
            let fix = if data.has_examples() {
                "set data.test to a file of held-out problems in the data's format (GSM8K's test.jsonl), \
                 or eval.problems: 0"
            } else {
                "token files have no prompts to answer; drop `eval:`"
            };
            return invalid(
                "eval.problems",
                format!(
                    "{}, but data of kind {} has no held-out problems; {fix}",
                    self.problems,
                    data.kind()
                ),
            );
        }
        let shapes = [("eval.prompt_len", self.prompt_len), ("eval.max_new_tokens", self.max_new_tokens)];
        for (field, value) in shapes {
            match value {
                Some(_) if grpo => {
                    return invalid(
                        field,
                        format!(
                            "a GRPO job evaluates with its rollout program, whose buffers are grpo.{}; drop {field}",
                            &field["eval.".len()..]
                        ),
                    );
                }
                None if !grpo => {
                    return invalid(
                        field,
                        format!(
                            "is missing; an SFT job decodes its held-out problems greedily into buffers of \
                             eval.prompt_len + eval.max_new_tokens tokens: set both (e.g. {}), or eval.problems: 0",
                            if field == "eval.prompt_len" {
                                "prompt_len: 256"
                            } else {
                                "max_new_tokens: 512"
                            }
                        ),
                    );
                }
                Some(0) => return invalid(field, "is 0; use at least 1".into()),
                _ => {}
            }
        }
        Ok(())
    }
}
