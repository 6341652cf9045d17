//! Hugging Face checkpoints written by transformers (crates/hf/tests/fixtures: tied and untied,
//! float32 and bfloat16, one sharded with an index) loaded onto trainers with `worker::hf`:
//! - the logits equal transformers' (its own float32 forward, in the fixtures) within 1e-4 of
//!   their scale, on one device (the weights placed alone, `worker::hf::place_weights`) and on
//!   a (fsdp 2, tp 2) trainer (`worker::hf::load`);
//! - the GRPO bundle's rollout at temperature 0 generates exactly transformers' greedy tokens;
//! - loaded, saved as a podctl checkpoint and exported (`hf::export`), every tensor is bitwise
//!   the source's (float32 exported as float32, bfloat16 as bfloat16);
//! - after training steps (`worker::run_step`), transformers loads the export with no missing or
//!   unexpected keys and its logits equal podctl's: only where the reference venv `.venv-hf/`
//!   exists (`scripts/setup-hf-reference.sh`); elsewhere that test says it was skipped.

use crate::support;
use bundle::{Bundle, ModelConfig};
use checkpoint::{Checkpoint, Limits, SaveOptions, Storage, StoreCommitLog, StoreOptions, finalize};
use hf::HfModel;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use worker::ckpt::{SaveLayout, Saver, StateSaver};
use worker::{Arg, Reduce, Trainer, run_step};

const ROWS: u64 = 2;
const SEQ: u64 = 16;

fn fixture(name: &str) -> PathBuf {
    support::root().join("crates/hf/tests/fixtures").join(name)
}

fn open(runtime: &tokio::runtime::Runtime, dir: &Path) -> HfModel {
    runtime.block_on(HfModel::open(dir.to_str().unwrap(), &StoreOptions::default())).unwrap()
}

/// transformers' reference outputs for a fixture.
#[derive(serde::Deserialize)]
struct Reference {
    logit_tokens: Vec<Vec<i32>>,
    prompts: Vec<Vec<i32>>,
    new_tokens: usize,
    generated: Vec<Vec<i32>>,
}

fn reference(name: &str) -> (Reference, Vec<f32>) {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    let logits = std::fs::read(fixture(name).join("logits.f32")).unwrap();
    (
        serde_json::from_str(&text).unwrap(),
        logits.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
    )
}

/// Exports a bundle of `model` with the exporter (the shape passed as `--model-json`).
fn export(dir: &Path, model: &ModelConfig, mesh: &str, rest: &[&str]) -> Bundle {
    let [flag, value] = model.exporter_args();
    let mut args = vec![flag.as_str(), value.as_str(), "--mesh", mesh, "--out", dir.to_str().unwrap()];
    args.extend(rest);
    support::python_module("podctl_models.export", &args);
    Bundle::load(dir).unwrap()
}

fn sft_bundle(dir: &Path, model: &ModelConfig, mesh: &str) -> Bundle {
    let (rows, seq) = (ROWS.to_string(), SEQ.to_string());
    export(
        dir,
        model,
        mesh,
        &["--micro-batch", &rows, "--seq-len", &seq, "--loss-chunk", "8", "--with-logits"],
    )
}

/// `max |ours - theirs|` relative to `max |theirs|`.
fn relative_error(ours: &[f32], theirs: &[f32]) -> f64 {
    assert_eq!(ours.len(), theirs.len());
    let diff = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    diff / theirs.iter().map(|b| b.abs() as f64).fold(0.0, f64::max)
}

fn flat(rows: &[Vec<i32>]) -> Vec<i32> {
    rows.iter().flatten().copied().collect()
}

