//! A Hugging Face model directory as a podctl checkpoint at step 0 (`podctl ckpt import`): the
//! state a trainer holds right after loading the model (parameters in the job's dtype, AdamW
//! moments zero), so restarts and replacements restore from podctl's own format (chunked CRCs,
//! ranged reads onto any mesh) instead of converting the safetensors again.
//!
//! The checkpoint is written as if by one host per slice of the hidden axis (`fsdp` up to 16,
//! `tp` 1): each writer's share is read from the source, uploaded and dropped before the next,
//! so the import holds about 1/16 of the model at a time however large it is. A restore reads
//! it onto any mesh. Its metadata records the model (`model`, the bundle's model object) and
//! the source (`hf.source`, `hf.identity`), which `podctl ckpt export --hf` uses.

use crate::model::HfModel;
use crate::{HfError, Result};
use bytes::Bytes;
use checkpoint::layout::dir_name;
use checkpoint::{
    ArraySpec, CommitLog, DataPosition, SaveOptions, SaveSpec, ShardBuffer, Storage, StoreCommitLog,
    Topology, finalize, save_host,
};
use mesh::{DType, IciMesh};
use std::collections::BTreeMap;

/// How to import.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportOptions {
    /// The parameters' dtype: the job's `train.param_dtype`.
    pub dtype: DType,
}

/// What an import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportReport {
    /// The checkpoint directory, `<step:012>-<save_id>` under the root.
    pub dir: String,
    /// Arrays saved (parameters and both moments).
    pub arrays: usize,
    /// Bytes of parameters written (in the import's dtype).
    pub param_bytes: u64,
    /// Writers the checkpoint was written as.
    pub writers: usize,
    /// The same model was imported into this root before: nothing was written.
    pub already: bool,
}

/// Imports `model` into the checkpoint root `storage` as step 0.
pub async fn import_checkpoint(
    model: &HfModel,
    storage: &Storage,
    options: &ImportOptions,
) -> Result<ImportReport> {
    if !matches!(options.dtype, DType::Float32 | DType::Bfloat16) {
        return Err(HfError::Mismatch(format!(
            "import dtype {}: podctl's parameters are float32 or bfloat16",
            options.dtype
        )));
    }
    let config = model.model();
    let save_id = format!("hf-{}-{}", &model.identity()[..16], options.dtype);
    let dir = dir_name(0, &save_id);
    let log = StoreCommitLog::new(storage.clone());
    if log.list().await?.iter().any(|c| c.step == 0 && c.save_id == save_id) {
        return Ok(ImportReport { dir, arrays: 0, param_bytes: 0, writers: 0, already: true });
    }
    // Writers along the hidden axis, which every fsdp-split dimension is.
    let writers =
        (0..=4).rev().map(|k| 1u64 << k).find(|w| config.hidden_size.is_multiple_of(*w)).unwrap_or(1);
    let mesh = IciMesh::new([("fsdp", writers as usize), ("tp", 1)]).expect("positive axes");
    let topology = Topology::new(1, mesh.clone(), writers as usize)?;
    let params = config.params();
    let mut arrays = Vec::with_capacity(3 * params.len());
    for prefix in ["params/", "opt/mu/", "opt/nu/"] {
        for p in &params {
            arrays.push(ArraySpec::new(
                format!("{prefix}{}", p.path),
                p.shape.clone(),
                options.dtype,
                p.sharding.clone(),
            ));
        }
    }
    let mut metadata = BTreeMap::new();
    metadata.insert("model".to_string(), serde_json::to_value(config).expect("model configs serialize"));
    metadata.insert(
        "hf".to_string(),
        serde_json::json!({"source": model.location().uri(), "identity": model.identity()}),
    );
    let spec = SaveSpec {
        step: 0,
        save_id,
        topology,
        arrays,
        bundle: model.identity().to_string(),
        data_position: DataPosition { seed: 0, step: 0 },
        rng_state: Vec::new(),
        metadata,
    };
    let plan = spec.plan()?;
    // The moments' shards are all zero: one buffer of the largest, sliced.
    let largest = spec
        .arrays
        .iter()
        .map(|a| a.sharding.shard_shape(&a.shape, &mesh).iter().product::<u64>() * a.dtype.size() as u64)
        .max()
        .unwrap_or(0);
    let zeros = Bytes::from(vec![0u8; largest as usize]);
    let mut reports = Vec::with_capacity(writers as usize);
    let mut param_bytes = 0;
    for host in 0..writers as usize {
        let mut buffers = Vec::new();
        let local = spec.topology.devices_of_host(host);
        for shard in plan.host_shards(host) {
            let array = &spec.arrays[shard.array];
            let device = *shard
                .devices
                .iter()
                .find(|d| local.contains(d))
                .expect("the plan gives a host its own devices' shards");
            let region = array.sharding.shard_region(&array.shape, &mesh, device);
            let data = match array.name.strip_prefix("params/") {
                Some(path) => {
                    let bytes =
                        model.read_regions(path, &array.shape, options.dtype, &[region]).await?.remove(0);
                    param_bytes += bytes.len() as u64;
                    Bytes::from(bytes)
                }
                None => zeros.slice(..(region.num_elements() * array.dtype.size() as u64) as usize),
            };
            buffers.push(ShardBuffer { array: array.name.clone(), device, data });
        }
        reports.push(save_host(storage, &spec, host, buffers, &SaveOptions::default()).await?);
    }
    finalize(storage, &spec, &reports, &log).await?;
    Ok(ImportReport {
        dir,
        arrays: spec.arrays.len(),
        param_bytes,
        writers: writers as usize,
        already: false,
    })
}
