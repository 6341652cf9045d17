//! Finding the project's Python and PJRT plugin, and exporting test bundles with the real
//! exporter.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

pub fn python() -> PathBuf {
    let python = std::env::var_os("PODCTL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    python
}

pub fn plugin() -> &'static pjrt::Plugin {
    let path = std::env::var_os("PODCTL_PJRT_PLUGIN").map(PathBuf::from).unwrap_or_else(|| {
        root().join(".venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
    });
    assert!(path.exists(), "CPU PJRT plugin {} is missing: run scripts/setup.sh", path.display());
    pjrt::Plugin::load(&path).expect("plugin loads")
}

/// Runs `python -m <module> <args>` with the exporter importable; panics with its stderr on failure.
pub fn python_module(module: &str, args: &[&str]) -> String {
    let out = Command::new(python())
        .args(["-m", module])
        .args(args)
        .env("PYTHONPATH", root().join("models"))
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "python -m {module} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Exports a tiny-model bundle for `mesh` (e.g. `fsdp=2,tp=2`) into `dir`.
pub fn export_tiny(dir: &Path, mesh: &str, micro_batch: u64, seq_len: u64) -> bundle::Bundle {
    let (mb, sl) = (micro_batch.to_string(), seq_len.to_string());
    let out = dir.to_str().expect("utf-8 path");
    python_module(
        "podctl_models.export",
        &[
            "--preset",
            "tiny",
            "--mesh",
            mesh,
            "--micro-batch",
            &mb,
            "--seq-len",
            &sl,
            "--loss-chunk",
            "16",
            "--out",
            out,
        ],
    );
    bundle::Bundle::load(dir).expect("exported bundle loads")
}

/// The arithmetic task's micro-batch `micro` of step `step`.
pub fn batch(global: usize, micro_batch: usize, seq_len: usize, step: u64, micro: u64) -> data::Batch {
    let config: data::DataConfig = serde_json::from_str(r#"{"kind": "arithmetic"}"#).expect("config");
    let spec = data::BatchSpec::new(global, micro_batch, seq_len).expect("spec");
    data::Loader::from_config(&config, spec, 7, &data::LocalFiles)
        .expect("loader")
        .micro_batch(step, micro)
        .expect("batch")
}
