//! `podctl ckpt import` and `podctl ckpt export --hf` on a Hugging Face checkpoint transformers
//! wrote (crates/hf/tests/fixtures), `podctl plan` of a job naming a model directory, and bad
//! input: exit status 2 with the file and field named.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn fixture(name: &str) -> PathBuf {
    root().join("crates/hf/tests/fixtures").join(name)
}

fn podctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podctl"))
        .args(args)
        .env("PODCTL_HOME", root())
        .env("PODCTL_CACHE", root().join("target/test-cache"))
        .output()
        .unwrap()
}

fn succeeds(args: &[&str]) -> String {
    let out = podctl(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "podctl {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn fails(args: &[&str]) -> String {
    let out = podctl(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "podctl {args:?}: {stderr}");
    assert!(stderr.starts_with("error: ") && !stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn import_then_export_hf_carries_the_model_and_its_files_over() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("untied-bf16");
    let ckpt = tmp.path().join("ckpt");
    let (model_arg, ckpt_arg) = (model.to_str().unwrap(), ckpt.to_str().unwrap());
    let printed = succeeds(&["ckpt", "import", model_arg, ckpt_arg, "--dtype", "bfloat16"]);
    assert!(
        printed.contains("25824 parameters, bfloat16") && printed.contains("written as 16 shards"),
        "{printed}"
    );
    assert!(
        succeeds(&["ckpt", "import", model_arg, ckpt_arg, "--dtype", "bfloat16"])
            .contains("is already imported")
    );
    succeeds(&["ckpt", "verify", ckpt_arg]);

    let out = tmp.path().join("export");
    let printed = succeeds(&["ckpt", "export", ckpt_arg, "--hf", "--out", out.to_str().unwrap()]);
    // bfloat16 by default; config.json and generation_config.json from the recorded source.
    assert!(
        printed.contains("25 tensors of step 0 in 1 file(s)") && printed.contains("bfloat16"),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("copied generation_config.json from {}", model.display())),
        "{printed}"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (config["tie_word_embeddings"].as_bool(), config["dtype"].as_str()),
        (Some(false), Some("bfloat16"))
    );
    assert!(out.join("model.safetensors").exists() && out.join("generation_config.json").exists());

    let e = fails(&["ckpt", "export", ckpt_arg, "--hf", "--out", out.to_str().unwrap()]);
    assert!(e.contains("exists and is not empty"), "{e}");
    let e = fails(&["ckpt", "export", ckpt_arg, "--hf", "--dtype", "float16", "--out", "x"]);
    assert!(e.contains("--dtype float16: write float32 or bfloat16"), "{e}");
}

#[test]
fn import_refuses_a_broken_model_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("tied-f32").join(file), model.join(file)).unwrap();
    }
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    std::fs::write(model.join("config.json"), config.replace("Qwen3ForCausalLM", "MistralForCausalLM"))
        .unwrap();
    let ckpt = tmp.path().join("ckpt");
    let e = fails(&["ckpt", "import", model.to_str().unwrap(), ckpt.to_str().unwrap()]);
    assert!(e.contains("config.json: architectures = [\"MistralForCausalLM\"] is not supported"), "{e}");
    let e = fails(&["ckpt", "import", "/no/such/model", ckpt.to_str().unwrap()]);
    assert!(e.contains("/no/such/model: missing"), "{e}");
}

#[test]
fn plan_reads_the_model_shape_from_config_json() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = format!(
        "name: hf-plan\nmodel: {{ hf: {} }}\nmesh: auto\nbatch: {{ global: 8 }}\nseq_len: 16\nsteps: 1\n\
         data: {{ kind: arithmetic }}\nruntime: {{ devices_per_host: 4 }}\n",
        fixture("untied-f32").display()
    );
    let path = tmp.path().join("job.yaml");
    std::fs::write(&path, spec).unwrap();
    let printed = succeeds(&["plan", path.to_str().unwrap()]);
    assert!(printed.contains("hf:untied-f32"), "{printed}");
    std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("untied-f32", "no-such-model"))
        .unwrap();
    let e = fails(&["plan", path.to_str().unwrap()]);
    assert!(e.contains("`model.hf`") && e.contains("no-such-model: missing"), "{e}");
}
