//! Verifiable rewards for GSM8K-style answers: the final answer is the number after the last
//! `####`, e.g. `47 + 85 = 132\n#### 132`.
//!
//! What counts as that number follows GSM8K's answers and what models write after the marker:
//! thousands separators (`#### 1,320`), a dollar sign (`#### $18`), a sentence's full stop
//! (`#### 72.`) and trailing words (`#### 18 dollars`) all give the number they start with, which
//! is compared by value (`1320` = `1320.0` = `01320`). Only a bare number is `well_formed`.
//!
//! [`Reward::score`] breaks a completion's reward into terms (correct, the digits it got right,
//! has the marker, the answer is a well-formed number, nothing follows it, length) so GRPO can
//! give partial credit for near misses and for format while the model is still learning them,
//! with weights from [`RewardWeights`].

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The marker before the final answer.
const MARKER: &str = "####";

/// The final answer of `text`: what follows the last `####` on its line, trimmed, with thousands
/// separators (commas) removed. `None` if there is no marker or nothing after it.
///
/// Borrows from `text` unless commas had to be removed.
pub fn extract_final_answer(text: &str) -> Option<Cow<'_, str>> {
    let (_, after) = text.rsplit_once(MARKER)?;
    let answer = after.lines().next().unwrap_or("").trim();
    if answer.is_empty() {
        return None;
    }
    if answer.contains(',') { Some(Cow::Owned(answer.replace(',', ""))) } else { Some(Cow::Borrowed(answer)) }
}

/// The number `answer` starts with, as plain decimal text: an optional `-`, an optional `$`,
/// digits (thousands separators dropped), and `.` with digits if they follow: `$1,320.50 a week`
/// gives `1320.50`, `72.` gives `72`, `-$5` gives `-5`. `None` when it does not start with one.
pub fn leading_number(answer: &str) -> Option<String> {
    let text = answer.trim_start();
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let bytes = text.strip_prefix('$').unwrap_or(text).as_bytes();
    let mut number = String::from(if negative { "-" } else { "" });
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'0'..=b'9' => number.push(char::from(byte)),
            // A comma between digits separates thousands.
            b',' if at > 0 && bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => {}
            _ => break,
        }
        at += 1;
    }
    if at == 0 {
        return None;
    }
    if bytes.get(at) == Some(&b'.') && bytes.get(at + 1).is_some_and(u8::is_ascii_digit) {
        number.push('.');
        number.extend(bytes[at + 1..].iter().take_while(|b| b.is_ascii_digit()).map(|&b| char::from(b)));
    }
    Some(number)
}

/// Whether `answer` is a plain decimal number: an optional `-`, digits, and optionally `.` and
/// more digits (`132`, `-7`, `2.50`; not `1e3`, `.5`, `132 marbles`).
pub fn is_well_formed_number(answer: &str) -> bool {
    let unsigned = answer.strip_prefix('-').unwrap_or(answer);
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, "0"));
    let all_digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    all_digits(whole) && all_digits(fraction)
}

/// The canonical text of a well-formed number, so `0132`, `132.0` and `132` compare equal
/// without going through floating point.
fn canonical_number(answer: &str) -> String {
    let (negative, unsigned) = match answer.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, answer),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let whole = whole.trim_start_matches('0');
    let fraction = fraction.trim_end_matches('0');
    let mut canonical = String::new();
    let is_zero = whole.is_empty() && fraction.is_empty();
    if negative && !is_zero {
        canonical.push('-');
    }
    canonical.push_str(if whole.is_empty() { "0" } else { whole });
    if !fraction.is_empty() {
        canonical.push('.');
        canonical.push_str(fraction);
    }
    canonical
}

/// The reference's final answer: after its `####` if it has one, else the whole (trimmed) text.
fn reference_answer(reference: &str) -> Cow<'_, str> {
    extract_final_answer(reference).unwrap_or_else(|| Cow::Owned(reference.trim().replace(',', "")))
}

/// The fraction of digit places a well-formed integer `found` gets right against `expected`,
/// aligned at the units: `132` against `142` is 2/3, `32` against `132` is 2/3, `1132` against
/// `132` is 3/4. 0 when either is not a plain integer or their signs differ.
pub fn digit_credit(found: &str, expected: &str) -> f32 {
    let integer = |s: &str| is_well_formed_number(s) && !s.contains('.');
    if !integer(found) || !integer(expected) {
        return 0.0;
    }
    let (found, expected) = (canonical_number(found), canonical_number(expected));
    let (found_negative, expected_negative) = (found.starts_with('-'), expected.starts_with('-'));
    if found_negative != expected_negative {
        return 0.0;
    }
    let (a, b) = (found.trim_start_matches('-').as_bytes(), expected.trim_start_matches('-').as_bytes());
    let right = a.iter().rev().zip(b.iter().rev()).filter(|(x, y)| x == y).count();
    right as f32 / a.len().max(b.len()) as f32
}

