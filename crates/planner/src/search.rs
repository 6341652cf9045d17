//! Candidates, the choice among them, and the memory-cliff search.
//!
//! [`plan`] enumerates every layout of the target's devices that divides the model, every
//! micro-batch the global batch splits into and every rematerialization policy; estimates each
//! analytically; and, given an [`Oracle`], measures the few that matter exactly: the best
//! candidate of each layout (and the next one when that does not fit), then the micro-batches
//! on both sides of the chosen layout's memory cliff. The choice is the fastest candidate that
//! fits, exactly when measured.

use crate::hardware::{Platform, Target};
use crate::memory::{MemoryEstimate, estimate};
use crate::time::{StepTime, step_time};
use crate::workload::{Attention, Candidate, Layout, Remat, Workload};
use crate::{PlanError, report::format_bytes};
use serde::{Deserialize, Serialize};

/// An exact measurement of one candidate: compiled memory statistics per program plus the
/// train state resident beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measured {
    /// Per program: (name, peak bytes per device including resident state).
    pub programs: Vec<(String, u64)>,
    /// Whether a compiler refused a program for exceeding the device memory; its bytes are then
    /// the compiler's own count of what it would have needed.
    pub compiler_out_of_memory: bool,
    /// Programs not compiled because the analytic model puts them far below the training
    /// program (it sets the peak): (name, analytic peak bytes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_compiled: Vec<(String, u64)>,
}

impl Measured {
    /// The step's exact peak bytes per device.
    pub fn peak(&self) -> u64 {
        self.programs.iter().map(|(_, bytes)| *bytes).max().unwrap_or(0)
    }

    /// The exact bytes of one program.
    pub fn program(&self, name: &str) -> Option<u64> {
        self.programs.iter().find(|(n, _)| n == name).map(|(_, bytes)| *bytes)
    }
}

/// Measures candidates exactly (compiles them). Implemented by [`crate::exact::ExactOracle`];
/// the search itself stays pure.
pub trait Oracle {
    /// The exact measurement of each candidate, in order; a failure is reported per candidate
    /// and the search goes on without it.
    fn measure(&self, candidates: &[Candidate]) -> Vec<Result<Measured, String>>;
}

/// Exact mode's outcome for one candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exact {
    /// Not compiled: the analytic model ruled it out or ranked it too low.
    NotMeasured,
    /// Compiled.
    Measured(Measured),
    /// Exporting or compiling failed (the message says why).
    Failed(String),
}

/// One candidate of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The configuration.
    pub candidate: Candidate,
    /// The analytic estimate, term by term.
    pub analytic: MemoryEstimate,
    /// The exact measurement, when made.
    pub exact: Exact,
    /// The estimated step time.
    pub time: StepTime,
}

impl Row {
    /// The best-known peak: exact when measured, analytic otherwise.
    pub fn peak(&self) -> u64 {
        match &self.exact {
            Exact::Measured(m) => m.peak(),
            _ => self.analytic.peak(),
        }
    }

    /// Whether it fits under `limit`, by the best-known peak.
    pub fn fits(&self, limit: u64) -> bool {
        self.peak() <= limit
    }

    /// Bytes left under `limit` (negative: over it), by the best-known peak.
    pub fn margin(&self, limit: u64) -> i64 {
        limit as i64 - self.peak() as i64
    }

    /// The exact peak, when measured.
    pub fn exact_peak(&self) -> Option<u64> {
        match &self.exact {
            Exact::Measured(m) => Some(m.peak()),
            _ => None,
        }
    }
}

/// One side of a memory cliff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CliffSide {
    /// The micro-batch.
    pub micro_batch: u64,
    /// Its exact peak bytes per device.
    pub peak: u64,
    /// `limit - peak`: positive under the limit, negative over it.
    pub margin: i64,
}

