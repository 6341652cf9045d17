//! What the end-to-end tests of the `podctl` binary share.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

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
