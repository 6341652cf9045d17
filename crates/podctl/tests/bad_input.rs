//! Bad input gets one clear error and exit status 2, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

const JOB: &str = "
name: bad-input
model: tiny
mesh: { ici: { fsdp: 2, tp: 2 } }
batch: { global: 8, micro: 4 }
seq_len: 128
steps: 2
data: { kind: arithmetic }
";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Runs `podctl launch <spec> --dry-run` and returns its stderr, checking it failed cleanly.
fn launch_fails(spec: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, spec).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_podctl"))
        .args(["launch", path.to_str().unwrap(), "--dry-run", "--out"])
        .arg(dir.path().join("run"))
        .env("PODCTL_HOME", root())
        .env("PODCTL_CACHE", root().join("target/test-cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "expected exit status 2, stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

#[test]
fn malformed_yaml() {
    let e = launch_fails("name: [unclosed\nmodel: tiny\n");
    assert!(e.contains("is not valid") && e.contains("line"), "{e}");
}

#[test]
fn mesh_that_does_not_tile_the_devices() {
    let spec = JOB
        .replace("fsdp: 2, tp: 2", "fsdp: 3, tp: 3")
        .replace("micro: 4", "micro: 3")
        .replace("global: 8", "global: 9");
    let e = launch_fails(&format!("{spec}runtime: {{ devices_per_host: 8 }}\n"));
    assert!(e.contains("uses 9 devices per slice, but each host has 8"), "{e}");
}

#[test]
fn missing_plugin() {
    let e = launch_fails(&format!("{JOB}runtime: {{ plugin: /nonexistent/pjrt_plugin.so }}\n"));
    assert!(e.contains("/nonexistent/pjrt_plugin.so"), "{e}");
}

#[test]
fn a_file_that_is_not_a_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("not_a_plugin.so");
    std::fs::write(&fake, b"this is text, not a shared library").unwrap();
    let e = launch_fails(&format!("{JOB}runtime: {{ plugin: {} }}\n", fake.display()));
    assert!(e.contains("not_a_plugin.so"), "{e}");
}

#[test]
fn unknown_model_preset() {
    let e = launch_fails(&JOB.replace("model: tiny", "model: gpt-17"));
    assert!(e.contains("gpt-17"), "{e}");
}

#[test]
fn bundle_lowered_for_another_mesh() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let out = Command::new(root().join(".venv/bin/python"))
        .args([
            "-m",
            "podctl_models.export",
            "--preset",
            "tiny",
            "--mesh",
            "fsdp=1,tp=1",
            "--micro-batch",
            "4",
            "--seq-len",
            "128",
            "--out",
        ])
        .arg(&bundle)
        .env("PYTHONPATH", root().join("models"))
        .output()
        .unwrap();
    assert!(out.status.success(), "export failed: {}", String::from_utf8_lossy(&out.stderr));
    let e = launch_fails(&format!("{JOB}bundle: {}\n", bundle.display()));
    assert!(e.contains("lowered for mesh (fsdp=1, tp=1), but the job runs on (fsdp=2, tp=2)"), "{e}");
}

#[test]
fn optimizer_offload_on_the_cpu_plugin() {
    let e = launch_fails(&format!("{JOB}train: {{ optimizer_offload: true }}\n"));
    assert!(
        e.contains("`train.optimizer_offload`") && e.contains("which the CPU plugin does not have"),
        "{e}"
    );
    // A job planned for TPU hosts, launched on this machine.
    let tpu = JOB.replace("fsdp: 2, tp: 2", "fsdp: 4, tp: 2").replace("micro: 4", "micro: 8");
    let e = launch_fails(&format!(
        "{tpu}train: {{ optimizer_offload: true }}\nruntime: {{ accelerator: v6e-8 }}\n"
    ));
    assert!(e.contains("this launch runs on the CPU plugin, which has none"), "{e}");
}

#[test]
fn a_coordinator_node_without_its_id_data_dir_or_token() {
    let dir = tempfile::tempdir().unwrap();
    let node = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_podctl"))
            .arg("coordinator")
            .args(args)
            .env_remove("PODCTL_ADMIN_TOKEN")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "expected exit status 2, stderr:\n{stderr}");
        assert!(stderr.starts_with("error: ") && !stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let data = dir.path().join("raft").display().to_string();
    assert!(node(&[]).contains("--id"));
    assert!(node(&["--id", "1"]).contains("--data-dir"));
    assert!(node(&["--id", "1", "--data-dir", &data]).contains("PODCTL_ADMIN_TOKEN"));
}
