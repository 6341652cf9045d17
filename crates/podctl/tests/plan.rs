//! `podctl plan` (analytic for seed 000's target, exact on a tiny model with the CPU plugin), bad
//! input for it, and the layout `podctl launch --dry-run` prints for a short-form mesh.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Seed 000's target: Qwen3-1.7B GRPO, 32 prompts x 8 generations, 256 + 2048 tokens.
const SEED_000: &str = "
name: seed-000
model: qwen3-1.7b
mesh: auto
grpo: { prompt_len: 256, max_new_tokens: 2048, generations: 8 }
batch: { global: 256 }
steps: 10
train: { loss_chunk: 256, param_dtype: float32, compute_dtype: bfloat16 }
data: { kind: arithmetic }
runtime: { accelerator: v6e-8 }
";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Runs podctl with `args`, the spec written to a temporary `job.yaml` in place of `JOB`.
fn podctl(spec: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, spec).unwrap();
    let args: Vec<&str> = args.iter().map(|a| if *a == "JOB" { path.to_str().unwrap() } else { a }).collect();
    Command::new(env!("CARGO_BIN_EXE_podctl"))
        .args(&args)
        .env("PODCTL_HOME", root())
        .env("PODCTL_CACHE", root().join("target/test-cache"))
        .output()
        .unwrap()
}

