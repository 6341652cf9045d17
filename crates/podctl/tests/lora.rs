//! `podctl launch` of a LoRA job on this machine, then `podctl ckpt export` of its checkpoint:
//! the adapters train, the checkpoints hold them apart from the base, and the export merges
//! them into the base.

mod common;
use common::{root, run};

#[test]
fn a_lora_job_trains_locally_and_exports_merged_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(root().join("examples/tiny-lora.yaml")).unwrap();
    let spec = tmp.path().join("job.yaml");
    std::fs::write(&spec, example.replace("steps: 100", "steps: 20").replace("every: 50", "every: 10"))
        .unwrap();
    let run_dir = tmp.path().join("run");
    let out = run(&["launch", spec.to_str().unwrap(), "--out", run_dir.to_str().unwrap()]);
    assert!(
        out.contains("LoRA rank 8 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj trains"),
        "{out}"
    );
    assert!(out.contains("done: 20 steps"), "{out}");

    let checkpoints = run_dir.join("checkpoints");
    let listed = run(&["ckpt", "list", checkpoints.to_str().unwrap()]);
    assert_eq!(listed.matches("committed").count(), 2, "{listed}");
    assert!(checkpoints.join("base").is_dir(), "the base is saved apart");

    let file = tmp.path().join("tiny.safetensors");
    let out = run(&["ckpt", "export", checkpoints.to_str().unwrap(), "--out", file.to_str().unwrap()]);
    assert!(out.contains("wrote 13 tensors of step 20"), "{out}");
    assert!(out.contains("LoRA adapters merged into 7 weights"), "{out}");
    let weights = checkpoint::export::read_safetensors(&file).unwrap();
    let names: Vec<&str> = weights.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(names[..3], ["embed", "layers/input_norm", "layers/q_proj"]);
    assert!(weights.iter().all(|(_, _, values)| values.iter().all(|v| v.is_finite())));
}
