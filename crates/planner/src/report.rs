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
        "accum",
        "analytic",
        "exact",
        "fits",
        "margin",
        "step time*",
        "DCN/step",
    ];
    let mut table: Vec<[String; 10]> = Vec::new();
    for (i, row) in plan.rows.iter().enumerate() {
        let c = &row.candidate;
        let best_of_group = plan
            .rows
            .iter()
            .filter(|r| {
                r.candidate.layout == c.layout && r.candidate.remat == c.remat && r.analytic.peak() <= limit
            })
            .max_by_key(|r| r.candidate.micro_batch)
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
            if i < 3 {
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
    }
    if let Some(cliff) = &plan.cliff {
        let _ = write!(out, "memory cliff of {} remat {}: ", cliff.layout, cliff.remat);
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
                "choice: mesh {} micro-batch {} remat {} ({} accumulation steps), peak {} of {}",
                row.candidate.layout,
                row.candidate.micro_batch,
                row.candidate.remat,
                row.candidate.accum_steps(w),
                format_bytes(row.peak()),
                format_bytes(limit)
            );
            out.push_str(&render_breakdown(&row.analytic, limit));
        }
        None => {
            let _ = writeln!(out, "choice: nothing fits");
        }
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