/// Places each fixture on one device and compares the logits with transformers'.
#[test]
fn logits_equal_transformers_on_one_device() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for tie in ["tied", "untied"] {
        let first = open(&runtime, &fixture(&format!("{tie}-f32")));
        let bundle = sft_bundle(&tmp.path().join(tie), first.model(), "fsdp=1,tp=1");
        let slice = worker::Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
        let program = slice.compile(&bundle, "logits").unwrap();
        for dtype in ["f32", "bf16"] {
            let name = format!("{tie}-{dtype}");
            let model = open(&runtime, &fixture(&name));
            let weights =
                worker::hf::place_weights(&slice, bundle.manifest(), &model, runtime.handle()).unwrap();
            let (reference, theirs) = reference(&name);
            let weights: Vec<&worker::DeviceArray> = weights.iter().collect();
            let ours =
                worker::hf::logits(&slice, &program, &weights, &flat(&reference.logit_tokens)).unwrap();
            let error = relative_error(&ours, &theirs);
            println!(
                "{name} on one device: logits within {error:.2e} of transformers' (relative to their scale)"
            );
            assert!(error <= 1e-4, "{name}: logits differ from transformers' by {error:.3e}");
        }
    }
}

/// Loads each fixture onto a trainer of (fsdp 2, tp 2) and compares the logits; then saves the
/// loaded state, exports it and compares every tensor with the source, bit for bit.
#[test]
fn logits_equal_transformers_and_export_is_bitwise_on_fsdp2_tp2() {
    let mesh = "fsdp=2,tp=2";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for tie in ["tied", "untied"] {
        let first = open(&runtime, &fixture(&format!("{tie}-f32")));
        let bundle = sft_bundle(&tmp.path().join(tie), first.model(), mesh);
        let slice = worker::Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
        let program = slice.compile(&bundle, "logits").unwrap();
        let mut trainer = Trainer::new(slice, &bundle).unwrap();
        for dtype in ["f32", "bf16"] {
            let name = format!("{tie}-{dtype}");
            let model = open(&runtime, &fixture(&name));
            let loaded = worker::hf::load(&mut trainer, &model, 0, runtime.handle()).unwrap();
            assert_eq!(loaded.tensors, bundle.manifest().params.len());
            let (reference, theirs) = reference(&name);
            let ours = trainer_logits(&trainer, &program, &reference.logit_tokens);
            let error = relative_error(&ours, &theirs);
            println!(
                "{name} on {mesh}: logits within {error:.2e} of transformers' (relative to their scale)"
            );
            assert!(error <= 1e-4, "{name} on {mesh}: logits differ from transformers' by {error:.3e}");

            let export_dtype = if dtype == "f32" { mesh::DType::Float32 } else { mesh::DType::Bfloat16 };
            let out = tmp.path().join(format!("{name}-export"));
            let (checkpoint, root) = save(&runtime, &trainer, &tmp.path().join(format!("{name}-ckpt")));
            let options = hf::export::ExportOptions { dtype: export_dtype, ..Default::default() };
            runtime
                .block_on(hf::export::export_checkpoint(
                    &checkpoint,
                    &root,
                    &out,
                    Some(model.location()),
                    &options,
                ))
                .unwrap();
            let (source, exported) = (tensors(&fixture(&name)), tensors(&out));
            assert_eq!(source.keys().collect::<Vec<_>>(), exported.keys().collect::<Vec<_>>(), "{name}");
            for (tensor, bytes) in &source {
                assert!(
                    exported[tensor] == *bytes,
                    "{name}: {tensor} is not bitwise the source's after import and export"
                );
            }
            println!("{name} on {mesh}: {} tensors exported bitwise equal to the source", source.len());
        }
    }
}

fn trainer_logits(trainer: &Trainer, program: &worker::Program, tokens: &[Vec<i32>]) -> Vec<f32> {
    let weights: Vec<&worker::DeviceArray> =
        trainer.frozen().iter().chain(trainer.params().unwrap()).collect();
    worker::hf::logits(trainer.slice(), program, &weights, &flat(tokens)).unwrap()
}

