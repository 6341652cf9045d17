//! The built-in reward functions a job's `grpo.rewards` can name besides the numeric answer
//! ([`crate::Reward`]): a completion's format against a regular expression, and its length. Each
//! scores one completion; the job weighs them with the others.

use regex::Regex;
use serde::{Deserialize, Serialize};

/// 1.0 when the completion matches a regular expression, else 0.0 (TRL's format rewards). The
/// pattern is Rust's `regex` syntax, searched anywhere in the completion: anchor it with `^`
/// and `$`, and let `.` cross lines with `(?s)`.
#[derive(Debug, Clone)]
pub struct FormatReward {
    regex: Regex,
}

/// The largest compiled pattern (the `regex` crate's bound on what a pattern may make it
/// allocate); a job's pattern is a short line.
const MAX_PATTERN_BYTES: usize = 1 << 20;

impl FormatReward {
    /// Compiles `pattern`; the error says what is wrong with it.
    pub fn new(pattern: &str) -> Result<Self, String> {
        let regex = regex::RegexBuilder::new(pattern)
            .size_limit(MAX_PATTERN_BYTES)
            .build()
            .map_err(|error| format!("{pattern:?} is not a regular expression: {error}"))?;
        Ok(Self { regex })
    }

    /// 1.0 when `completion` matches.
    pub fn score(&self, completion: &str) -> f32 {
        if self.regex.is_match(completion) { 1.0 } else { 0.0 }
    }
}

/// What a completion's length is counted in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthUnit {
    /// Tokens of the completion, its stop token excluded.
    #[default]
    Tokens,
    /// Characters of its text.
    Chars,
}

/// DAPO's overlong reward shaping: 0 for a completion of at most `max - soft` units, falling
/// linearly to -1 at `max`, -1 beyond (`soft = 0`: a step from 0 to -1 past `max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthReward {
    /// The length from which the reward is -1.
    pub max: u64,
    /// The length of the ramp below `max`.
    #[serde(default)]
    pub soft: u64,
    /// What is counted.
    #[serde(default)]
    pub unit: LengthUnit,
}

impl LengthReward {
    /// Checks the bounds; the error says the fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.max == 0 {
            return Err("max is 0; give the length (in units) from which the reward is -1".into());
        }
        if self.soft > self.max {
            return Err(format!(
                "soft {} is longer than max {}; the ramp lies below max",
                self.soft, self.max
            ));
        }
        Ok(())
    }

    /// The reward of a completion `length` units long.
    pub fn score(&self, length: u64) -> f32 {
        let free = self.max - self.soft.min(self.max);
        if length <= free {
            0.0
        } else if length > self.max || self.soft == 0 {
            -1.0
        } else {
            -((length - free) as f32) / self.soft as f32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_matches_anywhere_unless_anchored() {
        let marker = FormatReward::new(r"#### -?\d+\s*$").expect("compiles");
        assert_eq!(marker.score("so 3 + 4 = 7\n#### 7\n"), 1.0);
        assert_eq!(marker.score("#### 7 apples"), 0.0);
        let think = FormatReward::new(r"(?s)^<think>.*</think>").expect("compiles");
        assert_eq!((think.score("<think>\na\n</think> 7"), think.score("7 <think></think>")), (1.0, 0.0));
        let error = FormatReward::new("(unclosed").expect_err("bad pattern");
        assert!(error.contains("\"(unclosed\" is not a regular expression"), "{error}");
    }

    #[test]
    fn length_ramps_from_zero_to_minus_one() {
        let length = LengthReward { max: 100, soft: 20, unit: LengthUnit::Tokens };
        let scores: Vec<f32> = [0, 80, 90, 100, 101, 500].map(|n| length.score(n)).into();
        assert_eq!(scores, [0.0, 0.0, -0.5, -1.0, -1.0, -1.0]);
        let hard = LengthReward { max: 10, soft: 0, unit: LengthUnit::Chars };
        assert_eq!((hard.score(10), hard.score(11)), (0.0, -1.0));
        assert!(LengthReward { max: 0, ..hard }.validate().expect_err("0").contains("max is 0"));
        assert!(LengthReward { soft: 11, ..hard }.validate().expect_err("soft").contains("soft 11"));
    }
}
