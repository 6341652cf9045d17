//! Broken model directories: each refused when it is opened, before any tensor data is read,
//! with a message naming the file and the tensor or field.

use crate::common::{copy, open};
use serde_json::{Value, json};
use std::path::Path;

/// Rewrites a safetensors file's header with `edit` (the data stays as it was).
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

fn edit_config(dir: &Path, field: &str, value: Value) {
    let path = dir.join("config.json");
    let mut config: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config.insert(field.into(), value);
    std::fs::write(path, serde_json::to_vec(&config).unwrap()).unwrap();
}

async fn refused(dir: &Path) -> String {
    open(dir).await.expect_err("a broken model directory opens").to_string()
}

fn assert_names(error: &str, file: &str, what: &str) {
    assert!(error.contains(file) && error.contains(what), "expected {file} and '{what}' in: {error}");
}

#[tokio::test]
async fn an_unsupported_architecture_is_refused_naming_what_is_supported() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("tied-f32", tmp.path());
    edit_config(&dir, "architectures", json!(["LlamaForCausalLM"]));
    let e = refused(&dir).await;
    assert_names(
        &e,
        "config.json",
        "architectures = [\"LlamaForCausalLM\"] is not supported; podctl loads Qwen3ForCausalLM",
    );
}

#[tokio::test]
async fn absurd_sizes_in_config_json_are_refused_before_anything_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("tied-f32", tmp.path());
    edit_config(&dir, "vocab_size", json!(1_000_000_000_000u64));
    // Without weights at all: the configuration alone is refused.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let e = refused(&dir).await;
    assert_names(
        &e,
        "config.json",
        "vocab_size: 1000000000000 is out of range: it must be between 1 and 4194304",
    );
    edit_config(&dir, "vocab_size", json!(64));
    edit_config(&dir, "num_hidden_layers", json!(1024));
    edit_config(&dir, "hidden_size", json!(65536));
    edit_config(&dir, "intermediate_size", json!(1 << 20));
    let e = refused(&dir).await;
    assert_names(&e, "config.json", "over the limit of 10000000000000");
}

#[tokio::test]
async fn a_missing_shard_is_named_with_a_tensor_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("untied-bf16", tmp.path());
    std::fs::remove_file(dir.join("model-00003-of-00004.safetensors")).unwrap();
    let e = refused(&dir).await;
    assert_names(
        &e,
        "model-00003-of-00004.safetensors",
        "missing; model.safetensors.index.json names it for tensor model.layers.",
    );
}

#[tokio::test]
async fn missing_weights_say_what_is_expected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("tied-f32", tmp.path());
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let e = refused(&dir).await;
    assert_names(
        &e,
        "model.safetensors",
        "missing; the weights are model.safetensors, or shards listed in model.safetensors.index.json",
    );
    std::fs::remove_file(dir.join("config.json")).unwrap();
    assert_names(&refused(&dir).await, "config.json", "missing");
}

#[tokio::test]
async fn a_tensor_of_the_wrong_shape_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("tied-f32", tmp.path());
    // The same bytes declared [in, out] instead of nn.Linear's [out, in].
    edit_header(&dir.join("model.safetensors"), |h| {
        h["model.layers.1.self_attn.q_proj.weight"]["shape"] = json!([32, 64]);
    });
    let e = refused(&dir).await;
    assert_names(
        &e,
        "model.safetensors",
        "tensor model.layers.1.self_attn.q_proj.weight has shape [32, 64], but config.json's dimensions make it [64, 32]",
    );
}

#[tokio::test]
async fn an_unknown_dtype_is_named_with_its_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("tied-f32", tmp.path());
    edit_header(&dir.join("model.safetensors"), |h| h["model.norm.weight"]["dtype"] = json!("F7"));
    let e = refused(&dir).await;
    assert_names(&e, "model.safetensors", "tensor model.norm.weight: unknown variant `F7`");
    let dir = copy("tied-bf16", tmp.path());
    // A known safetensors dtype of the right size that is not a float: I16 for BF16.
    edit_header(&dir.join("model.safetensors"), |h| h["model.norm.weight"]["dtype"] = json!("I16"));
    let e = refused(&dir).await;
    assert_names(
        &e,
        "model.safetensors",
        "tensor model.norm.weight: dtype I16 is not a float type podctl loads weights from",
    );
}

#[tokio::test]
async fn a_header_claiming_more_bytes_than_the_file_holds_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("untied-f32", tmp.path());
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let e = refused(&dir).await;
    assert_names(&e, "model.safetensors", "bytes of tensor data");
    assert!(e.contains("but the file holds"), "{e}");
    // A header length past the end of the file: refused before reading that many bytes.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..8].copy_from_slice(&(50_000_000u64).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    assert_names(
        &refused(&dir).await,
        "model.safetensors",
        "its header claims 50000000 bytes but the file holds",
    );
}

#[tokio::test]
async fn a_tensor_podctl_would_drop_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("tied-f32", tmp.path());
    // A bias podctl's attention does not have, appended to the file.
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data_len = (bytes.len() - 8 - n) as u64;
    edit_header(&path, |h| {
        h.insert(
            "model.layers.0.self_attn.q_proj.bias".into(),
            json!({"dtype": "F32", "shape": [64], "data_offsets": [data_len, data_len + 256]}),
        );
    });
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend([0u8; 256]);
    std::fs::write(&path, bytes).unwrap();
    let e = refused(&dir).await;
    assert_names(
        &e,
        "model.safetensors",
        "tensor model.layers.0.self_attn.q_proj.bias is not part of a Qwen3ForCausalLM",
    );
}

#[tokio::test]
async fn an_index_and_shards_that_disagree_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("untied-bf16", tmp.path());
    let path = dir.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let shards: Vec<String> =
        index["weight_map"].as_object().unwrap().values().map(|v| v.as_str().unwrap().to_string()).collect();
    let other = shards
        .iter()
        .find(|s| *s != index["weight_map"]["model.norm.weight"].as_str().unwrap())
        .unwrap()
        .clone();
    index["weight_map"]["model.norm.weight"] = json!(other);
    std::fs::write(&path, serde_json::to_vec(&index).unwrap()).unwrap();
    let e = refused(&dir).await;
    assert!(e.contains("model.norm.weight"), "{e}");
}
