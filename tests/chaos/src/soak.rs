//! The soak: every kind of failure the harness knows, many times over, in one run. A job trains
//! once without failures; then the same job twice under seeded schedules, once checkpointing to
//! the harness's disk (the failures of processes and network, a full disk, a slow disk) and once
//! to the harness's S3 bucket (the failures of processes and network, and the object store's
//! throttling, errors, dropped connections and latency). Each is checked against the calm run
//! ([`verify`]: every committed checkpoint and the final state bitwise equal) and its
//! checkpoint root against the retention rule (exactly `keep` committed checkpoints left).

use crate::schedule::{self, Kind};
use crate::{Harness, JobRun, JobSpec, Policy, Store, Verified, print_events, verify};
use anyhow::Result;
use std::time::Duration;

/// Up to this many checkpoints the calm run keeps all of them (under the coordinator's limit
/// of a job's catalog); past it, as many as the failing runs.
const CALM_CHECKPOINTS_KEPT: u64 = 1000;

/// What the soak runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The schedules' seed (the bucket job's is the next one).
    pub seed: u64,
    /// Failures of every disk and store kind; the process and network kinds get twice as many
    /// (this many in each job).
    pub per_kind: usize,
    /// Steps of every job; 0: enough for the schedule.
    pub steps: u64,
    /// The first failure once this many steps are committed, the next ones every `gap` steps
    /// (once the job is over the previous one).
    pub first: u64,
    /// See `first`.
    pub gap: u64,
    /// Steps to give each failure when `steps` is 0. One after another, a failure is over in
    /// ~5 s (a cut heals after 5-9 s, then its worker rejoins) while steps go on: ~10 steps a
    /// failure were measured at ~0.45 s a step (debug build), so give 16 there and ~48 at the
    /// release build's ~0.15 s. Overlapping, one starts every ~2 s: ~13 steps of a release build.
    pub steps_per_failure: u64,
    /// The retention rule, `checkpoint.keep`.
    pub keep: u32,
    /// Sequence length (longer: slower steps).
    pub seq_len: u64,
    /// How long each job may take (`None`: the harness's default for its steps and failures).
    pub time_limit: Option<Duration>,
    /// Failures overlap ([`JobSpec::overlap`]): a slice fails while another rejoins, the leader
    /// dies or the store fails meanwhile. A thousand failures one after another take hours.
    pub overlap: bool,
}

impl Options {
    /// The failures of each job, by kind, in its order.
    pub fn jobs(&self) -> [(Store, Vec<Kind>); 2] {
        let with = |extra: &[Kind]| -> Vec<Kind> { Kind::PROCESSES.iter().chain(extra).copied().collect() };
        [(Store::Disk, with(&Kind::DISK)), (Store::Bucket, with(&Kind::STORE))]
    }

    /// Steps of every job.
    pub fn steps(&self) -> u64 {
        if self.steps > 0 {
            return self.steps;
        }
        let most = self.jobs().iter().map(|(_, kinds)| kinds.len()).max().unwrap_or(0) * self.per_kind;
        (self.first + (most as u64 + 2) * self.steps_per_failure.max(self.gap)).div_ceil(10) * 10
    }

    fn spec(&self, name: &str, store: Store) -> JobSpec {
        JobSpec {
            time_limit: self.time_limit,
            store,
            keep: Some(self.keep),
            overlap: self.overlap,
            ..JobSpec::new(name, self.steps(), self.seq_len)
        }
    }
}

/// One job under failures, as checked.
#[derive(Debug)]
pub struct Phase {
    /// The run.
    pub run: JobRun,
    /// What [`verify`] found.
    pub verified: Verified,
    /// Its checkpoint root.
    pub root: String,
    /// Every checkpoint directory under the root at the end: (step, committed).
    pub listed: Vec<(u64, bool)>,
}

impl Phase {
    /// Steps of the committed checkpoints left under the root.
    pub fn committed(&self) -> Vec<u64> {
        self.listed.iter().filter(|(_, committed)| *committed).map(|(step, _)| *step).collect()
    }
}

/// The soak, as run.
#[derive(Debug)]
pub struct Soak {
    /// The run without failures.
    pub calm: JobRun,
    /// Its final state's digest.
    pub calm_digest: String,
    /// The runs under failures.
    pub phases: Vec<Phase>,
    /// The retention rule.
    pub keep: u32,
}