/// Final answers that start with numbers compare those numbers by value; others compare as text.
fn answers_match(found: &str, expected: &str) -> bool {
    match (leading_number(found), leading_number(expected)) {
        (Some(found), Some(expected)) => canonical_number(&found) == canonical_number(&expected),
        _ => found == expected,
    }
}

/// Whether `completion`'s final answer equals `reference`'s (a full `... #### 132` answer or the
/// bare `132`). Numbers compare by value (`1,320` = `$1320` = `1320.0` = `1320 marbles`),
/// anything else as text.
pub fn exact_match(completion: &str, reference: &str) -> bool {
    match extract_final_answer(completion) {
        Some(found) => answers_match(&found, &reference_answer(reference)),
        None => false,
    }
}

/// Weights of the reward terms. The total is the weighted sum of the terms that hold (and of
/// the fraction of digits right), minus `length_penalty` per character beyond `soft_max_chars`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardWeights {
    /// The final answer is right.
    pub exact_match: f32,
    /// Times the fraction of the answer's digit places that are right ([`digit_credit`]): a
    /// near miss earns more than a far one, so a group whose answers are all wrong still has a
    /// spread to learn from.
    pub partial_credit: f32,
    /// The completion has a `####` marker.
    pub has_marker: f32,
    /// What follows the last marker is a well-formed number.
    pub well_formed: f32,
    /// Nothing but whitespace follows the final answer's line (the model stopped).
    pub stops_cleanly: f32,
    /// Subtracted per character beyond `soft_max_chars`.
    pub length_penalty: f32,
    /// Completions up to this many characters carry no length penalty.
    pub soft_max_chars: u32,
}

impl Default for RewardWeights {
    /// Correctness dominates; the format terms are small nudges; no length penalty.
    fn default() -> Self {
        Self {
            exact_match: 1.0,
            partial_credit: 0.0,
            has_marker: 0.1,
            well_formed: 0.1,
            stops_cleanly: 0.1,
            length_penalty: 0.0,
            soft_max_chars: 512,
        }
    }
}

impl RewardWeights {
    /// Checks that every weight is a finite number; the error names the field.
    pub fn validate(&self) -> crate::Result<()> {
        let weights = [
            ("reward.exact_match", self.exact_match),
            ("reward.partial_credit", self.partial_credit),
            ("reward.has_marker", self.has_marker),
            ("reward.well_formed", self.well_formed),
            ("reward.stops_cleanly", self.stops_cleanly),
            ("reward.length_penalty", self.length_penalty),
        ];
        match weights.into_iter().find(|(_, weight)| !weight.is_finite()) {
            Some((field, weight)) => Err(crate::DataError::InvalidConfig {
                field,
                message: format!("{weight} is not a finite number; use a plain number such as 0.1"),
            }),
            None => Ok(()),
        }
    }
}

/// One completion's reward, term by term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reward {
    /// The final answer equals the reference's.
    pub exact_match: bool,
    /// The fraction of the answer's digit places that are right (1 when it matches).
    pub digits_right: f32,
    /// The completion contains `####`.
    pub has_marker: bool,
    /// The final answer is a well-formed number.
    pub well_formed: bool,
    /// Only whitespace follows the final answer's line.
    pub stops_cleanly: bool,
    /// Length of the completion in characters.
    pub length_chars: usize,
    /// The weighted total.
    pub total: f32,
}