/// Saves `trainer`'s state at step 0 under `root` and opens the committed checkpoint.
fn save(runtime: &tokio::runtime::Runtime, trainer: &Trainer, root: &Path) -> (Checkpoint, String) {
    let url = format!("file://{}", root.display());
    let storage = Storage::open(&url, &StoreOptions::default()).unwrap();
    let layout = SaveLayout { dcn: 1, slice: 0, seed: 0, identity: serde_json::Value::Null, hf_source: None };
    let mut saver = StateSaver::new(
        storage.clone(),
        SaveOptions::default(),
        layout,
        "hf".into(),
        runtime.handle().clone(),
    )
    .unwrap();
    let saved = saver.start(trainer, 0).unwrap().wait().unwrap();
    let log = StoreCommitLog::new(storage.clone());
    let commit = runtime.block_on(finalize(&storage, &saved.spec, &[saved.report], &log)).unwrap();
    (runtime.block_on(Checkpoint::open(&storage, &commit, &Limits::default())).unwrap(), url)
}

/// Every tensor of a directory's safetensors files: name -> (dtype, shape, bytes).
fn tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            for (name, view) in safetensors::SafeTensors::deserialize(&bytes).unwrap().tensors() {
                out.insert(
                    name,
                    (format!("{:?}", view.dtype()), view.shape().to_vec(), view.data().to_vec()),
                );
            }
        }
    }
    out
}

/// The GRPO bundle's rollout at temperature 0 on (fsdp 2, tp 2), prompts of different lengths
/// left-padded into one batch, against transformers' `generate` of each prompt alone.
#[test]
fn greedy_rollout_generates_exactly_transformers_tokens() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    const PROMPT: usize = 8;
    for tie in ["tied", "untied"] {
        let first = open(&runtime, &fixture(&format!("{tie}-f32")));
        let (shape, _) = reference(&format!("{tie}-f32"));
        let rows = shape.prompts.len();
        let (rows_arg, prompt_arg, new_arg) =
            (rows.to_string(), PROMPT.to_string(), shape.new_tokens.to_string());
        let bundle = export(
            &tmp.path().join(tie),
            first.model(),
            "fsdp=2,tp=2",
            &[
                "--kind",
                "grpo",
                "--micro-batch",
                &rows_arg,
                "--prompt-len",
                &prompt_arg,
                "--max-new-tokens",
                &new_arg,
                "--logprob-chunk",
                "8",
            ],
        );
        let slice = worker::Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
        let rollout = slice.compile(&bundle, "rollout").unwrap();
        for dtype in ["f32", "bf16"] {
            let name = format!("{tie}-{dtype}");
            let model = open(&runtime, &fixture(&name));
            let weights =
                worker::hf::place_weights(&slice, bundle.manifest(), &model, runtime.handle()).unwrap();
            let (expected, _) = reference(&name);
            // Left-padded prompts, as the rollout takes them (docs/BUNDLE.md).
            let mut prompts = vec![0i32; rows * PROMPT];
            let mut lengths = Vec::new();
            for (row, prompt) in expected.prompts.iter().enumerate() {
                prompts[row * PROMPT + PROMPT - prompt.len()..(row + 1) * PROMPT].copy_from_slice(prompt);
                lengths.push(prompt.len() as i32);
            }
            let inputs = &rollout.spec().inputs;
            let n = bundle.manifest().params.len();
            let seeds = vec![7u32; rows];
            let uploaded = [
                slice.upload(&inputs[n], bytemuck::cast_slice(&prompts)).unwrap(),
                slice.upload(&inputs[n + 1], bytemuck::cast_slice(&lengths)).unwrap(),
                slice.upload(&inputs[n + 2], bytemuck::cast_slice(&seeds)).unwrap(),
                slice.scalar(&inputs[n + 3], 0.0f32.to_le_bytes()).unwrap(),
                slice.scalar(&inputs[n + 4], 1.0f32.to_le_bytes()).unwrap(),
                // No stop ids: transformers generated all 32 tokens too.
                slice
                    .upload(&inputs[n + 5], bytemuck::cast_slice(&[-1i32; bundle::STOP_IDS as usize]))
                    .unwrap(),
                slice.scalar(&inputs[n + 6], 0i32.to_le_bytes()).unwrap(),
            ];
            let mut args: Vec<Arg<'_>> = weights.iter().map(Arg::Borrow).collect();
            args.extend(uploaded.iter().map(Arg::Borrow));
            let out = rollout.run(args).unwrap();
            let tokens = slice.download(&rollout.spec().outputs[0], &out[0]).unwrap();
            let tokens: &[i32] = bytemuck::cast_slice(&tokens);
            let generated: Vec<Vec<i32>> = tokens.chunks(expected.new_tokens).map(|r| r.to_vec()).collect();
            assert_eq!(
                generated, expected.generated,
                "{name}: podctl's greedy tokens differ from transformers'"
            );
            println!(
                "{name}: {rows} prompts x {} greedy tokens equal transformers' generate",
                expected.new_tokens
            );
        }
    }
}

