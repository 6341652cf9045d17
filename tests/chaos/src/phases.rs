//! The phases of a recovery, and where the goodput a run under failures misses goes.
//!
//! Per injected failure, seconds from the failure to:
//!
//! - **detected**: the coordinator removed the worker (the job's `recovery` event that begins
//!   the next generation), or, for a leader kill, another node leads (its `leading` log line);
//! - **formed**: the generation that recovered formed (its `generation` event);
//! - **first step**: the first step trained in it (the first `step N` line a member logged in
//!   that generation; for a leader kill, the first after the failure);
//! - **committed**: the next committed global step (the harness's status poll);
//!
//! and for the replacement or healed worker: its start (or the heal) to member again, and the
//! training pause its join cost (last step of the older generation to the first of the joining
//! one).
//!
//! Each failure's cost in training time is the stall it made: the first step trained after it
//! minus the last one before it, minus the step that would have run anyway (the median step
//! time of the run). For a failure of a slice the stall is split at the failure, the detection
//! and the formation into the step in flight (its work is lost), detection, forming the
//! generation and resuming (ring, state, and whatever the first step took beyond a normal
//! one); when the ending generation still finished a step after the failure (a preempted
//! member finishing its step in flight with the others), nothing was in flight to lose and the
//! detection overlapped training: the stall runs from that step; for a leader kill it is what
//! training waited on the leader; a join's pause minus a
//! step is the join's. Past the phases, what steps took beyond the run's median step
//! ([`excess`]): each new generation's first steps (a joiner's first executions, a fresh ring)
//! apart from the steady rest (slower steps while survivors carry a lost slice's ranks, the
//! machine's jitter), each against the calm run's. What none of these explain of the wall time
//! the run took beyond the calm run's went elsewhere: the commits of the last steps, the
//! machine's drift in pace between the runs, noise.
//!
//! Times come from the coordinator's job events and the workers' and nodes' own log lines
//! (microsecond time stamps), so they do not depend on how often the harness polls; only the
//! next committed step and member-again are the harness's (it polls every 100 ms).

use crate::schedule::Kind;
use crate::{EventRecord, JobRun};
use std::collections::BTreeMap;
use std::path::Path;

/// One step a member finished: when (Unix seconds), which step, in which generation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trained {
    /// When its log line was written.
    pub unix: f64,
    /// The step (1-based: the steps done after it).
    pub step: u64,
    /// The generation it was trained in.
    pub generation: u64,
}

/// What the harness knows of one failure, in Unix seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// What was injected.
    pub kind: Kind,
    /// When.
    pub unix: f64,
    /// The generation in force then.
    pub generation: u64,
    /// For a leader kill: when another node was seen leading.
    pub elected: Option<f64>,
    /// When the next global step was committed.
    pub committed: Option<f64>,
    /// When the replacement started (or the cut healed).
    pub join_started: Option<f64>,
    /// When it was a member again.
    pub member_again: Option<f64>,
}

/// The seconds training lost to one failure, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    /// The step in flight when a slice failed: its work is lost.
    pub in_flight: f64,
    /// From the failure until the coordinator removed the worker.
    pub detection: f64,
    /// From the removal until the next generation formed.
    pub formation: f64,
    /// From the formation until the first step in it, beyond a normal step.
    pub resume: f64,
    /// Training stalled while there was no leader (a leader kill).
    pub leader: f64,
    /// The pause to take the replacement or healed worker in, beyond a normal step.
    pub join: f64,
}

impl Cost {
    /// All of it.
    pub fn total(&self) -> f64 {
        self.in_flight + self.detection + self.formation + self.resume + self.leader + self.join
    }

    fn add(&mut self, other: &Cost) {
        self.in_flight += other.in_flight;
        self.detection += other.detection;
        self.formation += other.formation;
        self.resume += other.resume;
        self.leader += other.leader;
        self.join += other.join;
    }
}

/// One failure's phases: seconds from the failure (the join's from its start).
#[derive(Debug, Clone, PartialEq)]
pub struct Phases {
    /// What was injected.
    pub kind: Kind,
    /// Removed, or a new leader elected.
    pub detected: Option<f64>,
    /// The recovering generation formed (none for a leader kill: the generation stays).
    pub formed: Option<f64>,
    /// The first step trained after it.
    pub first_step: Option<f64>,
    /// The next committed global step.
    pub committed: Option<f64>,
    /// The replacement's start (or the heal) until it was a member again.
    pub member_again: Option<f64>,
    /// How long training paused to take it in.
    pub join_pause: Option<f64>,
    /// What it cost in training time.
    pub cost: Cost,
}

