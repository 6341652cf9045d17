use super::*;
use mesh::{DType, Sharding};
use serde_json::json;

fn tensor(
    name: &str,
    shape: &[u64],
    dtype: &str,
    sharding: serde_json::Value,
    donated: bool,
) -> serde_json::Value {
    json!({"name": name, "shape": shape, "dtype": dtype, "sharding": sharding, "donated": donated})
}

/// A manifest following docs/BUNDLE.md for a model with two parameters on mesh (fsdp=2, tp=2).
fn manifest() -> serde_json::Value {
    let params =
        [("embed", vec![128u64, 64], json!([["tp"], ["fsdp"]])), ("final_norm", vec![64], json!([[]]))];
    let each = |prefix: &str, donated: bool| -> Vec<serde_json::Value> {
        params
            .iter()
            .map(|(p, s, sh)| tensor(&format!("{prefix}{p}"), s, "float32", sh.clone(), donated))
            .collect()
    };
    let scalar = |name: &str, dtype: &str| tensor(name, &[], dtype, json!([]), false);
    let batch = |name: &str, dtype: &str| tensor(name, &[8, 16], dtype, json!([["fsdp"], []]), false);
    let cat = |parts: Vec<Vec<serde_json::Value>>| parts.concat();
    let program = |name: &str, inputs: Vec<serde_json::Value>, outputs: Vec<serde_json::Value>| json!({"file": format!("programs/{name}.mlirbc"), "inputs": inputs, "outputs": outputs});
    json!({
        "format": "podctl-bundle/1",
        "exporter": {"version": "0.1.0", "jax": "0.10.2"},
        "platform": "cpu",
        "mesh": [{"name": "fsdp", "size": 2}, {"name": "tp", "size": 2}],
        "model": {"preset": "test", "vocab_size": 128, "hidden_size": 64, "num_layers": 1, "num_heads": 2,
                  "num_kv_heads": 1, "head_dim": 32, "intermediate_size": 128, "rope_theta": 1e6,
                  "rms_norm_eps": 1e-6, "tie_embeddings": true},
        "train": {"kind": "sft", "micro_batch": 8, "seq_len": 16, "param_dtype": "float32",
                  "compute_dtype": "float32", "remat": "none", "loss_chunk": 8, "attention": "xla"},
        "optimizer": {"name": "adamw", "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "max_grad_norm": 1.0},
        "params": each("params/", false),
        "programs": {
            "init": program("init", vec![scalar("seed", "uint32")],
                cat(vec![each("params/", false), each("opt/mu/", false), each("opt/nu/", false)])),
            "zero_grads": program("zero_grads", vec![], each("grads/", false)),
            "grad_step": program("grad_step",
                cat(vec![each("params/", false), each("grads/", true),
                         vec![batch("batch/tokens", "int32"), batch("batch/targets", "int32"), batch("batch/loss_mask", "float32")]]),
                cat(vec![each("grads/", false), vec![scalar("loss_sum", "float32"), scalar("token_count", "float32")]])),
            "apply_step": program("apply_step",
                cat(vec![each("params/", true), each("opt/mu/", true), each("opt/nu/", true), each("grads/", true),
                         vec![scalar("step", "int32"), scalar("learning_rate", "float32"), scalar("grad_scale", "float32")]]),
                cat(vec![each("params/", false), each("opt/mu/", false), each("opt/nu/", false), each("grads/", false),
                         vec![scalar("grad_norm", "float32")]])),
        }
    })
}

fn write(manifest: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("programs")).unwrap();
    for name in manifest["programs"].as_object().unwrap().keys() {
        std::fs::write(dir.path().join(format!("programs/{name}.mlirbc")), name.as_bytes()).unwrap();
    }
    std::fs::write(dir.path().join("manifest.json"), serde_json::to_vec_pretty(manifest).unwrap()).unwrap();
    dir
}

fn load_err(m: &serde_json::Value) -> String {
    Bundle::load(write(m).path()).unwrap_err().to_string()
}

