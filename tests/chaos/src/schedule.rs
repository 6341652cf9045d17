//! The failures to inject, as a pure function of a seed: which kind, on which slice, when, and
//! how long until the replacement starts, the cut heals or the killed node restarts.

use std::fmt;
use std::time::Duration;

/// A failure the harness injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// SIGTERM of a worker (a spot preemption notice); a replacement starts later.
    Preempt,
    /// SIGKILL of a worker (the VM vanished); a replacement starts later.
    Kill,
    /// SIGKILL of the Raft leader among the coordinators; it restarts later.
    LeaderKill,
    /// The slice's network is cut (coordinators and peers alike); it heals later and the
    /// cut-off worker rejoins.
    Cut,
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 4] = [Kind::Preempt, Kind::Kill, Kind::LeaderKill, Kind::Cut];

    /// Whether the failure hits a worker slice.
    pub fn hits_a_slice(self) -> bool {
        self != Kind::LeaderKill
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Preempt => "SIGTERM",
            Kind::Kill => "SIGKILL",
            Kind::LeaderKill => "leader SIGKILL",
            Kind::Cut => "network cut",
        })
    }
}

/// When an event fires (once the job has settled from the previous one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// Once this many steps are committed.
    Step(u64),
    /// This long after the job's first committed step.
    After(Duration),
}

/// One injected failure and what follows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// When.
    pub trigger: Trigger,
    /// What.
    pub kind: Kind,
    /// The slice it hits (ignored for a leader kill).
    pub slice: usize,
    /// After the failure: when the replacement worker starts (preempt, kill), the cut heals
    /// (cut), or the killed coordinator restarts (leader kill).
    pub then_after: Duration,
}

/// A small deterministic generator (SplitMix64): the schedule depends on the seed only.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// How long after a failure its sequel comes, for `kind`.
fn sequel(rng: &mut Rng, kind: Kind) -> Duration {
    let ms = match kind {
        // A new VM takes a moment; the survivors carry the lost ranks meanwhile.
        Kind::Preempt | Kind::Kill => rng.range(1_000, 4_000),
        Kind::LeaderKill => rng.range(1_000, 3_000),
        // Longer than a lease, so the job goes on without the cut slice before it heals.
        Kind::Cut => rng.range(5_000, 9_000),
    };
    Duration::from_millis(ms)
}

/// `per_kind` failures of every kind in a seeded order, triggered by committed steps: the first
/// at `first_step`, then every `gap` steps (give or take a quarter), on seeded slices.
pub fn by_steps(seed: u64, per_kind: usize, slices: usize, first_step: u64, gap: u64) -> Vec<Event> {
    let mut rng = Rng(seed);
    let mut kinds: Vec<Kind> = Kind::ALL.iter().flat_map(|&k| std::iter::repeat_n(k, per_kind)).collect();
    rng.shuffle(&mut kinds);
    let mut step = first_step;
    kinds
        .into_iter()
        .map(|kind| {
            let event = Event {
                trigger: Trigger::Step(step),
                kind,
                slice: rng.range(0, slices as u64 - 1) as usize,
                then_after: sequel(&mut rng, kind),
            };
            step += rng.range(gap - gap / 4, gap + gap / 4);
            event
        })
        .collect()
}

/// A failure every `every` (give or take a fifth) for `duration`, kinds cycling through a seeded
/// order so that each appears about as often, on seeded slices.
pub fn by_time(seed: u64, every: Duration, duration: Duration, slices: usize) -> Vec<Event> {
    let mut rng = Rng(seed);
    let mut order = Kind::ALL;
    rng.shuffle(&mut order);
    let every_ms = every.as_millis() as u64;
    let mut at = every_ms;
    let mut events = Vec::new();
    while at <= duration.as_millis() as u64 {
        let kind = order[events.len() % order.len()];
        events.push(Event {
            trigger: Trigger::After(Duration::from_millis(at)),
            kind,
            slice: rng.range(0, slices as u64 - 1) as usize,
            then_after: sequel(&mut rng, kind),
        });
        at += rng.range(every_ms - every_ms / 5, every_ms + every_ms / 5);
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_a_function_of_its_seed() {
        assert_eq!(by_steps(7, 6, 4, 10, 8), by_steps(7, 6, 4, 10, 8));
        assert_ne!(by_steps(7, 6, 4, 10, 8), by_steps(8, 6, 4, 10, 8));
        let every = Duration::from_secs(30);
        assert_eq!(
            by_time(7, every, Duration::from_secs(300), 4),
            by_time(7, every, Duration::from_secs(300), 4)
        );
    }

    #[test]
    fn every_kind_appears_as_often_as_asked_on_valid_slices_with_rising_triggers() {
        let events = by_steps(3, 6, 4, 10, 8);
        assert_eq!(events.len(), 24);
        for kind in Kind::ALL {
            assert_eq!(events.iter().filter(|e| e.kind == kind).count(), 6, "{kind}");
        }
        assert!(events.iter().all(|e| e.slice < 4));
        let steps: Vec<u64> = events
            .iter()
            .map(|e| match e.trigger {
                Trigger::Step(s) => s,
                Trigger::After(_) => panic!("a step trigger"),
            })
            .collect();
        assert_eq!(steps[0], 10);
        assert!(steps.windows(2).all(|w| (6..=10).contains(&(w[1] - w[0]))), "{steps:?}");
    }

    #[test]
    fn a_timed_schedule_cycles_through_the_kinds() {
        let events = by_time(5, Duration::from_secs(30), Duration::from_secs(300), 4);
        assert!((8..=13).contains(&events.len()), "{}", events.len());
        for kind in Kind::ALL {
            assert!(events.iter().filter(|e| e.kind == kind).count() >= 2, "{kind}");
        }
        let Trigger::After(first) = events[0].trigger else { panic!() };
        assert_eq!(first, Duration::from_secs(30));
    }
}
