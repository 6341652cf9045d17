//! The command line as scripts and shells use it, through the real binary: `--json` on `plan`
//! and `ckpt list|show|verify`, `--set` overrides checked as the spec file is, shell
//! completions, and status 1 for a job that ran and failed.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::root;

fn podctl(args: &[&str]) -> Output {
    common::podctl().args(args).env("PODCTL_CONFIG", "/nonexistent/podctl.yaml").output().unwrap()
}

fn succeeds(args: &[&str]) -> String {
    let out = podctl(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "podctl {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn fails_with(code: i32, args: &[&str]) -> String {
    let out = podctl(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "podctl {args:?}: {stderr}");
    assert!(stderr.starts_with("error: ") && !stderr.contains("panicked"), "{stderr}");
    stderr
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {text}"))
}

const JOB: &str = "name: planned\nmodel: tiny\nmesh: { ici: { fsdp: 2, tp: 1 } }\n\
                   batch: { global: 16, micro: 4 }\nseq_len: 128\nsteps: 10\ndata: { kind: arithmetic }\n\
                   runtime: { devices_per_host: 2 }\n";

#[test]
fn plan_json_carries_every_candidate_and_set_overrides_are_checked_like_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("job.yaml");
    std::fs::write(&spec, JOB).unwrap();
    let spec = spec.to_str().unwrap();
    let plan = json(&succeeds(&["plan", spec, "--json"]));
    let candidates = plan["candidates"].as_array().unwrap();
    assert!(candidates.len() > 1, "{plan}");
    let chosen: Vec<&Value> = candidates.iter().filter(|c| c["chosen"] == true).collect();
    assert_eq!(chosen.len(), 1);
    assert_eq!(&plan["choice"], chosen[0]);
    for c in candidates {
        let (peak, analytic) =
            (c["peak_bytes"].as_u64().unwrap(), c["analytic_peak_bytes"].as_u64().unwrap());
        assert_eq!(peak, analytic, "nothing measured without --exact: {c}");
        assert!(c["step_seconds"].as_f64().unwrap() > 0.0, "{c}");
        let limit = plan["target"]["memory_limit_bytes"].as_i64().unwrap();
        assert_eq!(c["margin_bytes"].as_i64().unwrap(), limit - peak as i64);
    }
    assert_eq!(plan["target"]["accelerator"], "cpu-2");
    assert_eq!(plan["this_job"]["considered"], true);
    assert!(plan["this_job"]["candidate"].as_str().unwrap().contains("mb=4"), "{plan}");

    // An override changes what is planned, exactly as editing the file would.
    let overridden = json(&succeeds(&["plan", spec, "--json", "--set", "batch.micro=2"]));
    assert!(overridden["this_job"]["candidate"].as_str().unwrap().contains("mb=2"), "{overridden}");
    let edited = dir.path().join("edited.yaml");
    std::fs::write(&edited, JOB.replace("micro: 4", "micro: 2")).unwrap();
    let from_file = json(&succeeds(&["plan", edited.to_str().unwrap(), "--json"]));
    assert_eq!(overridden["candidates"], from_file["candidates"]);

    // Overrides are validated as the file is, and the error names the override.
    let e = fails_with(2, &["plan", spec, "--set", "batch.micro=3"]);
    assert!(e.contains("--set batch.micro=3: job spec field `batch"), "{e}");
    let e = fails_with(2, &["plan", spec, "--set", "optimizer.lrr=1"]);
    assert!(e.contains("--set optimizer.lrr=1:") && e.contains("lrr"), "{e}");
    let e = fails_with(2, &["plan", spec, "--set", "steps"]);
    assert!(e.contains("--set steps: write FIELD=VALUE"), "{e}");
}