/// The memory cliff of one layout and remat policy: the largest micro-batch that fits and the
/// next one, which does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cliff {
    /// The layout searched.
    pub layout: Layout,
    /// The remat policy searched.
    pub remat: Remat,
    /// The attention implementation searched.
    pub attention: Attention,
    /// Whether optimizer offload was on.
    pub offload: bool,
    /// The largest micro-batch that fits, if any does.
    pub fits: Option<CliffSide>,
    /// The next micro-batch, which does not fit; `None` when the largest allowed one fits.
    pub next: Option<CliffSide>,
}

/// Knobs of the search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Only these layouts (the default: every `(fsdp, tp)` tiling of a slice that divides the
    /// model, with `dcn` = the target's slices).
    pub layouts: Option<Vec<Layout>>,
    /// Only these micro-batches (the default: every multiple of `fsdp` the global batch splits
    /// into evenly).
    pub micro_batches: Option<Vec<u64>>,
    /// The remat policies to consider.
    pub remats: Vec<Remat>,
    /// The attention implementations to consider (Pallas only on TPU targets).
    pub attentions: Vec<Attention>,
    /// Optimizer offload off and/or on (on only on TPU targets).
    pub offloads: Vec<bool>,
    /// Measure a candidate exactly only if its analytic peak is at most this multiple of the
    /// limit (the analytic model's error budget).
    pub exact_slack: f64,
    /// Rounds of exact measurements until a candidate fits exactly.
    pub max_rounds: usize,
    /// Also measure the best candidate of every layout exactly, not only the ones the choice
    /// rests on (slower: one training-program compile per layout at least).
    pub every_layout: bool,
    /// Search the memory cliff of the chosen layout.
    pub cliff: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            layouts: None,
            micro_batches: None,
            remats: Remat::ALL.to_vec(),
            attentions: Attention::ALL.to_vec(),
            offloads: vec![false, true],
            exact_slack: 1.3,
            max_rounds: 6,
            every_layout: false,
            cliff: true,
        }
    }
}

/// A plan: every candidate considered, the choice and the cliff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// What was planned.
    pub workload: Workload,
    /// Where.
    pub target: Target,
    /// Every candidate, by layout, then remat, then micro-batch.
    pub rows: Vec<Row>,
    /// Index into `rows` of the choice, if anything fits.
    pub choice: Option<usize>,
    /// The chosen layout's memory cliff, when searched in exact mode.
    pub cliff: Option<Cliff>,
    /// Layouts of the target's devices that cannot run this model, and why.
    pub skipped: Vec<(Layout, String)>,
}

impl Plan {
    /// The chosen row.
    pub fn chosen(&self) -> Option<&Row> {
        self.choice.map(|i| &self.rows[i])
    }

    /// The per-device memory limit.
    pub fn limit(&self) -> u64 {
        self.target.accelerator.memory_limit
    }

    /// The row of `candidate`, if considered.
    pub fn row(&self, candidate: &Candidate) -> Option<&Row> {
        self.rows.iter().find(|r| r.candidate == *candidate)
    }
}

/// Why `layout` cannot split the model, or `None` if it can.
fn does_not_divide(workload: &Workload, layout: &Layout) -> Option<String> {
    let m = &workload.model;
    let tp = layout.tp as u64;
    for (what, size) in [
        ("query heads", m.num_heads),
        ("key/value heads", m.num_kv_heads),
        ("MLP width", m.intermediate_size),
        ("vocabulary", m.vocab_size),
    ] {
        if size % tp != 0 {
            return Some(format!("tp={tp} does not divide the {size} {what} of {}", m.preset));
        }
    }
    let fsdp = layout.fsdp as u64;
    if !m.hidden_size.is_multiple_of(fsdp) {
        return Some(format!(
            "fsdp={fsdp} does not divide the hidden size {} of {}",
            m.hidden_size, m.preset
        ));
    }
    let per_slice = workload.global_batch / layout.dcn as u64;
    if !workload.global_batch.is_multiple_of(layout.dcn as u64) || !per_slice.is_multiple_of(fsdp) {
        return Some(format!(
            "{} rows per step do not split over dcn={} x fsdp={fsdp}",
            workload.global_batch, layout.dcn
        ));
    }
    None
}

