//! The tables `podctl plan` prints: the candidates with analytic and exact bytes, and the
//! breakdown of one candidate's peak, term by term, like the seeds' memory budgets.

use crate::memory::{MemoryEstimate, TermKind};
use crate::search::{Exact, Plan, Row};
use std::fmt::Write;

/// Bytes as GiB with two decimals (`31.25 GiB`), or MiB below one GiB; negative values keep
/// their sign.
pub fn format_bytes(bytes: impl Into<i128>) -> String {
    let bytes: i128 = bytes.into();
    let sign = if bytes < 0 { "-" } else { "" };
    let magnitude = bytes.unsigned_abs() as f64;
    if magnitude >= (1u64 << 30) as f64 {
        format!("{sign}{:.2} GiB", magnitude / (1u64 << 30) as f64)
    } else {
        format!("{sign}{:.1} MiB", magnitude / (1u64 << 20) as f64)
    }
}

fn seconds(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0} s")
    } else if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} ms", s * 1e3)
    }
}

fn exact_cell(row: &Row) -> String {
    match &row.exact {
        Exact::NotMeasured => "-".into(),
        Exact::Measured(m) if m.compiler_out_of_memory => format!(">{} (OOM)", format_bytes(m.peak())),
        Exact::Measured(m) => format_bytes(m.peak()),
        Exact::Failed(_) => "failed".into(),
    }
}

/// The plan as a table, the choice, the cliff, and the layouts that could not run.
///
/// Rows shown: every exactly measured candidate, the analytic best of each layout and remat,
/// and the chosen one; `all` shows every candidate.
pub fn render_plan(plan: &Plan, all: bool) -> String {
    let limit = plan.limit();
    let w = &plan.workload;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {} on {} x {}: {} rows/step x {} tokens, params {}, compute {}; limit {} per device",
        w.model.preset,
        w.kind_name().to_uppercase(),
        plan.target.slices,
        plan.target.accelerator.name,
        w.global_batch,
        w.seq_len(),
        w.param_dtype,
        w.compute_dtype,
        format_bytes(limit)
    );
    let header = [
        "mesh",
        "micro-batch",
        "remat",
        "attention",
        "offload",
        "accum",
        "analytic",
        "exact",
        "fits",
        "margin",
        "step time*",
        "DCN/step",
    ];
    let mut table: Vec<[String; 12]> = Vec::new();
    for (i, row) in plan.rows.iter().enumerate() {
        let c = &row.candidate;
        // The analytic best of each mesh and remat policy (fastest that fits, any other lever).
        let best_of_group = plan
            .rows
            .iter()
            .filter(|r| {
                r.candidate.layout == c.layout && r.candidate.remat == c.remat && r.analytic.peak() <= limit
            })
            .min_by_key(|r| {
                ((r.time.total() * 1e6).round() as u64, r.candidate.offload, r.candidate.attention)
            })
            .is_some_and(|r| r.candidate == *c);
        let shown =
            all || plan.choice == Some(i) || !matches!(row.exact, Exact::NotMeasured) || best_of_group;
        if !shown {
            continue;
        }
        let mark = if plan.choice == Some(i) { "> " } else { "  " };
        let fits = match (&row.exact, row.fits(limit)) {
            (Exact::Measured(_), true) => "yes",
            (Exact::Measured(_), false) => "NO",
            (_, true) => "yes?",
            (_, false) => "no?",
        };
        table.push([
            format!("{mark}{}", c.layout),
            c.micro_batch.to_string(),
            c.remat.to_string(),
            c.attention.to_string(),
            if c.offload { "on".into() } else { "-".into() },
            c.accum_steps(w).to_string(),
            format_bytes(row.analytic.peak()),
            exact_cell(row),
            fits.to_string(),
            format_bytes(row.margin(limit)),
            seconds(row.time.total()),
            if row.time.dcn_bytes == 0 { "-".into() } else { format_bytes(row.time.dcn_bytes) },
        ]);
    }
    let mut widths = header.map(str::len);
    for cells in &table {
        for (w, cell) in widths.iter_mut().zip(cells) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w - cell.chars().count();
            if i < 5 {
                let _ = write!(text, "{cell}{} ", " ".repeat(pad));
            } else {
                let _ = write!(text, "{}{cell} ", " ".repeat(pad));
            }
        }
        text.trim_end().to_string()
    };
    let _ = writeln!(out, "  {}", line(&header.map(String::from)));
    for cells in &table {
        let _ = writeln!(out, "{}", line(cells));
    }
    let _ = writeln!(
        out,
        "  (fits: yes/NO exact, yes?/no? analytic only; margin = limit - peak; *step time is an estimate at {:.0}% MFU)",
        plan.target.mfu * 100.0
    );
    for (layout, why) in &plan.skipped {
        let _ = writeln!(out, "  skipped {layout}: {why}");
    }
    for row in &plan.rows {
        if let Exact::Failed(message) = &row.exact {
            let _ = writeln!(out, "  {} failed: {message}", row.candidate);
        }
        if let Exact::Measured(m) = &row.exact {
            for (program, bytes) in &m.not_compiled {
                let _ = writeln!(
                    out,
                    "  {}: {program} not compiled, analytic {} is far below the training program",
                    row.candidate,
                    format_bytes(*bytes)
                );
            }
        }
    }
    // Exact mode compiles what the choice rests on; say why a mesh kept its analytic numbers.
    if let (true, Some(chosen)) = (plan.rows.iter().any(|r| r.exact_peak().is_some()), plan.chosen()) {
        let mut layouts: Vec<crate::Layout> = plan.rows.iter().map(|r| r.candidate.layout).collect();
        layouts.dedup();
        for layout in layouts {
            let of_layout = || plan.rows.iter().filter(move |r| r.candidate.layout == layout);
            if of_layout().any(|r| r.exact != Exact::NotMeasured) {
                continue;
            }
            let fastest = of_layout()
                .filter(|r| r.analytic.peak() <= limit)
                .map(|r| r.time.total())
                .fold(f64::INFINITY, f64::min);
            let why = match fastest.is_finite() {
                true => format!(
                    "its fastest candidate that may fit ({}) is slower than the choice ({})",
                    seconds(fastest),
                    seconds(chosen.time.total())
                ),
                false => "nothing fits by the analytic model".to_string(),
            };
            let _ = writeln!(out, "  {layout} not compiled: {why}");
        }
    }
    if let Some(cliff) = &plan.cliff {
        let mut levers = format!("remat {}", cliff.remat);
        if cliff.attention != crate::Attention::Xla {
            levers.push_str(&format!(" attention {}", cliff.attention));
        }
        if cliff.offload {
            levers.push_str(" offload");
        }
        let _ = write!(out, "memory cliff of {} {levers}: ", cliff.layout);
        match (cliff.fits, cliff.next) {
            (Some(f), Some(n)) => {
                let _ = writeln!(
                    out,
                    "micro-batch {} fits with {} to spare; {} does not, over by {}",
                    f.micro_batch,
                    format_bytes(f.margin),
                    n.micro_batch,
                    format_bytes(-n.margin)
                );
            }
            (Some(f), None) => {
                let _ = writeln!(
                    out,
                    "micro-batch {} fits with {} to spare and no larger one splits the batch",
                    f.micro_batch,
                    format_bytes(f.margin)
                );
            }
            (None, _) => {
                let _ = writeln!(out, "no micro-batch fits");
            }
        }
    }
    match plan.chosen() {
        Some(row) => {
            let _ = writeln!(
                out,
                "choice: mesh {} micro-batch {}, {} ({} accumulation steps), peak {} of {}",
                row.candidate.layout,
                row.candidate.micro_batch,
                row.candidate.levers(),
                row.candidate.accum_steps(w),
                format_bytes(row.peak()),
                format_bytes(limit)
            );
            out.push_str(&render_breakdown(&row.analytic, limit));
            out.push_str(&render_levers(plan));
        }
        None => {
            let _ = writeln!(out, "choice: nothing fits");
        }
    }
    out
}

