//! A checkpoint's model weights as one safetensors file, LoRA adapters merged into their base.
//!
//! A full fine-tuning checkpoint holds `params/<path>`: those are the weights. A LoRA checkpoint
//! holds the adapters `params/<path>.lora_a` `[L, in, r]` and `.lora_b` `[L, r, out]` and names
//! its frozen base in its metadata (`lora.base`, a checkpoint directory relative to the root,
//! with `rank`, `alpha` and `targets`); each target's weight is `W + (alpha / r) A @ B` layer by
//! layer, every other weight is the base's. Tensors are named by their path (`embed`,
//! `layers/q_proj`, ...) and stored in float32 or bfloat16 (rounded to nearest even).
//!
//! The file is written one tensor at a time (the header first: every size is known from the
//! manifests), so memory stays at about one tensor whatever the model. [`Weights`] is the
//! reader under it, merged and as float32, by tensor or a range of layers; the Hugging Face
//! export (`hf::export`) writes the same values under Hugging Face's names.

use crate::layout::parse_dir_name;
use crate::restore::Checkpoint;
use crate::{CheckpointError, Limits, Result, Storage, StoreCommitLog, StoreOptions};
use mesh::{DType, Region};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// LoRA settings as a checkpoint's metadata records them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraMetadata {
    /// Inner dimension of the adapters.
    pub rank: u64,
    /// The product is scaled by `alpha / rank`.
    pub alpha: f64,
    /// The projections carrying adapters.
    pub targets: Vec<String>,
    /// The base's checkpoint directory, relative to the checkpoint root.
    pub base: String,
}

impl LoraMetadata {
    /// The `lora` entry of a checkpoint's metadata, if it has one.
    pub fn of(checkpoint: &Checkpoint) -> Result<Option<Self>> {
        let Some(lora) = checkpoint.manifest().metadata.get("lora") else { return Ok(None) };
        let bad = |reason: &str| {
            CheckpointError::invalid(format!("metadata lora of {}", checkpoint.commit().dir()), reason)
        };
        let rank = lora
            .get("rank")
            .and_then(|v| v.as_u64())
            .filter(|&r| r > 0)
            .ok_or_else(|| bad("rank is not a positive integer"))?;
        let alpha = lora.get("alpha").and_then(|v| v.as_f64()).ok_or_else(|| bad("alpha is not a number"))?;
        let targets = lora
            .get("targets")
            .and_then(|v| v.as_array())
            .and_then(|a| a.iter().map(|t| t.as_str().map(String::from)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("targets is not a list of names"))?;
        let base = lora.get("base").and_then(|v| v.as_str()).ok_or_else(|| bad("base is missing"))?;
        Ok(Some(Self { rank, alpha, targets, base: base.to_string() }))
    }

    /// `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }
}

/// What [`export_weights`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportReport {
    /// Tensors written, in file order.
    pub tensors: Vec<(String, Vec<u64>)>,
    /// Bytes of the file.
    pub bytes: u64,
    /// The projections whose adapters were merged (empty for a full fine-tuning checkpoint).
    pub merged: Vec<String>,
}

/// One weight of the model: its path, shape and where its values come from.
struct Planned {
    path: String,
    shape: Vec<u64>,
    /// The array holding the weight (`params/<path>` or, for LoRA, `frozen/<path>` of the base).
    source: String,
    /// LoRA: the adapters to add, `(lora_a, lora_b)` arrays of the checkpoint.
    adapters: Option<(String, String)>,
}

/// Opens the LoRA base a checkpoint names, under `root_url`.
async fn open_base(root_url: &str, lora: &LoraMetadata) -> Result<Checkpoint> {
    let (parent, dir) = lora.base.rsplit_once('/').unwrap_or(("", &lora.base));
    let Some((step, save_id)) =
        parse_dir_name(dir).filter(|_| !parent.contains("..") && !parent.starts_with('/'))
    else {
        return Err(CheckpointError::invalid(
            "metadata lora.base",
            format!("'{}' is not <dir>/<step:012>-<save_id>", lora.base),
        ));
    };
    let url = match parent {
        "" => root_url.trim_end_matches('/').to_string(),
        parent => format!("{}/{parent}", root_url.trim_end_matches('/')),
    };
    let storage = Storage::open(&url, &StoreOptions::default())?;
    let commit = crate::CommitLog::list(&StoreCommitLog::new(storage.clone()))
        .await?
        .into_iter()
        .find(|c| c.step == step && c.save_id == save_id)
        .ok_or_else(|| CheckpointError::NotFound {
            what: format!("the LoRA base {}", lora.base),
            hint: format!("it is not committed under {url}"),
        })?;
    Checkpoint::open(&storage, &commit, &Limits::default()).await
}

