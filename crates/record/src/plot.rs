//! PNG line charts with plotters, using an embedded font so that they render the same on any
//! machine (plotters' system-font path needs fontconfig).

use crate::{Event, RecordError};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use std::path::Path;
use std::sync::Once;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");
const SIZE: (u32, u32) = (900, 500);

fn ensure_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The font is embedded and known to parse; failure here would be a build defect.
        register_font("sans-serif", FontStyle::Normal, FONT)
            .unwrap_or_else(|_| panic!("embedded font parses"));
    });
}

fn plot_error(path: &Path, e: impl std::fmt::Display) -> RecordError {
    RecordError::Plot { path: path.to_path_buf(), reason: e.to_string() }
}

/// Padded `[min, max]` of values, never empty.
fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    // A floor, so that a single point (or a constant series at 0) still spans a range plotters
    // can put ticks on.
    let pad = ((hi - lo) * 0.05).max(hi.abs() * 1e-3).max(1e-3);
    (lo - pad, hi + pad)
}

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A chart over `x` and `y` on `root`, its axes drawn and described.
fn axes<'a, 'b>(
    root: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    path: &Path,
    title: &str,
    (x_label, x): (&str, std::ops::Range<f64>),
    (y_label, y): (&str, std::ops::Range<f64>),
) -> Result<Chart<'a, 'b>, RecordError> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(|e| plot_error(path, e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| plot_error(path, e))?;
    Ok(chart)
}

/// A dashed vertical line from `y0` to `y1` per marker (red for preemptions and failures),
/// with the marker's label at the top when `labelled`.
fn draw_markers(
    chart: &mut Chart<'_, '_>,
    path: &Path,
    markers: &[(f64, String)],
    (y0, y1): (f64, f64),
    labelled: bool,
) -> Result<(), RecordError> {
    for (x, label) in markers {
        let color = if label.contains("preempt") || label.contains("fail") { RED } else { BLUE };
        chart
            .draw_series(DashedLineSeries::new([(*x, y0), (*x, y1)], 6, 4, color.mix(0.6).stroke_width(1)))
            .map_err(|e| plot_error(path, e))?;
        if labelled {
            chart
                .draw_series([Text::new(
                    label.clone(),
                    (*x, y1),
                    ("sans-serif", 12).into_font().color(&color),
                )])
                .map_err(|e| plot_error(path, e))?;
        }
    }
    Ok(())
}

/// Draws `series` against step, with a dashed vertical line and label per marker.
pub(crate) fn lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(&str, Vec<(f64, f64)>)],
    markers: &[(f64, String)],
) -> Result<(), RecordError> {
    ensure_font();
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
    let all = || series.iter().flat_map(|(_, points)| points.iter());
    let (x0, x1) = range(all().map(|p| p.0));
    let (y0, y1) = range(all().map(|p| p.1));
    let mut chart = axes(&root, path, title, (x_label, x0..x1), (y_label, y0..y1))?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| plot_error(path, e))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    draw_markers(&mut chart, path, markers, (y0, y1), true)?;
    if series.len() > 1 {
        chart.configure_series_labels().border_style(BLACK).draw().map_err(|e| plot_error(path, e))?;
    }
    root.present().map_err(|e| plot_error(path, e))
}

/// Draws stacked bands against step: `bands` hold each band's top (the running sum of the
/// layers up to it, bottom first), so band `i` fills from band `i - 1`'s top to its own; `total`
/// is drawn as a black line over them (what the bands should add up to).
pub(crate) fn stacked(
    path: &Path,
    title: &str,
    y_label: &str,
    bands: &[(String, Vec<(f64, f64)>)],
    total: (&str, &[(f64, f64)]),
    markers: &[(f64, String)],
) -> Result<(), RecordError> {
    ensure_font();
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
    let all = || bands.iter().flat_map(|(_, points)| points.iter()).chain(total.1.iter());
    let (x0, x1) = range(all().map(|p| p.0));
    let (_, y1) = range(all().map(|p| p.1));
    let mut chart = axes(&root, path, title, ("step", x0..x1), (y_label, 0.0..y1))?;
    for (i, (name, points)) in bands.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        // The band's outline: its top left to right, then the band below's top back.
        let below: Vec<(f64, f64)> = match i {
            0 => points.iter().map(|&(x, _)| (x, 0.0)).collect(),
            _ => bands[i - 1].1.clone(),
        };
        let outline: Vec<(f64, f64)> = points.iter().copied().chain(below.into_iter().rev()).collect();
        chart
            .draw_series([Polygon::new(outline, color.filled())])
            .map_err(|e| plot_error(path, e))?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], color.filled()));
    }
    chart
        .draw_series(LineSeries::new(total.1.iter().copied(), BLACK.stroke_width(2)))
        .map_err(|e| plot_error(path, e))?
        .label(total.0)
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.stroke_width(2)));
    draw_markers(&mut chart, path, markers, (0.0, y1), false)?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_error(path, e))?;
    root.present().map_err(|e| plot_error(path, e))
}

/// Draws events over wall time: one row per kind, a point per event, labelled with its step.
pub(crate) fn timeline(path: &Path, events: &[Event]) -> Result<(), RecordError> {
    ensure_font();
    let mut kinds: Vec<&str> = Vec::new();
    for e in events {
        if !kinds.contains(&e.kind.as_str()) {
            kinds.push(&e.kind);
        }
    }
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
    let (t0, t1) = range(events.iter().map(|e| e.t));
    let rows = kinds.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption("Events", ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(110)
        .build_cartesian_2d(t0..t1, -0.5..rows - 0.5)
        .map_err(|e| plot_error(path, e))?;
    let labels = kinds.clone();
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_labels(kinds.len().max(1))
        .y_label_formatter(&move |y: &f64| {
            let i = y.round();
            if (y - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).map_or(String::new(), |s| s.to_string())
            } else {
                String::new()
            }
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| plot_error(path, e))?;
    for (row, kind) in kinds.iter().enumerate() {
        let color = Palette99::pick(row).to_rgba();
        let points: Vec<(f64, f64)> =
            events.iter().filter(|e| e.kind == *kind).map(|e| (e.t, row as f64)).collect();
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 6, color.filled())))
            .map_err(|e| plot_error(path, e))?;
        chart
            .draw_series(events.iter().filter(|e| e.kind == *kind).map(|e| {
                Text::new(format!("step {}", e.step), (e.t, row as f64 + 0.2), ("sans-serif", 12).into_font())
            }))
            .map_err(|e| plot_error(path, e))?;
    }
    root.present().map_err(|e| plot_error(path, e))
}
