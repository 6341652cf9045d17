//! The model's parameters from its dimensions alone, and the bounds a model's dimensions must
//! keep: what the exporter's `qwen3.param_specs` declares, for every Rust side that needs the
//! shapes without a bundle (the planner, a Hugging Face import, job checks).

use crate::ModelConfig;
use mesh::Sharding;

/// One parameter: its path under `params/`, global shape and sharding over `(fsdp, tp)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamShape {
    /// The path, e.g. `layers/q_proj`.
    pub path: &'static str,
    /// The global shape.
    pub shape: Vec<u64>,
    /// The sharding.
    pub sharding: Sharding,
    /// Whether it is stacked over layers (scanned over), as opposed to the embedding, the final
    /// norm and an untied output head.
    pub per_layer: bool,
}

fn spec(axes: &[Option<&str>]) -> Sharding {
    Sharding::new(axes.iter().map(|a| a.map(|name| vec![name.to_string()]).unwrap_or_default()).collect())
}

/// Largest value of each dimension a model may declare. Far past any dense Qwen3 (Qwen3-32B:
/// hidden 5,120, 64 layers, 64 heads, intermediate 25,600, vocabulary 151,936), and small
/// enough that every count of elements and bytes derived from them fits in a `u64`.
pub const DIMENSION_LIMITS: [(&str, u64); 7] = [
    ("vocab_size", 1 << 22),
    ("hidden_size", 1 << 16),
    ("num_layers", 1 << 10),
    ("num_heads", 1 << 10),
    ("num_kv_heads", 1 << 10),
    ("head_dim", 1 << 11),
    ("intermediate_size", 1 << 20),
];

/// Largest parameter count a model may declare (10 trillion).
pub const MAX_PARAMS: u64 = 10_000_000_000_000;

impl ModelConfig {
    /// The parameters in canonical order (the manifest's `params` of a full fine-tuning bundle):
    /// matrices stored `[in, out]` and stacked over layers, the embedding `[vocab, hidden]`, and
    /// for an untied model `lm_head` in the embedding's layout.
    pub fn params(&self) -> Vec<ParamShape> {
        let (l, h, i) = (self.num_layers, self.hidden_size, self.intermediate_size);
        let q_out = self.num_heads * self.head_dim;
        let kv_out = self.num_kv_heads * self.head_dim;
        let (f, t) = (Some("fsdp"), Some("tp"));
        let matrix = |path, fan_in, fan_out, a, b| ParamShape {
            path,
            shape: vec![l, fan_in, fan_out],
            sharding: spec(&[None, a, b]),
            per_layer: true,
        };
        let norm = |path, size| ParamShape {
            path,
            shape: vec![l, size],
            sharding: spec(&[None, None]),
            per_layer: true,
        };
        let vocabulary = |path| ParamShape {
            path,
            shape: vec![self.vocab_size, h],
            sharding: spec(&[t, f]),
            per_layer: false,
        };
        let mut params = vec![
            vocabulary("embed"),
            norm("layers/input_norm", h),
            matrix("layers/q_proj", h, q_out, f, t),
            matrix("layers/k_proj", h, kv_out, f, t),
            matrix("layers/v_proj", h, kv_out, f, t),
            norm("layers/q_norm", self.head_dim),
            norm("layers/k_norm", self.head_dim),
            matrix("layers/o_proj", q_out, h, t, f),
            norm("layers/post_norm", h),
            matrix("layers/gate_proj", h, i, f, t),
            matrix("layers/up_proj", h, i, f, t),
            matrix("layers/down_proj", i, h, t, f),
            ParamShape { path: "final_norm", shape: vec![h], sharding: spec(&[None]), per_layer: false },
        ];
        if !self.tie_embeddings {
            params.push(vocabulary("lm_head"));
        }
        params
    }

