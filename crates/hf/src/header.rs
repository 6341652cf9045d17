//! A safetensors file's header, read from its bytes alone, and `model.safetensors.index.json`.
//!
//! A safetensors file is an 8-byte little-endian header length `n`, `n` bytes of JSON (each
//! tensor's dtype, shape and `data_offsets` into the data that follows, plus optional string
//! `__metadata__`), then the data. The header is parsed with the `safetensors` crate's own types
//! ([`safetensors::tensor::TensorInfo`] per tensor, [`safetensors::tensor::Metadata`] for the
//! whole), which check that the offsets tile the data without gaps and that every tensor's byte
//! count is its shape times its dtype's size. What the crate checks against a whole file in
//! memory, the data's length, is checked here against the file's size, so a shard is never read
//! whole just to learn what it holds.

use crate::{HfError, Result};
use safetensors::tensor::{Metadata, TensorInfo};
use serde_json::Value;
use std::collections::BTreeMap;
use std::ops::Range;

/// Largest header accepted, in bytes: the `safetensors` crate's own limit.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
/// The single-file weights' name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of sharded weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Largest index read, in bytes (Qwen3-235B's is about 2 MiB).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// The element types podctl reads weights from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceDType {
    /// `F32`.
    F32,
    /// `BF16`.
    Bf16,
    /// `F16` (converted on the way in).
    F16,
}

impl SourceDType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            SourceDType::F32 => 4,
            SourceDType::Bf16 | SourceDType::F16 => 2,
        }
    }

    /// The safetensors name.
    pub fn name(self) -> &'static str {
        match self {
            SourceDType::F32 => "F32",
            SourceDType::Bf16 => "BF16",
            SourceDType::F16 => "F16",
        }
    }
}

/// One tensor of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Its element type.
    pub dtype: SourceDType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its bytes, as absolute offsets in the file.
    pub range: Range<u64>,
}

/// A parsed header.
#[derive(Debug, Clone, PartialEq)]
pub struct FileHeader {
    /// Where the data starts in the file (8 + header length).
    pub data_start: u64,
    /// The tensors by name.
    pub tensors: BTreeMap<String, TensorEntry>,
    /// `__metadata__`, if any.
    pub metadata: BTreeMap<String, String>,
}

/// The header length a file's first 8 bytes declare, checked against the file's size before
/// anything of that length is read.
pub fn header_len(first: &[u8], file_size: u64, file: &str) -> Result<u64> {
    let bad = |reason: String| HfError::invalid(file, reason);
    let Some(prefix) = first.get(..8) else {
        return Err(bad(format!(
            "{file_size} bytes is too short for a safetensors file (8-byte header length)"
        )));
    };
    let n = u64::from_le_bytes(prefix.try_into().expect("8 bytes"));
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "its header claims {n} bytes, over the format's limit of {MAX_HEADER_BYTES}"
        )));
    }
    if n > file_size.saturating_sub(8) {
        return Err(bad(format!(
            "its header claims {n} bytes but the file holds {file_size} in all; the file is truncated or not safetensors"
        )));
    }
    Ok(n)
}