/// One lever setting of the chosen candidate's mesh and micro-batch, as the levers table shows it.
struct LeverRow {
    lever: String,
    peak: u64,
    exact: bool,
    seconds: f64,
    /// The largest micro-batch of the mesh that fits with this setting, and whether exactly.
    cliff: Option<(u64, bool)>,
}

/// What each memory lever does to the chosen candidate: its mesh and micro-batch under every
/// remat policy, attention implementation and offload setting the plan considered (the other
/// levers as chosen), and LoRA rank 64 on every projection (or full fine-tuning, for a LoRA job):
/// the peak per device and the saving against the choice, the estimated step time, and where the
/// memory cliff of the mesh goes (the largest micro-batch that fits). Exact where measured.
pub fn render_levers(plan: &Plan) -> String {
    let Some(chosen) = plan.chosen() else { return String::new() };
    let limit = plan.limit();
    let c = chosen.candidate;
    let cliff_of = |levers: &crate::Candidate| {
        plan.rows
            .iter()
            .filter(|r| {
                crate::Candidate { micro_batch: 0, ..r.candidate }
                    == crate::Candidate { micro_batch: 0, ..*levers }
            })
            .filter(|r| r.fits(limit))
            .max_by_key(|r| r.candidate.micro_batch)
            .map(|r| (r.candidate.micro_batch, r.exact_peak().is_some()))
    };
    let of_row = |lever: String, row: &Row| LeverRow {
        lever,
        peak: row.peak(),
        exact: row.exact_peak().is_some(),
        seconds: row.time.total(),
        cliff: cliff_of(&row.candidate),
    };
    let mut rows = vec![of_row(format!("as chosen: {}", c.levers()), chosen)];
    let mut variants: Vec<(String, crate::Candidate)> = Vec::new();
    for remat in crate::Remat::ALL {
        variants.push((format!("remat {remat}"), crate::Candidate { remat, ..c }));
    }
    for attention in crate::Attention::ALL {
        variants.push((format!("attention {attention}"), crate::Candidate { attention, ..c }));
    }
    variants.push((
        if c.offload { "no optimizer offload".into() } else { "optimizer offload".into() },
        crate::Candidate { offload: !c.offload, ..c },
    ));
    for (lever, candidate) in variants {
        if candidate == c {
            continue;
        }
        if let Some(row) = plan.row(&candidate) {
            rows.push(of_row(lever, row));
        }
    }
    // LoRA changes the workload, not the candidate: estimated here, analytically.
    let w = &plan.workload;
    let (lora_lever, other) = match &w.lora {
        Some(lora) => (
            format!("full fine-tuning (not LoRA rank {})", lora.rank),
            crate::Workload { lora: None, ..w.clone() },
        ),
        None => (
            "LoRA rank 64, all projections (changes what trains)".to_string(),
            crate::Workload {
                lora: Some(crate::LoraShape {
                    rank: 64,
                    targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
                        .map(String::from)
                        .to_vec(),
                    base_dtype: mesh::DType::Bfloat16,
                }),
                ..w.clone()
            },
        ),
    };
    if other.validate().is_ok() {
        let acc = &plan.target.accelerator;
        let peak = crate::estimate(&other, &c, acc).peak();
        let seconds = crate::step_time(&other, &c, &plan.target).total();
        let cliff = crate::search::micro_batches_of(&other, &c.layout)
            .into_iter()
            .filter(|&mb| {
                crate::estimate(&other, &crate::Candidate { micro_batch: mb, ..c }, acc).peak() <= limit
            })
            .max()
            .map(|mb| (mb, false));
        rows.push(LeverRow { lever: lora_lever, peak, exact: false, seconds, cliff });
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "levers at mesh {} micro-batch {} (one changed at a time), per device:",
        c.layout, c.micro_batch
    );
    let width = rows.iter().map(|r| r.lever.len()).max().unwrap_or(0);
    let _ = writeln!(
        out,
        "  {:<width$}  {:>16}  {:>12}  {:>13}  largest micro-batch that fits",
        "lever", "peak", "vs choice", "step time*"
    );
    for r in &rows {
        let peak = format!("{}{}", format_bytes(r.peak), if r.exact { " exact" } else { "" });
        let delta = r.peak as i128 - chosen.peak() as i128;
        let saving = match std::ptr::eq(r, &rows[0]) {
            true => "-".to_string(),
            false => format!("{}{}", if delta >= 0 { "+" } else { "" }, format_bytes(delta)),
        };
        let step = format!("{} ({:+.0}%)", seconds(r.seconds), 100.0 * (r.seconds / rows[0].seconds - 1.0));
        let cliff = match r.cliff {
            Some((mb, true)) => format!("{mb} (exact)"),
            Some((mb, false)) => mb.to_string(),
            None => "none".into(),
        };
        let _ = writeln!(out, "  {:<width$}  {:>16}  {:>12}  {:>13}  {cliff}", r.lever, peak, saving, step);
    }
    out
}