/// Every `(fsdp, tp)` tiling of the target's slice, with `dcn` = its slices: `(layout, why it
/// cannot run the model)` for each, `None` when it can.
pub fn layouts(workload: &Workload, target: &Target) -> Vec<(Layout, Option<String>)> {
    let devices = target.accelerator.devices_per_slice;
    (1..=devices)
        .rev()
        .filter(|fsdp| devices.is_multiple_of(*fsdp))
        .map(|fsdp| {
            let layout = Layout { dcn: target.slices, fsdp, tp: devices / fsdp };
            (layout, does_not_divide(workload, &layout))
        })
        .collect()
}

/// Every micro-batch a plan considers for `layout`.
pub fn micro_batches_of(workload: &Workload, layout: &Layout) -> Vec<u64> {
    micro_batches(workload, layout, None)
}

/// `v` sorted, without repeats.
fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v.dedup();
    v
}

/// The micro-batches of `layout`: multiples of `fsdp` that split a slice's rows per step evenly.
fn micro_batches(workload: &Workload, layout: &Layout, only: Option<&[u64]>) -> Vec<u64> {
    let per_slice = workload.global_batch / layout.dcn as u64;
    let fsdp = layout.fsdp as u64;
    (1..=per_slice / fsdp)
        .map(|k| k * fsdp)
        .filter(|mb| per_slice.is_multiple_of(*mb))
        .filter(|mb| only.is_none_or(|only| only.contains(mb)))
        .collect()
}

/// Every candidate of `layout` under `options` that `platform` can run (Pallas attention and
/// optimizer offload are TPU levers), ordered by remat, attention, offload, then micro-batch.
pub fn candidates(
    workload: &Workload,
    layout: &Layout,
    options: &PlanOptions,
    platform: Platform,
) -> Vec<Candidate> {
    let remats = sorted(options.remats.clone());
    let attentions: Vec<Attention> = sorted(options.attentions.clone())
        .into_iter()
        .filter(|&a| a != Attention::Pallas || platform == Platform::Tpu)
        .collect();
    let offloads: Vec<bool> =
        sorted(options.offloads.clone()).into_iter().filter(|&o| !o || platform == Platform::Tpu).collect();
    let mbs = micro_batches(workload, layout, options.micro_batches.as_deref());
    let mut out = Vec::new();
    for &remat in &remats {
        for &attention in &attentions {
            for &offload in &offloads {
                for &micro_batch in &mbs {
                    out.push(Candidate { layout: *layout, micro_batch, remat, attention, offload });
                }
            }
        }
    }
    out
}

/// The order of preference among candidates that fit: fastest first, then the cheaper remat,
/// no offload, the plainer attention, then the larger margin. Step times are compared at
/// microsecond resolution so that float noise never decides.
fn preference(row: &Row, limit: u64) -> (u64, Remat, bool, Attention, i64) {
    let c = &row.candidate;
    ((row.time.total() * 1e6).round() as u64, c.remat, c.offload, c.attention, -row.margin(limit))
}

/// The analytic plan: no compiles.
pub fn plan_analytic(workload: &Workload, target: &Target, options: &PlanOptions) -> Result<Plan, PlanError> {
    plan(workload, target, options, None)
}

