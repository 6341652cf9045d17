//! The coordinator's decisions, as pure functions of the replicated job, the leader's in-memory
//! view of its workers, and the time.
//!
//! Nothing here does I/O or reads a clock: the leader loop ([`crate::leader`]) gathers the
//! inputs, calls these, and carries out what they return (a Raft proposal, directives to
//! workers). So every rule is tested with hand-built state, and a rerun with the same inputs
//! decides the same thing.
//!
//! - [`place`]: which virtual ranks each live worker computes.
//! - [`decide_generation`]: when to start a new generation, when to form it, when to give up.
//! - [`plan_generation`]: the members, `start_step` and where each member's state comes from.
//! - [`step_to_commit`] / [`aggregate`]: when a step is committed and with which metrics.
//! - [`retention`] / [`retention_due`]: which committed checkpoints a job keeps, and when the
//!   leader must apply that to its root.

use crate::state::{Job, JobState, MemberPlan, ResumePlan, StepCommit};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How far a worker may run ahead of the committed step: bounds the steps a new generation may
/// have to carry, and the reports the leader holds.
pub const MAX_STEPS_AHEAD: u64 = 64;

/// Why a worker is out of the running, as the leader saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// It said it is leaving (SIGTERM).
    Preempted(String),
    /// It said it is leaving (SIGTERM) with time to finish its step in flight, and goes on
    /// training until told where to stop: the generation it leaves ends after that step, so
    /// nobody's work on it is thrown away.
    Leaving(String),
    /// It said it cannot go on.
    Failed(String),
    /// It said the job's own inputs cannot run (its bundle, its spec, its model, a step with
    /// nothing to learn from), which are the same for every member: the job fails.
    Unrunnable(String),
    /// A peer named it as the one that vanished.
    Suspected {
        /// The peer that named it.
        by: String,
        /// The peer's reason.
        reason: String,
    },
}

/// What a worker's failure report says happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// The worker's own failure: it leaves the generation.
    Own,
    /// The peer it names vanished or broke the protocol: the peer leaves.
    Peer(String),
    /// The checkpoint it names failed its integrity check: passed over, and the worker leaves.
    Checkpoint(String),
    /// The job's own inputs, which no member can run: the job fails.
    Job,
}

/// The leader's memory of one worker: nothing here is replicated.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerLive {
    /// The last heartbeat (or the leader's start, or the registration).
    pub last_seen: Instant,
    /// When the leader first knew it (registration or leader start).
    pub joined: Instant,
    /// The generation its last heartbeat carried.
    pub generation: u64,
    /// Steps done its last heartbeat reported.
    pub steps_done: u64,
    /// Its last reported phase.
    pub phase: String,
    /// Set when it left or was named as lost.
    pub out: Option<Out>,
}

impl WorkerLive {
    /// A worker first seen at `now`.
    pub fn new(now: Instant) -> Self {
        Self { last_seen: now, joined: now, generation: 0, steps_done: 0, phase: String::new(), out: None }
    }

    /// Whether this leader has heard from it since it first knew it: a new leader grants a worker
    /// it has not heard from yet a full lease, whatever else says it is silent.
    pub fn heard(&self) -> bool {
        self.last_seen > self.joined
    }
}

/// One worker's report of one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepReportData {
    /// Loss summed over its virtual ranks.
    pub loss_sum: f64,
    /// Tokens the loss is over.
    pub token_count: f64,
    /// The global gradient norm.
    pub grad_norm: f64,
    /// Its step time.
    pub step_seconds: f64,
    /// Tokens it processed.
    pub tokens: u64,
    /// Other metrics, over its virtual ranks.
    pub metrics: BTreeMap<String, f64>,
}

/// The leader's memory of one job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobLive {
    /// Workers by id.
    pub workers: BTreeMap<String, WorkerLive>,
    /// The generation whose quiesce is running and since when.
    pub recovering_since: Option<(u64, Instant)>,
    /// Step reports not yet committed, by step then worker.
    pub step_reports: BTreeMap<u64, BTreeMap<String, StepReportData>>,
    /// When the leader first saw every step committed (the final checkpoint is awaited).
    pub finished_since: Option<Instant>,
    /// The last step this leader committed, and when.
    pub last_commit: Option<(u64, Instant)>,
    /// How long a step takes, from this leader's commits ([`JobLive::committed`]).
    pub step_time: Option<Duration>,
    /// The job's retention runs.
    pub retention: RetentionLive,
    /// Saves whose every part is in and whose commit is being written: the job does not
    /// complete under them, or one would commit after it and outlive its retention run.
    pub saves_finalizing: u32,
}

impl JobLive {
    /// Notes that this leader committed `step` at `now`. The step time is a decaying maximum of
    /// the time per step between commits, so a burst of queued reports after an election does
    /// not make a long step look short.
    pub fn committed(&mut self, step: u64, now: Instant) {
        if let Some((before, at)) = self.last_commit
            && step > before
        {
            let per_step =
                now.saturating_duration_since(at) / u32::try_from(step - before).unwrap_or(u32::MAX);
            self.step_time = Some(per_step.max(self.step_time.unwrap_or_default() / 2));
        }
        self.last_commit = Some((step, now));
    }
}

/// The leader's memory of a job's retention: after every commit, and whenever the catalog
/// holds more than the rule keeps (a leader that died between a commit and its retention), the
/// leader applies the rule to the root; one run at a time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetentionLive {
    /// A checkpoint was committed since the last run (which also collects orphans).
    pub wanted: bool,
    /// A run is under way.
    pub running: bool,
    /// The last run failed: not again before this.
    pub retry_at: Option<Instant>,
    /// Why the last run failed.
    pub failed: Option<String>,
}

/// The timeouts the decisions use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Silence longer than this loses a worker; a quiesce unanswered this long drops the silent.
    pub lease: Duration,
    /// Silence longer than this loses a member the rest of its generation is stuck on
    /// ([`stalled_on`]): shorter than the lease, because the survivors' heartbeats say the job
    /// cannot go on without it.
    pub suspect_after: Duration,
    /// A pending job starts with fewer than `dp_size` workers after waiting this long.
    pub formation_wait: Duration,
    /// A recovering job with no live worker for this long fails.
    pub abandon_after: Duration,
    /// After the last step, how long to wait for the final checkpoint.
    pub final_checkpoint_wait: Duration,
}

/// What to do about a job's generation.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Commit `BeginGeneration(current + 1)` and quiesce the survivors.
    Begin {
        /// Why, for people.
        reason: String,
        /// Workers to remove from the job.
        removed: Vec<String>,
        /// The step boundary the members stop at; 0: at once, aborting the step in flight (a
        /// member is lost, so the step cannot finish).
        after_step: u64,
    },
    /// Commit `NewGeneration` and send the assignments.
    Form(GenerationPlan),
    /// Every step is committed; stop waiting for the final checkpoint.
    Complete {
        /// Why now.
        reason: String,
    },
    /// Give up on the job.
    Fail {
        /// Why.
        reason: String,
    },
}

/// A generation, ready to be committed.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationPlan {
    /// The generation.
    pub generation: u64,
    /// Steps done at its start.
    pub start_step: u64,
    /// The members, by slice.
    pub members: Vec<MemberPlan>,
    /// Steps the previous generation finished and nobody committed, to commit with it.
    pub carried: Vec<StepCommit>,
    /// Workers to remove from the job.
    pub removed: Vec<String>,
    /// Why, for people.
    pub reason: String,
}

