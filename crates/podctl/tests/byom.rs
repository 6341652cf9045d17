//! Bring your own model, end to end through the real `podctl` binary on the CPU plugin: a Hugging
//! Face directory (`tests/fixtures/hf-gsm8k/model`, written by transformers: a tiny
//! `Qwen3ForCausalLM`, its tokenizer and Qwen3's chat template) -> SFT on the GSM8K-format
//! fixture -> GRPO from that checkpoint -> held-out accuracy before and after each -> `podctl ckpt
//! export --hf`. Where `.venv-hf/` exists (torch), transformers loads the export and its greedy
//! continuation of a held-out prompt is the one podctl generated.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

mod common;
use common::{root, run};

fn jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The tensor names of a directory's safetensors files (their headers).
fn tensor_names(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
            names.extend(header.into_iter().map(|(k, _)| k).filter(|k| k != "__metadata__"));
        }
    }
    names
}

/// The held-out evaluations of a run: (step, accuracy, first sample).
fn evaluations(run: &Path) -> Vec<(u64, f64, Value)> {
    jsonl(&run.join("events.jsonl"))
        .into_iter()
        .filter(|e| e["kind"] == "eval")
        .map(|e| {
            let detail = &e["detail"];
            (e["step"].as_u64().unwrap(), detail["accuracy"].as_f64().unwrap(), detail["samples"][0].clone())
        })
        .collect()
}

#[test]
fn a_hugging_face_model_fine_tunes_on_gsm8k_then_grpo_then_exports() {
    let dir = tempfile::tempdir().unwrap();
    let model = root().join("tests/fixtures/hf-gsm8k/model");
    let gsm8k = root().join("tests/fixtures/gsm8k");
    let data = format!(
        "data: {{ kind: gsm8k, path: {}, test: {}, tokenizer: {{ kind: hf, path: {} }}, chat: {{ enable_thinking: false }} }}\n",
        gsm8k.join("train.jsonl").display(),
        gsm8k.join("test.jsonl").display(),
        model.display()
    );
    let common = format!(
        "model: {{ hf: {} }}\nmesh: {{ ici: {{ fsdp: 2, tp: 1 }} }}\nseed: 3\n{data}",
        model.display()
    );
    let sft_run = dir.path().join("sft");
    let sft = dir.path().join("sft.yaml");
    std::fs::write(
        &sft,
        format!(
            "name: byom-sft\n{common}seq_len: 256\nbatch: {{ global: 8, micro: 4 }}\nsteps: 12\n\
             optimizer: {{ lr: 1.0e-2, schedule: constant, weight_decay: 0.0 }}\n\
             eval: {{ problems: 8, prompt_len: 128, max_new_tokens: 32 }}\n\
             checkpoint: {{ every: 12 }}\noutput: {}\n",
            sft_run.display()
        ),
    )
    .unwrap();
    let out = run(&["launch", sft.to_str().unwrap()]);
    println!("{out}");
    assert!(out.contains(&format!("weights from the Hugging Face model {}", model.display())), "{out}");
    assert!(out.contains("held-out accuracy (greedy, 8 problems)"), "{out}");
    let lines = jsonl(&sft_run.join("metrics.jsonl"));
    let loss = |i: usize| lines[i]["loss"].as_f64().unwrap();
    assert!(
        loss(lines.len() - 1) < 0.8 * loss(0),
        "SFT learns the answers: {} -> {}",
        loss(0),
        loss(lines.len() - 1)
    );
    let evals = evaluations(&sft_run);
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 12], "before and after training");
    assert!(lines[0].get("eval_accuracy_initial").is_some() && lines[11].get("eval_accuracy").is_some());

    let grpo_run = dir.path().join("grpo");
    let grpo = dir.path().join("grpo.yaml");
    std::fs::write(
        &grpo,
        format!(
            "name: byom-grpo\n{common}\
             grpo: {{ prompt_len: 128, max_new_tokens: 32, generations: 4, init_from: {} }}\n\
             batch: {{ global: 16, micro: 8 }}\nsteps: 2\ntrain: {{ loss_chunk: 32 }}\n\
             optimizer: {{ lr: 1.0e-3, schedule: constant, weight_decay: 0.0 }}\n\
             eval: {{ problems: 8 }}\ncheckpoint: {{ every: 2 }}\noutput: {}\n",
            sft.display(),
            grpo_run.display()
        ),
    )
    .unwrap();
    let out = run(&["launch", grpo.to_str().unwrap()]);
    println!("{out}");
    let sft_checkpoints = sft_run.join("checkpoints");
    let started =
        out.lines().find_map(|l| l.strip_prefix("policy and reference start from ")).unwrap_or_default();
    assert!(started.contains(&format!("{}/000000000012-", sft_checkpoints.display())), "{out}");
    assert!(out.contains("held-out accuracy (greedy, 8 problems)"), "{out}");
    let evals = evaluations(&grpo_run);
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 2]);
    // GRPO's first evaluation scores the SFT result it starts from, on the same problems.
    let sft_after = &evaluations(&sft_run)[1];
    assert_eq!((evals[0].1, &evals[0].2), (sft_after.1, &sft_after.2), "GRPO starts where SFT ended");

    let export = dir.path().join("export");
    let checkpoints = grpo_run.join("checkpoints");
    run(&[
        "ckpt",
        "export",
        checkpoints.to_str().unwrap(),
        "--hf",
        "--dtype",
        "float32",
        "--out",
        export.to_str().unwrap(),
    ]);
    for file in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        assert!(export.join(file).is_file(), "the export has {file}");
    }
    assert_eq!(tensor_names(&export), tensor_names(&model), "the export has exactly the source's tensors");

    // Where torch is installed: transformers loads the export and continues the first held-out
    // prompt greedily as podctl did in its last evaluation.
    let python = root().join(".venv-hf/bin/python");
    if !python.exists() {
        println!("no .venv-hf (scripts/setup-hf-reference.sh): transformers' side skipped");
        return;
    }
    let sample = &evals[1].2;
    let script = r#"
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
export, prompt, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(export)
model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                               add_generation_prompt=True, enable_thinking=False)
ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
print(json.dumps(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)))
"#;
    let out = Command::new(python)
        .args(["-c", script, export.to_str().unwrap(), sample["prompt"].as_str().unwrap(), "32"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: String = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        theirs,
        sample["completion"].as_str().unwrap(),
        "transformers' greedy continuation of the export"
    );
}