fn succeeds(spec: &str, args: &[&str]) -> String {
    let out = podctl(spec, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn fails(spec: &str, args: &[&str]) -> String {
    let out = podctl(spec, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "expected exit status 2, stderr:\n{stderr}");
    assert!(stderr.starts_with("error: ") && !stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn seed_000_lists_the_four_meshes_and_picks_one_that_fits() {
    let out = succeeds(SEED_000, &["plan", "JOB"]);
    assert!(out.starts_with("qwen3-1.7b GRPO on 1 x v6e-8: 256 rows/step x 2304 tokens"), "{out}");
    for mesh in ["(8,1)", "(4,2)", "(2,4)", "(1,8)"] {
        assert!(out.contains(&format!("  {mesh} ")) || out.contains(&format!("> {mesh} ")), "{mesh}:\n{out}");
    }
    for remat in [" none ", " dots ", " full "] {
        assert!(out.contains(remat), "{remat}:\n{out}");
    }
    let choice = out.lines().find(|l| l.starts_with("choice: mesh ")).unwrap_or_else(|| panic!("{out}"));
    assert!(choice.contains("of 31.25 GiB"), "{choice}");
    // mesh: auto in the spec resolved to the same choice.
    assert!(out.contains("this job (") && out.contains("; fits, margin"), "{out}");
    assert!(out.contains("analytic breakdown of grpo_grad_step") && out.contains("wall time"), "{out}");
}

#[test]
fn two_hosts_list_dcn_layouts_with_their_dcn_bytes() {
    let out = succeeds(SEED_000, &["plan", "JOB", "--hosts", "2"]);
    assert!(out.contains("(8,2) = dcn 2 x ici(4,2)") && out.contains("(4,4) = dcn 2 x ici(2,4)"), "{out}");
    // f32 gradients of 1.72B parameters, ring all-reduce over 2 hosts: 2 (n-1)/n x 6.41 GiB.
    assert!(out.contains(" 6.41 GiB\n"), "{out}");
}

#[test]
fn bad_targets_and_models_that_do_not_fit_say_what_would() {
    let e = fails(SEED_000, &["plan", "JOB", "--target", "v5e-8"]);
    assert!(
        e.contains("--target v5e-8: unknown topology 'v5e-8'; podctl plans for v6e-1, v6e-4, v6e-8, cpu-N"),
        "{e}"
    );
    // On one chip the f32 AdamW state of 1.7B parameters does not fit beside the rest; held in
    // host memory it does, and the plan takes that lever.
    let out = succeeds(SEED_000, &["plan", "JOB", "--target", "v6e-1"]);
    let choice = out.lines().find(|l| l.starts_with("choice: mesh (1,1)")).unwrap_or_else(|| panic!("{out}"));
    assert!(choice.contains("optimizer offload"), "{choice}");
    let pinned = SEED_000
        .replace("v6e-8", "v6e-1")
        .replace("compute_dtype: bfloat16", "compute_dtype: bfloat16, optimizer_offload: false");
    let e = fails(&pinned, &["plan", "JOB"]);
    assert!(
        e.contains("qwen3-1.7b does not fit")
            && e.contains("optimizer offload (AdamW state in host memory) would fit")
            && e.contains("the largest preset that fits is qwen3-0.6b"),
        "{e}"
    );
    let fixed =
        SEED_000.replace("mesh: auto", "mesh: \"(2,4)\"").replace("global: 256", "global: 256, micro: 64");
    let local = fixed.replace("runtime: { accelerator: v6e-8 }", "");
    let e = fails(&local.replace("(2,4)", "(8,3)").replace("micro: 64", "micro: 32"), &["plan", "JOB"]);
    assert!(
        e.contains("`mesh.ici.tp`: 3 does not divide the query heads of qwen3-1.7b (16)")
            && e.contains("meshes of 24 devices that divide the model are (24,1), (12,2), (6,4), (3,8)"),
        "{e}"
    );
    let e = fails(&fixed.replace("(2,4)", "(3,3)"), &["plan", "JOB"]);
    assert!(e.contains("(fsdp=3, tp=3) uses 9 devices per slice, but a v6e-8 host has 8"), "{e}");
    assert!(e.contains("choose axes whose product is 8: (1,8), (2,4), (4,2), (8,1)"), "{e}");
    // A GRPO job launches too: the dry run exports its bundle and shows which device holds what.
    let out = succeeds(&fixed, &["launch", "JOB", "--dry-run"]);
    assert!(out.starts_with("job seed-000: qwen3-1.7b") && out.contains("64 x 2304 tokens"), "{out}");
}

#[test]
fn exact_plan_of_a_tiny_job_compiles_then_reads_the_cache() {
    let spec = "
name: tiny-plan
model: tiny
mesh: auto
batch: { global: 8 }
seq_len: 64
steps: 2
data: { kind: arithmetic }
runtime: { devices_per_host: 2, device_memory: 64MiB }
";
    let first = succeeds(spec, &["plan", "JOB", "--exact"]);
    assert!(first.starts_with("exact: "), "{first}");
    let chosen = first.lines().find(|l| l.starts_with("> ")).unwrap_or_else(|| panic!("{first}"));
    assert!(chosen.contains(" MiB  yes "), "the choice is measured exactly: {chosen}");
    let again = succeeds(spec, &["plan", "JOB", "--exact"]);
    assert!(again.contains(" 0 compiles ") && again.contains("from the cache"), "{again}");
    assert_eq!(first.lines().find(|l| l.starts_with("> ")), again.lines().find(|l| l.starts_with("> ")));
}

#[test]
fn dry_run_prints_which_device_of_which_host_holds_which_shard() {
    let spec = "
name: layout
model: tiny
mesh: { shape: \"(4,2)\", hosts: 2 }
batch: { global: 16, micro: 4 }
seq_len: 64
steps: 2
data: { kind: arithmetic }
";
    let out = succeeds(spec, &["launch", "JOB", "--dry-run"]);
    assert!(out.contains("mesh (4,2) on 2 hosts = dcn 2 x ici(fsdp=2, tp=2), 4 devices per host"), "{out}");
    assert!(out.contains("devices of each host at (fsdp, tp): 0=(0,0) 1=(0,1) 2=(1,0) 3=(1,1)"), "{out}");
    assert!(out.contains("hosts 0..1 hold the same shards: device d of host h is device h x 4 + d"), "{out}");
    assert!(out.contains("layers/q_proj") && out.contains("  device 3: [:, "), "{out}");
}
