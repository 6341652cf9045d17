//! An opened Hugging Face model directory, every tensor checked, and reads of any region of a
//! podctl parameter from it.

use crate::config::{CONFIG_FILE, HfConfig, MAX_CONFIG_BYTES};
use crate::convert::{Block, copy_block};
use crate::header::{
    FileHeader, INDEX_FILE, Index, MAX_INDEX_BYTES, SINGLE_FILE, TensorEntry, header_len, parse_header,
};
use crate::names::{self, Mapping, TIED_HEAD};
use crate::source::Location;
use crate::{HfError, Result};
use bundle::ModelConfig;
use checkpoint::StoreOptions;
use futures::{StreamExt, TryStreamExt};
use mesh::{DType, Region};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::ops::{DerefMut, Range};

/// Source bytes handled per copy: a window of whole rows of one tensor. Bounds what a read holds
/// beside the shards it fills (an embedding of 151,936 x 2,048 bf16 is 622 MB).
pub const WINDOW_BYTES: u64 = 64 << 20;
/// Largest single ranged read from an object store, and how many run at once.
const FETCH_BYTES: u64 = 16 << 20;
const FETCHES_IN_FLIGHT: usize = 4;

/// A model directory whose `config.json` parsed and whose safetensors headers hold exactly the
/// tensors of that configuration, shapes checked, and nothing else.
#[derive(Debug)]
pub struct HfModel {
    location: Location,
    config: HfConfig,
    files: Vec<WeightFile>,
    /// Tensor name -> (index into `files`, entry).
    tensors: BTreeMap<String, (usize, TensorEntry)>,
    identity: String,
}

#[derive(Debug)]
struct WeightFile {
    name: String,
    /// Open for memory maps, in a local directory.
    local: Option<(std::fs::File, std::path::PathBuf)>,
}

/// Reads and parses `config.json` of `location`.
pub async fn read_config(location: &Location) -> Result<(HfConfig, Vec<u8>)> {
    let bytes =
        location.read_small(CONFIG_FILE, MAX_CONFIG_BYTES).await?.ok_or_else(|| HfError::Missing {
            file: location.describe(CONFIG_FILE),
            hint: "a Hugging Face model directory has config.json beside its safetensors weights".into(),
        })?;
    let config = HfConfig::parse(&bytes, location.name(), &location.describe(CONFIG_FILE))?;
    Ok((config, bytes))
}