/// A checkpoint's model weights as float32, LoRA adapters merged into their base on read: what
/// every export writes, under whatever names and layout.
pub struct Weights {
    checkpoint: Checkpoint,
    /// LoRA: the frozen base the checkpoint names, and its settings.
    base: Option<(Checkpoint, LoraMetadata)>,
    planned: Vec<Planned>,
}

impl Weights {
    /// The weights of `checkpoint` (committed under `root_url`, where a LoRA checkpoint's base
    /// is found).
    pub async fn open(checkpoint: &Checkpoint, root_url: &str) -> Result<Self> {
        let lora = LoraMetadata::of(checkpoint)?;
        let base = match lora {
            Some(lora) => Some((open_base(root_url, &lora).await?, lora)),
            None => None,
        };
        let weights = base.as_ref().map_or(checkpoint, |(base, _)| base);
        let prefix = if base.is_some() { "frozen/" } else { "params/" };
        let mut planned = Vec::new();
        for array in &weights.manifest().arrays {
            let Some(path) = array.name.strip_prefix(prefix) else { continue };
            let adapters = base.as_ref().and_then(|_| {
                let a = format!("params/{path}.lora_a");
                let b = format!("params/{path}.lora_b");
                (checkpoint.manifest().array(&a).is_some() && checkpoint.manifest().array(&b).is_some())
                    .then_some((a, b))
            });
            planned.push(Planned {
                path: path.to_string(),
                shape: array.shape.clone(),
                source: array.name.clone(),
                adapters,
            });
        }
        if planned.is_empty() {
            return Err(CheckpointError::invalid(
                format!("checkpoint {}", checkpoint.commit().dir()),
                format!("it holds no {prefix}* arrays to export"),
            ));
        }
        let this = Self { checkpoint: checkpoint.clone(), base, planned };
        if let Some((_, lora)) = &this.base {
            let merged = this.merged();
            let found: std::collections::BTreeSet<&str> =
                merged.iter().map(|p| p.rsplit('/').next().unwrap_or(p)).collect();
            if found.len() != lora.targets.len() {
                return Err(CheckpointError::invalid(
                    format!("checkpoint {}", checkpoint.commit().dir()),
                    format!(
                        "its metadata names LoRA targets {:?} but adapters of {found:?} pair with the base",
                        lora.targets
                    ),
                ));
            }
        }
        Ok(this)
    }

    /// Every weight's path (`embed`, `layers/q_proj`, ...) and shape, in the checkpoint's order.
    pub fn tensors(&self) -> Vec<(String, Vec<u64>)> {
        self.planned.iter().map(|p| (p.path.clone(), p.shape.clone())).collect()
    }

    /// The weights whose LoRA adapters are merged on read (empty for full fine-tuning).
    pub fn merged(&self) -> Vec<String> {
        self.planned.iter().filter(|p| p.adapters.is_some()).map(|p| p.path.clone()).collect()
    }

    /// The LoRA settings merged, if any.
    pub fn lora(&self) -> Option<&LoraMetadata> {
        self.base.as_ref().map(|(_, lora)| lora)
    }

    /// The checkpoint the weights belong to.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// Weight `path` as float32, whole or (`layers`) only those entries of its first axis: a
    /// stacked weight a few layers at a time keeps memory at that many layers.
    pub async fn read(&self, path: &str, layers: Option<std::ops::Range<u64>>) -> Result<Vec<f32>> {
        let p = self.planned.iter().find(|p| p.path == path).ok_or_else(|| CheckpointError::NotFound {
            what: format!("weight '{path}' in checkpoint {}", self.checkpoint.commit().dir()),
            hint: "list the arrays with `podctl ckpt show`".into(),
        })?;
        let cut = |shape: &[u64]| -> Result<(Region, Vec<u64>)> {
            let mut ranges: Vec<std::ops::Range<u64>> = shape.iter().map(|&d| 0..d).collect();
            let mut cut = shape.to_vec();
            if let Some(layers) = &layers {
                if shape.is_empty() || layers.end > shape[0] || layers.start >= layers.end {
                    return Err(CheckpointError::invalid(
                        format!("layers {layers:?} of '{path}'"),
                        format!("its shape is {shape:?}"),
                    ));
                }
                ranges[0] = layers.clone();
                cut[0] = layers.end - layers.start;
            }
            Ok((Region::new(ranges), cut))
        };
        let weights = self.base.as_ref().map_or(&self.checkpoint, |(base, _)| base);
        let (region, shape) = cut(&p.shape)?;
        let mut values = read_f32(weights, &p.source, &region).await?;
        if let (Some((a, b)), Some((_, lora))) = (&p.adapters, &self.base) {
            let a_full = &self.checkpoint.manifest().array(a).expect("planned from the manifest").shape;
            let b_full = &self.checkpoint.manifest().array(b).expect("planned from the manifest").shape;
            let (a_region, a_shape) = cut(a_full)?;
            let (b_region, b_shape) = cut(b_full)?;
            let a_values = read_f32(&self.checkpoint, a, &a_region).await?;
            let b_values = read_f32(&self.checkpoint, b, &b_region).await?;
            merge(&mut values, &shape, &a_values, &a_shape, &b_values, &b_shape, lora.scale() as f32)
                .map_err(|reason| CheckpointError::invalid(format!("adapters of {path}"), reason))?;
        }
        Ok(values)
    }
}