/// The Python of the reference venv, if it is installed.
fn reference_python() -> Option<PathBuf> {
    let python = support::root().join(".venv-hf/bin/python");
    python.exists().then_some(python)
}

/// Trains the sharded untied bf16 model a few steps, exports it, and has transformers load the
/// export and compute the logits of the same tokens.
#[test]
fn transformers_loads_a_trained_export_and_agrees_with_podctl() {
    let Some(python) = reference_python() else {
        println!("skipped: transformers is not installed here (.venv-hf/; scripts/setup-hf-reference.sh)");
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let model = open(&runtime, &fixture("untied-bf16"));
    let bundle = sft_bundle(&tmp.path().join("bundle"), model.model(), "fsdp=2,tp=2");
    let slice = worker::Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    let program = slice.compile(&bundle, "logits").unwrap();
    let mut trainer = Trainer::new(slice, &bundle).unwrap();
    worker::hf::load(&mut trainer, &model, 0, runtime.handle()).unwrap();

    // A token file within the model's 64-token vocabulary.
    let corpus: Vec<u16> = (0..4096u32).map(|i| ((i * 37 + i / 7) % 64) as u16).collect();
    let corpus_path = tmp.path().join("corpus.bin");
    std::fs::write(&corpus_path, bytemuck::cast_slice(&corpus)).unwrap();
    let config: data::DataConfig =
        serde_json::from_value(serde_json::json!({"kind": "tokens", "path": corpus_path, "dtype": "u16"}))
            .unwrap();
    let sft = worker::sft::Sft::from_loader(
        data::Loader::from_config(
            &config,
            data::BatchSpec::new(4, ROWS as usize, SEQ as usize).unwrap(),
            3,
            &data::LocalFiles,
        )
        .unwrap(),
    );
    let tokens = reference("untied-bf16").0.logit_tokens;
    let before = trainer_logits(&trainer, &program, &tokens);
    for step in 0..3 {
        run_step(&mut trainer, &sft, step, &[0], 2, 1e-2, Reduce::Alone).unwrap();
    }
    let ours = trainer_logits(&trainer, &program, &tokens);
    assert!(relative_error(&ours, &before) > 1e-3, "training changed the model");

    let (checkpoint, root) = save(&runtime, &trainer, &tmp.path().join("ckpt"));
    let out = tmp.path().join("export");
    let options = hf::export::ExportOptions { dtype: mesh::DType::Float32, ..Default::default() };
    runtime
        .block_on(hf::export::export_checkpoint(&checkpoint, &root, &out, Some(model.location()), &options))
        .unwrap();
    let tokens_path = tmp.path().join("tokens.json");
    std::fs::write(&tokens_path, serde_json::to_vec(&tokens).unwrap()).unwrap();
    let logits_path = tmp.path().join("theirs.f32");
    let status = Command::new(python)
        .arg(support::root().join("crates/hf/tests/fixtures/transformers_logits.py"))
        .args([&out, &tokens_path, &logits_path])
        .status()
        .unwrap();
    assert!(status.success(), "transformers did not load the export");
    let theirs: Vec<f32> = std::fs::read(&logits_path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let error = relative_error(&ours, &theirs);
    println!("after 3 steps: transformers' logits of the export within {error:.2e} of podctl's");
    assert!(error <= 1e-4, "transformers' logits of the export differ from podctl's by {error:.3e}");
}