/// Parses a header's JSON (`text`, the `n` bytes after the length) of a file of `file_size`
/// bytes: every tensor's dtype, shape and offsets, checked by the `safetensors` crate, and the
/// data's length against what the file holds.
pub fn parse_header(text: &[u8], file_size: u64, file: &str) -> Result<FileHeader> {
    let bad = |reason: String| HfError::invalid(file, reason);
    let data_start = 8 + text.len() as u64;
    let raw: BTreeMap<String, Value> =
        serde_json::from_slice(text).map_err(|e| bad(format!("its header is not a JSON object: {e}")))?;
    let mut metadata = BTreeMap::new();
    let mut infos = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        if name == "__metadata__" {
            metadata = serde_json::from_value(value)
                .map_err(|e| bad(format!("__metadata__ is not a map of strings: {e}")))?;
            continue;
        }
        let info: TensorInfo = serde_json::from_value(value).map_err(|e| {
            bad(format!("tensor {name}: {e} (dtypes are the safetensors names, e.g. F32, BF16, F16)"))
        })?;
        infos.push((name, info));
    }
    infos.sort_by_key(|(_, info)| info.data_offsets);
    // The crate's own checks: offsets contiguous from 0, each span its shape times its dtype.
    let names: Vec<String> = infos.iter().map(|(name, _)| name.clone()).collect();
    let checked = Metadata::new(None, infos.clone()).map_err(|e| {
        let culprit = names
            .iter()
            .zip(&infos)
            .find(|(_, (_, info))| span_disagrees(info))
            .map_or(String::new(), |(name, _)| format!("tensor {name}: "));
        bad(format!("{culprit}its header is inconsistent: {e}"))
    })?;
    let data_len = checked.data_len() as u64;
    let available = file_size - data_start;
    if data_len != available {
        let last = names.last().map_or("its tensors".to_string(), |n| format!("tensor {n}"));
        return Err(bad(if data_len > available {
            format!(
                "its header claims {data_len} bytes of tensor data ({last} ends there) but the file holds {available} \
                 after its header; the file is truncated or its header is corrupt"
            )
        } else {
            format!("its header accounts for {data_len} bytes of tensor data but the file holds {available}")
        }));
    }
    let mut tensors = BTreeMap::new();
    for (name, info) in infos {
        let dtype = match info.dtype {
            safetensors::Dtype::F32 => SourceDType::F32,
            safetensors::Dtype::BF16 => SourceDType::Bf16,
            safetensors::Dtype::F16 => SourceDType::F16,
            other => {
                return Err(bad(format!(
                    "tensor {name}: dtype {other:?} is not a float type podctl loads weights from (F32, BF16, F16)"
                )));
            }
        };
        let (start, end) = info.data_offsets;
        let shape = info.shape.iter().map(|&d| d as u64).collect();
        tensors.insert(
            name,
            TensorEntry { dtype, shape, range: data_start + start as u64..data_start + end as u64 },
        );
    }
    Ok(FileHeader { data_start, tensors, metadata })
}

/// Whether a tensor's byte span differs from its shape times its dtype's size (or overflows).
fn span_disagrees(info: &TensorInfo) -> bool {
    let (start, end) = info.data_offsets;
    let bits = info.shape.iter().try_fold(info.dtype.bitsize(), |acc, &d| acc.checked_mul(d));
    end < start || bits.is_none_or(|bits| bits % 8 != 0 || bits / 8 != end - start)
}

/// `model.safetensors.index.json`: which file holds each tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// Tensor name -> file name.
    pub weight_map: BTreeMap<String, String>,
}

impl Index {
    /// Parses an index; file names must be plain names in the model directory.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Self> {
        let bad = |reason: String| HfError::invalid(file, reason);
        #[derive(serde::Deserialize)]
        struct Raw {
            weight_map: BTreeMap<String, String>,
        }
        let raw: Raw = serde_json::from_slice(bytes).map_err(|e| {
            bad(format!("not an index of weights ({{\"weight_map\": {{tensor: file}}}}): {e}"))
        })?;
        for (tensor, shard) in &raw.weight_map {
            let plain = !shard.is_empty()
                && shard != "."
                && shard != ".."
                && !shard.contains(['/', '\\'])
                && shard.ends_with(".safetensors");
            if !plain {
                return Err(bad(format!(
                    "weight_map names file '{}' for tensor {tensor}; shards are .safetensors files in the model directory",
                    shard.escape_debug()
                )));
            }
        }
        if raw.weight_map.is_empty() {
            return Err(bad("weight_map is empty; it should name the file of every tensor".into()));
        }
        Ok(Self { weight_map: raw.weight_map })
    }

    /// The files, each once, in name order.
    pub fn files(&self) -> Vec<String> {
        let mut files: Vec<String> = self.weight_map.values().cloned().collect();
        files.sort();
        files.dedup();
        files
    }
}