/// Plans `workload` on `target`: analytic estimates for every candidate, then, with an
/// `oracle`, exact measurements of the ones that decide the choice and the cliff.
pub fn plan(
    workload: &Workload,
    target: &Target,
    options: &PlanOptions,
    oracle: Option<&dyn Oracle>,
) -> Result<Plan, PlanError> {
    workload.validate()?;
    if target.slices == 0 {
        return Err(PlanError::Invalid {
            field: "slices",
            reason: "is 0; plan for at least one slice".into(),
        });
    }
    let all = layouts(workload, target);
    let fits: Vec<Layout> = all.iter().filter(|(_, why)| why.is_none()).map(|(l, _)| *l).collect();
    let mut skipped = Vec::new();
    let chosen_layouts: Vec<Layout> = match &options.layouts {
        Some(requested) => {
            for layout in requested {
                let devices = target.accelerator.devices_per_slice;
                let why = if layout.devices_per_slice() != devices || layout.dcn != target.slices {
                    Some(format!(
                        "it uses {} slices of {} devices but {} has {} slices of {devices}",
                        layout.dcn,
                        layout.devices_per_slice(),
                        target.accelerator.name,
                        target.slices
                    ))
                } else {
                    does_not_divide(workload, layout)
                };
                if let Some(reason) = why {
                    return Err(PlanError::MeshDoesNotDivide { layout: *layout, reason, fits });
                }
            }
            requested.clone()
        }
        None => {
            for (layout, why) in &all {
                if let Some(reason) = why {
                    skipped.push((*layout, reason.clone()));
                }
            }
            fits.clone()
        }
    };
    if chosen_layouts.is_empty() {
        return Err(PlanError::Invalid {
            field: "global_batch",
            reason: format!(
                "no layout of {} devices per slice divides {} (skipped: {})",
                target.accelerator.devices_per_slice,
                workload.model.preset,
                skipped.iter().map(|(l, why)| format!("{l}: {why}")).collect::<Vec<_>>().join("; ")
            ),
        });
    }

    let limit = target.accelerator.memory_limit;
    let mut rows: Vec<Row> = chosen_layouts
        .iter()
        .flat_map(|layout| candidates(workload, layout, options, target.accelerator.platform))
        .map(|candidate| Row {
            candidate,
            analytic: estimate(workload, &candidate, &target.accelerator),
            exact: Exact::NotMeasured,
            time: step_time(workload, &candidate, target),
        })
        .collect();
    if rows.is_empty() {
        return Err(PlanError::Invalid {
            field: "micro_batches",
            reason: "no micro-batch is a multiple of fsdp that splits the global batch evenly".into(),
        });
    }

    let mut cliff = None;
    if let Some(oracle) = oracle {
        if options.every_layout {
            measure_per_layout(&mut rows, &chosen_layouts, limit, options, oracle);
        }
        measure_deciding(&mut rows, limit, options, oracle);
    }
    let mut choice = choose(&rows, limit, oracle.is_some());
    if let (Some(oracle), Some(index), true) = (oracle, choice, options.cliff) {
        let found = search_cliff(&mut rows, index, limit, options.exact_slack, oracle);
        cliff = Some(found);
        choice = choose(&rows, limit, true);
    }
    // Nothing fits by either count: say what would. (When the analytic model thinks something
    // fits but no compile agrees, the plan itself shows the exact numbers.)
    if choice.is_none() && !rows.iter().any(|r| r.analytic.peak() <= limit) {
        return Err(does_not_fit(workload, target, &rows));
    }
    Ok(Plan { workload: workload.clone(), target: target.clone(), rows, choice, cliff, skipped })
}

/// The best row that fits: exactly measured ones only in exact mode.
fn choose(rows: &[Row], limit: u64, exact_mode: bool) -> Option<usize> {
    rows.iter()
        .enumerate()
        .filter(|(_, r)| r.fits(limit))
        .filter(|(_, r)| !exact_mode || matches!(r.exact, Exact::Measured(_)))
        .min_by_key(|(_, r)| preference(r, limit))
        .map(|(i, _)| i)
}

/// Indices of `layout`'s rows not yet measured whose analytic peak is within the slack, best
/// first.
fn unmeasured_in_slack(rows: &[Row], layout: &Layout, limit: u64, slack: f64) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].candidate.layout == *layout)
        .filter(|&i| rows[i].exact == Exact::NotMeasured)
        .filter(|&i| rows[i].analytic.peak() as f64 <= limit as f64 * slack)
        .collect();
    // Prefer what the analytic model says fits; among the rest, the smallest first.
    ids.sort_by_key(|&i| {
        let row = &rows[i];
        let fits = row.analytic.peak() <= limit;
        (
            !fits,
            if fits {
                preference(row, limit)
            } else {
                (
                    0,
                    row.candidate.remat,
                    row.candidate.offload,
                    row.candidate.attention,
                    row.analytic.peak() as i64,
                )
            },
        )
    });
    ids
}