    /// Checks the dimensions: each positive and within [`DIMENSION_LIMITS`], whole groups of
    /// query heads per key/value head, an even head width (RoPE), positive RoPE base and norm
    /// epsilon, and at most [`MAX_PARAMS`] parameters. On failure: the field and what is wrong.
    /// Nothing is allocated from a model's dimensions before this passes.
    pub fn check(&self) -> Result<(), (String, String)> {
        let dims = [
            self.vocab_size,
            self.hidden_size,
            self.num_layers,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate_size,
        ];
        for ((field, limit), value) in DIMENSION_LIMITS.iter().zip(dims) {
            if value == 0 || value > *limit {
                return Err((
                    field.to_string(),
                    format!("{value} is out of range: it must be between 1 and {limit}"),
                ));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err((
                "num_heads".into(),
                format!(
                    "{} query heads do not split into whole groups over {} key/value heads",
                    self.num_heads, self.num_kv_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err((
                "head_dim".into(),
                format!("{} is odd; RoPE needs an even head width", self.head_dim),
            ));
        }
        for (field, value) in [("rope_theta", self.rope_theta), ("rms_norm_eps", self.rms_norm_eps)] {
            if !(value.is_finite() && value > 0.0) {
                return Err((field.into(), format!("{value} must be a positive number")));
            }
        }
        if self.num_params() > MAX_PARAMS {
            return Err((
                "num_layers".into(),
                format!(
                    "the dimensions make {} parameters, over the limit of {MAX_PARAMS}",
                    self.num_params()
                ),
            ));
        }
        Ok(())
    }

    /// Number of parameters (the embedding doubles as the output head when `tie_embeddings`).
    /// Within [`ModelConfig::check`]'s limits it cannot overflow.
    pub fn num_params(&self) -> u64 {
        self.params().iter().map(|p| p.shape.iter().product::<u64>()).sum()
    }
}

#[cfg(test)]
mod tests {
    use crate::preset;

    #[test]
    fn presets_check_and_their_counts_are_the_exporters() {
        for (name, count) in [
            ("tiny", 410_368),
            ("small", 3_181_056),
            ("qwen3-0.6b", 596_049_920),
            ("qwen3-1.7b", 1_720_574_976),
        ] {
            let model = preset(name).unwrap();
            model.check().unwrap();
            // podctl_models.qwen3.num_params.
            assert_eq!(model.num_params(), count, "{name}");
        }
    }

    #[test]
    fn an_untied_model_has_its_own_output_head() {
        let tied = preset("qwen3-1.7b").unwrap();
        let untied = crate::ModelConfig { tie_embeddings: false, ..tied.clone() };
        let head = untied.params().pop().unwrap();
        assert_eq!(
            (head.path, head.shape.as_slice(), head.per_layer),
            ("lm_head", &[151_936, 2048][..], false)
        );
        assert_eq!(head.sharding.dims(), [vec!["tp".to_string()], vec!["fsdp".to_string()]]);
        assert_eq!(untied.num_params(), tied.num_params() + 151_936 * 2048);
    }

    #[test]
    fn absurd_dimensions_are_refused_naming_the_field() {
        let good = preset("tiny").unwrap();
        let cases = [
            (crate::ModelConfig { vocab_size: 1 << 40, ..good.clone() }, "vocab_size"),
            (crate::ModelConfig { hidden_size: 0, ..good.clone() }, "hidden_size"),
            (crate::ModelConfig { num_kv_heads: 3, ..good.clone() }, "num_heads"),
            (crate::ModelConfig { head_dim: 31, ..good.clone() }, "head_dim"),
            (crate::ModelConfig { rope_theta: f64::NAN, ..good.clone() }, "rope_theta"),
            (crate::ModelConfig { rms_norm_eps: -1.0, ..good.clone() }, "rms_norm_eps"),
            (
                crate::ModelConfig {
                    num_layers: 1 << 10,
                    hidden_size: 1 << 16,
                    intermediate_size: 1 << 20,
                    ..good.clone()
                },
                "num_layers",
            ),
        ];
        for (model, field) in cases {
            let (got, reason) = model.check().unwrap_err();
            assert_eq!(got, field, "{reason}");
        }
    }
}
