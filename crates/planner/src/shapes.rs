//! The arrays a step keeps on each device, from the model's dimensions alone: the parameters
//! (the bundle crate's mirror of `qwen3.param_specs` in models/, checked against exported
//! manifests by tests) and how many bytes one device's shard of an array takes once the
//! compiler has laid it out.

use crate::hardware::Platform;
use crate::workload::{Layout, LoraShape};
use bundle::ModelConfig;
pub use bundle::ParamShape;
use mesh::{DType, IciMesh, Sharding};

/// The parameters in canonical order: the manifest's `params` (an untied model's `lm_head`
/// last). One definition for every Rust side: [`bundle::ModelConfig::params`].
pub fn param_shapes(model: &ModelConfig) -> Vec<ParamShape> {
    model.params()
}

/// Bytes of one device's piece of an array of `local_shape` (already divided by its shards)
/// as `platform` lays it out. XLA:TPU tiles the two minor dimensions by (8, 128) 32-bit words
/// (16 rows for 16-bit types) and gives a scalar a 512-byte word; XLA:CPU stores arrays dense.
pub fn laid_out_bytes(local_shape: &[u64], dtype: DType, platform: Platform) -> u64 {
    let size = dtype.size() as u64;
    match platform {
        Platform::Cpu => local_shape.iter().product::<u64>() * size,
        Platform::Tpu => match local_shape {
            [] => 512,
            [n] => n.div_ceil(128) * 128 * size,
            [outer @ .., rows, cols] => {
                let sublanes = 8 * (4 / size.min(4));
                outer.iter().product::<u64>()
                    * rows.div_ceil(sublanes)
                    * sublanes
                    * cols.div_ceil(128)
                    * 128
                    * size
            }
        },
    }
}

/// Bytes one device holds of a `shape` array sharded by `sharding` over `mesh`.
pub fn shard_bytes(
    shape: &[u64],
    sharding: &Sharding,
    mesh: &IciMesh,
    dtype: DType,
    platform: Platform,
) -> u64 {
    laid_out_bytes(&sharding.shard_shape(shape, mesh), dtype, platform)
}

/// Per-device bytes of one full set of parameters (or gradients, or one optimizer moment) in
/// `dtype`: `(all, per_layer)`, the second counting only the stacked layer weights.
pub fn param_bytes(model: &ModelConfig, layout: &Layout, dtype: DType, platform: Platform) -> (u64, u64) {
    let mesh = layout.ici_mesh();
    param_shapes(model).iter().fold((0, 0), |(all, layers), p| {
        let bytes = shard_bytes(&p.shape, &p.sharding, &mesh, dtype, platform);
        (all + bytes, layers + if p.per_layer { bytes } else { 0 })
    })
}

/// LoRA's adapters in canonical order: for each target projection `layers/P` `[L, in, out]`,
/// `layers/P.lora_a` `[L, in, r]` split like its input and `layers/P.lora_b` `[L, r, out]` split
/// like its output (mirroring `qwen3.lora_specs`).
pub fn lora_shapes(model: &ModelConfig, lora: &LoraShape) -> Vec<(String, Vec<u64>, Sharding)> {
    let mut out = Vec::new();
    for p in param_shapes(model) {
        let Some(name) = p.path.strip_prefix("layers/") else { continue };
        if p.shape.len() != 3 || !lora.targets.iter().any(|t| t == name) {
            continue;
        }
        let (l, fan_in, fan_out) = (p.shape[0], p.shape[1], p.shape[2]);
        let dims = p.sharding.dims();
        let axis = |d: &[String]| d.to_vec();
        out.push((
            format!("{}.lora_a", p.path),
            vec![l, fan_in, lora.rank],
            Sharding::new(vec![vec![], axis(&dims[1]), vec![]]),
        ));
        out.push((
            format!("{}.lora_b", p.path),
            vec![l, lora.rank, fan_out],
            Sharding::new(vec![vec![], vec![], axis(&dims[2])]),
        ));
    }
    out
}

/// Per-device bytes of one set of LoRA adapters in `dtype` (all of them are stacked layer
/// tensors), and of the largest one.
pub fn lora_bytes(
    model: &ModelConfig,
    lora: &LoraShape,
    layout: &Layout,
    dtype: DType,
    platform: Platform,
) -> (u64, u64) {
    let mesh = layout.ici_mesh();
    lora_shapes(model, lora).iter().fold((0, 0), |(all, largest), (_, shape, sharding)| {
        let bytes = shard_bytes(shape, sharding, &mesh, dtype, platform);
        (all + bytes, largest.max(bytes))
    })
}

/// Per-device bytes of the largest parameter's shard in `dtype`.
pub fn largest_param_bytes(model: &ModelConfig, layout: &Layout, dtype: DType, platform: Platform) -> u64 {
    let mesh = layout.ici_mesh();
    param_shapes(model)
        .iter()
        .map(|p| shard_bytes(&p.shape, &p.sharding, &mesh, dtype, platform))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_count_like_the_exporter() {
        for name in ["tiny", "small", "qwen3-0.6b", "qwen3-1.7b"] {
            let model = bundle::preset(name).unwrap();
            let total: u64 = param_shapes(&model).iter().map(|p| p.shape.iter().product::<u64>()).sum();
            assert_eq!(total, model.num_params(), "{name}");
        }
        // An untied head is one more [vocab, hidden] parameter, split like the embedding.
        let untied = ModelConfig { tie_embeddings: false, ..bundle::preset("qwen3-0.6b").unwrap() };
        let layout = Layout { dcn: 1, fsdp: 4, tp: 2 };
        let tied = bundle::preset("qwen3-0.6b").unwrap();
        let (all, layers) = param_bytes(&untied, &layout, DType::Bfloat16, Platform::Cpu);
        let (all_tied, layers_tied) = param_bytes(&tied, &layout, DType::Bfloat16, Platform::Cpu);
        assert_eq!((all - all_tied, layers), (151_936 * 1024 * 2 / 8, layers_tied));
    }

    #[test]
    fn tpu_padding_matches_what_libtpu_reported() {
        // apply_step of qwen3-0.6b on v6e:2x4, mesh (4,2), f32: XLA's argument bytes were
        // 1,193,166,336 = params + mu + nu + grads + three 512-byte scalars.
        let model = bundle::preset("qwen3-0.6b").unwrap();
        let layout = Layout { dcn: 1, fsdp: 4, tp: 2 };
        let (params, _) = param_bytes(&model, &layout, DType::Float32, Platform::Tpu);
        assert_eq!(4 * params + 3 * 512, 1_193_166_336);
        assert_eq!(laid_out_bytes(&[28, 1024], DType::Float32, Platform::Tpu), 32 * 1024 * 4);
        assert_eq!(laid_out_bytes(&[3, 100], DType::Bfloat16, Platform::Tpu), 16 * 128 * 2);
        assert_eq!(laid_out_bytes(&[3, 100], DType::Bfloat16, Platform::Cpu), 600);
    }
}