/// The row of the next micro-batch above `row` with the same layout and levers.
fn next_on_ladder(rows: &[Row], row: usize) -> Option<usize> {
    let c = rows[row].candidate;
    (0..rows.len())
        .filter(|&i| {
            let o = rows[i].candidate;
            Candidate { micro_batch: 0, ..o } == Candidate { micro_batch: 0, ..c }
                && o.micro_batch > c.micro_batch
        })
        .min_by_key(|&i| rows[i].candidate.micro_batch)
}

/// Measures what the choice rests on: the fastest candidate the analytic model says fits,
/// together with the next micro-batch of its mesh and levers (the far side of its memory cliff,
/// compiled in parallel); when that candidate does not fit exactly, the next fastest, and so on
/// for up to `max_rounds` rounds. Nothing slower than a candidate that fits exactly can be
/// chosen, so nothing slower is compiled: the other meshes keep their analytic numbers.
fn measure_deciding(rows: &mut [Row], limit: u64, options: &PlanOptions, oracle: &dyn Oracle) {
    for _ in 0..options.max_rounds.max(1) {
        let fitting = choose(rows, limit, true).map(|i| preference(&rows[i], limit));
        let best = (0..rows.len())
            .filter(|&i| rows[i].exact == Exact::NotMeasured && rows[i].analytic.peak() <= limit)
            .filter(|&i| fitting.is_none_or(|f| preference(&rows[i], limit) < f))
            .min_by_key(|&i| preference(&rows[i], limit));
        let Some(best) = best else { break };
        let mut batch = vec![best];
        if let Some(next) =
            next_on_ladder(rows, best).filter(|&n| options.cliff && rows[n].exact == Exact::NotMeasured)
        {
            batch.push(next);
        }
        record(rows, &batch, oracle);
        if rows[best].exact_peak().is_some_and(|p| p <= limit) {
            break;
        }
    }
}

/// Measures the best candidate of every layout; where it does not fit exactly, the next best,
/// for up to `max_rounds` rounds. Each round is one batch for the oracle to run in parallel.
fn measure_per_layout(
    rows: &mut [Row],
    layouts: &[Layout],
    limit: u64,
    options: &PlanOptions,
    oracle: &dyn Oracle,
) {
    let mut open: Vec<Layout> = layouts.to_vec();
    for _ in 0..options.max_rounds.max(1) {
        let batch: Vec<usize> = open
            .iter()
            .filter_map(|l| unmeasured_in_slack(rows, l, limit, options.exact_slack).first().copied())
            .collect();
        if batch.is_empty() {
            break;
        }
        record(rows, &batch, oracle);
        open.retain(|l| {
            !rows.iter().any(|r| r.candidate.layout == *l && r.exact_peak().is_some_and(|p| p <= limit))
        });
        if open.is_empty() {
            break;
        }
    }
}

fn record(rows: &mut [Row], ids: &[usize], oracle: &dyn Oracle) {
    let candidates: Vec<Candidate> = ids.iter().map(|&i| rows[i].candidate).collect();
    for (&i, result) in ids.iter().zip(oracle.measure(&candidates)) {
        rows[i].exact = match result {
            Ok(measured) => Exact::Measured(measured),
            Err(message) => Exact::Failed(message),
        };
    }
}