/// Places `dp_size` virtual ranks over the `live` workers (ascending ids).
///
/// Ranks stay where they are (`previous`); ranks of workers that are gone go, lowest first, to
/// the least loaded live worker; then, while one worker has two ranks more than another (a
/// replacement has none), the most loaded gives its highest rank to the least loaded. Ties go
/// to the lowest id for receiving and the highest id for giving. Workers left with no rank
/// (more workers than ranks) are not placed. The result is deterministic.
pub fn place(dp_size: u32, previous: &[MemberPlan], live: &[String]) -> BTreeMap<String, Vec<u32>> {
    let mut ranks: BTreeMap<String, BTreeSet<u32>> =
        live.iter().map(|w| (w.clone(), BTreeSet::new())).collect();
    if ranks.is_empty() {
        return BTreeMap::new();
    }
    let mut placed = BTreeSet::new();
    for member in previous {
        if let Some(mine) = ranks.get_mut(&member.worker_id) {
            for &r in member.virtual_ranks.iter().filter(|&&r| r < dp_size) {
                if placed.insert(r) {
                    mine.insert(r);
                }
            }
        }
    }
    for orphan in (0..dp_size).filter(|r| !placed.contains(r)) {
        let least = least_loaded(&ranks);
        ranks.get_mut(&least).expect("a live worker").insert(orphan);
    }
    loop {
        let least = least_loaded(&ranks);
        let most = ranks.iter().max_by_key(|(_, r)| r.len()).map(|(w, _)| w.clone()).expect("a live worker");
        if ranks[&most].len() < ranks[&least].len() + 2 {
            break;
        }
        let moved = ranks.get_mut(&most).and_then(|r| r.pop_last()).expect("the most loaded has ranks");
        ranks.get_mut(&least).expect("a live worker").insert(moved);
    }
    ranks.into_iter().filter(|(_, r)| !r.is_empty()).map(|(w, r)| (w, r.into_iter().collect())).collect()
}

fn least_loaded(ranks: &BTreeMap<String, BTreeSet<u32>>) -> String {
    ranks.iter().min_by_key(|(_, r)| r.len()).map(|(w, _)| w.clone()).expect("a live worker")
}

/// Why a registered worker is not a candidate for the next generation, if it is not.
fn lost_reason(now: Instant, worker: Option<&WorkerLive>, lease: Duration) -> Option<String> {
    let Some(worker) = worker else { return Some("unknown to the leader".into()) };
    match &worker.out {
        Some(Out::Preempted(reason)) => Some(format!("preempted ({reason})")),
        Some(Out::Leaving(reason)) => Some(format!("preempted ({reason}) after its step in flight")),
        Some(Out::Failed(reason)) => Some(format!("failed ({reason})")),
        Some(Out::Unrunnable(reason)) => Some(format!("cannot run the job ({reason})")),
        Some(Out::Suspected { by, reason }) => Some(format!("named lost by {by} ({reason})")),
        None if now.saturating_duration_since(worker.last_seen) > lease => Some(format!(
            "lease expired (silent for {:.1} s)",
            now.saturating_duration_since(worker.last_seen).as_secs_f64()
        )),
        None => None,
    }
}

/// The members of a running generation the others are stuck on, with why: a member silent for
/// longer than `suspect_after` (shorter than the lease) while every other member is heard from (its
/// heartbeats come at least every heartbeat interval, even while it waits in the all-reduce) and
/// none is more than one step past the silent one's last `steps_done`. A ring cannot finish a
/// second step without a member, so survivors that are alive and not past it are waiting on it:
/// their heartbeats are the report that their collective stalls, and the leader need not wait a
/// whole lease to re-form without it (a network cut drops packets without a reset, so no peer's
/// connection breaks to name it). A member this leader has not yet heard from (a new leader)
/// keeps its full lease, and a silent member the others are past (only its session to the
/// leader broke, or its heartbeats are late while it trains) is not suspected. The reason says
/// `lease expired early`: metrics and the run record count it as the lease expiry it is.
pub fn stalled_on(now: Instant, job: &Job, live: &JobLive, timing: &Timing) -> BTreeMap<String, String> {
    let mut suspects = BTreeMap::new();
    let finished = job.committed_step >= job.shape.total_steps;
    if job.state != JobState::Running
        || finished
        || job.members.len() < 2
        || timing.suspect_after >= timing.lease
    {
        return suspects;
    }
    let silence = |w: &WorkerLive| now.saturating_duration_since(w.last_seen);
    let of = |id: &String| live.workers.get(id).filter(|w| w.out.is_none());
    for member in &job.members {
        let Some(silent) = of(&member.worker_id) else { continue };
        if silence(silent) <= timing.suspect_after || !silent.heard() {
            continue;
        }
        let others: Option<Vec<&WorkerLive>> = job
            .members
            .iter()
            .filter(|m| m.worker_id != member.worker_id)
            .map(|m| of(&m.worker_id))
            .collect();
        let Some(others) = others else { continue };
        let waiting = others.iter().all(|w| {
            silence(w) <= timing.suspect_after
                && w.generation == job.generation
                && w.steps_done <= silent.steps_done + 1
        });
        if waiting {
            suspects.insert(
                member.worker_id.clone(),
                format!(
                    "lease expired early (silent for {:.1} s while the other {} member(s) wait on it at step {} or before)",
                    silence(silent).as_secs_f64(),
                    others.len(),
                    silent.steps_done + 1
                ),
            );
        }
    }
    suspects
}

