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
    /// How the exporter is told about this model: `--preset NAME` when it is exactly that
    /// preset, else `--model-json` with the manifest's `model` object (a Hugging Face model's
    /// shape), so the exporter lowers for the very dimensions given.
    pub fn exporter_args(&self) -> [String; 2] {
        match preset(&self.preset) {
            Ok(known) if known == *self => ["--preset".into(), self.preset.clone()],
            _ => ["--model-json".into(), serde_json::to_string(self).expect("model configs serialize")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_unknown_names_list_the_known_ones() {
        let all = presets();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["qwen3-0.6b", "qwen3-1.7b", "small", "tiny"]);
        assert_eq!(all["qwen3-1.7b"].preset, "qwen3-1.7b");
        assert_eq!(all["tiny"].exporter_args(), ["--preset", "tiny"]);
        let renamed = ModelConfig { preset: "hf:Qwen3-1.7B".into(), ..all["qwen3-1.7b"].clone() };
        let [flag, json] = renamed.exporter_args();
        assert_eq!(flag, "--model-json");
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), renamed);
        let e = preset("gpt-17").unwrap_err();
        assert!(e.contains("choose one of qwen3-0.6b, qwen3-1.7b, small, tiny"), "{e}");
    }
}