/// A generation event's number: "generation G from step S ..." or "generation G: reason".
fn generation_number(detail: &str) -> Option<u64> {
    let rest = detail.strip_prefix("generation ")?;
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The first time each (generation, step) was finished by a member, in time order.
fn first_finished(trained: &[Trained]) -> Vec<Trained> {
    let mut first: BTreeMap<(u64, u64), f64> = BTreeMap::new();
    for t in trained {
        let at = first.entry((t.generation, t.step)).or_insert(t.unix);
        *at = at.min(t.unix);
    }
    let mut steps: Vec<Trained> =
        first.into_iter().map(|((generation, step), unix)| Trained { unix, step, generation }).collect();
    steps.sort_by(|a, b| a.unix.total_cmp(&b.unix));
    steps
}

/// The median time between a step and the next one of the same generation.
pub fn step_seconds(trained: &[Trained]) -> f64 {
    let steps = first_finished(trained);
    let mut by_generation: BTreeMap<u64, Vec<&Trained>> = BTreeMap::new();
    for t in &steps {
        by_generation.entry(t.generation).or_default().push(t);
    }
    let mut gaps: Vec<f64> = Vec::new();
    for mut of in by_generation.into_values() {
        of.sort_by_key(|t| t.step);
        gaps.extend(of.windows(2).filter(|w| w[1].step == w[0].step + 1).map(|w| w[1].unix - w[0].unix));
    }
    if gaps.is_empty() {
        return 0.0;
    }
    gaps.sort_by(f64::total_cmp);
    gaps[gaps.len() / 2]
}

/// How many steps at a generation's start count as its settling: a joiner's first executions,
/// a ring's fresh connections and whatever else a new generation pays once.
pub const SETTLING_STEPS: usize = 10;

/// What a run's steps took beyond its median step, signed so that jitter cancels: the first
/// [`SETTLING_STEPS`] of each generation apart from the rest. A step's time is the gap from the
/// step before it in the same generation (the gap across a generation change is a phase's).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Excess {
    /// The generations seen.
    pub generations: usize,
    /// Seconds beyond the median over the settling steps of every generation.
    pub settling: f64,
    /// Those steps.
    pub settling_steps: usize,
    /// Seconds beyond the median over every other step.
    pub steady: f64,
    /// Those steps.
    pub steady_steps: usize,
}

/// The excess of a run's steps over its median step, settling apart from steady.
pub fn excess(trained: &[Trained]) -> Excess {
    let step = step_seconds(trained);
    let mut by_generation: BTreeMap<u64, Vec<Trained>> = BTreeMap::new();
    for t in first_finished(trained) {
        by_generation.entry(t.generation).or_default().push(t);
    }
    let mut excess = Excess { generations: by_generation.len(), ..Excess::default() };
    for mut of in by_generation.into_values() {
        of.sort_by_key(|t| t.step);
        let gaps = of.windows(2).filter(|w| w[1].step == w[0].step + 1).map(|w| w[1].unix - w[0].unix - step);
        for (i, beyond) in gaps.enumerate() {
            if i < SETTLING_STEPS {
                excess.settling += beyond;
                excess.settling_steps += 1;
            } else {
                excess.steady += beyond;
                excess.steady_steps += 1;
            }
        }
    }
    excess
}

/// A run's own pace from its members' logs: the median seconds between steps, and the share of
/// its wall (first to last step) its steps would take at that pace. A calm run's share is below
/// 1 too (checkpoint commits, the machine's own jitter), so the goodput bench prints both runs'.
pub fn pace(run_dir: &Path) -> (f64, f64) {
    let trained = trained_steps(run_dir);
    let steps = first_finished(&trained);
    let step = step_seconds(&trained);
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else { return (step, 0.0) };
    let wall = last.unix - first.unix;
    let share = if wall > 0.0 { (last.step - first.step) as f64 * step / wall } else { 0.0 };
    (step, share)
}