#[test]
fn loads_a_valid_bundle() {
    let dir = write(&manifest());
    let b = Bundle::load(dir.path()).unwrap();
    assert_eq!(b.manifest().params.len(), 2);
    assert_eq!(b.mesh().num_devices(), 4);
    assert_eq!(b.id().len(), 64);
    assert_eq!(b.program_bytes("grad_step").unwrap(), b"grad_step");
    let p = &b.program("grad_step").unwrap().inputs[0];
    assert_eq!((p.dtype, p.num_bytes()), (DType::Float32, 128 * 64 * 4));
    assert_eq!(p.sharding, Sharding::new(vec![vec!["tp".into()], vec!["fsdp".into()]]));
}

#[test]
fn identity_covers_programs() {
    let dir = write(&manifest());
    let before = Bundle::load(dir.path()).unwrap().id().to_string();
    assert_eq!(Bundle::load(dir.path()).unwrap().id(), before, "identity is deterministic");
    std::fs::write(dir.path().join("programs/apply_step.mlirbc"), b"changed").unwrap();
    assert_ne!(Bundle::load(dir.path()).unwrap().id(), before);
}

#[test]
fn refuses_another_mesh() {
    let b = Bundle::load(write(&manifest()).path()).unwrap();
    let other = IciMesh::new([("fsdp", 4), ("tp", 1)]).unwrap();
    let e = b.check_mesh(&other).unwrap_err().to_string();
    assert!(e.contains("lowered for mesh (fsdp=2, tp=2), but the job runs on (fsdp=4, tp=1)"), "{e}");
    b.check_mesh(&IciMesh::new([("fsdp", 2), ("tp", 2)]).unwrap()).unwrap();
}

#[test]
fn names_the_broken_field() {
    let mut m = manifest();
    m["format"] = json!("podctl-bundle/9");
    assert!(load_err(&m).contains("format: 'podctl-bundle/9' is not a format"));

    let mut m = manifest();
    m["programs"]["grad_step"]["inputs"][2]["donated"] = json!(false);
    let e = load_err(&m);
    assert!(e.contains("programs.grad_step.inputs[2]: expected 'grads/embed'"), "{e}");

    let mut m = manifest();
    m["programs"]["apply_step"]["inputs"].as_array_mut().unwrap().pop();
    let e = load_err(&m);
    assert!(e.contains("programs.apply_step.inputs[10]: expected 'grad_scale'"), "{e}");

    let mut m = manifest();
    m["params"][0]["sharding"] = json!([["dp"], []]);
    let e = load_err(&m);
    assert!(e.contains("params[0] (params/embed)") && e.contains("axis 'dp'"), "{e}");

    let mut m = manifest();
    m["programs"].as_object_mut().unwrap().remove("zero_grads");
    assert!(load_err(&m).contains("programs.zero_grads: missing"));

    let mut m = manifest();
    m["programs"]["init"]["file"] = json!("../../etc/passwd");
    assert!(load_err(&m).contains("must be a path inside the bundle directory"));
}

#[test]
fn refuses_tensors_whose_byte_count_overflows() {
    // Issue 10: a shape whose byte count overflows u64 passed the checks, then `num_bytes`
    // panicked (debug) or wrapped (release) in whoever sized buffers from it.
    let mut m = manifest();
    m["params"][0]["shape"] = json!([1u64 << 32, 1u64 << 32]);
    let e = load_err(&m);
    assert!(e.contains("params[0] (params/embed)") && e.contains("is over 281474976710656 bytes"), "{e}");
    let text = serde_json::to_vec(&m).unwrap();
    let e = Manifest::parse(&text, std::path::Path::new("/b")).unwrap_err().to_string();
    assert!(e.contains("is over 281474976710656 bytes"), "{e}");

    let mut m = manifest();
    m["programs"]["grad_step"]["outputs"][0]["shape"] = json!([1u64 << 62, 8]);
    let e = load_err(&m);
    assert!(e.contains("programs.grad_step.outputs[0]") && e.contains("is over"), "{e}");
    let t: TensorSpec = serde_json::from_value(m["programs"]["grad_step"]["outputs"][0].clone()).unwrap();
    assert_eq!(t.num_bytes(), u64::MAX);
}