/// A safetensors header for `tensors` (name, dtype, shape, in data order), padded to 8 bytes as
/// the format asks, with `{"format": "pt"}` metadata (transformers refuses files without it).
/// Returns the bytes to write before the data: length, then JSON.
pub fn write_header(tensors: &[(String, safetensors::Dtype, Vec<u64>)]) -> Result<Vec<u8>> {
    let mut offset = 0usize;
    let mut infos = Vec::with_capacity(tensors.len());
    for (name, dtype, shape) in tensors {
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let bytes = shape.iter().product::<usize>() * dtype.bitsize() / 8;
        infos.push((
            name.clone(),
            TensorInfo { dtype: *dtype, shape, data_offsets: (offset, offset + bytes) },
        ));
        offset += bytes;
    }
    let metadata = Metadata::new(Some([("format".to_string(), "pt".to_string())].into()), infos)
        .map_err(|e| HfError::Mismatch(format!("writing a safetensors header: {e}")))?;
    let mut json = serde_json::to_vec(&metadata).expect("headers serialize");
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(std::iter::repeat_n(0u8, data));
        out
    }

    fn parse(bytes: &[u8]) -> Result<FileHeader> {
        let n = header_len(bytes, bytes.len() as u64, "x.safetensors")?;
        parse_header(&bytes[8..8 + n as usize], bytes.len() as u64, "x.safetensors")
    }

    #[test]
    fn reads_what_the_writer_writes() {
        let header = write_header(&[
            ("b".into(), safetensors::Dtype::BF16, vec![2, 3]),
            ("a".into(), safetensors::Dtype::F32, vec![4]),
        ])
        .unwrap();
        assert_eq!(header.len() % 8, 0);
        let mut bytes = header.clone();
        bytes.extend([0u8; 28]);
        let parsed = parse(&bytes).unwrap();
        let start = header.len() as u64;
        assert_eq!(parsed.data_start, start);
        assert_eq!(
            parsed.tensors["b"],
            TensorEntry { dtype: SourceDType::Bf16, shape: vec![2, 3], range: start..start + 12 }
        );
        assert_eq!(parsed.tensors["a"].range, start + 12..start + 28);
        assert_eq!(parsed.metadata["format"], "pt");
    }

    #[test]
    fn bad_headers_name_the_file_and_tensor() {
        let ok = r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
        assert!(parse(&file(ok, 16)).is_ok());
        let cases = [
            (file(ok, 8), "claims 16 bytes of tensor data (tensor w ends there) but the file holds 8"),
            (file(ok, 20), "accounts for 16 bytes of tensor data but the file holds 20"),
            (
                file(r#"{"w":{"dtype":"X9","shape":[2],"data_offsets":[0,8]}}"#, 8),
                "tensor w: unknown variant `X9`",
            ),
            (
                file(r#"{"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#, 8),
                "tensor w: dtype I64 is not a float type",
            ),
            (
                file(r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, 8),
                "tensor w: its header is inconsistent",
            ),
            (
                file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#, 12),
                "its header is inconsistent: invalid offset for tensor `w`",
            ),
            (file("[]", 0), "not a JSON object"),
            (vec![1, 2, 3], "too short"),
        ];
        for (bytes, want) in cases {
            let e = parse(&bytes).unwrap_err().to_string();
            assert!(e.starts_with("x.safetensors: ") && e.contains(want), "{want}: {e}");
        }
        let mut huge = file(ok, 16);
        huge[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(parse(&huge).unwrap_err().to_string().contains("over the format's limit"));
        huge[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(parse(&huge).unwrap_err().to_string().contains("claims 1000 bytes but the file holds"));
    }

    #[test]
    fn an_index_names_plain_files_only() {
        let index = Index::parse(
            br#"{"metadata": {"total_size": 8}, "weight_map": {"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}"#,
            "model.safetensors.index.json",
        )
        .unwrap();
        assert_eq!(index.files(), ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
        for (text, want) in [
            (r#"{"weight_map": {"a": "../x.safetensors"}}"#, "names file '../x.safetensors' for tensor a"),
            (r#"{"weight_map": {"a": "x.bin"}}"#, "names file 'x.bin'"),
            (r#"{"weight_map": {}}"#, "weight_map is empty"),
            (r#"{"metadata": {}}"#, "missing field `weight_map`"),
        ] {
            let e = Index::parse(text.as_bytes(), "model.safetensors.index.json").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
