//! The run record: what a run leaves in its directory for people to look at.
//!
//! ```text
//! <run>/metrics.jsonl   one JSON object per step ({"step": 1, "loss": ..., ...})
//! <run>/events.jsonl    one JSON object per event (preemption, recovery, save, ...) with times
//! <run>/loss.png        loss per step (and reward.png, step_time.png, timeline.png when there is
//!                       something to draw; step_time.png stacks the phases of each step,
//!                       `phase_<name>_seconds`, under its `step_seconds`)
//! <run>/summary.json    the run at a glance
//! <run>/events.out.tfevents.*.podctl
//!                       TensorBoard's event file: every numeric field of every metrics.jsonl
//!                       line as a scalar of the same name at its step ([`tensorboard`])
//! ```
//!
//! Lines are flushed as they are written, so `tail -f` and a crash both see every step.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod plot;
pub mod tensorboard;

use serde::Serialize;
use serde_json::{Map, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Why the record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A file in the run directory could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error("cannot draw {path}: {reason}")]
    Plot {
        /// The image.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// One event of a run, as written to `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Event {
    /// Seconds since the record was opened.
    pub t: f64,
    /// Wall-clock time, seconds since the Unix epoch.
    pub unix: f64,
    /// What happened: `preemption`, `recovery`, `checkpoint`, ...
    pub kind: String,
    /// The step the job was at.
    pub step: u64,
    /// Anything else worth knowing.
    #[serde(default)]
    pub detail: Value,
}

/// An open run directory.
pub struct RunRecord {
    dir: PathBuf,
    started: Instant,
    metrics: BufWriter<File>,
    events_file: BufWriter<File>,
    tensorboard: tensorboard::EventWriter,
    steps: Vec<Map<String, Value>>,
    events: Vec<Event>,
}

impl RunRecord {
    /// Creates the run directory (and parents) and starts fresh metric and event files.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self, RecordError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|source| RecordError::Io { path: dir.clone(), source })?;
        let open = |name: &str| {
            let path = dir.join(name);
            File::create(&path).map(BufWriter::new).map_err(|source| RecordError::Io { path, source })
        };
        let tensorboard = tensorboard::EventWriter::create(&dir, unix_now())
            .map_err(|source| RecordError::Io { path: dir.join("events.out.tfevents.*"), source })?;
        Ok(Self {
            metrics: open("metrics.jsonl")?,
            events_file: open("events.jsonl")?,
            tensorboard,
            dir,
            started: Instant::now(),
            steps: Vec::new(),
            events: Vec::new(),
        })
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one step's metrics; `metrics` must serialize to a JSON object with a `step`.
    /// Its numeric fields also go to the TensorBoard event file, as scalars at that step.
    pub fn step(&mut self, metrics: &impl Serialize) -> Result<(), RecordError> {
        let Value::Object(fields) = serde_json::to_value(metrics).unwrap_or(Value::Null) else {
            return Err(self.io_error("metrics.jsonl", "step metrics must serialize to a JSON object"));
        };
        let line = Value::Object(fields.clone()).to_string();
        writeln!(self.metrics, "{line}")
            .and_then(|()| self.metrics.flush())
            .map_err(|source| RecordError::Io { path: self.dir.join("metrics.jsonl"), source })?;
        let step = fields.get("step").and_then(Value::as_u64).unwrap_or(self.steps.len() as u64 + 1);
        let scalars = fields
            .iter()
            .filter(|(key, _)| *key != "step")
            .filter_map(|(k, v)| Some((k.as_str(), v.as_f64()?)));
        self.tensorboard
            .scalars(step, unix_now(), scalars)
            .map_err(|source| RecordError::Io { path: self.tensorboard.path().to_path_buf(), source })?;
        self.steps.push(fields);
        Ok(())
    }

    /// Appends an event.
    pub fn event(&mut self, kind: &str, step: u64, detail: Value) -> Result<(), RecordError> {
        let unix = unix_now();
        let event = Event { t: self.started.elapsed().as_secs_f64(), unix, kind: kind.into(), step, detail };
        let line = serde_json::to_string(&event).expect("events serialize");
        writeln!(self.events_file, "{line}")
            .and_then(|()| self.events_file.flush())
            .map_err(|source| RecordError::Io { path: self.dir.join("events.jsonl"), source })?;
        self.events.push(event);
        Ok(())
    }