/// The analytic breakdown of a candidate's peak program, one term per line.
pub fn render_breakdown(estimate: &MemoryEstimate, limit: u64) -> String {
    let program = estimate.peak_program();
    let mut out = String::new();
    let _ = writeln!(out, "analytic breakdown of {} (the peak program), per device:", program.program);
    let width = program.terms.iter().map(|t| t.name.len()).max().unwrap_or(0);
    for term in &program.terms {
        let kind = match term.kind {
            TermKind::Resident => "resident",
            TermKind::Argument => "argument",
            TermKind::Temporary => "temp",
            TermKind::Code => "code",
        };
        let _ = writeln!(
            out,
            "  {:<width$}  {:>10}  {:<8}  {}",
            term.name,
            format_bytes(term.bytes),
            kind,
            term.detail
        );
    }
    let total = program.bytes();
    let _ = writeln!(out, "  {:<width$}  {:>10}", "total", format_bytes(total));
    let _ = writeln!(
        out,
        "  {:<width$}  {:>10}  (limit {})",
        "margin",
        format_bytes(limit as i128 - total as i128),
        format_bytes(limit)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_like_the_seeds() {
        assert_eq!(format_bytes(crate::V6E_HBM_LIMIT), "31.25 GiB");
        assert_eq!(format_bytes(-(18_800_000i64)), "-17.9 MiB");
        assert_eq!(format_bytes(3u64 << 30), "3.00 GiB");
        assert_eq!(seconds(0.25), "250 ms");
        assert_eq!(seconds(12.34), "12.3 s");
    }
}