#[test]
fn reports_io_and_parse_errors_with_paths() {
    let dir = tempfile::tempdir().unwrap();
    let e = Bundle::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("manifest.json") && e.starts_with("cannot read"), "{e}");
    std::fs::write(dir.path().join("manifest.json"), b"{\"format\": 3").unwrap();
    let e = Bundle::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("is not a valid bundle manifest") && e.contains("line 1"), "{e}");
}

/// The GRPO bundle of docs/BUNDLE.md for the same model: micro-batch 8, prompt 10 + 6 new tokens.
fn grpo_manifest() -> serde_json::Value {
    let mut m = manifest();
    let sft = m["programs"].as_object_mut().unwrap();
    let grads: Vec<serde_json::Value> = sft["grad_step"]["outputs"].as_array().unwrap()[..2].to_vec();
    let params: Vec<serde_json::Value> = sft["grad_step"]["inputs"].as_array().unwrap()[..2].to_vec();
    let donated: Vec<serde_json::Value> = sft["grad_step"]["inputs"].as_array().unwrap()[2..4].to_vec();
    sft.remove("grad_step");
    m["train"] = json!({"kind": "grpo", "micro_batch": 8, "seq_len": 16, "param_dtype": "float32",
        "compute_dtype": "float32", "remat": "none", "loss_chunk": 8, "attention": "xla",
        "prompt_len": 10, "max_new_tokens": 6, "logprob_chunk": 8});
    let scalar = |name: &str, dtype: &str| tensor(name, &[], dtype, json!([]), false);
    let rows = |name: &str, dtype: &str, shape: &[u64]| {
        let sharding = if shape.len() == 1 { json!([["fsdp"]]) } else { json!([["fsdp"], []]) };
        tensor(name, shape, dtype, sharding, false)
    };
    let program = |name: &str, inputs: Vec<serde_json::Value>, outputs: Vec<serde_json::Value>| json!({"file": format!("programs/{name}.mlirbc"), "inputs": inputs, "outputs": outputs});
    let sequence = || {
        vec![
            rows("batch/tokens", "int32", &[8, 16]),
            rows("batch/targets", "int32", &[8, 16]),
            rows("batch/prompt_lengths", "int32", &[8]),
        ]
    };
    let metrics =
        ["loss_sum", "token_count", "kl_sum", "clipped_count", "ratio_sum", "ratio_min", "ratio_max"]
            .map(|name| scalar(name, "float32"));
    m["programs"]["rollout"] = program(
        "rollout",
        [
            params.clone(),
            vec![
                rows("prompt/tokens", "int32", &[8, 10]),
                rows("prompt/lengths", "int32", &[8]),
                rows("sample/seeds", "uint32", &[8]),
                scalar("sample/temperature", "float32"),
                scalar("sample/top_p", "float32"),
                tensor("sample/stop_ids", &[8], "int32", json!([[]]), false),
                scalar("sample/pad_id", "int32"),
            ],
        ]
        .concat(),
        vec![
            rows("completion/tokens", "int32", &[8, 6]),
            rows("completion/lengths", "int32", &[8]),
            rows("completion/logprobs", "float32", &[8, 6]),
        ],
    );
    m["programs"]["logprobs"] = program(
        "logprobs",
        [params.clone(), sequence(), vec![scalar("sample/temperature", "float32")]].concat(),
        vec![rows("logprobs", "float32", &[8, 16])],
    );
    m["programs"]["grpo_grad_step"] = program(
        "grpo_grad_step",
        [
            params,
            donated,
            sequence(),
            vec![
                rows("batch/loss_mask", "float32", &[8, 16]),
                rows("batch/advantages", "float32", &[8]),
                rows("batch/old_logprobs", "float32", &[8, 16]),
                rows("batch/ref_logprobs", "float32", &[8, 16]),
                scalar("sample/temperature", "float32"),
                scalar("grpo/clip_low", "float32"),
                scalar("grpo/clip_high", "float32"),
                scalar("grpo/kl_beta", "float32"),
            ],
        ]
        .concat(),
        [grads, metrics.to_vec()].concat(),
    );
    m
}

