//! Model presets, shared with the exporter through `models/podctl_models/presets.json` so that
//! both sides agree on every shape without a bundle (the planner's analytic mode, job checks).

use crate::ModelConfig;
use std::collections::BTreeMap;

const PRESETS_JSON: &str = include_str!("../../../models/podctl_models/presets.json");

/// Every preset, by name.
pub fn presets() -> BTreeMap<String, ModelConfig> {
    let raw: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(PRESETS_JSON).expect("presets.json is valid JSON (checked by tests)");
    raw.into_iter()
        .filter(|(name, _)| !name.starts_with('_'))
        .map(|(name, mut dims)| {
            dims["preset"] = serde_json::Value::String(name.clone());
            let config: ModelConfig = serde_json::from_value(dims).expect("presets.json matches ModelConfig");
            (name, config)
        })
        .collect()
}

/// The preset called `name`, or an error listing the known ones.
pub fn preset(name: &str) -> Result<ModelConfig, String> {
    let mut all = presets();
    all.remove(name).ok_or_else(|| {
        format!(
            "'{name}' is not a model preset; choose one of {}",
            all.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    })
}

impl ModelConfig {
    /// Number of parameters (embedding tied to the output projection when `tie_embeddings`).
    pub fn num_params(&self) -> u64 {
        let (d, h, kv, hd, f, l) = (
            self.hidden_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate_size,
            self.num_layers,
        );
        let attention = d * h * hd + 2 * d * kv * hd + h * hd * d + 2 * hd;
        let mlp = 3 * d * f;
        let norms = 2 * d;
        let embed = self.vocab_size * d * if self.tie_embeddings { 1 } else { 2 };
        embed + l * (attention + mlp + norms) + d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_count_like_the_exporter() {
        let all = presets();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["qwen3-0.6b", "qwen3-1.7b", "small", "tiny"]);
        // The exporter's counts (podctl_models.qwen3.num_params).
        assert_eq!(all["tiny"].num_params(), 410_368);
        assert_eq!(all["small"].num_params(), 3_181_056);
        assert_eq!(all["qwen3-0.6b"].num_params(), 596_049_920);
        assert_eq!(all["qwen3-1.7b"].num_params(), 1_720_574_976);
        assert_eq!(all["qwen3-1.7b"].preset, "qwen3-1.7b");
        let e = preset("gpt-17").unwrap_err();
        assert!(e.contains("choose one of qwen3-0.6b, qwen3-1.7b, small, tiny"), "{e}");
    }
}
