//! What the planner's tests and benchmark share: the project's real exporter (Python, run as a
//! process, bundles cached by their arguments and the exporter's sources) and real compilers
//! (the crate's `podctl-compile-stats` child with the CPU plugin or libtpu).
#![allow(dead_code)]

use planner_exact::{BundleRequest, DiskCache, ProcessCompiler};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository root exists")
}

fn site_packages() -> PathBuf {
    root().join(".venv/lib/python3/site-packages")
}

/// The CPU PJRT plugin the project's setup installs.
pub fn cpu_plugin() -> PathBuf {
    site_packages().join("xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

/// libtpu.
pub fn libtpu() -> PathBuf {
    site_packages().join("libtpu/libtpu.so")
}

/// Where exported bundles and compile results are kept between runs: `PLANNER_CACHE` or
/// `target/planner-cache`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("PLANNER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/planner-cache"))
}

/// The compile cache.
pub fn compile_cache() -> DiskCache {
    DiskCache::new(cache_dir().join("compiles"))
}

/// The crate's child compiler with `plugin`; tests and benches pass
/// `env!("CARGO_BIN_EXE_podctl-compile-stats")`.
pub fn compiler(child: &str, plugin: PathBuf) -> ProcessCompiler {
    ProcessCompiler::new(child, Vec::new(), plugin)
}

fn exporter_sources_hash() -> Vec<u8> {
    let dir = root().join("models/podctl_models");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("models/podctl_models exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "py" || e == "json"))
        .collect();
    files.sort();
    let mut hash = Sha256::new();
    for file in files {
        hash.update(file.file_name().unwrap().to_string_lossy().as_bytes());
        hash.update(std::fs::read(&file).unwrap());
    }
    hash.finalize().to_vec()
}

/// Exports the bundle of `request` with the project's Python exporter, once per arguments and
/// exporter sources.
pub fn export(request: &BundleRequest) -> Result<PathBuf, String> {
    let args = request.exporter_args();
    let mut hash = Sha256::new();
    hash.update(exporter_sources_hash());
    for arg in &args {
        hash.update(arg.as_bytes());
        hash.update([0]);
    }
    let key = hex::encode(hash.finalize());
    let bundles = cache_dir().join("bundles");
    let dir = bundles.join(&key[..16]);
    if dir.join("manifest.json").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&bundles).map_err(|e| e.to_string())?;
    let staging =
        bundles.join(format!(".{}-{}-{:?}", &key[..16], std::process::id(), std::thread::current().id()));
    let output = Command::new(root().join(".venv/bin/python"))
        .args(["-m", "podctl_models.export"])
        .args(&args)
        .arg("--out")
        .arg(&staging)
        .env("PYTHONPATH", root().join("models"))
        .output()
        .map_err(|e| format!("cannot run the exporter: {e}"))?;
    if !output.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!("exporter failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    match std::fs::rename(&staging, &dir) {
        Ok(()) => Ok(dir),
        Err(_) if dir.join("manifest.json").exists() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(dir)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// An example's `main`: the example is its own compile child, so with `child` as the first
/// argument it compiles; otherwise `run` gets the arguments, and an error is printed with exit
/// status 2.
pub fn example_main(
    child: &str,
    run: impl FnOnce(std::vec::IntoIter<String>) -> Result<(), String>,
) -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(child) {
        return planner_exact::child_main(args.into_iter().skip(1));
    }
    match run(args.into_iter()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            std::process::ExitCode::from(2)
        }
    }
}
