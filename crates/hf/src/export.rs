//! A podctl checkpoint as a Hugging Face model directory that transformers'
//! `AutoModelForCausalLM.from_pretrained` loads with no missing or unexpected keys.
//!
//! ```text
//! <out>/config.json                        the source's, with the export's dtype (or made from the model)
//! <out>/model.safetensors                  one file when the weights fit in one shard, else
//! <out>/model-00001-of-0000N.safetensors   shards of at most `max_shard_bytes` (5 GB, as
//! <out>/model.safetensors.index.json         transformers shards) and their index
//! <out>/generation_config.json             the source's, or the config's token ids
//! <out>/tokenizer.json, ...                the source's tokenizer files, copied
//! ```
//!
//! Weights are read through [`checkpoint::export::Weights`] (LoRA adapters merged into their
//! base), one layer of one weight at a time, and written in bfloat16 (rounded to nearest even)
//! or float32. The directory is written under a temporary name and renamed into place last, so
//! a failed export leaves nothing that looks like a model.

use crate::config::{CONFIG_FILE, synthesize};
use crate::header::{INDEX_FILE, SINGLE_FILE, write_header};
use crate::model::read_config;
use crate::names::{self, HfTensor};
use crate::source::Location;
use crate::{HfError, Result};
use bundle::ModelConfig;
use checkpoint::Checkpoint;
use checkpoint::export::{Weights, f32_to_bf16};
use mesh::DType;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The generation settings file.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// The tokenizer files copied from the source directory when it has them.
pub const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
];
/// Largest tokenizer or generation file copied (Qwen3's tokenizer.json is 11 MB).
pub const MAX_COPIED_BYTES: u64 = 256 << 20;
/// transformers' default shard size (`max_shard_size="5GB"`, decimal).
pub const DEFAULT_SHARD_BYTES: u64 = 5_000_000_000;

/// How to export.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    /// `bfloat16` (the default, what Qwen3 checkpoints hold) or `float32`.
    pub dtype: DType,
    /// Largest shard file, in bytes of tensor data.
    pub max_shard_bytes: u64,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self { dtype: DType::Bfloat16, max_shard_bytes: DEFAULT_SHARD_BYTES }
    }
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportReport {
    /// Weight files and their sizes.
    pub files: Vec<(String, u64)>,
    /// Tensors written.
    pub tensors: usize,
    /// Weights whose LoRA adapters were merged.
    pub merged: Vec<String>,
    /// Files copied from the source directory (tokenizer, generation config).
    pub copied: Vec<String>,
}

/// The model a checkpoint records (`metadata.model`, written by podctl's saves and imports).
pub fn recorded_model(checkpoint: &Checkpoint) -> Result<Option<ModelConfig>> {
    let Some(value) = checkpoint.manifest().metadata.get("model") else { return Ok(None) };
    serde_json::from_value(value.clone()).map(Some).map_err(|e| {
        HfError::invalid(format!("checkpoint {} metadata.model", checkpoint.commit().dir()), e.to_string())
    })
}

/// The Hugging Face directory a checkpoint was imported from (`metadata.hf.source`), if any.
pub fn recorded_source(checkpoint: &Checkpoint) -> Option<String> {
    checkpoint.manifest().metadata.get("hf")?.get("source")?.as_str().map(String::from)
}