#[test]
fn ckpt_list_show_and_verify_speak_json() {
    let dir = tempfile::tempdir().unwrap();
    let root_dir = dir.path().join("ckpt");
    let model = root().join("crates/hf/tests/fixtures/untied-f32");
    succeeds(&["ckpt", "import", model.to_str().unwrap(), root_dir.to_str().unwrap()]);
    let ckpt_root = root_dir.to_str().unwrap();

    let listed = json(&succeeds(&["ckpt", "list", ckpt_root, "--json"]));
    let checkpoints = listed["checkpoints"].as_array().unwrap();
    assert_eq!(checkpoints.len(), 1, "{listed}");
    assert_eq!(
        (checkpoints[0]["step"].as_u64(), checkpoints[0]["committed"].as_bool()),
        (Some(0), Some(true))
    );
    let uri = checkpoints[0]["uri"].as_str().unwrap().to_string();

    let shown = json(&succeeds(&["ckpt", "show", &uri, "--json"]));
    assert_eq!(shown["step"], 0);
    assert_eq!(shown["uri"], uri.as_str());
    let arrays = shown["arrays"].as_array().unwrap();
    assert!(arrays.iter().any(|a| a["name"] == "params/embed"), "{shown}");
    let bytes: u64 = shown["objects"].as_array().unwrap().iter().map(|o| o["size"].as_u64().unwrap()).sum();
    assert_eq!(shown["bytes"].as_u64(), Some(bytes));
    assert_eq!(bytes, checkpoints[0]["bytes"].as_u64().unwrap() - manifest_and_marker(&uri));

    let verified = json(&succeeds(&["ckpt", "verify", ckpt_root, "--json"]));
    assert_eq!(verified["ok"], true);
    assert_eq!(verified["checkpoints"][0]["ok"], true);

    // A flipped byte: the check fails (status 1, what was checked failed), and says where.
    let shards = std::fs::read_dir(Path::new(uri.trim_start_matches("file://")))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "shards"))
        .unwrap();
    let mut data = std::fs::read(&shards).unwrap();
    data[10] ^= 0xff;
    std::fs::write(&shards, data).unwrap();
    let out = podctl(&["ckpt", "verify", ckpt_root, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let verified = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        (verified["ok"].as_bool(), verified["checkpoints"][0]["ok"].as_bool()),
        (Some(false), Some(false))
    );
    assert!(verified["checkpoints"][0]["error"].as_str().unwrap().contains("crc32c"), "{verified}");
}

/// Bytes of a checkpoint directory that are not array data: its manifest and commit marker.
fn manifest_and_marker(uri: &str) -> u64 {
    let dir = Path::new(uri.trim_start_matches("file://"));
    ["manifest.json", "COMMITTED"].iter().map(|f| std::fs::metadata(dir.join(f)).unwrap().len()).sum()
}

#[test]
fn completions_load_into_the_shells() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = succeeds(&["completions", shell]);
        for word in ["launch", "status", "logs", "context", "ckpt"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    // bash itself loads the script and completes `podctl st<TAB>`.
    let script = succeeds(&["completions", "bash"]);
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{script}\nCOMP_WORDS=(podctl st); COMP_CWORD=1; COMP_LINE='podctl st'; COMP_POINT=9; \
             _podctl podctl st podctl; echo \"${{COMPREPLY[@]}}\""
        ))
        .output()
        .unwrap();
    let offered = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(offered.split_whitespace().collect::<Vec<_>>(), ["status", "stop"], "{offered}");
}

/// A spec that validates, and a job that starts and then fails: every prompt is longer than
/// `seq_len`, so the first step has no answer token to learn from. That is the job's failure
/// (status 1, with the worker's reason), not a bad spec (2) or an unreachable cluster (3).
#[test]
fn a_job_that_runs_and_fails_exits_1_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String =
        (0..8).map(|_| format!("{{\"prompt\": \"{}\", \"answer\": \"42\"}}\n", "x".repeat(300))).collect();
    let data = dir.path().join("rows.jsonl");
    std::fs::write(&data, rows).unwrap();
    let spec = dir.path().join("fails.yaml");
    std::fs::write(
        &spec,
        format!(
            "name: fails\nmodel: tiny\nmesh: {{ ici: {{ fsdp: 1, tp: 1 }} }}\nbatch: {{ global: 4, micro: 4 }}\n\
             seq_len: 64\nsteps: 5\ndata: {{ kind: jsonl, path: {}, tokenizer: {{ kind: char }} }}\noutput: {}\n",
            data.display(),
            dir.path().join("run").display()
        ),
    )
    .unwrap();
    let e = fails_with(1, &["launch", spec.to_str().unwrap()]);
    assert!(e.contains("step 1 has no target tokens to learn from"), "{e}");
}