impl HfModel {
    /// Opens the model directory at `uri` (a local path, `file://`, `s3://`, `gs://`): reads
    /// `config.json`, the index (if the weights are sharded) and each shard's header, and checks
    /// that the tensors are exactly those of the configured model, with its shapes and float
    /// dtypes. Reads no tensor data.
    pub async fn open(uri: &str, options: &StoreOptions) -> Result<Self> {
        let location = Location::parse(uri, options)?;
        let (config, config_bytes) = read_config(&location).await?;
        let mut identity = Sha256::new();
        identity.update(&config_bytes);

        let index = match location.read_small(INDEX_FILE, MAX_INDEX_BYTES).await? {
            Some(bytes) => Some(Index::parse(&bytes, &location.describe(INDEX_FILE))?),
            None => None,
        };
        let names = match &index {
            Some(index) => index.files(),
            None if location.size(SINGLE_FILE).await?.is_some() => vec![SINGLE_FILE.to_string()],
            None => {
                return Err(HfError::Missing {
                    file: location.describe(SINGLE_FILE),
                    hint: format!(
                        "the weights are {SINGLE_FILE}, or shards listed in {INDEX_FILE}; neither is there"
                    ),
                });
            }
        };
        let mut files = Vec::with_capacity(names.len());
        let mut tensors: BTreeMap<String, (usize, TensorEntry)> = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            let label = location.describe(name);
            let (header, text) = read_header(&location, name, index.as_ref()).await?;
            identity.update(name.as_bytes());
            identity.update(&text);
            for (tensor, entry) in header.tensors {
                if let Some(index) = &index
                    && index.weight_map.get(&tensor) != Some(name)
                {
                    return Err(HfError::invalid(
                        label,
                        format!(
                            "tensor {tensor} is not listed for this file in {INDEX_FILE}; the index and the shards disagree"
                        ),
                    ));
                }
                if let Some((other, _)) = tensors.insert(tensor.clone(), (i, entry)) {
                    return Err(HfError::invalid(
                        label,
                        format!("tensor {tensor} is also in {}", names[other]),
                    ));
                }
            }
            let local = match location.local_path(name) {
                Some(path) => {
                    Some((std::fs::File::open(&path).map_err(|e| HfError::io(path.display(), e))?, path))
                }
                None => None,
            };
            files.push(WeightFile { name: name.clone(), local });
        }
        if let Some(index) = &index
            && let Some((tensor, file)) = index.weight_map.iter().find(|(t, _)| !tensors.contains_key(*t))
        {
            return Err(HfError::invalid(
                location.describe(INDEX_FILE),
                format!("names {file} for tensor {tensor}, but that file's header does not have it"),
            ));
        }
        let model = Self { location, config, files, tensors, identity: hex::encode(identity.finalize()) };
        model.check_tensors(index.is_some())?;
        Ok(model)
    }

    /// Every tensor the configured model has is there with its shape and a float dtype, and
    /// nothing else is (a tied model's redundant `lm_head.weight` is tolerated, never read).
    fn check_tensors(&self, sharded: bool) -> Result<()> {
        let model = &self.config.model;
        let expected = names::hf_tensors(model);
        let mut known = std::collections::BTreeSet::new();
        for t in &expected {
            known.insert(t.name.as_str());
            let Some((file, entry)) = self.tensors.get(&t.name) else {
                let file = if sharded { INDEX_FILE } else { SINGLE_FILE };
                return Err(HfError::invalid(
                    self.location.describe(file),
                    format!("has no tensor {}; a model with config.json's dimensions needs it", t.name),
                ));
            };
            if entry.shape != t.shape {
                return Err(HfError::invalid(
                    self.location.describe(&self.files[*file].name),
                    format!(
                        "tensor {} has shape {:?}, but config.json's dimensions make it {:?}",
                        t.name, entry.shape, t.shape
                    ),
                ));
            }
        }
        let extra: Vec<&String> = self
            .tensors
            .keys()
            .filter(|name| !(known.contains(name.as_str()) || model.tie_embeddings && *name == TIED_HEAD))
            .collect();
        if let Some(first) = extra.first() {
            let (file, _) = &self.tensors[*first];
            return Err(HfError::invalid(
                self.location.describe(&self.files[*file].name),
                format!(
                    "tensor {first}{} is not part of a {} with config.json's dimensions; podctl would drop it",
                    if extra.len() > 1 { format!(" (and {} more)", extra.len() - 1) } else { String::new() },
                    crate::config::ARCHITECTURE
                ),
            ));
        }
        Ok(())
    }

    /// The directory.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// The model's dimensions.
    pub fn model(&self) -> &ModelConfig {
        &self.config.model
    }

    /// A SHA-256 (hex) of `config.json` and every shard's header: which model this is.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// A tensor's entry, by its Hugging Face name.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name).map(|(_, entry)| entry)
    }

    /// Bytes of all tensor data the model has (what a full load reads once).
    pub fn data_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .filter(|(name, _)| !(self.config.model.tie_embeddings && *name == TIED_HEAD))
            .map(|(_, (_, e))| e.range.end - e.range.start)
            .sum()
    }

    /// Checks that podctl parameter `path` shaped `shape` is one of this model's, as the
    /// model's configuration shapes it.
    fn check_param(&self, path: &str, shape: &[u64]) -> Result<&'static Mapping> {
        let mapping = names::mapping(path).ok_or_else(|| {
            HfError::Mismatch(format!("parameter '{path}' has no Hugging Face tensor to load it from"))
        })?;
        let params = self.config.model.params();
        let want = params.iter().find(|p| p.path == path).ok_or_else(|| {
            HfError::Mismatch(format!(
                "parameter '{path}' is not in {} (tie_word_embeddings = {}); export the bundle for this model",
                self.location.describe(CONFIG_FILE),
                self.config.model.tie_embeddings
            ))
        })?;
        if want.shape != shape {
            return Err(HfError::Mismatch(format!(
                "parameter '{path}' is {shape:?} in the bundle but {:?} in the model at {}; export the bundle for this model",
                want.shape,
                self.location.uri()
            )));
        }
        Ok(mapping)
    }

    /// `regions` of podctl parameter `path` in groups that read the same rows of the same source
    /// tensors (devices that differ only along the axis splitting a tensor's columns): reading
    /// a group at once reads those rows once (indices into `regions`, in order).
    pub fn shared_reads(&self, path: &str, regions: &[Region]) -> Vec<Vec<usize>> {
        let Some(mapping) = names::mapping(path) else {
            return (0..regions.len()).map(|i| vec![i]).collect();
        };
        // The podctl axis whose range is the source's rows (None: vectors, one row).
        let row_axis = match (mapping.per_layer, mapping.transposed) {
            (true, true) => Some(2),
            (false, _) if regions.first().is_some_and(|r| r.ranges().len() == 2) => Some(0),
            _ => None,
        };
        let key = |r: &Region| {
            let layers = if mapping.per_layer { Some(r.ranges()[0].clone()) } else { None };
            (layers, row_axis.map(|axis| r.ranges()[axis].clone()))
        };
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, region) in regions.iter().enumerate() {
            match groups.iter_mut().find(|g| key(&regions[g[0]]) == key(region)) {
                Some(group) => group.push(i),
                None => groups.push(vec![i]),
            }
        }
        groups
    }

    /// The bytes of each of `regions` of podctl parameter `path` (global shape `shape`), in
    /// `dtype`, row-major in podctl's layout. Each source byte any region needs is read once,
    /// a window of whole rows of one tensor at a time: a region's rows of a tensor (every
    /// column of them) when one region is asked for, the union of all regions' rows when
    /// several are (a host asking for all its devices' regions at once reads each byte of the
    /// model once; asking region by region holds one region at a time).
    pub async fn read_regions(
        &self,
        path: &str,
        shape: &[u64],
        dtype: DType,
        regions: &[Region],
    ) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Vec<u8>> =
            regions.iter().map(|r| vec![0u8; r.num_elements() as usize * dtype.size()]).collect();
        self.read_regions_into(path, shape, dtype, regions, &mut out).await?;
        Ok(out)
    }

    /// [`HfModel::read_regions`] into the caller's buffers, `out[i]` for `regions[i]` and of
    /// exactly its size: a loader gives the memory its devices will hold (e.g. host memory a
    /// device buffer takes over), so nothing is copied again.
    pub async fn read_regions_into<B: DerefMut<Target = [u8]>>(
        &self,
        path: &str,
        shape: &[u64],
        dtype: DType,
        regions: &[Region],
        out: &mut [B],
    ) -> Result<()> {
        let mapping = self.check_param(path, shape)?;
        let full = Region::full(shape);
        for region in regions {
            if !full.contains(region) {
                return Err(HfError::Mismatch(format!(
                    "region {:?} is outside parameter '{path}' {shape:?}",
                    region.ranges()
                )));
            }
        }
        if out.len() != regions.len() {
            return Err(HfError::Mismatch(format!("{} buffers for {} regions", out.len(), regions.len())));
        }
        let size = dtype.size();
        for (buf, region) in out.iter().zip(regions) {
            let len = region.num_elements() as usize * size;
            if buf.len() != len {
                return Err(HfError::Mismatch(format!(
                    "a buffer of {} bytes for region {:?} of '{path}', which takes {len}",
                    buf.len(),
                    region.ranges()
                )));
            }
        }
        if !mapping.per_layer {
            let targets: Vec<(Vec<Range<u64>>, usize)> =
                regions.iter().map(|r| (r.ranges().to_vec(), 0)).collect();
            let mut bufs: Vec<&mut [u8]> = out.iter_mut().map(|b| &mut **b).collect();
            return self.copy_tensor(mapping, 0, &targets, &mut bufs, dtype).await;
        }
        let first = regions.iter().map(|r| r.ranges()[0].start).min().unwrap_or(0);
        let last = regions.iter().map(|r| r.ranges()[0].end).max().unwrap_or(0);
        for layer in first..last {
            let holds = |r: &Region| r.ranges()[0].contains(&layer);
            // The layer's block in each region that holds it: after the layers before it.
            let targets: Vec<(Vec<Range<u64>>, usize)> = regions
                .iter()
                .filter(|r| holds(r))
                .map(|r| {
                    let block_bytes = (r.num_elements() / r.shape()[0]) as usize * size;
                    (r.ranges()[1..].to_vec(), (layer - r.ranges()[0].start) as usize * block_bytes)
                })
                .collect();
            let mut bufs: Vec<&mut [u8]> =
                out.iter_mut().zip(regions).filter(|(_, r)| holds(r)).map(|(b, _)| &mut **b).collect();
            self.copy_tensor(mapping, layer, &targets, &mut bufs, dtype).await?;
        }
        Ok(())
    }

    /// Copies one Hugging Face tensor's part of each target: its ranges over the tensor's podctl
    /// axes (the layer axis dropped) and the byte offset of its block in the matching buffer of
    /// `out`.
    async fn copy_tensor(
        &self,
        mapping: &Mapping,
        layer: u64,
        targets: &[(Vec<Range<u64>>, usize)],
        out: &mut [&mut [u8]],
        dtype: DType,
    ) -> Result<()> {
        let name = mapping.hf_name(layer);
        let (file, entry) = self.tensors.get(&name).expect("checked when the model was opened");
        let file = &self.files[*file];
        // The tensor as a row-major matrix [rows, width] (a vector is one row), and each
        // region's block of it: source rows and columns (a matrix's podctl [in, out] is the
        // source's [out, in] transposed).
        let (rows, width) = match entry.shape.as_slice() {
            [n] => (1, *n),
            [r, w] => (*r, *w),
            other => return Err(HfError::Mismatch(format!("tensor {name} has rank {}", other.len()))),
        };
        let blocks: Vec<Block> = targets
            .iter()
            .map(|(d, _)| {
                let (rows, cols) = match (d.len(), mapping.transposed) {
                    (1, _) => (0..1, d[0].clone()),
                    (_, false) => (d[0].clone(), d[1].clone()),
                    (_, true) => (d[1].clone(), d[0].clone()),
                };
                let block_rows = rows.end - rows.start;
                Block { first_row: rows.start, rows, cols, block_rows, transposed: mapping.transposed }
            })
            .collect();
        let want_start = blocks.iter().map(|b| b.rows.start).min().unwrap_or(0);
        let want_end = blocks.iter().map(|b| b.rows.end).max().unwrap_or(0).min(rows);
        let esize = entry.dtype.size() as u64;
        let row_bytes = width * esize;
        let window_rows = (WINDOW_BYTES / row_bytes.max(1)).max(1);
        let mut start = want_start;
        while start < want_end {
            let end = (start + window_rows).min(want_end);
            let bytes = entry.range.start + start * row_bytes..entry.range.start + end * row_bytes;
            let window = self.read_window(file, bytes).await?;
            for ((block, buf), (_, offset)) in blocks.iter().zip(out.iter_mut()).zip(targets) {
                let rows = block.rows.start.max(start)..block.rows.end.min(end);
                if rows.is_empty() {
                    continue;
                }
                let offset = *offset;
                let len = ((block.cols.end - block.cols.start) * block.block_rows) as usize * dtype.size();
                let part = Block { rows, ..block.clone() };
                copy_block(&window, entry.dtype, start, width, &part, &mut buf[offset..offset + len], dtype)
                    .map_err(|reason| {
                        HfError::invalid(
                            self.location.describe(&file.name),
                            format!("tensor {name}: {reason}"),
                        )
                    })?;
            }
            start = end;
        }
        Ok(())
    }

    /// Bytes `range` of a weight file: mapped (local) or fetched in bounded ranged reads.
    async fn read_window(&self, file: &WeightFile, range: Range<u64>) -> Result<Window> {
        if let Some((handle, path)) = &file.local {
            return Ok(Window::Mapped(crate::mmap::map_range(handle, range, path)?));
        }
        let pieces: Vec<Range<u64>> = (range.start..range.end)
            .step_by(FETCH_BYTES as usize)
            .map(|s| s..(s + FETCH_BYTES).min(range.end))
            .collect();
        let fetched: Vec<bytes::Bytes> = futures::stream::iter(pieces)
            .map(|piece| self.location.read_range(&file.name, piece))
            .buffered(FETCHES_IN_FLIGHT)
            .try_collect()
            .await?;
        let mut joined = Vec::with_capacity((range.end - range.start) as usize);
        for piece in fetched {
            joined.extend_from_slice(&piece);
        }
        Ok(Window::Fetched(joined))
    }
}