/// Each failure's phases and cost, from the job's events (Unix seconds, kind, detail) and the
/// steps its members logged.
pub fn analyse(failures: &[Failure], history: &[(f64, String, String)], trained: &[Trained]) -> Vec<Phases> {
    let steps = first_finished(trained);
    let step = step_seconds(trained);
    let events = |kind: &'static str| {
        history
            .iter()
            .filter(move |(_, k, _)| k == kind)
            .filter_map(|(unix, _, d)| Some((*unix, generation_number(d)?)))
    };
    let last_before = |at: f64| steps.iter().rev().find(|t| t.unix <= at).copied();
    let since = |at: f64, t: Option<f64>| t.map(|t| t - at);
    failures
        .iter()
        .map(|f| {
            let t0 = f.unix;
            let previous = last_before(t0);
            let mut phases = Phases {
                kind: f.kind,
                detected: None,
                formed: None,
                first_step: None,
                committed: since(t0, f.committed),
                member_again: f.join_started.zip(f.member_again).map(|(s, m)| m - s),
                join_pause: None,
                cost: Cost::default(),
            };
            let mut recovered_in = f.generation;
            if f.kind.hits_the_leader() {
                phases.detected = since(t0, f.elected);
                let first = steps.iter().find(|t| t.unix > t0).map(|t| t.unix);
                phases.first_step = since(t0, first);
                if let (Some(first), Some(previous)) = (first, previous) {
                    phases.cost.leader = first - previous.unix - step;
                }
            } else {
                let removed = events("recovery").find(|&(unix, g)| unix >= t0 && g > f.generation);
                let formed =
                    removed.and_then(|(at, g)| events("generation").find(|&(u, h)| u >= at && h >= g));
                let first = formed.and_then(|(_, g)| {
                    recovered_in = g;
                    steps.iter().find(|t| t.generation >= g).map(|t| t.unix)
                });
                phases.detected = since(t0, removed.map(|(u, _)| u));
                phases.formed = since(t0, formed.map(|(u, _)| u));
                phases.first_step = since(t0, first);
                // A step of the ending generation finished after the failure: the members went
                // on until a named boundary (a preempted member finishing its step in flight),
                // so nothing was in flight to lose and the removal cost nothing.
                let last_of_ending = formed.and_then(|(_, g)| steps.iter().rev().find(|t| t.generation < g));
                let finished_after = last_of_ending.filter(|t| t.unix > t0);
                if let (Some(last), Some((formed, _)), Some(first)) = (finished_after, formed, first) {
                    phases.cost.formation = (formed - last.unix).max(0.0);
                    phases.cost.resume = first - last.unix.max(formed) - step;
                } else if let (Some(previous), Some((removed, _)), Some((formed, _)), Some(first)) =
                    (previous, removed, formed, first)
                {
                    phases.cost.in_flight = t0 - previous.unix;
                    phases.cost.detection = removed - t0;
                    phases.cost.formation = formed - removed;
                    phases.cost.resume = first - formed - step;
                }
            }
            // The generation that took the joiner in: the first formed after its start.
            let joining = f.join_started.and_then(|started| {
                events("generation").find(|&(u, g)| u >= started && g > recovered_in).map(|(_, g)| g)
            });
            if let Some(g) = joining {
                let last = steps.iter().rev().find(|t| t.generation < g).map(|t| t.unix);
                let first = steps.iter().find(|t| t.generation >= g).map(|t| t.unix);
                if let (Some(last), Some(first)) = (last, first) {
                    phases.join_pause = Some(first - last);
                    phases.cost.join = first - last - step;
                }
            }
            phases
        })
        .collect()
}

/// The steps every member logged (`step N loss ...` lines, with the tracing time stamp and the
/// line's `generation=` field), from the `worker-*.log` files of a run directory.
pub fn trained_steps(run_dir: &Path) -> Vec<Trained> {
    let Ok(dir) = std::fs::read_dir(run_dir) else { return Vec::new() };
    let mut trained = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !(name.starts_with("worker-") && name.ends_with(".log")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        trained.extend(text.lines().filter_map(parse_step_line));
    }
    trained
}

/// `2026-12-05T23:31:17.123456Z  INFO ...: step 12 loss 2.1 (0.36s) ... generation=3`.
fn parse_step_line(line: &str) -> Option<Trained> {
    let (stamp, rest) = line.split_once(' ')?;
    let (_, after) = rest.split_once(": step ")?;
    let step = after.split(' ').next()?.parse().ok()?;
    if after.split(' ').nth(1).is_none_or(|w| w != "loss") {
        return None;
    }
    let generation =
        after.split_once("generation=")?.1.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    Some(Trained { unix: unix_of_rfc3339(stamp)?, step, generation })
}

