//! Hugging Face tensor names and layouts against podctl's parameters.
//!
//! podctl stacks each kind of layer weight on a leading `[num_layers]` axis and stores matrices
//! `[in, out]` (`x @ W`); a Hugging Face checkpoint has one tensor per layer and stores
//! `nn.Linear` weights `[out, in]` (`x @ W.T`). So `layers/q_proj[l]` is
//! `model.layers.{l}.self_attn.q_proj.weight` transposed, a norm's `layers/<norm>[l]` is its
//! per-layer vector, and the embedding, the final norm and an untied `lm_head` (both `[vocab,
//! hidden]`) are the same arrays under other names. RoPE is rotate-half in both, so no query or
//! key permutation is needed (notes/models.md).

use bundle::ModelConfig;

/// Where one podctl parameter lives in a Hugging Face checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// podctl's path (under `params/`).
    pub path: &'static str,
    /// The Hugging Face name: whole, or with `{}` for the layer index.
    pub name: &'static str,
    /// Stacked over layers: one Hugging Face tensor per layer.
    pub per_layer: bool,
    /// A matrix stored `[out, in]` there and `[in, out]` here.
    pub transposed: bool,
}

const fn whole(path: &'static str, name: &'static str) -> Mapping {
    Mapping { path, name, per_layer: false, transposed: false }
}

const fn layer(path: &'static str, name: &'static str, transposed: bool) -> Mapping {
    Mapping { path, name, per_layer: true, transposed }
}

/// Every parameter's mapping, in podctl's canonical order (`lm_head` last, untied models only).
pub const MAPPINGS: [Mapping; 14] = [
    whole("embed", "model.embed_tokens.weight"),
    layer("layers/input_norm", "model.layers.{}.input_layernorm.weight", false),
    layer("layers/q_proj", "model.layers.{}.self_attn.q_proj.weight", true),
    layer("layers/k_proj", "model.layers.{}.self_attn.k_proj.weight", true),
    layer("layers/v_proj", "model.layers.{}.self_attn.v_proj.weight", true),
    layer("layers/q_norm", "model.layers.{}.self_attn.q_norm.weight", false),
    layer("layers/k_norm", "model.layers.{}.self_attn.k_norm.weight", false),
    layer("layers/o_proj", "model.layers.{}.self_attn.o_proj.weight", true),
    layer("layers/post_norm", "model.layers.{}.post_attention_layernorm.weight", false),
    layer("layers/gate_proj", "model.layers.{}.mlp.gate_proj.weight", true),
    layer("layers/up_proj", "model.layers.{}.mlp.up_proj.weight", true),
    layer("layers/down_proj", "model.layers.{}.mlp.down_proj.weight", true),
    whole("final_norm", "model.norm.weight"),
    whole("lm_head", "lm_head.weight"),
];

/// The name a tied checkpoint may still carry for its head (transformers drops it when saving,
/// some tools keep it); it is the embedding, so it is not read.
pub const TIED_HEAD: &str = "lm_head.weight";

/// The mapping of podctl parameter `path`.
pub fn mapping(path: &str) -> Option<&'static Mapping> {
    MAPPINGS.iter().find(|m| m.path == path)
}

impl Mapping {
    /// The Hugging Face name of layer `layer` (ignored for whole tensors).
    pub fn hf_name(&self, layer: u64) -> String {
        if self.per_layer { self.name.replace("{}", &layer.to_string()) } else { self.name.to_string() }
    }

    /// The Hugging Face shape of one tensor of a podctl parameter shaped `shape`: the layer axis
    /// dropped, a matrix's axes swapped.
    pub fn hf_shape(&self, shape: &[u64]) -> Vec<u64> {
        let mut one = if self.per_layer { shape[1..].to_vec() } else { shape.to_vec() };
        if self.transposed {
            one.reverse();
        }
        one
    }
}

/// One tensor of a Hugging Face checkpoint of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfTensor {
    /// Its name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// The podctl parameter it belongs to.
    pub mapping: &'static Mapping,
    /// Its layer, for per-layer tensors.
    pub layer: Option<u64>,
}

/// Every tensor a Hugging Face checkpoint of `model` holds, in transformers' module order
/// (embedding, each layer's, final norm, head).
pub fn hf_tensors(model: &ModelConfig) -> Vec<HfTensor> {
    let params = model.params();
    let shape_of = |path: &str| params.iter().find(|p| p.path == path).map(|p| p.shape.clone());
    let mut out = Vec::new();
    let mut push = |m: &'static Mapping, layer: Option<u64>| {
        if let Some(shape) = shape_of(m.path) {
            out.push(HfTensor {
                name: m.hf_name(layer.unwrap_or(0)),
                shape: m.hf_shape(&shape),
                mapping: m,
                layer,
            });
        }
    };
    push(&MAPPINGS[0], None);
    for l in 0..model.num_layers {
        for m in MAPPINGS.iter().filter(|m| m.per_layer) {
            push(m, Some(l));
        }
    }
    for m in MAPPINGS.iter().filter(|m| !m.per_layer).skip(1) {
        push(m, None);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_maps_and_shapes_transpose() {
        let model = bundle::preset("qwen3-0.6b").unwrap();
        for p in model.params() {
            assert!(mapping(p.path).is_some(), "{}", p.path);
        }
        let tensors = hf_tensors(&model);
        assert_eq!(tensors.len(), 2 + 28 * 11);
        let q = tensors.iter().find(|t| t.name == "model.layers.3.self_attn.q_proj.weight").unwrap();
        // Qwen3-0.6B: 16 heads of 128 from a 1024-wide stream.
        assert_eq!((q.shape.as_slice(), q.layer), (&[2048, 1024][..], Some(3)));
        let o = tensors.iter().find(|t| t.name == "model.layers.27.self_attn.o_proj.weight").unwrap();
        assert_eq!(o.shape, [1024, 2048]);
        let norm = tensors.iter().find(|t| t.name == "model.layers.0.self_attn.k_norm.weight").unwrap();
        assert_eq!(norm.shape, [128]);
        assert_eq!(tensors.last().unwrap().name, "model.norm.weight");
        let untied = ModelConfig { tie_embeddings: false, ..model };
        let head = hf_tensors(&untied).pop().unwrap();
        assert_eq!((head.name.as_str(), head.shape.as_slice()), ("lm_head.weight", &[151_936, 1024][..]));
    }
}