/// Decides whether the job's generation must change, may be formed, or the job must fail.
pub fn decide_generation(now: Instant, job: &Job, live: &JobLive, timing: &Timing) -> Option<Decision> {
    if job.state.is_terminal() {
        return None;
    }
    let mut candidates = Vec::new();
    let mut lost = stalled_on(now, job, live, timing);
    for (id, _) in job.active_workers() {
        if lost.contains_key(id) {
            continue;
        }
        match lost_reason(now, live.workers.get(id), timing.lease) {
            None => candidates.push(id.clone()),
            Some(reason) => {
                lost.insert(id.clone(), reason);
            }
        }
    }
    let removed: Vec<String> = lost.keys().cloned().collect();
    let unrunnable =
        job.active_workers().find_map(|(id, _)| match live.workers.get(id).and_then(|w| w.out.as_ref()) {
            Some(Out::Unrunnable(reason)) => Some((id, reason)),
            _ => None,
        });
    if let Some((worker, reason)) = unrunnable {
        return Some(Decision::Fail { reason: format!("{worker} cannot run the job: {reason}") });
    }
    match job.state {
        JobState::Pending => {
            let waited = candidates
                .iter()
                .filter_map(|w| live.workers.get(w))
                .map(|w| now.saturating_duration_since(w.joined))
                .max()
                .unwrap_or_default();
            let enough = candidates.len() >= job.shape.dp_size as usize;
            if candidates.is_empty() || !(enough || waited >= timing.formation_wait) {
                return None;
            }
            let reason = if enough {
                format!("{} workers registered", candidates.len())
            } else {
                format!(
                    "{} of {} workers after {:.0} s",
                    candidates.len(),
                    job.shape.dp_size,
                    waited.as_secs_f64()
                )
            };
            Some(Decision::Form(plan_generation(job, live, &candidates, removed, reason)))
        }
        JobState::Running if job.committed_step >= job.shape.total_steps => {
            let waited =
                live.finished_since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
            if job.final_checkpoint_committed() {
                // Done once retention has left exactly the retained set, so whoever sees the
                // job completed sees its root as it stays; a store that keeps failing gets the
                // same wait as a missing final checkpoint.
                let total = job.shape.total_steps;
                if live.saves_finalizing == 0 && !retention_pending(job, live) {
                    return Some(Decision::Complete {
                        reason: format!("all {total} steps and the final checkpoint committed"),
                    });
                }
                return (waited >= timing.final_checkpoint_wait).then(|| Decision::Complete {
                    reason: format!(
                        "all {total} steps and the final checkpoint committed; retention did not finish \
                         in {:.0} s: {}",
                        waited.as_secs_f64(),
                        match (&live.retention.failed, live.saves_finalizing) {
                            (Some(failed), _) => failed.clone(),
                            (None, 0) => "still running".into(),
                            (None, n) => format!("{n} saves still being committed"),
                        }
                    ),
                });
            }
            if let Some((worker, reason)) = lost.iter().find(|(w, _)| job.member(w).is_some()) {
                return Some(Decision::Complete {
                    reason: format!(
                        "all steps committed; the final checkpoint is lost with {worker} ({reason})"
                    ),
                });
            }
            (waited >= timing.final_checkpoint_wait).then(|| Decision::Complete {
                reason: format!(
                    "all steps committed; no final checkpoint after {:.0} s",
                    waited.as_secs_f64()
                ),
            })
        }
        JobState::Running => {
            if let Some((worker, reason)) = lost.iter().find(|(w, _)| job.member(w).is_some()) {
                // Members that leave with their step in flight finishing stop with the others
                // after it; any other loss means that step cannot finish.
                let leaving = |w: &String| {
                    matches!(live.workers.get(w).and_then(|l| l.out.as_ref()), Some(Out::Leaving(_)))
                };
                let all_leaving = lost.keys().filter(|w| job.member(w).is_some()).all(leaving);
                return Some(Decision::Begin {
                    reason: format!("{worker} {reason}"),
                    removed,
                    after_step: if all_leaving { step_in_flight(job, live) } else { 0 },
                });
            }
            // With a worker per rank nobody can take one back: spares wait (and this skips the
            // placement on every tick of a job with many spares).
            if job.members.len() >= job.shape.dp_size as usize {
                return None;
            }
            let placement = place(job.shape.dp_size, &job.members, &candidates);
            let joiner = placement.keys().find(|w| job.member(w).is_none());
            // Every member is alive: they finish the step in flight (its work is not thrown
            // away) and stop together after it.
            joiner.map(|w| Decision::Begin {
                reason: format!("replacement {w} joined"),
                removed,
                after_step: step_in_flight(job, live),
            })
        }
        JobState::Recovering => {
            let since = match live.recovering_since {
                Some((generation, since)) if generation == job.generation => since,
                _ => now,
            };
            let waited = now.saturating_duration_since(since);
            if candidates.is_empty() {
                return (waited >= timing.abandon_after).then(|| Decision::Fail {
                    reason: format!("no live worker for {:.0} s", waited.as_secs_f64()),
                });
            }
            let silent: Vec<&String> = candidates
                .iter()
                .filter(|w| live.workers.get(*w).is_none_or(|l| l.generation != job.generation))
                .collect();
            if silent.is_empty() {
                let reason = format!("{} workers answered the quiesce", candidates.len());
                return Some(Decision::Form(plan_generation(job, live, &candidates, removed, reason)));
            }
            // A named boundary may never come: a member nobody knew was lost (cut off, not yet
            // named) holds the step in flight, and the others wait in its all-reduce,
            // heartbeating. Once the step had time to finish, they are asked again to stop at
            // once (they answer then, with their state), and only those not heard from go.
            // Dropping them all instead, as below, threw every replica away for a checkpoint.
            // A member this leader has not heard from yet keeps the full lease a new leader
            // grants: its session is still finding the leader (the soak lost 98 steps when a
            // leader dropped the last holder of the state 1.2 s into its term, 30 ms before that
            // member's session opened); the usual patience below drops it if it never answers.
            if job.quiesce_after > 0 {
                let step_window = live.step_time.unwrap_or_default() * 2 + timing.suspect_after;
                if waited < step_window {
                    return None;
                }
                let unheard = silent.iter().copied().filter(|w| {
                    live.workers.get(*w).is_none_or(|l| {
                        l.heard() && now.saturating_duration_since(l.last_seen) > timing.suspect_after
                    })
                });
                let mut removed = removed;
                removed.extend(unheard.cloned());
                removed.sort();
                let names = silent.iter().map(|w| w.as_str()).collect::<Vec<_>>().join(", ");
                return Some(Decision::Begin {
                    reason: format!(
                        "the step in flight did not finish (no answer from {names}); stopping at once"
                    ),
                    removed,
                    after_step: 0,
                });
            }
            // A survivor still heartbeating may be inside a device call that is not interrupted and
            // answers once its step ends: a model whose step takes longer than the lease must not
            // lose every survivor, and the state they hold, to a quiesce.
            let patience = (timing.lease + live.step_time.unwrap_or_default() * 2).min(timing.abandon_after);
            if waited < patience {
                return None;
            }
            let names = silent.iter().map(|w| w.as_str()).collect::<Vec<_>>().join(", ");
            let mut removed = removed;
            removed.extend(silent.into_iter().cloned());
            removed.sort();
            Some(Decision::Begin {
                reason: format!("no answer to the quiesce from {names}"),
                removed,
                after_step: 0,
            })
        }
        JobState::Completed | JobState::Failed | JobState::Stopped => None,
    }
}

/// Whether a member preempted with `deadline` left before it is killed finishes its step in
/// flight first (it offered to): with a step known and time for two more and a second to spare,
/// so that a slow step still ends before the kill. Otherwise it stops at once and the step in
/// flight is lost, as with a kill.
pub fn finishes_step_before_leaving(deadline: Duration, step_time: Option<Duration>) -> bool {
    step_time.is_some_and(|step| deadline >= step * 2 + Duration::from_secs(1))
}

/// The step the members of the running generation are in: one past the most any of them is
/// known to have done (heartbeats, step reports, commits). Named as a quiesce's stop, it lets
/// the step in flight finish; a member the news reached late is past it and stops at once.
pub fn step_in_flight(job: &Job, live: &JobLive) -> u64 {
    let heard = job.members.iter().filter_map(|m| live.workers.get(&m.worker_id)).map(|w| w.steps_done);
    let reported = live.step_reports.keys().next_back().copied();
    heard.chain(reported).fold(job.committed_step, u64::max) + 1
}

/// The job's retention rule. Scoped through its catalog, not a line: the catalog holds only the
/// line's checkpoints (up to the one resumed from, and the job's own saves). The job's saves of
/// an ended generation (`<line>.<attempt>g<generation>`) never commit: collected at once; so are
/// all of its saves once it is `finished` (nothing of it can commit any more).
pub fn retention(job: &Job, finished: bool) -> checkpoint::Retention {
    checkpoint::Retention {
        keep_last: job.shape.keep_last as usize,
        keep_every: job.shape.keep_every,
        own_saves: Some(checkpoint::OwnSaves {
            prefix: job.save_id_prefix(),
            generation: job.generation + u64::from(finished),
        }),
        ..Default::default()
    }
}

/// Whether nothing of the job can commit any more: every step and the final checkpoint are
/// committed and no save is being committed. A member saves one checkpoint at a time and
/// reported its final one, so no part of an earlier save is still being written.
pub fn saves_finished(job: &Job, live: &JobLive) -> bool {
    job.committed_step >= job.shape.total_steps
        && job.final_checkpoint_committed()
        && live.saves_finalizing == 0
}

/// Whether the job's catalog holds a commit its retention rule expires.
pub fn catalog_exceeds_retention(job: &Job) -> bool {
    let committed: Vec<_> = job.checkpoints.iter().map(|c| c.record.clone()).collect();
    let plan = checkpoint::gc::plan_gc(&committed, &[], &retention(job, false), &BTreeSet::new(), 0);
    !plan.expire.is_empty()
}

fn retention_pending(job: &Job, live: &JobLive) -> bool {
    live.retention.wanted || live.retention.running || catalog_exceeds_retention(job)
}