/// Unix seconds of a UTC time stamp `YYYY-MM-DDTHH:MM:SS[.frac]Z`.
fn unix_of_rfc3339(stamp: &str) -> Option<f64> {
    let stamp = stamp.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (t.next()?.parse::<i64>().ok()?, t.next()?.parse::<i64>().ok()?);
    let s: f64 = t.next()?.parse().ok()?;
    // Days from 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3_600 + min * 60) as f64 + s)
}

/// When a coordinator node started leading (its `leading; ...` log line), from the `node*.log`
/// files of the harness's directory, in time order.
pub fn leading_since(dir: &Path) -> Vec<f64> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut times: Vec<f64> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.starts_with("node") && name.ends_with(".log")
        })
        .flat_map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            text.lines()
                .filter(|l| l.contains(": leading;"))
                .filter_map(|l| unix_of_rfc3339(l.split(' ').next()?))
                .collect::<Vec<_>>()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

/// The harness's failures of a run, in Unix seconds; `leading` as [`leading_since`] gives.
pub fn failures(run: &JobRun, leading: &[f64]) -> Vec<Failure> {
    run.events
        .iter()
        .map(|r: &EventRecord| {
            let at = |seconds: Option<f64>| seconds.map(|s| r.unix + s);
            Failure {
                kind: r.kind,
                unix: r.unix,
                generation: r.generation,
                elected: r
                    .kind
                    .hits_the_leader()
                    .then(|| leading.iter().copied().find(|&t| t >= r.unix))
                    .flatten(),
                committed: at(r.next_step_after),
                join_started: r.join_started.map(|j| r.unix + j.duration_since(r.started).as_secs_f64()),
                member_again: r
                    .join_started
                    .and_then(|j| Some(r.unix + j.duration_since(r.started).as_secs_f64() + r.join_after?)),
            }
        })
        .collect()
}

/// The phases of a run's failures and the step time they are measured against; `dir` is the
/// harness's (`Setup::dir`), where the nodes log.
pub fn of_run(run: &JobRun, dir: &Path) -> (Vec<Phases>, f64) {
    let trained = trained_steps(&run.run_dir);
    (analyse(&failures(run, &leading_since(dir)), &run.history, &trained), step_seconds(&trained))
}

fn mean(values: impl Iterator<Item = Option<f64>>) -> String {
    let values: Vec<f64> = values.flatten().collect();
    if values.is_empty() {
        return "-".into();
    }
    format!("{:.2}", values.iter().sum::<f64>() / values.len() as f64)
}