/// Runs the soak on `harness` (started with `storage_faults`).
pub fn run(harness: &mut Harness, options: &Options) -> Result<Soak> {
    // The calm run keeps every checkpoint it can: which ones a failing run keeps depends on
    // which of its saves failed, and each needs a counterpart to be compared with.
    let mut calm_spec = options.spec("calm", Store::RunDir);
    if calm_spec.steps / calm_spec.checkpoint_every < CALM_CHECKPOINTS_KEPT {
        calm_spec.keep = None;
    }
    let calm = harness.run_job(&calm_spec, &[], Policy::Elastic)?;
    println!("calm run: {} steps in {:.1}s", calm.steps, calm.wall_seconds);
    let calm_digest = harness.digest(&calm.checkpoints.last().map(|c| c.1.clone()).unwrap_or_default())?;
    let mut phases = Vec::new();
    for (n, (store, kinds)) in options.jobs().into_iter().enumerate() {
        let name = if store == Store::Disk { "soak-disk" } else { "soak-bucket" };
        let events = schedule::by_steps(
            options.seed + n as u64,
            &kinds,
            options.per_kind,
            4,
            options.first,
            options.gap,
        );
        let spec = options.spec(name, store);
        let run = harness.run_job(&spec, &events, Policy::Elastic)?;
        print_events(&run);
        let verified = verify(harness, &calm, &run)?;
        let root = spec.checkpoint_root(harness.setup()).unwrap_or_default();
        let listed = harness.list(&root)?;
        phases.push(Phase { run, verified, root, listed });
    }
    Ok(Soak { calm, calm_digest, phases, keep: options.keep })
}

impl Soak {
    /// Every injected failure of every phase.
    pub fn failures(&self) -> usize {
        self.phases.iter().map(|p| p.run.events.len()).sum()
    }

    /// Prints the report: failures by kind (recovered, steps lost, how long), the final digests
    /// against the calm run's, and the committed checkpoints left against the retention rule.
    pub fn print(&self) {
        println!("\nsoak report: {} failures in {} jobs", self.failures(), self.phases.len());
        println!(
            "{:<16} {:>6} {:>9} {:>10} {:>15} {:>15} {:>16} {:>9}",
            "failure",
            "count",
            "recovered",
            "steps lost",
            "next step mean",
            "next step max",
            "recovery mean/max",
            "faulted"
        );
        for kind in Kind::ALL {
            let of: Vec<_> =
                self.phases.iter().flat_map(|p| &p.run.events).filter(|r| r.kind == kind).collect();
            if of.is_empty() {
                println!("{:<16} {:>6}", kind.to_string(), 0);
                continue;
            }
            let recovered = of.iter().filter(|r| r.recovered()).count();
            let lost: u64 = of.iter().filter_map(|r| r.steps_lost).sum();
            let next: Vec<f64> = of.iter().filter_map(|r| r.next_step_after).collect();
            let recovery: Vec<f64> =
                of.iter().filter_map(|r| r.join_after.or(r.committed_after).or(r.next_step_after)).collect();
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
            let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            let faulted: u64 = of.iter().filter_map(|r| r.faulted).sum();
            println!(
                "{:<16} {:>6} {:>9} {:>10} {:>14.2}s {:>14.2}s {:>8.2}/{:>6.2}s {:>9}",
                kind.to_string(),
                of.len(),
                recovered,
                lost,
                mean(&next),
                max(&next),
                mean(&recovery),
                max(&recovery),
                if of.iter().any(|r| r.faulted.is_some()) { faulted.to_string() } else { "-".into() }
            );
        }
        println!(
            "(recovery: the slice a member again; for a disk or store fault, a checkpoint committed after it ended;\n \
             faulted: the requests a store fault answered, the saves (one per host) a full disk failed)"
        );
        println!(
            "calm run: {} steps in {:.1}s, final state {}",
            self.calm.steps, self.calm.wall_seconds, self.calm_digest
        );
        for phase in &self.phases {
            let run = &phase.run;
            let committed = phase.committed();
            println!(
                "{}: {} failures, {} steps in {:.1}s (calm {:.1}s); final state {} {} the calm run's; {} committed \
                 checkpoints equal the calm run's at their steps ({} older than the calm run kept); {} checkpoint \
                 uploads failed ({} for a full disk); {} unexpected worker exits",
                run.name,
                run.events.len(),
                run.steps,
                run.wall_seconds,
                self.calm.wall_seconds,
                phase.verified.final_digest,
                if phase.verified.final_digest == self.calm_digest { "==" } else { "!=" },
                phase.verified.checkpoints_equal,
                phase.verified.checkpoints_unmatched,
                run.failed_saves.0,
                run.failed_saves.1,
                run.unexpected_exits.len(),
            );
            println!(
                "  {}: {} committed checkpoints left (keep {}: {}), steps {:?}; {} uncommitted directories; \
                 the job's catalog lists {}",
                phase.root,
                committed.len(),
                self.keep,
                if committed.len() == self.keep as usize {
                    "as the rule says"
                } else {
                    "NOT what the rule says"
                },
                committed,
                phase.listed.len() - committed.len(),
                run.checkpoints.len(),
            );
        }
    }
}
