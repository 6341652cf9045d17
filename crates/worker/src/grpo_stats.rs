//! GRPO's statistics: group-normalized advantages, and the tally of a step's sums that is
//! all-reduced with the gradients and becomes the step's metrics.

use data::Reward;
use std::collections::BTreeMap;

/// Added to a group's standard deviation before dividing: a group whose rewards all agree gets
/// advantages of 0, not a division by 0.
const STD_EPS: f64 = 1e-4;

/// Sums over a step's rows (host side) and grad steps (device side). One rank's tally is
/// reduced with the other ranks' in the gradients' all-reduce, as float32 values in this order.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Tally {
    pub(crate) rows: f32,
    pub(crate) reward: f32,
    pub(crate) reward_squares: f32,
    pub(crate) correct: f32,
    pub(crate) digits_right: f32,
    pub(crate) has_marker: f32,
    pub(crate) well_formed: f32,
    pub(crate) stops_cleanly: f32,
    pub(crate) completion_tokens: f32,
    pub(crate) stopped: f32,
    pub(crate) truncated_prompts: f32,
    pub(crate) groups: f32,
    pub(crate) groups_with_spread: f32,
    pub(crate) loss_sum: f32,
    pub(crate) token_count: f32,
    pub(crate) kl_sum: f32,
    pub(crate) clipped: f32,
    pub(crate) ratio_sum: f32,
    /// Completions no reward function scored.
    pub(crate) unscored: f32,
}

impl Tally {
    pub(crate) const LEN: usize = 19;

    pub(crate) fn to_vec(self) -> Vec<f32> {
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
            self.unscored,
        ]
    }

    pub(crate) fn from_slice(v: &[f32]) -> Self {
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
            unscored: v[18],
        }
    }

    /// Counts a completion whose reward (of all the job's functions) is `total` and whose
    /// numeric answer's terms are `reward`.
    pub(crate) fn count_row(&mut self, reward: &Reward, total: f32, length: i32, max_new: usize) {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        self.rows += 1.0;
        // A completion no function scored has no reward: the mean is over the scored ones.
        if total.is_nan() {
            self.unscored += 1.0;
        } else {
            self.reward += total;
            self.reward_squares += total * total;
        }
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
    /// Mean reward per completion (of those a reward function scored).
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
    /// Completions no reward function scored (every one returned None).
    pub unscored: f64,
}

impl GrpoMetrics {
    pub(crate) fn from_tally(t: Tally) -> Self {
        let f = |x: f32| x as f64;
        let rows = f(t.rows).max(1.0);
        let tokens = f(t.token_count).max(1.0);
        let scored = (f(t.rows) - f(t.unscored)).max(1.0);
        let reward = f(t.reward) / scored;
        Self {
            reward,
            reward_std: (f(t.reward_squares) / scored - reward * reward).max(0.0).sqrt(),
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
            unscored: f(t.unscored),
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
            ("unscored", self.unscored),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Group-normalized advantages of `rewards`, `generations` consecutive rows per group; also the
/// number of groups whose rewards are not all equal. A NaN reward (a completion no reward
/// function scored) is left out of its group's mean and deviation and gets an advantage of 0,
/// as in TRL.
pub(crate) fn advantages(rewards: &[f32], generations: usize, scale: bool) -> (Vec<f32>, usize) {
    let mut out = Vec::with_capacity(rewards.len());
    let mut spread = 0;
    for group in rewards.chunks(generations) {
        let scored: Vec<f64> = group.iter().filter(|r| !r.is_nan()).map(|&r| r as f64).collect();
        let n = scored.len().max(1) as f64;
        let mean = scored.iter().sum::<f64>() / n;
        let var = scored.iter().map(|&r| (r - mean).powi(2)).sum::<f64>() / n;
        if scored.iter().any(|&r| r != scored[0]) {
            spread += 1;
        }
        let denominator = if scale { var.sqrt() + STD_EPS } else { 1.0 };
        out.extend(
            group.iter().map(|&r| if r.is_nan() { 0.0 } else { ((r as f64 - mean) / denominator) as f32 }),
        );
    }
    (out, spread)
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
        let (unscored, spread) = advantages(&[3.0, f32::NAN, 1.0, f32::NAN, f32::NAN, 2.0], 3, false);
        assert_eq!(unscored, [1.0, 0.0, -1.0, 0.0, 0.0, 0.0], "unscored rows: no advantage, not in the mean");
        assert_eq!(spread, 1);
    }

    #[test]
    fn a_tally_keeps_its_layout_through_the_reduction_and_reads_back_as_means() {
        let values: Vec<f32> = (1..=Tally::LEN).map(|i| i as f32).collect();
        assert_eq!(Tally::from_slice(&values).to_vec(), values, "every field has a slot of its own");
        let tally = Tally {
            rows: 4.0,
            reward: 2.0,
            reward_squares: 2.0,
            correct: 1.0,
            loss_sum: 5.0,
            token_count: 10.0,
            clipped: 1.0,
            ..Tally::default()
        };
        let metrics = GrpoMetrics::from_tally(Tally::from_slice(&tally.to_vec()));
        assert_eq!((metrics.reward, metrics.accuracy), (0.5, 0.25));
        assert_eq!((metrics.loss, metrics.clip_fraction), (0.5, 0.1));
        assert_eq!(metrics.reward_std, 0.5, "population std of rewards with mean 0.5 and mean square 0.5");
    }
}