/// Whether the leader should start a retention run for the job now: one is wanted (a commit
/// since the last run, or a catalog over the rule), none is running, and a failed one has
/// waited out its back-off.
pub fn retention_due(now: Instant, job: &Job, live: &JobLive) -> bool {
    let r = &live.retention;
    !r.running && r.retry_at.is_none_or(|at| now >= at) && (r.wanted || catalog_exceeds_retention(job))
}

/// The next generation over `candidates` (ascending ids): placement, `start_step`, where each
/// member's state comes from, and the steps to carry.
///
/// Holders are candidates that were members of the previous generation: their state is at the
/// `steps_done` they reported. `start_step` is the largest of those and of the newest committed
/// checkpoint's step; a holder at it keeps its state, anyone else fetches it from a holder at it
/// (spread over them). With no holder at it, every member restores that checkpoint, or starts
/// fresh at step 0. A holder behind the checkpoint (a member formed a moment ago that had not yet
/// restored or fetched its state) never drags the job back below what is committed.
pub fn plan_generation(
    job: &Job,
    live: &JobLive,
    candidates: &[String],
    removed: Vec<String>,
    reason: String,
) -> GenerationPlan {
    let generation = if job.state == JobState::Pending { job.generation + 1 } else { job.generation };
    let placement = place(job.shape.dp_size, &job.members, candidates);
    let holders: BTreeMap<&String, u64> = candidates
        .iter()
        .filter(|w| job.member(w).is_some())
        .filter_map(|w| Some((w, live.workers.get(w)?.steps_done)))
        .collect();
    let checkpoint = job.last_checkpoint();
    let start_step = holders.values().copied().chain(checkpoint.map(|c| c.record.step)).max().unwrap_or(0);
    let sources: Vec<&String> = holders.iter().filter(|(_, s)| **s == start_step).map(|(w, _)| *w).collect();
    let mut by_lowest_rank: Vec<(&String, &Vec<u32>)> = placement.iter().collect();
    by_lowest_rank.sort_by_key(|(_, ranks)| ranks[0]);
    let mut fetchers = 0usize;
    let members = by_lowest_rank
        .into_iter()
        .enumerate()
        .map(|(slice, (worker, ranks))| {
            let resume = if holders.get(worker) == Some(&start_step) {
                ResumePlan::Keep
            } else if !sources.is_empty() {
                let source = sources[fetchers % sources.len()];
                fetchers += 1;
                ResumePlan::FromPeer {
                    worker_id: source.clone(),
                    data_addr: job.workers.get(source).map(|w| w.data_addr.clone()).unwrap_or_default(),
                    step: start_step,
                }
            } else if let Some(c) = checkpoint {
                ResumePlan::FromCheckpoint { uri: c.uri.clone(), step: c.record.step }
            } else {
                ResumePlan::Fresh
            };
            MemberPlan {
                worker_id: worker.clone(),
                slice: slice as u32,
                virtual_ranks: ranks.clone(),
                resume,
            }
        })
        .collect();
    let carried = (job.committed_step + 1..=start_step.min(job.committed_step + MAX_STEPS_AHEAD))
        .map(|step| {
            let empty = BTreeMap::new();
            aggregate(step, &job.members, live.step_reports.get(&step).unwrap_or(&empty))
        })
        .collect();
    GenerationPlan { generation, start_step, members, carried, removed, reason }
}

/// The next step to commit, when every member of the running generation has reported it.
pub fn step_to_commit(job: &Job, live: &JobLive) -> Option<StepCommit> {
    if job.state != JobState::Running || job.members.is_empty() {
        return None;
    }
    let step = job.committed_step + 1;
    let reports = live.step_reports.get(&step)?;
    job.members
        .iter()
        .all(|m| reports.contains_key(&m.worker_id))
        .then(|| aggregate(step, &job.members, reports))
}

