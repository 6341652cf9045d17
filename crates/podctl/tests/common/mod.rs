//! What the end-to-end tests of the `podctl` binary share.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
pub use test_support::root;

/// The `podctl` binary under test, with the repository as its home (the exporter, the plugin)
/// and the tests' bundle cache.
pub fn podctl() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_podctl"));
    command.env("PODCTL_HOME", root()).env("PODCTL_CACHE", root().join("target/test-cache"));
    command
}

/// Runs podctl with `args`; returns its stdout, failing with both streams.
#[allow(dead_code)] // for the tests that run commands to completion
pub fn run(args: &[&str]) -> String {
    let out = podctl().args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "podctl {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Polls `ready` until it gives a value, failing the test after `limit`.
#[allow(dead_code)] // not every test binary waits
pub fn wait_for<T>(what: &str, limit: Duration, mut ready: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(started.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The steps `podctl ckpt list <root>` shows as committed.
#[allow(dead_code)] // for the tests that check retention
pub fn committed_listed(root: &Path) -> Vec<u64> {
    let out = run(&["ckpt", "list", root.to_str().unwrap()]);
    out.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(2) == Some(&"committed")).then(|| fields[0].parse().unwrap())
        })
        .collect()
}

/// A 2-slice tiny job that runs until stopped, saving every 5 steps, with its run record in `run`.
#[allow(dead_code)] // for the tests that watch a live job
pub fn endless_two_slice_job(name: &str, run: &Path) -> String {
    format!(
        "name: {name}\nmodel: tiny\nmesh: {{ dcn: 2, ici: {{ fsdp: 2, tp: 1 }} }}\n\
         batch: {{ global: 16, micro: 4 }}\nseq_len: 128\nsteps: 100000\n\
         data: {{ kind: arithmetic }}\ncheckpoint: {{ every: 5, keep: 2 }}\noutput: {}\n",
        run.display()
    )
}

/// The scalars TensorBoard's own reader (`EventAccumulator`, pinned in
/// scripts/requirements/tensorboard.txt) finds in `run`'s event files: (tag, step) -> value.
#[allow(dead_code)] // for the tests that check a run's TensorBoard file
pub fn tensorboard_scalars(run: &Path) -> std::collections::BTreeMap<(String, u64), f64> {
    const READ: &str = "
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
print(json.dumps([[tag, e.step, e.value] for tag in acc.Tags()['scalars'] for e in acc.Scalars(tag)]))
";
    let out = Command::new(root().join(".venv/bin/python")).args(["-c", READ]).arg(run).output().unwrap();
    assert!(out.status.success(), "the TensorBoard reader failed: {}", String::from_utf8_lossy(&out.stderr));
    let scalars: Vec<(String, u64, f64)> = serde_json::from_slice(&out.stdout).unwrap();
    scalars.into_iter().map(|(tag, step, value)| ((tag, step), value)).collect()
}

/// Checks that TensorBoard reads exactly the numbers of `run`'s `metrics.jsonl` back, each at its
/// line's step and equal to the JSON value rounded to float32; returns how many.
#[allow(dead_code)] // for the tests that check a run's TensorBoard file
pub fn assert_tensorboard_has_the_metrics(run: &Path) -> usize {
    let mut expected = std::collections::BTreeMap::new();
    for line in std::fs::read_to_string(run.join("metrics.jsonl")).unwrap().lines() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        let step = line["step"].as_u64().unwrap();
        for (key, value) in line.as_object().unwrap().iter().filter(|(k, _)| *k != "step") {
            if let Some(value) = value.as_f64() {
                expected.insert((key.clone(), step), value as f32);
            }
        }
    }
    let read = tensorboard_scalars(run);
    let missing: Vec<_> = expected.keys().filter(|k| !read.contains_key(*k)).collect();
    let extra: Vec<_> = read.keys().filter(|k| !expected.contains_key(*k)).collect();
    assert!(missing.is_empty() && extra.is_empty(), "TensorBoard lacks {missing:?} and has more: {extra:?}");
    for (key, value) in &expected {
        // TensorBoard holds float32; the JSON between the reader and this test is exact to a
        // float32 (serde_json may miss the last bit of a float64 it parses).
        let read = read[key] as f32;
        assert_eq!(read.to_bits(), value.to_bits(), "{key:?}: TensorBoard has {read}, metrics.jsonl {value}");
    }
    expected.len()
}
