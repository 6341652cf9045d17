//! The failures to inject, as a pure function of a seed: which kind, on which slice, when, and
//! how long until the replacement starts, the cut heals, the killed node restarts or the disk or
//! object-store fault ends.

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
    /// SIGSTOP of the Raft leader: it hangs with its port and connections open (a paused VM, a
    /// process stuck in the kernel), then resumes (SIGCONT) and finds another leader in charge.
    LeaderHang,
    /// The slice's network is cut (coordinators and peers alike); it heals later and the
    /// cut-off worker rejoins.
    Cut,
    /// The slice's host reboots: its worker is SIGKILLed, its local files are deleted, and a
    /// fresh worker starts later under the same host name.
    NodeRestart,
    /// The checkpoint folder's filesystem is full (`ENOSPC` on the next checkpoint write) until
    /// the fault ends. Jobs whose checkpoints are on the harness's disk only.
    DiskFull,
    /// The checkpoint folder's disk writes at a trickle until the fault ends. Jobs whose
    /// checkpoints are on the harness's disk only.
    SlowDisk,
    /// The object store answers every request `503 SlowDown` until the fault ends. Jobs whose
    /// checkpoints are in the harness's S3 bucket only.
    StoreThrottle,
    /// The object store answers every request `500 InternalError` until the fault ends.
    StoreError,
    /// The object store drops every connection without an answer until the fault ends.
    StoreDrop,
    /// The object store answers every request late until the fault ends.
    StoreSlow,
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 12] = [
        Kind::Preempt,
        Kind::Kill,
        Kind::LeaderKill,
        Kind::LeaderHang,
        Kind::Cut,
        Kind::NodeRestart,
        Kind::DiskFull,
        Kind::SlowDisk,
        Kind::StoreThrottle,
        Kind::StoreError,
        Kind::StoreDrop,
        Kind::StoreSlow,
    ];

    /// The failures of processes and of the network: what any job can be put through.
    pub const PROCESSES: [Kind; 6] =
        [Kind::Preempt, Kind::Kill, Kind::LeaderKill, Kind::LeaderHang, Kind::Cut, Kind::NodeRestart];

    /// The failures of the checkpoint folder's disk.
    pub const DISK: [Kind; 2] = [Kind::DiskFull, Kind::SlowDisk];

    /// The failures of the object store in front of the checkpoint bucket.
    pub const STORE: [Kind; 4] = [Kind::StoreThrottle, Kind::StoreError, Kind::StoreDrop, Kind::StoreSlow];

    /// Whether the failure hits the Raft leader (one at a time, with every coordinator up).
    pub fn hits_the_leader(self) -> bool {
        matches!(self, Kind::LeaderKill | Kind::LeaderHang)
    }

    /// Whether the failure hits a worker slice.
    pub fn hits_a_slice(self) -> bool {
        matches!(self, Kind::Preempt | Kind::Kill | Kind::Cut | Kind::NodeRestart)
    }

    /// Whether the failure hits where checkpoints are written (disk or object store): it is over
    /// once a checkpoint commits after the fault ended.
    pub fn hits_storage(self) -> bool {
        Kind::DISK.contains(&self) || Kind::STORE.contains(&self)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Preempt => "SIGTERM",
            Kind::Kill => "SIGKILL",
            Kind::LeaderKill => "leader SIGKILL",
            Kind::LeaderHang => "leader hang",
            Kind::Cut => "network cut",
            Kind::NodeRestart => "node restart",
            Kind::DiskFull => "disk full",
            Kind::SlowDisk => "slow disk",
            Kind::StoreThrottle => "S3 503 SlowDown",
            Kind::StoreError => "S3 500",
            Kind::StoreDrop => "S3 dropped conn",
            Kind::StoreSlow => "S3 latency",
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
    /// (cut), the killed coordinator restarts (leader kill), the rebooted host's fresh worker
    /// starts (node restart), or the disk or object-store fault ends.
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
        // Past a worker's session silence and a lease: the soak met a killed leader that hung
        // 10 s in the kernel before it died.
        Kind::LeaderHang => rng.range(4_000, 10_000),
        // Longer than a lease, so the job goes on without the cut slice before it heals.
        Kind::Cut => rng.range(5_000, 9_000),
        // A reboot.
        Kind::NodeRestart => rng.range(1_000, 3_000),
        // Long enough to span a checkpoint write (one every few seconds in the harness's jobs)
        // and, for the object store, the client's retries of it.
        Kind::DiskFull | Kind::SlowDisk => rng.range(3_000, 6_000),
        Kind::StoreThrottle | Kind::StoreError | Kind::StoreDrop | Kind::StoreSlow => rng.range(3_000, 7_000),
    };
    Duration::from_millis(ms)
}

/// `per_kind` failures of each of `kinds` in a seeded order, triggered by committed steps: the
/// first at `first_step`, then every `gap` steps (give or take a quarter), on seeded slices.
pub fn by_steps(
    seed: u64,
    kinds: &[Kind],
    per_kind: usize,
    slices: usize,
    first_step: u64,
    gap: u64,
) -> Vec<Event> {
    let mut rng = Rng(seed);
    let mut kinds: Vec<Kind> = kinds.iter().flat_map(|&k| std::iter::repeat_n(k, per_kind)).collect();
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

/// A failure of the processes or the network every `every` (give or take a fifth) for
/// `duration`, kinds cycling through a seeded order so that each appears about as often, on
/// seeded slices.
pub fn by_time(seed: u64, every: Duration, duration: Duration, slices: usize) -> Vec<Event> {
    let mut rng = Rng(seed);
    let mut order = [Kind::Preempt, Kind::Kill, Kind::LeaderKill, Kind::Cut];
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
        assert_eq!(by_steps(7, &Kind::ALL, 6, 4, 10, 8), by_steps(7, &Kind::ALL, 6, 4, 10, 8));
        assert_ne!(by_steps(7, &Kind::ALL, 6, 4, 10, 8), by_steps(8, &Kind::ALL, 6, 4, 10, 8));
        let every = Duration::from_secs(30);
        assert_eq!(
            by_time(7, every, Duration::from_secs(300), 4),
            by_time(7, every, Duration::from_secs(300), 4)
        );
    }

    #[test]
    fn every_kind_appears_as_often_as_asked_on_valid_slices_with_rising_triggers() {
        let events = by_steps(3, &Kind::ALL, 6, 4, 10, 8);
        assert_eq!(events.len(), 72);
        for kind in Kind::ALL {
            assert_eq!(events.iter().filter(|e| e.kind == kind).count(), 6, "{kind}");
        }
        let processes = by_steps(3, &Kind::PROCESSES, 2, 4, 10, 8);
        assert!(processes.iter().all(|e| Kind::PROCESSES.contains(&e.kind)), "{processes:?}");
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
        for kind in [Kind::Preempt, Kind::Kill, Kind::LeaderKill, Kind::Cut] {
            assert!(events.iter().filter(|e| e.kind == kind).count() >= 2, "{kind}");
        }
        let Trigger::After(first) = events[0].trigger else { panic!() };
        assert_eq!(first, Duration::from_secs(30));
    }
}