#[test]
fn loads_a_valid_grpo_bundle() {
    let dir = write(&grpo_manifest());
    let b = Bundle::load(dir.path()).unwrap();
    let train = &b.manifest().train;
    assert_eq!((train.prompt_len, train.max_new_tokens, train.logprob_chunk), (Some(10), Some(6), Some(8)));
    assert_eq!(train.prompt_group, None);
    let mut grouped = grpo_manifest();
    grouped["train"]["prompt_group"] = json!(4);
    assert_eq!(Bundle::load(write(&grouped).path()).unwrap().manifest().train.prompt_group, Some(4));
    assert_eq!(b.program("grpo_grad_step").unwrap().inputs.len(), 2 * 2 + 11);
    assert_eq!(b.program("rollout").unwrap().inputs.len(), 2 + 7);
    assert!(b.program("grad_step").is_err());
}

#[test]
fn grpo_checks_name_the_broken_field() {
    type Breakage = (fn(&mut serde_json::Value), &'static str);
    let cases: [Breakage; 11] = [
        (|m| m["train"]["seq_len"] = json!(17), "train.seq_len: 17 is not prompt_len + max_new_tokens"),
        (|m| m["train"]["prompt_group"] = json!(3), "train.prompt_group: 3 does not divide micro_batch = 8"),
        (|m| m["train"]["prompt_group"] = json!(0), "train.prompt_group: 0 does not divide micro_batch = 8"),
        (|m| m["train"]["loss_chunk"] = json!(16), "train.loss_chunk: 16 is not logprob_chunk"),
        (
            |m| m["train"].as_object_mut().unwrap().remove("logprob_chunk").map(drop).unwrap(),
            "train.logprob_chunk: missing",
        ),
        (|m| m["train"]["max_new_tokens"] = json!(0), "train.max_new_tokens: is 0"),
        (|m| m["train"]["kind"] = json!("dpo"), "train.kind: 'dpo' is not a kind"),
        (
            |m| m["programs"]["rollout"]["inputs"][3]["shape"] = json!([16]),
            "programs.rollout.inputs[3]: expected 'prompt/lengths' int32 [8] sharded P(fsdp)",
        ),
        (
            |m| m["programs"]["logprobs"]["inputs"][3]["sharding"] = json!([[], []]),
            "programs.logprobs.inputs[3]: expected 'batch/targets'",
        ),
        (
            |m| m["programs"]["grpo_grad_step"]["outputs"][8]["name"] = json!("ratio_mean"),
            "programs.grpo_grad_step.outputs[8]: expected 'ratio_max'",
        ),
        (
            |m| m["programs"]["grad_step"] = m["programs"]["logprobs"].clone(),
            "programs.grad_step: a grpo bundle",
        ),
    ];
    for (break_it, expected) in cases {
        let mut m = grpo_manifest();
        break_it(&mut m);
        let e = load_err(&m);
        assert!(e.contains(expected), "{e}\nexpected: {expected}");
    }
    let mut m = grpo_manifest();
    m["programs"].as_object_mut().unwrap().remove("logprobs");
    assert!(load_err(&m).contains("programs.logprobs: missing; every grpo bundle has it"));

    // An SFT bundle decodes (held-out evaluation) with both buffers and `rollout`, or not at all.
    let mut sft = manifest();
    sft["train"]["prompt_len"] = json!(4);
    assert!(load_err(&sft).contains("train.prompt_len: an sft bundle has both rollout buffers"));
    sft["train"]["logprob_chunk"] = json!(4);
    assert!(load_err(&sft).contains("train.logprob_chunk: only grpo bundles have it"));
}

/// A LoRA bundle of the same shape as `manifest()`: a bf16 frozen base of `embed` and one
/// stacked projection, rank-4 adapters on it as the trainable parameters.
fn lora_manifest() -> serde_json::Value {
    let mut m = manifest();
    let frozen = vec![
        tensor("frozen/embed", &[128, 64], "bfloat16", json!([["tp"], ["fsdp"]]), false),
        tensor("frozen/layers/q_proj", &[1, 64, 64], "bfloat16", json!([[], ["fsdp"], ["tp"]]), false),
    ];
    let adapters = [
        ("layers/q_proj.lora_a", vec![1u64, 64, 4], json!([[], ["fsdp"], []])),
        ("layers/q_proj.lora_b", vec![1u64, 4, 64], json!([[], [], ["tp"]])),
    ];
    let each = |prefix: &str, donated: bool| -> Vec<serde_json::Value> {
        adapters
            .iter()
            .map(|(p, s, sh)| tensor(&format!("{prefix}{p}"), s, "float32", sh.clone(), donated))
            .collect()
    };
    let strip = |v: Vec<serde_json::Value>| -> Vec<serde_json::Value> {
        v.into_iter()
            .map(|mut t| {
                t.as_object_mut().unwrap().remove("donated");
                t
            })
            .collect()
    };
    m["train"]["lora"] = json!({"rank": 4, "alpha": 8.0, "targets": ["q_proj"], "base_dtype": "bfloat16"});
    m["frozen"] = json!(strip(frozen.clone()));
    m["params"] = json!(strip(each("params/", false)));
    let programs = m["programs"].as_object_mut().unwrap();
    programs["init"]["outputs"] = json!(
        [frozen.clone(), each("params/", false), each("opt/mu/", false), each("opt/nu/", false)].concat()
    );
    programs["zero_grads"]["outputs"] = json!(each("grads/", false));
    let batch = programs["grad_step"]["inputs"].as_array().unwrap()[4..].to_vec();
    let metrics = programs["grad_step"]["outputs"].as_array().unwrap()[2..].to_vec();
    programs["grad_step"]["inputs"] =
        json!([frozen, each("params/", false), each("grads/", true), batch].concat());
    programs["grad_step"]["outputs"] = json!([each("grads/", false), metrics].concat());
    let scalars = programs["apply_step"]["inputs"].as_array().unwrap()[8..].to_vec();
    programs["apply_step"]["inputs"] = json!(
        [each("params/", true), each("opt/mu/", true), each("opt/nu/", true), each("grads/", true), scalars]
            .concat()
    );
    let norm = programs["apply_step"]["outputs"].as_array().unwrap()[8..].to_vec();
    programs["apply_step"]["outputs"] = json!(
        [each("params/", false), each("opt/mu/", false), each("opt/nu/", false), each("grads/", false), norm]
            .concat()
    );
    m
}

#[test]
fn loads_a_lora_bundle_with_its_frozen_base() {
    let b = Bundle::load(write(&lora_manifest()).path()).unwrap();
    let m = b.manifest();
    assert_eq!(m.frozen.len(), 2);
    assert_eq!(m.frozen[1].dtype, DType::Bfloat16);
    let lora = m.train.lora.as_ref().unwrap();
    assert_eq!((lora.rank, lora.scale()), (4, 2.0));
    assert_eq!(b.program("grad_step").unwrap().inputs.len(), 2 + 2 + 2 + 3);
    assert_eq!(b.program("init").unwrap().outputs[0].name, "frozen/embed");
}

#[test]
fn lora_checks_name_the_broken_field() {
    type Breakage = (fn(&mut serde_json::Value), &'static str);
    let cases: [Breakage; 6] = [
        (
            |m| m["train"].as_object_mut().unwrap().remove("lora").map(drop).unwrap(),
            "frozen: only LoRA bundles (train.lora) have a frozen base",
        ),
        (|m| m["frozen"] = json!([]), "frozen: missing; a LoRA bundle lists its frozen base"),
        (
            |m| m["frozen"][0]["name"] = json!("base/embed"),
            "frozen[0]: 'base/embed' must start with 'frozen/'",
        ),
        (
            |m| m["train"]["lora"]["targets"] = json!(["v_proj"]),
            "params[0]: 'params/layers/q_proj.lora_a' is not an adapter",
        ),
        (
            |m| m["programs"]["grad_step"]["inputs"][1]["dtype"] = json!("float32"),
            "programs.grad_step.inputs[1]: expected 'frozen/layers/q_proj' bfloat16",
        ),
        (
            |m| {
                let init = m["programs"]["init"]["outputs"].as_array_mut().unwrap();
                init.remove(0);
            },
            "programs.init.outputs[0]: expected 'frozen/embed'",
        ),
    ];
    for (break_it, expected) in cases {
        let mut m = lora_manifest();
        break_it(&mut m);
        let e = load_err(&m);
        assert!(e.contains(expected), "{e}\nexpected: {expected}");
    }
}

#[test]
fn offloaded_optimizer_state_lives_in_host_memory_on_tpu_only() {
    let mut m = manifest();
    m["platform"] = json!("tpu");
    m["train"]["optimizer_offload"] = json!(true);
    // Not yet marked: the moments of init must be in pinned_host.
    let e = load_err(&m);
    assert!(
        e.contains("programs.init.outputs[2]: expected 'opt/mu/embed'") && e.contains("in pinned_host"),
        "{e}"
    );
    for program in ["init", "apply_step"] {
        for side in ["inputs", "outputs"] {
            for t in m["programs"][program][side].as_array_mut().unwrap() {
                if t["name"].as_str().unwrap().starts_with("opt/") {
                    t["memory_kind"] = json!("pinned_host");
                }
            }
        }
    }
    let b = Bundle::load(write(&m).path()).unwrap();
    assert!(b.manifest().train.optimizer_offload);
    assert_eq!(b.program("init").unwrap().outputs[2].memory_kind.as_deref(), Some(HOST_MEMORY_KIND));

    m["platform"] = json!("cpu");
    let e = load_err(&m);
    assert!(
        e.contains("train.optimizer_offload: a cpu bundle cannot keep AdamW state in host memory"),
        "{e}"
    );
}

#[test]
fn an_optional_logits_program_is_checked_like_the_others() {
    let mut m = manifest();
    let params = m["programs"]["grad_step"]["inputs"].as_array().unwrap()[..2].to_vec();
    let tokens = tensor("batch/tokens", &[8, 16], "int32", json!([["fsdp"], []]), false);
    let logits = tensor("logits", &[8, 16, 128], "float32", json!([["fsdp"], [], []]), false);
    let inputs = [params, vec![tokens]].concat();
    m["programs"]["logits"] =
        json!({"file": "programs/logits.mlirbc", "inputs": inputs, "outputs": [logits]});
    let b = Bundle::load(write(&m).path()).unwrap();
    assert_eq!(b.program("logits").unwrap().outputs[0].shape, [8, 16, 128]);
    m["programs"]["logits"]["outputs"][0]["shape"] = json!([8, 16, 64]);
    let e = load_err(&m);
    assert!(e.contains("programs.logits.outputs[0]: expected 'logits' float32 [8, 16, 128]"), "{e}");
}

#[test]
fn absurd_model_dimensions_are_refused_naming_the_field() {
    let mut m = manifest();
    m["model"]["vocab_size"] = json!(1u64 << 40);
    let e = load_err(&m);
    assert!(e.contains("model.vocab_size: 1099511627776 is out of range"), "{e}");
}