impl Reward {
    /// Scores `completion` against `reference` (an answer with `####`, or a bare number).
    pub fn score(completion: &str, reference: &str, weights: &RewardWeights) -> Reward {
        let after_marker = completion.rsplit_once(MARKER).map(|(_, after)| after);
        let final_answer = extract_final_answer(completion);
        let well_formed = final_answer.as_deref().is_some_and(is_well_formed_number);
        let expected = reference_answer(reference);
        let exact_match = final_answer.as_deref().is_some_and(|found| answers_match(found, &expected));
        let digits_right = match (final_answer.as_deref().and_then(leading_number), leading_number(&expected))
        {
            _ if exact_match => 1.0,
            (Some(found), Some(expected)) => digit_credit(&found, &expected),
            _ => 0.0,
        };
        let stops_cleanly = after_marker
            .is_some_and(|after| after.split_once('\n').is_none_or(|(_, rest)| rest.trim().is_empty()));
        let length_chars = completion.chars().count();
        let term = |holds: bool, weight: f32| if holds { weight } else { 0.0 };
        let excess = length_chars.saturating_sub(weights.soft_max_chars as usize) as f32;
        // A fixed order of additions, so the total is bitwise reproducible.
        let total = term(exact_match, weights.exact_match)
            + weights.partial_credit * digits_right
            + term(after_marker.is_some(), weights.has_marker)
            + term(well_formed, weights.well_formed)
            + term(stops_cleanly, weights.stops_cleanly)
            - weights.length_penalty * excess;
        Reward {
            exact_match,
            digits_right,
            has_marker: after_marker.is_some(),
            well_formed,
            stops_cleanly,
            length_chars,
            total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_the_number_after_the_last_marker() {
        assert_eq!(extract_final_answer("47 + 85 = 132\n#### 132").as_deref(), Some("132"));
        assert_eq!(extract_final_answer("#### 1\nmore\n####   1,320  \ntail").as_deref(), Some("1320"));
        assert_eq!(extract_final_answer("####-7").as_deref(), Some("-7"));
        assert_eq!(extract_final_answer("#### 132 marbles").as_deref(), Some("132 marbles"));
        assert_eq!(extract_final_answer("no marker 132"), None);
        assert_eq!(extract_final_answer("#### \n 132"), None);
        assert_eq!(extract_final_answer("132 ####"), None);
        assert!(matches!(extract_final_answer("#### 132"), Some(Cow::Borrowed(_))));
    }

    #[test]
    fn well_formed_numbers() {
        for good in ["0", "132", "-7", "2.50", "007"] {
            assert!(is_well_formed_number(good), "{good}");
        }
        for bad in ["", "-", "1.", ".5", "1e3", "+5", "132 marbles", "1.2.3", "--1", "x"] {
            assert!(!is_well_formed_number(bad), "{bad}");
        }
    }

    #[test]
    fn leading_numbers_in_gsm8k_styles() {
        for (text, number) in [
            ("72", Some("72")),
            ("1,320", Some("1320")),
            ("$18", Some("18")),
            ("$1,320.50 a week", Some("1320.50")),
            ("72.", Some("72")),
            ("18 dollars", Some("18")),
            ("-$5", Some("-5")),
            ("-7", Some("-7")),
            ("0.5", Some("0.5")),
            ("12,", Some("12")),
            (",12", None),
            ("$", None),
            ("seven", None),
            ("", None),
        ] {
            assert_eq!(leading_number(text).as_deref(), number, "{text:?}");
        }
    }

    #[test]
    fn gsm8k_answers_match_what_models_write() {
        // A real GSM8K answer, and completions in the styles models write.
        let reference = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72";
        for completion in ["#### 72", "#### $72", "####72.", "#### 72 clips", "so 72\n#### 72.0\n"] {
            assert!(exact_match(completion, reference), "{completion:?}");
        }
        for completion in ["#### 7", "#### 720", "72", "#### about 72", "#### 72\n#### 73"] {
            assert!(!exact_match(completion, reference), "{completion:?}");
        }
        assert!(exact_match("#### 1,000", "#### 1000") && exact_match("#### 1000", "#### 1,000"));
        assert!(exact_match("#### -3", "#### -3") && !exact_match("#### 3", "#### -3"));
    }

    #[test]
    fn exact_match_compares_numbers_by_value() {
        let reference = "40 * 33 = 1320\n#### 1320";
        assert!(exact_match("so 40 * 33 = 1320\n#### 1320", reference));
        assert!(exact_match("#### 1,320", reference));
        assert!(exact_match("#### 1320.00", reference));
        assert!(exact_match("#### 01320", "1320"));
        assert!(exact_match("#### -0", "0"));
        assert!(!exact_match("#### 132", reference));
        assert!(!exact_match("1320", reference), "no marker, no match");
        assert!(!exact_match("#### 1320\n#### 13", reference), "the last marker counts");
        assert!(exact_match("#### seven", "#### seven"), "non-numbers compare as text");
    }

    #[test]
    fn score_breaks_the_reward_into_terms() {
        let weights = RewardWeights::default();
        let reference = "47 + 85 = 132\n#### 132";
        let perfect = Reward::score("47 + 85 = 132\n#### 132", reference, &weights);
        assert!(perfect.exact_match && perfect.has_marker && perfect.well_formed && perfect.stops_cleanly);
        assert_eq!(perfect.total, 1.0 + 0.1 + 0.1 + 0.1);

        let wrong = Reward::score("47 + 85 = 122\n#### 122\n", reference, &weights);
        assert!(!wrong.exact_match && wrong.well_formed && wrong.stops_cleanly);
        assert_eq!(wrong.total, 0.1 + 0.1 + 0.1);

        let rambling = Reward::score("#### 132\nand then some more text", reference, &weights);
        assert!(rambling.exact_match && !rambling.stops_cleanly);

        // The number is right, the format is not.
        let wordy = Reward::score("#### 132 marbles", reference, &weights);
        assert!(wordy.exact_match && !wordy.well_formed && wordy.stops_cleanly && wordy.has_marker);
        let dollars = Reward::score("#### $132", reference, &weights);
        assert!(dollars.exact_match && !dollars.well_formed);

        let nothing = Reward::score("I don't know", reference, &weights);
        assert_eq!(
            nothing,
            Reward {
                exact_match: false,
                digits_right: 0.0,
                has_marker: false,
                well_formed: false,
                stops_cleanly: false,
                length_chars: 12,
                total: 0.0
            }
        );
    }

    #[test]
    fn partial_credit_counts_the_digit_places_that_are_right() {
        assert_eq!(digit_credit("132", "142"), 2.0 / 3.0);
        assert_eq!(digit_credit("32", "132"), 2.0 / 3.0);
        assert_eq!(digit_credit("1132", "132"), 3.0 / 4.0);
        assert_eq!(digit_credit("0132", "132"), 1.0);
        assert_eq!(digit_credit("-5", "5"), 0.0);
        assert_eq!(digit_credit("-15", "-25"), 0.5);
        assert_eq!(digit_credit("1.5", "15"), 0.0);
        assert_eq!(digit_credit("x", "1"), 0.0);
        // Partial credit reads the number a wordy answer starts with.
        let near_wordy = Reward::score("#### 122 marbles", "#### 132", &RewardWeights::default());
        assert_eq!(near_wordy.digits_right, 2.0 / 3.0);

        let weights = RewardWeights { partial_credit: 0.5, ..RewardWeights::default() };
        let reference = "47 + 85 = 132\n#### 132";
        let near = Reward::score("47 + 85 = 122\n#### 122", reference, &weights);
        assert_eq!(near.digits_right, 2.0 / 3.0);
        assert_eq!(near.total, 0.5 * (2.0 / 3.0) + 0.1 + 0.1 + 0.1);
        let right = Reward::score("#### 132", reference, &weights);
        assert_eq!((right.digits_right, right.total), (1.0, 1.0 + 0.5 + 0.1 + 0.1 + 0.1));
        let far = Reward::score("#### 999", reference, &weights);
        assert!(far.total < near.total && near.total < right.total);
        assert_eq!(Reward::score("132", reference, &weights).digits_right, 0.0, "no marker, no credit");
    }

    #[test]
    fn length_penalty_applies_beyond_the_soft_maximum() {
        let weights = RewardWeights { length_penalty: 0.01, soft_max_chars: 10, ..RewardWeights::default() };
        let short = Reward::score("#### 5", "5", &weights);
        assert_eq!(short.total, 1.0 + 0.1 + 0.1 + 0.1);
        let long = Reward::score(&format!("{}#### 5", " ".repeat(14)), "5", &weights);
        assert_eq!(long.length_chars, 20);
        assert_eq!(long.total, 1.0 + 0.1 + 0.1 + 0.1 - 0.01 * 10.0);
    }

    #[test]
    fn weights_parse_with_defaults_and_refuse_non_finite_values() {
        let weights: RewardWeights = serde_json::from_str(r#"{"has_marker": 0.0}"#).expect("parses");
        assert_eq!(weights, RewardWeights { has_marker: 0.0, ..RewardWeights::default() });
        assert!(serde_json::from_str::<RewardWeights>(r#"{"exact": 1.0}"#).is_err());
        let error = RewardWeights { length_penalty: f32::NAN, ..RewardWeights::default() }
            .validate()
            .expect_err("nan");
        assert!(error.to_string().starts_with("reward.length_penalty:"), "{error}");
    }
}