/// Writes `checkpoint` (committed under `root_url`) as a Hugging Face directory `out`, which
/// must not exist or be empty. `source` is the model directory the job started from: its
/// `config.json` (kept, with the export's dtype), `generation_config.json` and tokenizer files
/// are carried over. Without one the configuration is made from the model the checkpoint
/// records.
pub async fn export_checkpoint(
    checkpoint: &Checkpoint,
    root_url: &str,
    out: &Path,
    source: Option<&Location>,
    options: &ExportOptions,
) -> Result<ExportReport> {
    if !matches!(options.dtype, DType::Float32 | DType::Bfloat16) {
        return Err(HfError::Mismatch(format!("export dtype {}: write float32 or bfloat16", options.dtype)));
    }
    let dir = checkpoint.commit().dir();
    let source_config = match source {
        Some(location) => Some(read_config(location).await?.0),
        None => None,
    };
    let model = match (recorded_model(checkpoint)?, &source_config) {
        (Some(model), _) => model,
        (None, Some(config)) => config.model.clone(),
        (None, None) => {
            return Err(HfError::Mismatch(format!(
                "checkpoint {dir} records no model (metadata.model); pass the Hugging Face directory the job \
                 started from, whose config.json describes it"
            )));
        }
    };
    model
        .check()
        .map_err(|(field, reason)| HfError::Mismatch(format!("checkpoint {dir}: model.{field}: {reason}")))?;
    let config_doc = match &source_config {
        Some(config) => config.for_export(&model, options.dtype)?,
        None => synthesize(&model, options.dtype),
    };

    let weights = Weights::open(checkpoint, root_url).await?;
    let held = weights.tensors();
    let wanted: Vec<(String, Vec<u64>)> =
        model.params().into_iter().map(|p| (p.path.to_string(), p.shape)).collect();
    if held != wanted {
        let differ = wanted.iter().find(|w| !held.contains(w)).or(held.iter().find(|h| !wanted.contains(h)));
        return Err(HfError::Mismatch(format!(
            "checkpoint {dir} holds weights {} that its model ({}) does not have as such; export the checkpoint of this model",
            differ.map_or("in another order".to_string(), |(p, s)| format!("'{p}' {s:?}")),
            model.preset
        )));
    }

    let staging = staging_dir(out)?;
    let written = async {
        let tensors = names::hf_tensors(&model);
        let shards = pack(&tensors, options.dtype, options.max_shard_bytes);
        let count = shards.len();
        let mut files = Vec::new();
        let mut weight_map = serde_json::Map::new();
        let mut total = 0u64;
        for (i, shard) in shards.iter().enumerate() {
            let name = if count == 1 {
                SINGLE_FILE.to_string()
            } else {
                format!("model-{:05}-of-{count:05}.safetensors", i + 1)
            };
            let bytes = write_shard(&weights, &staging.join(&name), shard, options.dtype).await?;
            for t in shard {
                weight_map.insert(t.name.clone(), Value::String(name.clone()));
                total += tensor_bytes(t, options.dtype);
            }
            files.push((name, bytes));
        }
        if count > 1 {
            let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
            write_json(&staging.join(INDEX_FILE), &index)?;
        }
        write_json(&staging.join(CONFIG_FILE), &Value::Object(config_doc.clone()))?;
        let mut copied = Vec::new();
        let generation = match source {
            Some(location) => location.read_small(GENERATION_CONFIG_FILE, MAX_COPIED_BYTES).await?,
            None => None,
        };
        match generation {
            Some(bytes) => {
                write_file(&staging.join(GENERATION_CONFIG_FILE), &bytes)?;
                copied.push(GENERATION_CONFIG_FILE.to_string());
            }
            None => write_json(&staging.join(GENERATION_CONFIG_FILE), &generation_config(&config_doc))?,
        }
        if let Some(location) = source {
            for file in TOKENIZER_FILES {
                if let Some(bytes) = location.read_small(file, MAX_COPIED_BYTES).await? {
                    write_file(&staging.join(file), &bytes)?;
                    copied.push(file.to_string());
                }
            }
        }
        Ok::<_, HfError>(ExportReport { files, tensors: tensors.len(), merged: weights.merged(), copied })
    }
    .await;
    let report = match written {
        Ok(report) => report,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    if out.exists() {
        std::fs::remove_dir(out).map_err(|e| HfError::io(out.display(), e))?;
    }
    std::fs::rename(&staging, out).map_err(|e| HfError::io(out.display(), e))?;
    Ok(report)
}

/// A fresh directory beside `out` to write into; `out` must not exist or be empty.
fn staging_dir(out: &Path) -> Result<PathBuf> {
    if let Ok(mut entries) = std::fs::read_dir(out)
        && entries.next().is_some()
    {
        return Err(HfError::invalid(
            out.display().to_string(),
            "exists and is not empty; export into a new directory (nothing was written)",
        ));
    }
    let name = out.file_name().map_or("export".into(), |n| n.to_string_lossy().into_owned());
    let staging = out.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| HfError::io(staging.display(), e))?;
    Ok(staging)
}

fn tensor_bytes(t: &HfTensor, dtype: DType) -> u64 {
    t.shape.iter().product::<u64>() * dtype.size() as u64
}