    /// The events so far.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Writes `summary.json`.
    pub fn summary(&self, summary: &impl Serialize) -> Result<(), RecordError> {
        let path = self.dir.join("summary.json");
        let text = serde_json::to_string_pretty(summary).expect("summaries serialize");
        std::fs::write(&path, text + "\n").map_err(|source| RecordError::Io { path, source })
    }

    /// Draws the plots the metrics allow: `loss.png` always, `reward.png` when steps carry a
    /// `reward` (with a curve per reward function, `reward_<name>`), `accuracy.png` when they carry an `accuracy` or an `eval_accuracy` (or `eval`
    /// events carry one), `kl.png` when they carry a `kl`, `step_time.png` when they carry
    /// `step_seconds`, `timeline.png` when there are events. Returns the files written.
    pub fn plot(&self) -> Result<Vec<PathBuf>, RecordError> {
        let mut written = Vec::new();
        let series = |key: &str| -> Vec<(f64, f64)> {
            self.steps
                .iter()
                .filter_map(|m| Some((m.get("step")?.as_f64()?, m.get(key)?.as_f64()?)))
                .filter(|(_, y)| y.is_finite())
                .collect()
        };
        // Evaluations are points of a series, not moments worth a marker.
        let markers: Vec<(f64, String)> = self
            .events
            .iter()
            .filter(|e| e.kind != "eval")
            .map(|e| (e.step as f64, e.kind.clone()))
            .collect();
        for (file, key, title, unit) in [
            ("loss.png", "loss", "Loss", "loss per target token"),
            ("reward.png", "reward", "Reward", "mean reward"),
            ("kl.png", "kl", "KL to the reference", "per token"),
            ("step_time.png", "step_seconds", "Step time", "seconds"),
        ] {
            let points = series(key);
            if points.is_empty() && key != "loss" {
                continue;
            }
            let path = self.dir.join(file);
            let bands = phase_bands(&self.steps);
            if key == "step_seconds" && !bands.is_empty() {
                plot::stacked(&path, "Step time by phase", "seconds", &bands, (key, &points), &markers)?;
            } else if key == "reward" {
                let mut curves = vec![(key.to_string(), points)];
                curves.extend(reward_functions(&self.steps).into_iter().map(|name| {
                    let points = series(&format!("reward_{name}"));
                    (name, points)
                }));
                let curves: Vec<(&str, Vec<(f64, f64)>)> =
                    curves.iter().map(|(name, points)| (name.as_str(), points.clone())).collect();
                plot::lines(&path, title, "step", unit, &curves, &markers)?;
            } else {
                plot::lines(&path, title, "step", unit, &[(key, points)], &markers)?;
            }
            written.push(path);
        }
        let mut held_out = series("eval_accuracy");
        for e in self.events.iter().filter(|e| e.kind == "eval") {
            if let Some(accuracy) = e.detail.get("accuracy").and_then(Value::as_f64)
                && !held_out.iter().any(|&(step, _)| step == e.step as f64)
            {
                held_out.push((e.step as f64, accuracy));
            }
        }
        held_out.sort_by(|a, b| a.0.total_cmp(&b.0));
        let accuracy = [("sampled (train)", series("accuracy")), ("held-out (greedy)", held_out)];
        if accuracy.iter().any(|(_, points)| !points.is_empty()) {
            let path = self.dir.join("accuracy.png");
            plot::lines(&path, "Exact-match accuracy", "step", "fraction right", &accuracy, &markers)?;
            written.push(path);
        }
        if !self.events.is_empty() {
            let path = self.dir.join("timeline.png");
            plot::timeline(&path, &self.events)?;
            written.push(path);
        }
        Ok(written)
    }

    fn io_error(&self, file: &str, message: &str) -> RecordError {
        RecordError::Io { path: self.dir.join(file), source: std::io::Error::other(message.to_string()) }
    }
}

/// The reward functions whose means the steps carry (`reward_<name>`, not `reward_std`), sorted.
fn reward_functions(steps: &[Map<String, Value>]) -> Vec<String> {
    let names: std::collections::BTreeSet<String> = steps
        .iter()
        .flat_map(|m| m.keys())
        .filter_map(|key| key.strip_prefix("reward_"))
        .filter(|name| *name != "std")
        .map(str::to_owned)
        .collect();
    names.into_iter().collect()
}

