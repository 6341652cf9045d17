//! AdamW's hyperparameters and the learning-rate schedule, which runs on the host so that the
//! exported `apply_step` takes the rate of each step as an input.

use crate::JobError;
use serde::{Deserialize, Serialize};

/// AdamW and its learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerSpec {
    /// Peak learning rate.
    pub lr: f64,
    /// Steps of linear warm-up from 0 to `lr`.
    pub warmup_steps: u64,
    /// Shape of the decay after warm-up.
    pub schedule: Schedule,
    /// The rate at the last step, as a fraction of `lr` (cosine and linear).
    pub min_lr_ratio: f64,
    /// Decoupled weight decay on matrices.
    pub weight_decay: f64,
    /// First-moment decay.
    pub b1: f64,
    /// Second-moment decay.
    pub b2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Global gradient-norm clip; 0 disables clipping.
    pub max_grad_norm: f64,
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        Self {
            lr: 3e-4,
            warmup_steps: 0,
            schedule: Schedule::Cosine,
            min_lr_ratio: 0.1,
            weight_decay: 0.1,
            b1: 0.9,
            b2: 0.95,
            eps: 1e-8,
            max_grad_norm: 1.0,
        }
    }
}

/// Decay after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Stay at the peak.
    Constant,
    /// Half a cosine from the peak to `min_lr_ratio * lr`.
    Cosine,
    /// A straight line from the peak to `min_lr_ratio * lr`.
    Linear,
}

impl OptimizerSpec {
    pub(crate) fn validate(&self, steps: u64) -> Result<(), JobError> {
        let invalid = |field, reason: String| Err(JobError::Invalid { field, reason });
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return invalid("optimizer.lr", format!("{} must be a positive number, e.g. 3e-4", self.lr));
        }
        if self.warmup_steps >= steps && self.warmup_steps > 0 {
            return invalid(
                "optimizer.warmup_steps",
                format!(
                    "{} must be below steps ({steps}) so that training reaches the peak rate",
                    self.warmup_steps
                ),
            );
        }
        for (field, value) in [
            ("optimizer.min_lr_ratio", self.min_lr_ratio),
            ("optimizer.b1", self.b1),
            ("optimizer.b2", self.b2),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return invalid(field, format!("{value} must lie in [0, 1]"));
            }
        }
        for (field, value) in [
            ("optimizer.weight_decay", self.weight_decay),
            ("optimizer.eps", self.eps),
            ("optimizer.max_grad_norm", self.max_grad_norm),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return invalid(field, format!("{value} must be a non-negative number"));
            }
        }
        Ok(())
    }

    /// The learning rate of 0-based step `step` of a run of `total` steps.
    pub fn learning_rate(&self, step: u64, total: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay_steps = total.saturating_sub(self.warmup_steps).saturating_sub(1).max(1);
        let progress = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
        let floor = self.lr * self.min_lr_ratio;
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                floor + (self.lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
            Schedule::Linear => self.lr - (self.lr - floor) * progress,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let o = OptimizerSpec { lr: 1.0, warmup_steps: 4, min_lr_ratio: 0.1, ..Default::default() };
        let lrs: Vec<f64> = (0..14).map(|s| o.learning_rate(s, 14)).collect();
        assert_eq!(&lrs[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert_eq!(lrs[4], 1.0);
        assert!((lrs[13] - 0.1).abs() < 1e-12, "{}", lrs[13]);
        assert!(lrs[4..].windows(2).all(|w| w[1] <= w[0]), "{lrs:?}");
    }

    #[test]
    fn constant_and_linear() {
        let c = OptimizerSpec { lr: 2.0, schedule: Schedule::Constant, ..Default::default() };
        assert_eq!(c.learning_rate(7, 10), 2.0);
        let l =
            OptimizerSpec { lr: 1.0, schedule: Schedule::Linear, min_lr_ratio: 0.0, ..Default::default() };
        assert_eq!(l.learning_rate(0, 11), 1.0);
        assert!((l.learning_rate(5, 11) - 0.5).abs() < 1e-12);
        assert_eq!(l.learning_rate(10, 11), 0.0);
    }
}