/// Walks the chosen layout and remat's micro-batches by exact measurement until one fits and
/// the next does not. Starts from the chosen row (which fits), and moves up; if the largest
/// micro-batch fits, there is no cliff above it.
fn search_cliff(rows: &mut [Row], chosen: usize, limit: u64, slack: f64, oracle: &dyn Oracle) -> Cliff {
    let chosen_candidate = rows[chosen].candidate;
    let Candidate { layout, remat, attention, offload, .. } = chosen_candidate;
    let ladder: Vec<usize> = {
        let same_levers = |c: &Candidate| {
            Candidate { micro_batch: 0, ..*c } == Candidate { micro_batch: 0, ..chosen_candidate }
        };
        let mut ids: Vec<usize> = (0..rows.len()).filter(|&i| same_levers(&rows[i].candidate)).collect();
        ids.sort_by_key(|&i| rows[i].candidate.micro_batch);
        ids
    };
    let side = |row: &Row| {
        row.exact_peak().map(|peak| CliffSide {
            micro_batch: row.candidate.micro_batch,
            peak,
            margin: limit as i64 - peak as i64,
        })
    };
    let mut at = ladder.iter().position(|&i| i == chosen).expect("the chosen row is on its ladder");
    // Measure the next micro-batch, and the one after it at the same time (the compiles run in
    // parallel) when the next one may well fit: then the walk probably goes on. When the
    // analytic model puts the next one past the limit by more than its error budget, it is the
    // cliff's far side and the one after it would be a wasted compile.
    loop {
        let mut ahead: Vec<usize> = ladder[at + 1..].iter().copied().take(2).collect();
        if ahead.first().is_some_and(|&i| rows[i].analytic.peak() as f64 > limit as f64 * slack) {
            ahead.truncate(1);
        }
        ahead.retain(|&i| rows[i].exact == Exact::NotMeasured);
        if !ahead.is_empty() {
            record(rows, &ahead, oracle);
        }
        let next = match ladder.get(at + 1) {
            None => None,
            Some(&next) => match rows[next].exact_peak() {
                Some(peak) if peak <= limit => {
                    at += 1;
                    continue;
                }
                Some(_) => side(&rows[next]),
                // The next one failed to export or compile: the cliff cannot be placed exactly.
                None => None,
            },
        };
        return Cliff { layout, remat, attention, offload, fits: side(&rows[ladder[at]]), next };
    }
}

/// The error when nothing fits analytically, with what would fit instead.
fn does_not_fit(workload: &Workload, target: &Target, rows: &[Row]) -> PlanError {
    let acc = &target.accelerator;
    let smallest = rows.iter().min_by_key(|r| r.analytic.peak()).expect("rows is not empty");
    let limit = acc.memory_limit;
    let mut advice = Vec::new();
    if acc.platform == Platform::Tpu && !smallest.candidate.offload {
        let offloaded = Candidate { offload: true, ..smallest.candidate };
        let peak = estimate(workload, &offloaded, acc).peak();
        if peak <= limit {
            advice.push(format!(
                "optimizer offload (AdamW state in host memory) would fit ({} per device)",
                format_bytes(peak)
            ));
        }
    }
    if workload.param_dtype != mesh::DType::Bfloat16 {
        let bf16 = Workload {
            param_dtype: mesh::DType::Bfloat16,
            compute_dtype: mesh::DType::Bfloat16,
            ..workload.clone()
        };
        let peak = estimate(&bf16, &smallest.candidate, acc).peak();
        if peak <= limit {
            advice.push(format!("bfloat16 parameters would fit ({} per device)", format_bytes(peak)));
        }
    }
    let mut presets: Vec<_> = bundle::presets().into_values().collect();
    presets.sort_by_key(|m| std::cmp::Reverse(m.num_params()));
    if let Some(model) = presets.iter().filter(|m| m.num_params() < workload.model.num_params()).find(|m| {
        let smaller = Workload { model: (*m).clone(), ..workload.clone() };
        layouts(&smaller, target).iter().any(|(layout, why)| {
            why.is_none()
                && candidates(&smaller, layout, &PlanOptions::default(), acc.platform)
                    .iter()
                    .any(|c| estimate(&smaller, c, acc).peak() <= limit)
        })
    }) {
        advice.push(format!("the largest preset that fits is {}", model.preset));
    }
    let needed_share = smallest.analytic.peak() as f64 / limit as f64;
    let bigger = (acc.devices_per_slice as f64 * needed_share).ceil() as usize;
    advice.push(format!(
        "the parameters are split only within a slice, so more slices do not help: it needs about {bigger} devices per slice"
    ));
    PlanError::DoesNotFit {
        model: workload.model.preset.clone(),
        smallest: format!(
            "the smallest configuration ({}) needs {} per device but {} allows {}",
            smallest.candidate,
            format_bytes(smallest.analytic.peak()),
            acc.name,
            format_bytes(limit)
        ),
        advice: advice.join("; "),
    }
}