/// Seconds since the Unix epoch.
fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The phases of the steps (`phase_<name>_seconds`) as stacked bands: the phase with the most
/// time over the run at the bottom, each band's points the running sum up to it (a step
/// without a phase adds 0 there). Empty when no step has a phase.
fn phase_bands(steps: &[Map<String, Value>]) -> Vec<(String, Vec<(f64, f64)>)> {
    let phase = |key: &str| Some(key.strip_prefix("phase_")?.strip_suffix("_seconds")?.to_string());
    let mut totals: Vec<(String, f64)> = Vec::new();
    for (key, value) in steps.iter().flat_map(|m| m.iter()) {
        if let (Some(name), Some(seconds)) = (phase(key), value.as_f64()) {
            match totals.iter_mut().find(|(n, _)| *n == name) {
                Some((_, total)) => *total += seconds,
                None => totals.push((name, seconds)),
            }
        }
    }
    totals.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let steps: Vec<(f64, &Map<String, Value>)> =
        steps.iter().filter_map(|m| Some((m.get("step")?.as_f64()?, m))).collect();
    let mut below = vec![0.0; steps.len()];
    totals
        .into_iter()
        .map(|(name, _)| {
            let key = format!("phase_{name}_seconds");
            let points = steps
                .iter()
                .zip(&mut below)
                .map(|((step, m), below)| {
                    *below += m.get(&key).and_then(Value::as_f64).filter(|s| s.is_finite()).unwrap_or(0.0);
                    (*step, *below)
                })
                .collect();
            (name, points)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_metrics_events_and_plots() {
        let dir = tempfile::tempdir().unwrap();
        let mut record = RunRecord::create(dir.path().join("run")).unwrap();
        for step in 1..=20u64 {
            let loss = 4.0 / step as f64;
            record
                .step(&json!({"step": step, "loss": loss, "step_seconds": 0.1, "reward": step as f64 / 20.0}))
                .unwrap();
        }
        record.event("eval", 0, json!({"accuracy": 0.4})).unwrap();
        record.event("preemption", 7, json!({"slice": 1})).unwrap();
        record.event("recovery", 8, json!({"seconds": 1.5})).unwrap();
        record.summary(&json!({"steps": 20})).unwrap();
        let written = record.plot().unwrap();
        let names: Vec<_> =
            written.iter().map(|p| p.file_name().unwrap().to_str().unwrap().to_string()).collect();
        assert_eq!(names, ["loss.png", "reward.png", "step_time.png", "accuracy.png", "timeline.png"]);
        for path in &written {
            let bytes = std::fs::read(path).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{path:?} is a PNG");
        }
        let metrics = std::fs::read_to_string(dir.path().join("run/metrics.jsonl")).unwrap();
        assert_eq!(metrics.lines().count(), 20);
        let first: Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
        assert_eq!(first["loss"], 4.0);
        let events: Vec<Event> = std::fs::read_to_string(dir.path().join("run/events.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!((events[1].kind.as_str(), events[1].step), ("preemption", 7));
        assert!(events[2].t >= events[1].t);
    }

    #[test]
    fn step_time_stacks_the_phases_largest_at_the_bottom() {
        let dir = tempfile::tempdir().unwrap();
        let mut record = RunRecord::create(dir.path()).unwrap();
        record
            .step(&json!({"step": 1, "loss": 1.0, "step_seconds": 1.0,
                "phase_rollout_seconds": 0.25, "phase_gradients_seconds": 0.75}))
            .unwrap();
        record
            .step(&json!({"step": 2, "loss": 1.0, "step_seconds": 1.375,
                "phase_gradients_seconds": 0.5, "phase_apply_seconds": 0.5, "phase_rollout_seconds": 0.375}))
            .unwrap();
        let bands = phase_bands(&record.steps);
        let expected = [
            ("gradients", vec![(1.0, 0.75), (2.0, 0.5)]),
            ("rollout", vec![(1.0, 1.0), (2.0, 0.875)]),
            ("apply", vec![(1.0, 1.0), (2.0, 1.375)]),
        ];
        assert_eq!(bands, expected.map(|(n, p)| (n.to_string(), p)));
        let written = record.plot().unwrap();
        assert!(written.contains(&dir.path().join("step_time.png")));
        assert!(phase_bands(&[]).is_empty());
    }

    #[test]
    fn only_loss_is_drawn_without_other_series() {
        let dir = tempfile::tempdir().unwrap();
        let mut record = RunRecord::create(dir.path()).unwrap();
        record.step(&json!({"step": 1, "loss": 2.0})).unwrap();
        let written = record.plot().unwrap();
        assert_eq!(written, vec![dir.path().join("loss.png")]);
        assert!(record.step(&json!([1, 2])).is_err());
    }
}