/// Source bytes for one copy.
enum Window {
    Mapped(crate::mmap::Mapped),
    Fetched(Vec<u8>),
}

impl std::ops::Deref for Window {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Window::Mapped(m) => m,
            Window::Fetched(v) => v,
        }
    }
}

/// A weight file's header: its size first, so nothing is read past what the file holds.
async fn read_header(
    location: &Location,
    name: &str,
    index: Option<&Index>,
) -> Result<(FileHeader, bytes::Bytes)> {
    let label = location.describe(name);
    let size = location.size(name).await?.ok_or_else(|| {
        let hint = match index {
            Some(index) => {
                let named: Vec<&String> =
                    index.weight_map.iter().filter(|(_, f)| *f == name).map(|(t, _)| t).collect();
                format!(
                    "{INDEX_FILE} names it for tensor {}{}",
                    named.first().map_or("?", |t| t.as_str()),
                    if named.len() > 1 { format!(" and {} more", named.len() - 1) } else { String::new() }
                )
            }
            None => "the weights are missing".into(),
        };
        HfError::Missing { file: label.clone(), hint }
    })?;
    let first = location.read_range(name, 0..size.min(8)).await?;
    let n = header_len(&first, size, &label)?;
    let text = location.read_range(name, 8..8 + n).await?;
    Ok((parse_header(&text, size, &label)?, text))
}