/// Writes the weights of `checkpoint` (committed under `root_url`) to `out` as safetensors in
/// `dtype` (float32 or bfloat16), merging LoRA adapters into their base.
pub async fn export_weights(
    checkpoint: &Checkpoint,
    root_url: &str,
    out: &Path,
    dtype: DType,
) -> Result<ExportReport> {
    if !matches!(dtype, DType::Float32 | DType::Bfloat16) {
        return Err(CheckpointError::invalid("export dtype", format!("{dtype}: write float32 or bfloat16")));
    }
    let weights = Weights::open(checkpoint, root_url).await?;
    let tensors = weights.tensors();

    // The header: every tensor's dtype, shape and byte range.
    let mut header = BTreeMap::new();
    let mut offset = 0u64;
    let size = dtype.size() as u64;
    for (path, shape) in &tensors {
        let bytes = shape.iter().product::<u64>() * size;
        header.insert(
            path.clone(),
            serde_json::json!({"dtype": if dtype == DType::Float32 { "F32" } else { "BF16" }, "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut meta = serde_json::Map::new();
    meta.insert("format".into(), "pt".into());
    meta.insert("podctl_checkpoint".into(), checkpoint.commit().dir().into());
    if let Some(lora) = weights.lora() {
        meta.insert(
            "podctl_lora_merged".into(),
            format!("rank {} alpha {} into {}", lora.rank, lora.alpha, lora.base).into(),
        );
    }
    header.insert("__metadata__".to_string(), serde_json::Value::Object(meta));
    let mut text = serde_json::to_vec(&header).expect("headers serialize");
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let io = |e: std::io::Error| {
        CheckpointError::invalid(format!("export output {}", out.display()), e.to_string())
    };
    let tmp = out.with_extension("safetensors.tmp");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    file.write_all(&(text.len() as u64).to_le_bytes()).map_err(io)?;
    file.write_all(&text).map_err(io)?;

    for (path, _) in &tensors {
        let values = weights.read(path, None).await?;
        match dtype {
            DType::Float32 => {
                for v in &values {
                    file.write_all(&v.to_le_bytes()).map_err(io)?;
                }
            }
            _ => {
                for v in &values {
                    file.write_all(&f32_to_bf16(*v).to_le_bytes()).map_err(io)?;
                }
            }
        }
    }
    file.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::rename(&tmp, out).map_err(io)?;
    Ok(ExportReport { tensors, bytes: 8 + text.len() as u64 + offset, merged: weights.merged() })
}

/// `region` of array `name` of `checkpoint` as float32.
async fn read_f32(checkpoint: &Checkpoint, name: &str, region: &Region) -> Result<Vec<f32>> {
    let dtype =
        checkpoint.manifest().array(name).map(|a| a.dtype).ok_or_else(|| CheckpointError::NotFound {
            what: format!("array '{name}' in checkpoint {}", checkpoint.commit().dir()),
            hint: "list the arrays with `podctl ckpt show`".into(),
        })?;
    let bytes = checkpoint.read_region(name, region).await?;
    match dtype {
        DType::Float32 => {
            Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        }
        DType::Bfloat16 => Ok(bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect()),
        other => Err(CheckpointError::invalid(
            format!("array {name}"),
            format!("{other} weights cannot be exported; float32 and bfloat16 can"),
        )),
    }
}

/// `w[l] += scale * a[l] @ b[l]` for stacked `w` `[L, in, out]`, `a` `[L, in, r]`, `b` `[L, r, out]`.
fn merge(
    w: &mut [f32],
    w_shape: &[u64],
    a: &[f32],
    a_shape: &[u64],
    b: &[f32],
    b_shape: &[u64],
    scale: f32,
) -> std::result::Result<(), String> {
    let [layers, rows, cols] = *w_shape else {
        return Err(format!("the base weight is {w_shape:?}, not [layers, in, out]"));
    };
    let rank = a_shape.get(2).copied().unwrap_or(0);
    if a_shape != [layers, rows, rank] || b_shape != [layers, rank, cols] {
        return Err(format!("A {a_shape:?} and B {b_shape:?} do not pair with the weight {w_shape:?}"));
    }
    let (rows, cols, rank) = (rows as usize, cols as usize, rank as usize);
    for l in 0..layers as usize {
        let w = &mut w[l * rows * cols..(l + 1) * rows * cols];
        let a = &a[l * rows * rank..(l + 1) * rows * rank];
        let b = &b[l * rank * cols..(l + 1) * rank * cols];
        for i in 0..rows {
            let row = &mut w[i * cols..(i + 1) * cols];
            for k in 0..rank {
                let coefficient = scale * a[i * rank + k];
                for (w, b) in row.iter_mut().zip(&b[k * cols..(k + 1) * cols]) {
                    *w += coefficient * b;
                }
            }
        }
    }
    Ok(())
}

/// Rounds to the nearest bfloat16, ties to even (NaN stays NaN).
pub fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    ((bits + rounding) >> 16) as u16
}

/// One tensor of a safetensors file: name, shape, values as float32.
pub type NamedTensor = (String, Vec<u64>, Vec<f32>);

/// Reads a safetensors file written by [`export_weights`]: each tensor's name, shape and
/// float32 values (bfloat16 widened), in file order.
pub fn read_safetensors(path: &Path) -> Result<Vec<NamedTensor>> {
    let bad =
        |reason: String| CheckpointError::invalid(format!("safetensors file {}", path.display()), reason);
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let n = bytes
        .get(..8)
        .map(|h| u64::from_le_bytes(h.try_into().expect("8 bytes")))
        .ok_or_else(|| bad("shorter than its header size".into()))?;
    let end = 8usize
        .checked_add(n as usize)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad(format!("header of {n} bytes overruns the file")))?;
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..end]).map_err(|e| bad(e.to_string()))?;
    let data = &bytes[end..];
    let mut tensors: Vec<(u64, String, Vec<u64>, Vec<f32>)> = Vec::new();
    for (name, entry) in header.into_iter().filter(|(name, _)| name != "__metadata__") {
        let shape: Vec<u64> =
            serde_json::from_value(entry["shape"].clone()).map_err(|e| bad(format!("{name}: {e}")))?;
        let [start, stop]: [u64; 2] =
            serde_json::from_value(entry["data_offsets"].clone()).map_err(|e| bad(format!("{name}: {e}")))?;
        let raw = data
            .get(start as usize..stop as usize)
            .ok_or_else(|| bad(format!("{name}: bytes {start}..{stop} overrun the file")))?;
        let values = match entry["dtype"].as_str() {
            Some("F32") => {
                raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            }
            Some("BF16") => raw
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect::<Vec<_>>(),
            other => return Err(bad(format!("{name}: dtype {other:?} is not F32 or BF16"))),
        };
        if values.len() as u64 != shape.iter().product::<u64>() {
            return Err(bad(format!("{name}: {} values for shape {shape:?}", values.len())));
        }
        tensors.push((start, name, shape, values));
    }
    tensors.sort_by_key(|t| t.0);
    Ok(tensors.into_iter().map(|(_, name, shape, values)| (name, shape, values)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_the_scaled_product_layer_by_layer() {
        // Two layers of a 2x3 weight, rank 1: w[l] += 2 * a[l] b[l].
        let mut w = vec![0.0f32; 12];
        let a = [1.0, 2.0, 0.0, -1.0];
        let b = [1.0, 0.0, 3.0, 1.0, 1.0, 1.0];
        merge(&mut w, &[2, 2, 3], &a, &[2, 2, 1], &b, &[2, 1, 3], 2.0).unwrap();
        assert_eq!(w, [2.0, 0.0, 6.0, 4.0, 0.0, 12.0, 0.0, 0.0, 0.0, -2.0, -2.0, -2.0]);
        assert!(
            merge(&mut w, &[2, 2, 3], &a, &[2, 2, 1], &b, &[2, 3, 1], 1.0)
                .unwrap_err()
                .contains("do not pair")
        );
    }

    #[test]
    fn bfloat16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to the even 1.0.
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert!(f32::from_bits((f32_to_bf16(f32::NAN) as u32) << 16).is_nan());
    }
}