/// Tensors in order, cut into shards of at most `max` bytes (a larger tensor gets one alone),
/// as transformers' `save_pretrained` cuts them.
fn pack(tensors: &[HfTensor], dtype: DType, max: u64) -> Vec<Vec<HfTensor>> {
    let mut shards: Vec<Vec<HfTensor>> = vec![Vec::new()];
    let mut size = 0u64;
    for t in tensors {
        let bytes = tensor_bytes(t, dtype);
        if size > 0 && size + bytes > max {
            shards.push(Vec::new());
            size = 0;
        }
        shards.last_mut().expect("one shard at least").push(t.clone());
        size += bytes;
    }
    shards
}

/// Writes one shard: the header, then each tensor from the checkpoint, one layer at a time.
async fn write_shard(weights: &Weights, path: &Path, tensors: &[HfTensor], dtype: DType) -> Result<u64> {
    let st_dtype = if dtype == DType::Float32 { safetensors::Dtype::F32 } else { safetensors::Dtype::BF16 };
    let header: Vec<(String, safetensors::Dtype, Vec<u64>)> =
        tensors.iter().map(|t| (t.name.clone(), st_dtype, t.shape.clone())).collect();
    let header = write_header(&header)?;
    let io = |e: std::io::Error| HfError::io(path.display(), e);
    let mut file = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path).map_err(io)?);
    file.write_all(&header).map_err(io)?;
    let mut bytes = header.len() as u64;
    for t in tensors {
        let layers = t.layer.map(|l| l..l + 1);
        let values = weights.read(t.mapping.path, layers).await?;
        let values = if t.mapping.transposed { transpose(&values, &t.shape) } else { values };
        let mut out = Vec::with_capacity(values.len() * dtype.size());
        match dtype {
            DType::Float32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            _ => values.iter().for_each(|v| out.extend_from_slice(&f32_to_bf16(*v).to_le_bytes())),
        }
        file.write_all(&out).map_err(io)?;
        bytes += out.len() as u64;
    }
    file.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    Ok(bytes)
}

/// podctl's `[in, out]` block as Hugging Face's `[out, in]` (`hf_shape`).
fn transpose(values: &[f32], hf_shape: &[u64]) -> Vec<f32> {
    let (rows, cols) = (hf_shape[0] as usize, hf_shape[1] as usize);
    let mut out = vec![0.0f32; values.len()];
    // values is [cols, rows]: out[r][c] = values[c][r].
    const TILE: usize = 32;
    for c0 in (0..cols).step_by(TILE) {
        for r0 in (0..rows).step_by(TILE) {
            for c in c0..(c0 + TILE).min(cols) {
                for r in r0..(r0 + TILE).min(rows) {
                    out[r * cols + c] = values[c * rows + r];
                }
            }
        }
    }
    out
}

/// `generation_config.json` from a configuration's token ids (a model podctl initialized, or a
/// source without one).
fn generation_config(config: &serde_json::Map<String, Value>) -> Value {
    let mut out = serde_json::Map::new();
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        if let Some(v) = config.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    Value::Object(out)
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(value).expect("JSON values serialize");
    text.push(b'\n');
    write_file(path, &text)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e: std::io::Error| HfError::io(path.display(), e);
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_pack_in_order_under_the_limit() {
        let model = bundle::preset("tiny").unwrap();
        let tensors = names::hf_tensors(&model);
        let total: u64 = tensors.iter().map(|t| tensor_bytes(t, DType::Float32)).sum();
        assert_eq!(pack(&tensors, DType::Float32, total).len(), 1);
        let shards = pack(&tensors, DType::Float32, total / 3);
        assert!(shards.len() >= 3, "{}", shards.len());
        let flat: Vec<&str> = shards.iter().flatten().map(|t| t.name.as_str()).collect();
        assert_eq!(flat, tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>());
        for shard in &shards {
            let bytes: u64 = shard.iter().map(|t| tensor_bytes(t, DType::Float32)).sum();
            assert!(bytes <= total / 3 || shard.len() == 1);
        }
    }

    #[test]
    fn transposes_back_to_out_in() {
        // podctl [in=2, out=3] -> HF [3, 2].
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(transpose(&values, &[3, 2]), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }
}
