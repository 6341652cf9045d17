//! Where a step's time goes: named phases and their wall time.
//!
//! A step function times each part of its work with [`Phases::time`] and returns the result in
//! its step outcome, so a driver can report the split (`metrics.jsonl`, status, plots) beside
//! the step's total. PJRT executions on this path wait for the devices before they return, so
//! a phase around a program call measures the program, not only its launch.
//!
//! Phases keep the order in which they first ran; timing the same name again adds to it (a
//! phase per micro-batch becomes one phase per step). The phases of one step are disjoint, so
//! their sum is the step's time less what no phase covered ([`Phases::total`] against the
//! step's own clock shows how much that is).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Named wall times, in the order each name first appeared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Phases {
    entries: Vec<(&'static str, Duration)>,
}

impl Phases {
    /// No phase yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `work` and adds its wall time to phase `name`.
    pub fn time<T>(&mut self, name: &'static str, work: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let result = work();
        self.add(name, started.elapsed());
        result
    }

    /// Adds `elapsed` to phase `name`.
    pub fn add(&mut self, name: &'static str, elapsed: Duration) {
        match self.entries.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += elapsed,
            None => self.entries.push((name, elapsed)),
        }
    }

    /// Adds every phase of `other` to this one's.
    pub fn merge(&mut self, other: &Phases) {
        for &(name, elapsed) in &other.entries {
            self.add(name, elapsed);
        }
    }

    /// The time of phase `name` (zero when it never ran).
    pub fn get(&self, name: &str) -> Duration {
        self.entries.iter().find(|(n, _)| *n == name).map_or(Duration::ZERO, |&(_, d)| d)
    }

    /// The phases in the order they first ran.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, Duration)> + '_ {
        self.entries.iter().copied()
    }

    /// The sum of every phase.
    pub fn total(&self) -> Duration {
        self.entries.iter().map(|&(_, d)| d).sum()
    }

    /// Seconds per phase keyed `phase_<name>_seconds`, as `metrics.jsonl` carries them.
    pub fn to_map(&self) -> BTreeMap<String, f64> {
        self.entries.iter().map(|&(name, d)| (format!("phase_{name}_seconds"), d.as_secs_f64())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_by_name_in_first_seen_order() {
        let mut phases = Phases::new();
        phases.add("rollout", Duration::from_millis(30));
        phases.add("rewards", Duration::from_millis(2));
        phases.add("rollout", Duration::from_millis(10));
        let value = phases.time("gradients", || 7);
        assert_eq!(value, 7);
        let names: Vec<_> = phases.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["rollout", "rewards", "gradients"]);
        assert_eq!(phases.get("rollout"), Duration::from_millis(40));
        assert_eq!(phases.get("apply"), Duration::ZERO);
        assert!(phases.total() >= Duration::from_millis(42));

        let mut other = Phases::new();
        other.add("apply", Duration::from_millis(5));
        other.add("rewards", Duration::from_millis(1));
        phases.merge(&other);
        assert_eq!(phases.get("rewards"), Duration::from_millis(3));
        let map = phases.to_map();
        assert_eq!(map["phase_apply_seconds"], 0.005);
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn a_timed_phase_measures_its_work() {
        let mut phases = Phases::new();
        phases.time("sleep", || std::thread::sleep(Duration::from_millis(20)));
        assert!(phases.get("sleep") >= Duration::from_millis(20));
    }
}