/// Aggregates the reports of one step: loss per token over everyone's tokens, the slowest step
/// time, the tokens of all, the largest gradient norm reported (they agree after the all-reduce),
/// and other metrics averaged over virtual ranks. Non-finite numbers are dropped.
pub fn aggregate(
    step: u64,
    members: &[MemberPlan],
    reports: &BTreeMap<String, StepReportData>,
) -> StepCommit {
    let finite = |x: f64| x.is_finite().then_some(x);
    let loss_sum: f64 = reports.values().filter_map(|r| finite(r.loss_sum)).sum();
    let token_count: f64 = reports.values().filter_map(|r| finite(r.token_count)).sum();
    let tokens: u64 = reports.values().map(|r| r.tokens).fold(0, u64::saturating_add);
    let step_seconds = reports.values().filter_map(|r| finite(r.step_seconds)).fold(0.0, f64::max);
    let grad_norm = reports.values().filter_map(|r| finite(r.grad_norm)).reduce(f64::max);
    let weight = |worker: &str| {
        members.iter().find(|m| m.worker_id == worker).map_or(1.0, |m| m.virtual_ranks.len().max(1) as f64)
    };
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (worker, report) in reports {
        for (name, value) in &report.metrics {
            if let Some(value) = finite(*value) {
                let entry = sums.entry(name.clone()).or_default();
                entry.0 += value * weight(worker);
                entry.1 += weight(worker);
            }
        }
    }
    StepCommit {
        step,
        loss: (token_count > 0.0).then(|| loss_sum / token_count),
        tokens,
        step_seconds,
        tokens_per_second: if step_seconds > 0.0 { tokens as f64 / step_seconds } else { 0.0 },
        grad_norm,
        metrics: sums.into_iter().map(|(k, (sum, w))| (k, sum / w)).collect(),
        reporters: reports.len() as u32,
        members: members.len() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::{register, submit};
    use crate::state::{CheckpointEntry, ClusterState, Command};

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn plan_of(placement: &BTreeMap<String, Vec<u32>>) -> Vec<MemberPlan> {
        placement
            .iter()
            .map(|(w, r)| MemberPlan {
                worker_id: w.clone(),
                slice: 0,
                virtual_ranks: r.clone(),
                resume: ResumePlan::Keep,
            })
            .collect()
    }

    fn ranks(placement: &BTreeMap<String, Vec<u32>>) -> Vec<(&str, Vec<u32>)> {
        placement.iter().map(|(w, r)| (w.as_str(), r.clone())).collect()
    }

    #[test]
    fn a_fresh_placement_gives_rank_i_to_the_ith_worker() {
        let p = place(4, &[], &ids(&["a", "b", "c", "d"]));
        assert_eq!(ranks(&p), vec![("a", vec![0]), ("b", vec![1]), ("c", vec![2]), ("d", vec![3])]);
    }

    #[test]
    fn orphans_go_to_the_least_loaded_and_survivors_keep_theirs() {
        let before = place(4, &[], &ids(&["a", "b", "c", "d"]));
        let after = place(4, &plan_of(&before), &ids(&["a", "c", "d"]));
        assert_eq!(ranks(&after), vec![("a", vec![0, 1]), ("c", vec![2]), ("d", vec![3])]);
        // A second loss: the orphan goes to a worker with one rank, not to `a`.
        let after2 = place(4, &plan_of(&after), &ids(&["a", "d"]));
        assert_eq!(ranks(&after2), vec![("a", vec![0, 1]), ("d", vec![2, 3])]);
    }

    #[test]
    fn a_replacement_gets_ranks_back_from_the_most_loaded() {
        let shrunk = place(4, &[], &ids(&["a", "c", "d"]));
        assert_eq!(ranks(&shrunk), vec![("a", vec![0, 3]), ("c", vec![1]), ("d", vec![2])]);
        let grown = place(4, &plan_of(&shrunk), &ids(&["a", "c", "d", "e"]));
        assert_eq!(ranks(&grown), vec![("a", vec![0]), ("c", vec![1]), ("d", vec![2]), ("e", vec![3])]);
    }

    #[test]
    fn extra_workers_stay_unplaced_and_placement_is_deterministic() {
        let p = place(2, &[], &ids(&["a", "b", "c"]));
        assert_eq!(ranks(&p), vec![("a", vec![0]), ("b", vec![1])]);
        assert_eq!(place(2, &[], &ids(&["a", "b", "c"])), p);
        assert!(place(2, &[], &[]).is_empty());
        // One worker computes every rank.
        assert_eq!(ranks(&place(3, &[], &ids(&["z"]))), vec![("z", vec![0, 1, 2])]);
    }

    const TIMING: Timing = Timing {
        lease: Duration::from_secs(3),
        suspect_after: Duration::from_millis(1500),
        formation_wait: Duration::from_secs(30),
        abandon_after: Duration::from_secs(600),
        final_checkpoint_wait: Duration::from_secs(60),
    };

    /// A running job of `n` workers, all heartbeating at `now` with `steps_done`.
    fn running(n: usize, steps_done: u64, now: Instant) -> (Job, JobLive) {
        let mut state = ClusterState::default();
        let job_id = submit(&mut state, n as u32, 100);
        let workers: Vec<String> = (0..n).map(|i| register(&mut state, &job_id, &format!("i{i}"))).collect();
        let mut live = JobLive::default();
        for w in &workers {
            live.workers.insert(w.clone(), WorkerLive { generation: 1, steps_done, ..WorkerLive::new(now) });
        }
        let job = state.jobs[&job_id].clone();
        let Some(Decision::Form(plan)) = decide_generation(now, &job, &live, &TIMING) else {
            panic!("forms")
        };
        assert_eq!(plan.generation, 1);
        assert!(plan.members.iter().all(|m| m.resume == ResumePlan::Fresh));
        state.apply(Command::NewGeneration {
            job_id: job_id.clone(),
            generation: 1,
            start_step: 0,
            members: plan.members,
            carried: vec![],
            removed: vec![],
            reason: String::new(),
            unix: 0.0,
        });
        for s in 1..=steps_done {
            state.apply(Command::CommitStep {
                job_id: job_id.clone(),
                generation: 1,
                commit: StepCommit { step: s, ..Default::default() },
                unix: 0.0,
            });
        }
        (state.jobs[&job_id].clone(), live)
    }

    fn begin(job: &mut Job, live: &mut JobLive, now: Instant) {
        job.generation += 1;
        job.state = JobState::Recovering;
        live.recovering_since = Some((job.generation, now));
    }

    #[test]
    fn a_pending_job_forms_when_enough_workers_or_after_the_wait() {
        let now = Instant::now();
        let mut state = ClusterState::default();
        let job_id = submit(&mut state, 2, 10);
        let a = register(&mut state, &job_id, "a");
        let job = state.jobs[&job_id].clone();
        let mut live = JobLive::default();
        live.workers.insert(a.clone(), WorkerLive::new(now));
        assert_eq!(decide_generation(now, &job, &live, &TIMING), None, "one of two, just joined");
        let later = now + TIMING.formation_wait - Duration::from_secs(1);
        live.workers.get_mut(&a).unwrap().last_seen = later;
        assert_eq!(decide_generation(later, &job, &live, &TIMING), None);
        let after = now + TIMING.formation_wait;
        live.workers.get_mut(&a).unwrap().last_seen = after;
        let Some(Decision::Form(plan)) = decide_generation(after, &job, &live, &TIMING) else { panic!() };
        assert_eq!(plan.members.len(), 1);
        assert_eq!(plan.members[0].virtual_ranks, vec![0, 1]);
        assert!(plan.reason.contains("1 of 2 workers"), "{}", plan.reason);
    }

    #[test]
    fn a_member_the_others_wait_on_is_lost_before_its_lease() {
        let now = Instant::now();
        let (job, mut live) = running(3, 5, now);
        let [a, b, c] = [0, 1, 2].map(|i| job.members[i].worker_id.clone());
        // This leader has heard from b before: it joined earlier than its last heartbeat.
        live.workers.get_mut(&b).unwrap().joined = now - Duration::from_secs(10);
        // b is cut off after step 5; a and c finish step 6 at most and wait, heartbeating.
        let at = |after: Duration| {
            let mut l = live.clone();
            for w in [&a, &c] {
                let w = l.workers.get_mut(w).unwrap();
                w.last_seen = now + after;
                w.steps_done = 6;
            }
            l
        };
        let early = now + Duration::from_millis(1400);
        assert_eq!(decide_generation(early, &job, &at(Duration::from_millis(1400)), &TIMING), None);
        let later = now + Duration::from_millis(1600);
        let waiting = at(Duration::from_millis(1600));
        assert_eq!(stalled_on(later, &job, &waiting, &TIMING).keys().collect::<Vec<_>>(), vec![&b]);
        let Some(Decision::Begin { reason, removed, .. }) = decide_generation(later, &job, &waiting, &TIMING)
        else {
            panic!("a new generation without b")
        };
        assert!(reason.contains(&b) && reason.contains("silent for 1.6 s"), "{reason}");
        assert!(reason.contains("wait on it at step 6"), "{reason}");
        // Counted as what it is, a lease cut short (metrics, run record).
        assert_eq!(crate::metrics::recovery_cause(&reason), "lease_expired");
        assert_eq!(removed, vec![b.clone()]);
    }

    #[test]
    fn a_silent_member_keeps_its_lease_unless_the_others_are_stuck_on_it() {
        let now = Instant::now();
        let (job, mut live) = running(3, 5, now);
        let [a, b, c] = [0, 1, 2].map(|i| job.members[i].worker_id.clone());
        live.workers.get_mut(&b).unwrap().joined = now - Duration::from_secs(10);
        let later = now + Duration::from_secs(2);
        let heard = |l: &mut JobLive, w: &String, steps: u64| {
            let w = l.workers.get_mut(w).unwrap();
            w.last_seen = later;
            w.steps_done = steps;
        };
        // The others went on past b's step: only b's session to the leader broke.
        let mut past = live.clone();
        heard(&mut past, &a, 8);
        heard(&mut past, &c, 8);
        assert_eq!(decide_generation(later, &job, &past, &TIMING), None);
        // c is silent too: nobody is known to wait, so the lease decides.
        let mut two_silent = live.clone();
        heard(&mut two_silent, &a, 6);
        assert_eq!(decide_generation(later, &job, &two_silent, &TIMING), None);
        // A new leader has not heard from b yet: b gets its full lease.
        let mut unheard = live.clone();
        unheard.workers.get_mut(&b).unwrap().joined = now;
        heard(&mut unheard, &a, 6);
        heard(&mut unheard, &c, 6);
        assert_eq!(decide_generation(later, &job, &unheard, &TIMING), None);
        // A suspicion as long as the lease turns the rule off.
        let mut waiting = live.clone();
        heard(&mut waiting, &a, 6);
        heard(&mut waiting, &c, 6);
        let off = Timing { suspect_after: TIMING.lease, ..TIMING };
        assert_eq!(decide_generation(later, &job, &waiting, &off), None);
        assert!(decide_generation(later, &job, &waiting, &TIMING).is_some());
        // Past the lease the lease decides, as before.
        let lease = now + TIMING.lease + Duration::from_millis(100);
        heard(&mut past, &a, 9);
        past.workers.get_mut(&a).unwrap().last_seen = lease;
        past.workers.get_mut(&c).unwrap().last_seen = lease;
        let Some(Decision::Begin { reason, .. }) = decide_generation(lease, &job, &past, &TIMING) else {
            panic!()
        };
        assert!(reason.contains("lease expired"), "{reason}");
    }

    #[test]
    fn a_healthy_running_job_needs_no_decision() {
        let now = Instant::now();
        let (job, live) = running(2, 5, now);
        assert_eq!(decide_generation(now + Duration::from_secs(2), &job, &live, &TIMING), None);
    }

    #[test]
    fn lease_expiry_preemption_and_a_named_suspect_each_begin_a_generation() {
        let now = Instant::now();
        let (job, live) = running(3, 5, now);
        let [a, b, c] = [0, 1, 2].map(|i| job.members[i].worker_id.clone());
        // b goes silent: after one lease it is lost.
        let mut silent = live.clone();
        let later = now + Duration::from_secs(4);
        for w in [&a, &c] {
            silent.workers.get_mut(w).unwrap().last_seen = later;
        }
        let Some(Decision::Begin { reason, removed, .. }) = decide_generation(later, &job, &silent, &TIMING)
        else {
            panic!()
        };
        assert!(reason.contains(&b) && reason.contains("lease expired"), "{reason}");
        assert_eq!(removed, vec![b.clone()]);

        let mut preempted = live.clone();
        preempted.workers.get_mut(&c).unwrap().out = Some(Out::Preempted("SIGTERM".into()));
        let Some(Decision::Begin { reason, .. }) = decide_generation(now, &job, &preempted, &TIMING) else {
            panic!()
        };
        assert!(reason.contains("preempted (SIGTERM)"), "{reason}");

        let mut suspected = live.clone();
        suspected.workers.get_mut(&a).unwrap().out =
            Some(Out::Suspected { by: c.clone(), reason: "peer reset".into() });
        let Some(Decision::Begin { reason, removed, .. }) = decide_generation(now, &job, &suspected, &TIMING)
        else {
            panic!()
        };
        assert!(reason.contains(&format!("named lost by {c}")), "{reason}");
        assert_eq!(removed, vec![a]);
    }

    #[test]
    fn recovery_waits_for_every_survivor_then_starts_from_the_furthest() {
        let now = Instant::now();
        let (mut job, mut live) = running(3, 5, now);
        let [a, b, c] = [0, 1, 2].map(|i| job.members[i].worker_id.clone());
        live.workers.get_mut(&c).unwrap().out = Some(Out::Preempted("spot".into()));
        begin(&mut job, &mut live, now);
        // a answered at step 6 (it finished the ring), b not yet.
        let wa = live.workers.get_mut(&a).unwrap();
        wa.generation = 2;
        wa.steps_done = 6;
        live.step_reports
            .entry(6)
            .or_default()
            .insert(a.clone(), StepReportData { tokens: 10, ..Default::default() });
        assert_eq!(decide_generation(now, &job, &live, &TIMING), None);
        let wb = live.workers.get_mut(&b).unwrap();
        wb.generation = 2;
        wb.steps_done = 5;
        let Some(Decision::Form(plan)) = decide_generation(now, &job, &live, &TIMING) else { panic!() };
        assert_eq!(plan.generation, 2);
        assert_eq!(plan.start_step, 6);
        assert_eq!(plan.removed, vec![c.clone()]);
        let by_worker: BTreeMap<_, _> =
            plan.members.iter().map(|m| (m.worker_id.clone(), m.clone())).collect();
        assert_eq!(by_worker[&a].resume, ResumePlan::Keep);
        assert!(
            matches!(&by_worker[&b].resume, ResumePlan::FromPeer { worker_id, step: 6, .. } if *worker_id == a)
        );
        assert_eq!(by_worker[&a].virtual_ranks, vec![0, 2]);
        assert_eq!(by_worker[&b].virtual_ranks, vec![1]);
        // Step 6 was finished but never committed: it is carried, with the one report that came.
        assert_eq!(plan.carried.len(), 1);
        assert_eq!((plan.carried[0].step, plan.carried[0].reporters, plan.carried[0].members), (6, 1, 3));
    }

    #[test]
    fn a_survivor_silent_during_the_quiesce_is_dropped_after_a_lease() {
        let now = Instant::now();
        let (mut job, mut live) = running(2, 5, now);
        let [a, b] = [0, 1].map(|i| job.members[i].worker_id.clone());
        begin(&mut job, &mut live, now);
        live.workers.get_mut(&a).unwrap().generation = 2;
        let later = now + TIMING.lease + Duration::from_millis(1);
        for w in live.workers.values_mut() {
            w.last_seen = later;
        }
        let Some(Decision::Begin { reason, removed, .. }) = decide_generation(later, &job, &live, &TIMING)
        else {
            panic!()
        };
        assert!(reason.contains(&format!("no answer to the quiesce from {b}")), "{reason}");
        assert_eq!(removed, vec![b]);
    }

    #[test]
    fn a_survivor_in_a_long_step_gets_the_step_time_to_answer_the_quiesce() {
        let start = Instant::now();
        let now = start + Duration::from_secs(45);
        let (mut job, mut live) = running(2, 5, now);
        let [a, b] = [0, 1].map(|i| job.members[i].worker_id.clone());
        // Steps committed 20 s apart, then 25 s apart: a model whose steps outlast the lease.
        live.committed(4, start);
        live.committed(5, start + Duration::from_secs(20));
        live.committed(6, now);
        assert_eq!(live.step_time, Some(Duration::from_secs(25)));
        begin(&mut job, &mut live, now);
        live.workers.get_mut(&a).unwrap().generation = 2;
        // b heartbeats from inside its step and answers at its end, well past a lease.
        let at = |after: Duration| {
            let mut l = live.clone();
            for w in l.workers.values_mut() {
                w.last_seen = now + after;
            }
            l
        };
        let past_lease = Duration::from_secs(30);
        assert_eq!(decide_generation(now + past_lease, &job, &at(past_lease), &TIMING), None);
        let mut answered = at(past_lease);
        answered.workers.get_mut(&b).unwrap().generation = 2;
        let Some(Decision::Form(plan)) = decide_generation(now + past_lease, &job, &answered, &TIMING) else {
            panic!("b answered: the generation forms with both")
        };
        assert_eq!(plan.members.len(), 2);
        // One that never answers is dropped after the lease and two steps' time.
        let gone = TIMING.lease + Duration::from_secs(50);
        let Some(Decision::Begin { removed, .. }) = decide_generation(now + gone, &job, &at(gone), &TIMING)
        else {
            panic!()
        };
        assert_eq!(removed, vec![b]);
        // A burst of queued reports after an election does not make the steps look short.
        live.committed(16, now + Duration::from_secs(1));
        assert_eq!(live.step_time, Some(Duration::from_millis(12_500)));
    }

    #[test]
    fn with_no_survivor_everyone_restores_the_last_checkpoint() {
        let now = Instant::now();
        let (mut job, mut live) = running(1, 5, now);
        let a = job.members[0].worker_id.clone();
        job.checkpoints.push(CheckpointEntry {
            record: checkpoint::CommitRecord {
                step: 4,
                save_id: "s4".into(),
                bundle: "00".into(),
                manifest_size: 1,
                manifest_crc32c: 0,
            },
            uri: "file:///c/000000000004-s4".into(),
            committed_unix: 0.0,
            bytes: 1,
        });
        live.workers.get_mut(&a).unwrap().out = Some(Out::Failed("OOM".into()));
        begin(&mut job, &mut live, now);
        // A replacement registers and answers.
        let r = format!("{}.w9", job.id);
        job.workers.insert(r.clone(), crate::state::tests::worker("r"));
        live.workers.insert(r.clone(), WorkerLive { generation: 2, ..WorkerLive::new(now) });
        let Some(Decision::Form(plan)) = decide_generation(now, &job, &live, &TIMING) else { panic!() };
        assert_eq!(plan.start_step, 4);
        assert_eq!(plan.members.len(), 1);
        assert_eq!(plan.members[0].worker_id, r);
        assert!(matches!(plan.members[0].resume, ResumePlan::FromCheckpoint { step: 4, .. }));
        assert!(plan.carried.is_empty(), "steps 5.. are recomputed, never committed twice");
    }

    #[test]
    fn a_holder_behind_the_last_checkpoint_restores_it_instead_of_dragging_the_job_back() {
        let now = Instant::now();
        let (mut job, mut live) = running(2, 12, now);
        let [a, b] = [0, 1].map(|i| job.members[i].worker_id.clone());
        job.checkpoints.push(CheckpointEntry {
            record: checkpoint::CommitRecord {
                step: 10,
                save_id: "s10".into(),
                bundle: "00".into(),
                manifest_size: 1,
                manifest_crc32c: 0,
            },
            uri: "file:///c/000000000010-s10".into(),
            committed_unix: 0.0,
            bytes: 1,
        });
        live.workers.get_mut(&b).unwrap().out = Some(Out::Preempted("spot".into()));
        begin(&mut job, &mut live, now);
        // a was formed a moment ago and answers before it restored anything: it holds step 0.
        let wa = live.workers.get_mut(&a).unwrap();
        wa.generation = 2;
        wa.steps_done = 0;
        let Some(Decision::Form(plan)) = decide_generation(now, &job, &live, &TIMING) else { panic!() };
        assert_eq!(plan.start_step, 10, "never below the committed checkpoint");
        assert!(matches!(plan.members[0].resume, ResumePlan::FromCheckpoint { step: 10, .. }), "{plan:?}");
        assert!(plan.carried.is_empty());
    }

    #[test]
    fn a_replacement_begins_a_generation_only_when_it_would_get_ranks() {
        let now = Instant::now();
        let (mut job, mut live) = running(2, 3, now);
        let extra = format!("{}.w9", job.id);
        job.workers.insert(extra.clone(), crate::state::tests::worker("x"));
        live.workers.insert(extra.clone(), WorkerLive::new(now));
        assert_eq!(decide_generation(now, &job, &live, &TIMING), None, "a spare: every rank has a worker");
        // One member computes both ranks: the newcomer takes one back.
        let keep = job.members[0].worker_id.clone();
        job.members = vec![MemberPlan {
            worker_id: keep,
            slice: 0,
            virtual_ranks: vec![0, 1],
            resume: ResumePlan::Keep,
        }];
        let Some(Decision::Begin { reason, after_step, .. }) = decide_generation(now, &job, &live, &TIMING)
        else {
            panic!()
        };
        assert!(reason.contains("joined"), "{reason}");
        // Every member is alive: the step in flight (the 4th; 3 are committed) finishes first.
        assert_eq!(after_step, 4);
        // A member heard past the others (its report came in) moves the boundary with it.
        live.step_reports.entry(5).or_default().insert(job.members[0].worker_id.clone(), Default::default());
        assert_eq!(step_in_flight(&job, &live), 6);
    }

    #[test]
    fn a_member_leaving_after_its_step_in_flight_ends_the_generation_after_that_step() {
        let now = Instant::now();
        let (job, mut live) = running(3, 4, now);
        let [a, b, c] = [0, 1, 2].map(|i| job.members[i].worker_id.clone());
        live.workers.get_mut(&c).unwrap().out = Some(Out::Leaving("SIGTERM".into()));
        let Some(Decision::Begin { reason, removed, after_step }) =
            decide_generation(now, &job, &live, &TIMING)
        else {
            panic!()
        };
        assert!(reason.contains("after its step in flight"), "{reason}");
        // 4 steps done: every member, the leaver too, finishes the 5th and stops.
        assert_eq!((removed, after_step), (vec![c.clone()], 5));
        // Another member lost at the same time: the step in flight cannot finish.
        live.workers.get_mut(&b).unwrap().out = Some(Out::Preempted("SIGTERM".into()));
        let Some(Decision::Begin { removed, after_step, .. }) = decide_generation(now, &job, &live, &TIMING)
        else {
            panic!()
        };
        assert_eq!((removed, after_step), (vec![b, c], 0));
        assert!(live.workers[&a].out.is_none());
    }

    #[test]
    fn a_boundary_that_never_comes_is_given_up_for_a_stop_at_once_keeping_every_member_heard_from() {
        // Three members at step 4, a replacement joins: they are to finish step 5. But c was cut
        // off a moment before, unnoticed: a and b wait in the all-reduce on it, heartbeating.
        let now = Instant::now();
        let (mut job, mut live) = running(3, 4, now);
        let [a, b, c] = [0, 1, 2].map(|i| job.members[i].worker_id.clone());
        live.step_time = Some(Duration::from_millis(250));
        // This leader heard from c before the cut.
        live.workers.get_mut(&c).unwrap().last_seen = now + Duration::from_millis(10);
        begin(&mut job, &mut live, now);
        job.quiesce_after = 5;
        let heard = |live: &mut JobLive, at: Instant| {
            for w in [&a, &b] {
                live.workers.get_mut(w).unwrap().last_seen = at;
            }
        };
        // The window: two steps and the suspicion's silence.
        let early = now + Duration::from_millis(1900);
        heard(&mut live, early);
        assert_eq!(decide_generation(early, &job, &live, &TIMING), None, "the step may still finish");
        let later = now + Duration::from_millis(2000);
        heard(&mut live, later);
        let Some(Decision::Begin { reason, removed, after_step }) =
            decide_generation(later, &job, &live, &TIMING)
        else {
            panic!()
        };
        assert!(reason.contains("did not finish"), "{reason}");
        // a and b stop at once and keep their state; c, silent, goes.
        assert_eq!((removed, after_step), (vec![c.clone()], 0));
        // Under a leader that has not heard from c yet (a new one, whose term began with the
        // quiesce), c keeps its lease: stopped at once, but not removed.
        let mut new_leader = live.clone();
        new_leader.workers.get_mut(&c).unwrap().joined = new_leader.workers[&c].last_seen;
        let Some(Decision::Begin { removed, after_step, .. }) =
            decide_generation(later, &job, &new_leader, &TIMING)
        else {
            panic!()
        };
        assert_eq!((removed, after_step), (vec![], 0));
        // Asked at once already, the usual patience holds.
        begin(&mut job, &mut live, later);
        job.quiesce_after = 0;
        let soon = later + Duration::from_secs(1);
        heard(&mut live, soon);
        assert_eq!(decide_generation(soon, &job, &live, &TIMING), None);
    }

    #[test]
    fn a_preempted_member_finishes_its_step_only_with_time_for_two_more() {
        let s = Duration::from_secs;
        assert!(finishes_step_before_leaving(s(30), Some(s(5))));
        assert!(finishes_step_before_leaving(s(11), Some(s(5))));
        assert!(!finishes_step_before_leaving(s(10), Some(s(5))), "a second to spare");
        assert!(!finishes_step_before_leaving(s(30), None), "no step measured yet");
    }

    #[test]
    fn a_member_that_cannot_run_the_job_s_inputs_fails_it_at_once() {
        let now = Instant::now();
        let (job, mut live) = running(2, 4, now);
        let a = job.members[0].worker_id.clone();
        live.workers.get_mut(&a).unwrap().out = Some(Out::Failed("out of device memory".into()));
        let Some(Decision::Begin { removed, after_step, .. }) = decide_generation(now, &job, &live, &TIMING)
        else {
            panic!("its own failure: the job goes on without it")
        };
        assert_eq!(removed, std::slice::from_ref(&a));
        assert_eq!(after_step, 0, "a member is lost: the step in flight cannot finish");
        live.workers.get_mut(&a).unwrap().out = Some(Out::Unrunnable("step 3 has no target tokens".into()));
        let Some(Decision::Fail { reason }) = decide_generation(now, &job, &live, &TIMING) else {
            panic!("no member can run it: the job fails")
        };
        assert_eq!(reason, format!("{a} cannot run the job: step 3 has no target tokens"));
    }

    #[test]
    fn a_job_without_workers_fails_after_the_abandon_wait() {
        let now = Instant::now();
        let (mut job, mut live) = running(1, 2, now);
        let a = job.members[0].worker_id.clone();
        live.workers.get_mut(&a).unwrap().out = Some(Out::Preempted("x".into()));
        begin(&mut job, &mut live, now);
        assert_eq!(decide_generation(now + Duration::from_secs(599), &job, &live, &TIMING), None);
        let Some(Decision::Fail { reason }) =
            decide_generation(now + TIMING.abandon_after, &job, &live, &TIMING)
        else {
            panic!()
        };
        assert!(reason.contains("no live worker"), "{reason}");
    }

    #[test]
    fn after_the_last_step_the_final_checkpoint_is_awaited_then_given_up() {
        let now = Instant::now();
        let (mut job, mut live) = running(1, 100, now);
        assert_eq!(job.committed_step, job.shape.total_steps);
        // `running` configures no checkpoints, so the job completed; pretend it awaits one.
        job.state = JobState::Running;
        live.finished_since = Some(now);
        let before = now + Duration::from_secs(59);
        for w in live.workers.values_mut() {
            w.last_seen = before;
        }
        assert_eq!(decide_generation(before, &job, &live, &TIMING), None);
        let later = now + Duration::from_secs(60);
        for w in live.workers.values_mut() {
            w.last_seen = later;
        }
        let Some(Decision::Complete { reason }) = decide_generation(later, &job, &live, &TIMING) else {
            panic!()
        };
        assert!(reason.contains("no final checkpoint"), "{reason}");
        let a = job.members[0].worker_id.clone();
        live.workers.get_mut(&a).unwrap().out = Some(Out::Preempted("spot".into()));
        let Some(Decision::Complete { reason }) = decide_generation(now, &job, &live, &TIMING) else {
            panic!()
        };
        assert!(reason.contains("lost with"), "{reason}");
    }

    fn saved(job: &mut Job, step: u64, save_id: &str) {
        job.checkpoints.push(CheckpointEntry {
            record: checkpoint::CommitRecord {
                step,
                save_id: save_id.into(),
                bundle: "00".into(),
                manifest_size: 1,
                manifest_crc32c: 0,
            },
            uri: format!("file:///c/{}", checkpoint::layout::dir_name(step, save_id)),
            committed_unix: 0.0,
            bytes: 1,
        });
    }

    #[test]
    fn retention_runs_after_a_commit_and_whenever_the_catalog_holds_more_than_it_keeps() {
        let now = Instant::now();
        let (mut job, mut live) = running(2, 100, now);
        job.shape.keep_last = 3;
        // One generation's saves share their id: the rule still counts them one by one.
        for step in [10, 20, 30] {
            saved(&mut job, step, "r1.s0a0b0c0dg1");
        }
        assert!(!catalog_exceeds_retention(&job));
        assert!(!retention_due(now, &job, &live));
        live.retention.wanted = true;
        assert!(retention_due(now, &job, &live), "a commit wants a run (it also collects orphans)");
        live.retention = RetentionLive::default();
        // A leader that died between a commit and its retention left one too many: a new
        // leader, with nothing in its memory, runs it anyway.
        saved(&mut job, 40, "r1.s0a0b0c0dg1");
        assert!(catalog_exceeds_retention(&job));
        assert!(retention_due(now, &job, &live));
        live.retention.running = true;
        assert!(!retention_due(now, &job, &live), "one run at a time");
        live.retention = RetentionLive {
            wanted: true,
            retry_at: Some(now + Duration::from_secs(5)),
            failed: Some("store down".into()),
            ..Default::default()
        };
        assert!(!retention_due(now, &job, &live), "a failed run backs off");
        assert!(retention_due(now + Duration::from_secs(5), &job, &live));
    }

    #[test]
    fn a_job_completes_once_its_final_checkpoint_is_committed_and_retention_has_run() {
        let now = Instant::now();
        let (mut job, mut live) = running(1, 100, now);
        // `running` configures no checkpoints, so the job completed; make it one that saves.
        job.state = JobState::Running;
        job.shape.keep_last = 3;
        live.finished_since = Some(now);
        for step in [70, 80, 90, 100] {
            saved(&mut job, step, "r1.s0a0b0c0dg1");
        }
        assert_eq!(decide_generation(now, &job, &live, &TIMING), None, "retention has not run");
        job.checkpoints.remove(0);
        live.retention.wanted = true;
        assert_eq!(decide_generation(now, &job, &live, &TIMING), None, "a run is wanted");
        live.retention.wanted = false;
        // An earlier save still being committed would land after the job's last retention run.
        live.saves_finalizing = 1;
        assert!(!saves_finished(&job, &live));
        assert_eq!(decide_generation(now, &job, &live, &TIMING), None, "a save is being committed");
        live.saves_finalizing = 0;
        assert!(saves_finished(&job, &live));
        let Some(Decision::Complete { reason }) = decide_generation(now, &job, &live, &TIMING) else {
            panic!()
        };
        assert_eq!(reason, "all 100 steps and the final checkpoint committed");
        // A store that keeps failing gets the final checkpoint's wait, then the job completes
        // saying why its root holds more than the rule keeps.
        live.retention =
            RetentionLive { wanted: true, failed: Some("store down".into()), ..Default::default() };
        let later = now + TIMING.final_checkpoint_wait;
        for w in live.workers.values_mut() {
            w.last_seen = later;
        }
        let Some(Decision::Complete { reason }) = decide_generation(later, &job, &live, &TIMING) else {
            panic!()
        };
        assert!(reason.contains("retention did not finish") && reason.contains("store down"), "{reason}");
    }

    #[test]
    fn once_finished_the_jobs_saves_of_the_running_generation_are_abandoned_too() {
        let now = Instant::now();
        let (mut job, live) = running(1, 100, now);
        let own = |generation: u64| format!("{}{generation}", job.save_id_prefix());
        let (ended, running) = (own(job.generation - 1), own(job.generation));
        let rule = |finished| retention(&job, finished).own_saves.unwrap();
        assert!(rule(false).ended(&ended) && !rule(false).ended(&running));
        assert!(rule(true).ended(&ended) && rule(true).ended(&running));
        // Finished: every step and the final checkpoint committed, nothing being committed.
        job.state = JobState::Running;
        assert!(!saves_finished(&job, &live), "no final checkpoint yet");
        saved(&mut job, 100, &running);
        assert!(saves_finished(&job, &live));
    }

    #[test]
    fn a_step_commits_when_every_member_reported_it() {
        let now = Instant::now();
        let (job, mut live) = running(2, 0, now);
        let [a, b] = [0, 1].map(|i| job.members[i].worker_id.clone());
        let report = |loss_sum, secs| StepReportData {
            loss_sum,
            token_count: 10.0,
            grad_norm: 1.5,
            step_seconds: secs,
            tokens: 10,
            metrics: BTreeMap::from([("reward".to_string(), loss_sum)]),
        };
        live.step_reports.entry(1).or_default().insert(a, report(20.0, 0.5));
        assert_eq!(step_to_commit(&job, &live), None);
        live.step_reports.entry(2).or_default().insert(b.clone(), report(1.0, 1.0));
        assert_eq!(step_to_commit(&job, &live), None, "step 2 is not next");
        live.step_reports.entry(1).or_default().insert(b, report(10.0, 1.0));
        let commit = step_to_commit(&job, &live).unwrap();
        assert_eq!(commit.step, 1);
        assert_eq!(commit.loss, Some(1.5));
        assert_eq!(commit.tokens, 20);
        assert_eq!(commit.step_seconds, 1.0);
        assert_eq!(commit.tokens_per_second, 20.0);
        assert_eq!(commit.metrics["reward"], 15.0);
        assert_eq!((commit.reporters, commit.members), (2, 2));
    }
}