/// The table of phases, per failure kind (means, seconds from the failure), and where the
/// seconds the run took beyond `calm_wall` went; `excess` is the run's [`excess`] and the calm
/// run's, whose one generation's settling (the job's start) the run had too.
pub fn render(phases: &[Phases], step: f64, wall: f64, calm_wall: f64, excess: [Excess; 2]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "phases of a recovery (mean seconds from the failure; a normal step {step:.3}s)\n\
         {:<15} {:>2} {:>9} {:>7} {:>11} {:>10} {:>15} {:>11}\n",
        "failure", "n", "detected", "formed", "first step", "committed", "joiner->member", "join pause"
    ));
    let mut total = Cost::default();
    for kind in Kind::ALL {
        let of: Vec<&Phases> = phases.iter().filter(|p| p.kind == kind).collect();
        if of.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "{:<15} {:>2} {:>9} {:>7} {:>11} {:>10} {:>15} {:>11}\n",
            kind.to_string(),
            of.len(),
            mean(of.iter().map(|p| p.detected)),
            mean(of.iter().map(|p| p.formed)),
            mean(of.iter().map(|p| p.first_step)),
            mean(of.iter().map(|p| p.committed)),
            mean(of.iter().map(|p| p.member_again)),
            mean(of.iter().map(|p| p.join_pause)),
        ));
    }
    for p in phases {
        total.add(&p.cost);
    }
    let missing = wall - calm_wall;
    let percent = |s: f64| 100.0 * s / wall.max(1e-9);
    out.push_str(&format!(
        "where the goodput went: {wall:.1}s against {calm_wall:.1}s calm, {missing:.1}s missing \
         ({:.1}% of the run)\n{:<52} {:>8} {:>8}\n",
        percent(missing),
        "phase",
        "seconds",
        "of run"
    ));
    let rows = [
        ("the step in flight at a slice's failure (lost)", total.in_flight),
        ("detection (failure -> the worker removed)", total.detection),
        ("forming the new generation (removed -> formed)", total.formation),
        ("resuming (formed -> first step, beyond a step)", total.resume),
        ("training stalled without a leader", total.leader),
        ("taking the joiner in (pause beyond a step)", total.join),
    ];
    let [run, calm] = excess;
    let settling = run.settling - calm.settling;
    let steady = run.steady - calm.steady * run.steady_steps as f64 / calm.steady_steps.max(1) as f64;
    let rows = rows.into_iter().chain([
        ("settling: a new generation's first 10 steps, beyond", settling),
        ("steady steps beyond the median, beyond the calm run's", steady),
        ("elsewhere (commits, the pace's drift, noise)", missing - total.total() - settling - steady),
    ]);
    for (label, seconds) in rows {
        out.push_str(&format!("{label:<52} {seconds:>7.2}s {:>7.2}%\n", percent(seconds)));
    }
    out.push_str(&format!(
        "the recoveries' phases explain {:.2}s, {:.2}% of the calm run: at most that much goodput lost \
         to them\n",
        total.total(),
        100.0 * total.total() / calm_wall.max(1e-9)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(events: &[(f64, &str, &str)]) -> Vec<(f64, String, String)> {
        events.iter().map(|(u, k, d)| (*u, k.to_string(), d.to_string())).collect()
    }

    /// Steps every 0.4 s by two members (the second 10 ms later) from `from` at `t`.
    fn run(steps: &mut Vec<Trained>, generation: u64, from: u64, to: u64, t: f64) {
        for (i, step) in (from..=to).enumerate() {
            let unix = t + 0.4 * i as f64;
            steps.push(Trained { unix, step, generation });
            steps.push(Trained { unix: unix + 0.01, step, generation });
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn a_kill_a_join_and_a_leader_kill_split_into_their_phases() {
        // Generation 1: steps 1-10 at 100.0-103.6. A worker is killed at 103.7; the leader
        // removes it at 104.2 (g2 begins), forms g2 at 104.5, and g2 trains step 11 at 105.2,
        // then on every 0.4 s. The replacement starts at 106.0, is taken in by g3 (begun at
        // 107.0, formed at 107.3); g2's last step is 16 at 107.2, g3's first 17 at 107.9.
        let mut steps = Vec::new();
        run(&mut steps, 1, 1, 10, 100.0);
        run(&mut steps, 2, 11, 16, 105.2);
        run(&mut steps, 3, 17, 40, 107.9);
        let events = history(&[
            (100.0, "generation", "generation 1 from step 0 (4 workers registered): a:[0] b:[1]"),
            (104.2, "recovery", "generation 2: j.w2 failed"),
            (104.5, "generation", "generation 2 from step 10 (3 workers answered the quiesce): a:[0, 1]"),
            (106.1, "joined", "j.w5 on slice1.p2"),
            (107.0, "recovery", "generation 3: replacement j.w5 joined"),
            (107.3, "generation", "generation 3 from step 16 (4 workers answered the quiesce): a:[0]"),
        ]);
        let kill = Failure {
            kind: Kind::Kill,
            unix: 103.7,
            generation: 1,
            elected: None,
            committed: Some(105.3),
            join_started: Some(106.0),
            member_again: Some(107.35),
        };
        // A leader kill at 110.0 in g3 with training going on through the election (steps at
        // 109.9, 110.3, ...): it costs nothing; the next commit came at 112.2.
        let leader = Failure {
            kind: Kind::LeaderKill,
            unix: 110.0,
            generation: 3,
            elected: Some(110.9),
            committed: Some(112.2),
            join_started: None,
            member_again: None,
        };
        assert!(close(step_seconds(&steps), 0.4));
        let phases = analyse(&[kill, leader], &events, &steps);

        let k = &phases[0];
        assert!(close(k.detected.unwrap(), 0.5) && close(k.formed.unwrap(), 0.8));
        assert!(close(k.first_step.unwrap(), 1.5) && close(k.committed.unwrap(), 1.6));
        assert!(close(k.member_again.unwrap(), 1.35));
        // Step 16 at 107.2 to step 17 at 107.9.
        assert!(close(k.join_pause.unwrap(), 0.7));
        // Step 10 at 103.6: 0.1 s of it in flight, 0.5 to detect, 0.3 to form, 0.7 - 0.4 to
        // resume; the join 0.7 - 0.4.
        let c = k.cost;
        assert!(close(c.in_flight, 0.1) && close(c.detection, 0.5) && close(c.formation, 0.3), "{c:?}");
        assert!(close(c.resume, 0.3) && close(c.join, 0.3) && close(c.leader, 0.0), "{c:?}");
        assert!(close(c.total(), 1.5));

        let l = &phases[1];
        assert_eq!((l.formed, l.member_again, l.join_pause), (None, None, None));
        assert!(close(l.detected.unwrap(), 0.9) && close(l.committed.unwrap(), 2.2));
        assert!(close(l.first_step.unwrap(), 0.3), "{l:?}");
        assert!(close(l.cost.total(), 0.0), "{:?}", l.cost);

        // A stall without a leader shows as such.
        let mut stalled = steps.clone();
        stalled.retain(|t| t.unix < 110.0 || t.unix > 111.8);
        let l = &analyse(&[phases_failure(Kind::LeaderKill, 110.0, 3)], &events, &stalled)[0];
        // Step 22 at 109.9, then the first after the stall at 111.9 (within 10 ms): 1.6 s lost.
        assert!((l.cost.leader - 1.6).abs() < 0.02, "{:?}", l.cost);

        let no_excess = [Excess::default(); 2];
        let table = render(&phases, 0.4, 120.0, 118.0, no_excess);
        assert!(table.contains("SIGKILL"), "{table}");
        assert!(table.contains("2.0s missing"), "{table}");
        // 2.0 s missing, 1.5 of it in the kill's phases: 0.5 elsewhere.
        assert!(table.lines().any(|l| l.starts_with("elsewhere") && l.contains("0.50s")), "{table}");
        // Of those, 0.2 s in new generations' first steps (the calm run's start had 0.1 s of its
        // own) and 0.1 s in steady steps beyond the calm run's rate (its 0.1 s over 200 steps
        // would be 0.2 s over the run's 400): 0.2 elsewhere.
        let run =
            Excess { generations: 3, settling: 0.3, settling_steps: 30, steady: 0.3, steady_steps: 400 };
        let calm =
            Excess { generations: 1, settling: 0.1, settling_steps: 10, steady: 0.1, steady_steps: 200 };
        let table = render(&phases, 0.4, 120.0, 118.0, [run, calm]);
        let row = |name: &str| table.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
        assert!(row("settling").contains("0.20s"), "{table}");
        assert!(row("steady").contains("0.10s"), "{table}");
        assert!(row("elsewhere").contains("0.20s"), "{table}");
    }

    fn phases_failure(kind: Kind, unix: f64, generation: u64) -> Failure {
        Failure {
            kind,
            unix,
            generation,
            elected: None,
            committed: None,
            join_started: None,
            member_again: None,
        }
    }

    #[test]
    fn a_member_that_finishes_its_step_before_leaving_loses_nothing_in_flight() {
        // Steps every 0.4 s to step 10 at 103.6 in g1; SIGTERM at 103.7, the member removed at
        // 103.71 with the others told to finish step 11, which they do at 104.0; g2 forms at
        // 104.05 and trains step 12 at 104.5.
        let mut steps = Vec::new();
        run(&mut steps, 1, 1, 11, 100.0);
        run(&mut steps, 2, 12, 20, 104.5);
        let events = history(&[
            (103.71, "recovery", "generation 2: j.w2 preempted (SIGTERM) after its step in flight"),
            (104.05, "generation", "generation 2 from step 11 (3 workers answered the quiesce): a:[0, 1]"),
        ]);
        let p = &analyse(&[phases_failure(Kind::Preempt, 103.7, 1)], &events, &steps)[0];
        assert!(close(p.detected.unwrap(), 0.01) && close(p.formed.unwrap(), 0.35), "{p:?}");
        let c = p.cost;
        assert!(close(c.in_flight, 0.0) && close(c.detection, 0.0), "{c:?}");
        // From step 11 (104.0) to the formation 0.05 s, then step 12 0.45 s later: 0.05 beyond a step.
        assert!(close(c.formation, 0.05) && close(c.resume, 0.05), "{c:?}");
    }

    #[test]
    fn a_cut_that_is_never_detected_costs_nothing_it_cannot_place() {
        let mut steps = Vec::new();
        run(&mut steps, 1, 1, 5, 0.0);
        let phases = analyse(&[phases_failure(Kind::Cut, 1.0, 1)], &[], &steps);
        assert_eq!(phases[0].detected, None);
        assert_eq!(phases[0].cost, Cost::default());
    }

    #[test]
    fn worker_log_lines_give_the_step_its_generation_and_time() {
        let line = "2026-12-05T23:31:17.250000Z  INFO worker::agent::trainer_side: step 12 loss 2.1234 (0.36s) \
                    job=j1 worker=j1.w3 slice=1 step=12 generation=3";
        let t = parse_step_line(line).unwrap();
        assert_eq!((t.step, t.generation), (12, 3));
        // 2026-12-05 is day 20,792 since 1970-01-01.
        assert!(close(t.unix, 20_792.0 * 86_400.0 + 23.0 * 3600.0 + 31.0 * 60.0 + 17.25), "{}", t.unix);
        assert_eq!(unix_of_rfc3339("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(unix_of_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800.0));
        let other = "2026-12-05T23:31:17.250000Z  INFO worker: checkpoint of step 10 committed";
        assert_eq!(parse_step_line(other), None);
        assert_eq!(parse_step_line("--- worker process 2 (slice1.p2)"), None);
    }

    #[test]
    fn a_runs_pace_is_its_median_step_and_a_stall_lowers_its_share() {
        let dir = tempfile_dir();
        // Steps 1-9 every 0.25 s, then a 1 s stall before step 10, logged by two members.
        let mut at = 17.0;
        let mut log = String::new();
        for step in 1..=10u64 {
            at += if step == 10 { 1.0 } else { 0.25 };
            log.push_str(&format!(
                "2026-12-05T23:31:{at:09.6}Z  INFO w: step {step} loss 1.0 (0.25s) job=j step={step} generation=1\n"
            ));
        }
        std::fs::write(dir.join("worker-0.log"), &log).unwrap();
        std::fs::write(dir.join("worker-1.log"), &log).unwrap();
        let (step, share) = pace(&dir);
        assert!(close(step, 0.25), "{step}");
        // 9 gaps at 0.25 s would take 2.25 s of the 3.0 s between the first and last step.
        assert!(close(share, 0.75), "{share}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_generations_first_steps_settle_apart_from_the_rest() {
        // Two generations of 0.4 s steps; the second's first 3 steps take 0.6 s each, and one
        // later step of the first takes 0.5 s.
        let mut steps = Vec::new();
        run(&mut steps, 1, 1, 30, 0.0);
        let mut at = 20.0;
        for step in 31..=60u64 {
            at += if step <= 33 { 0.6 } else { 0.4 };
            steps.push(Trained { unix: at, step, generation: 2 });
        }
        for t in steps.iter_mut().filter(|t| t.generation == 1 && t.step >= 20) {
            t.unix += 0.1;
        }
        let e = excess(&steps);
        // 29 gaps in each generation, 10 of them settling: step 31 follows a step of the other
        // generation, so its gap is no step of either; steps 32 and 33 are 0.2 s over each.
        assert_eq!((e.generations, e.settling_steps, e.steady_steps), (2, 20, 38));
        assert!(close(e.settling, 0.4), "{e:?}");
        assert!(close(e.steady, 0.1), "{e:?}");
    }

    #[test]
    fn nodes_log_when_they_start_leading() {
        let dir = tempfile_dir();
        std::fs::write(
            dir.join("node2.log"),
            "2026-12-05T23:31:17.500000Z  INFO coordinator::leader: leading; every known worker gets one \
             full lease id=2 term=3\n2026-12-05T23:31:18.000000Z  INFO coordinator::leader: new generation\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("node1.log"),
            "2026-12-05T23:30:00.000000Z  INFO coordinator::leader: leading; every known worker gets one \
             full lease id=1 term=1\n",
        )
        .unwrap();
        std::fs::write(dir.join("worker-0.log"), "2026-12-05T23:40:00Z  INFO x: leading; no\n").unwrap();
        let times = leading_since(&dir);
        let day = 20_792.0 * 86_400.0 + 23.0 * 3600.0;
        assert_eq!(times, vec![day + 30.0 * 60.0, day + 31.0 * 60.0 + 17.5]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("podctl-chaos-phases-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn generation_numbers_of_both_event_kinds() {
        assert_eq!(generation_number("generation 12 from step 40 (x): a:[0]"), Some(12));
        assert_eq!(generation_number("generation 3: j.w2 failed"), Some(3));
        assert_eq!(generation_number("step 10 at file:///x"), None);
    }
}
