//! `config.json`: a Hugging Face `Qwen3ForCausalLM` configuration to podctl's model dimensions,
//! and back for an export.
//!
//! Defaults are transformers' own (`Qwen3Config` in transformers 5.24): a field a config leaves
//! out means what it means to transformers, e.g. `tie_word_embeddings` absent is false and
//! `num_key_value_heads` absent or null is `num_attention_heads`. What podctl's model does not
//! implement is refused by name rather than ignored: another architecture, attention biases,
//! sliding-window attention, RoPE scaling, an activation other than SiLU, quantized weights.

use crate::{HfError, Result};
use bundle::ModelConfig;
use serde_json::{Map, Value, json};

/// The file name.
pub const CONFIG_FILE: &str = "config.json";
/// The only architecture podctl loads.
pub const ARCHITECTURE: &str = "Qwen3ForCausalLM";
/// Largest `config.json` read, in bytes (real ones are about 1 KiB).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A parsed `config.json`: podctl's dimensions, and the document itself (what an export writes
/// back, with the fields podctl does not use kept as they were).
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// The dimensions, checked against [`bundle::DIMENSION_LIMITS`].
    pub model: ModelConfig,
    /// The whole document.
    pub raw: Map<String, Value>,
}

/// transformers' name of each of podctl's dimensions, and its `Qwen3Config` default.
const DIMENSIONS: [(&str, &str, Option<u64>); 7] = [
    ("vocab_size", "vocab_size", Some(151_936)),
    ("hidden_size", "hidden_size", Some(4096)),
    ("num_layers", "num_hidden_layers", Some(32)),
    ("num_heads", "num_attention_heads", Some(32)),
    ("num_kv_heads", "num_key_value_heads", None),
    ("head_dim", "head_dim", Some(128)),
    ("intermediate_size", "intermediate_size", Some(22_016)),
];

/// transformers' field name for one of podctl's dimensions (`num_layers` ->
/// `num_hidden_layers`), for messages.
pub fn hf_field(podctl_field: &str) -> &str {
    DIMENSIONS.iter().find(|(ours, _, _)| *ours == podctl_field).map_or(podctl_field, |(_, theirs, _)| theirs)
}

impl HfConfig {
    /// Parses `config.json` bytes; `name` becomes the model's name (`hf:<name>`), `file` labels
    /// errors. Every dimension is checked before the caller can size anything from it.
    pub fn parse(bytes: &[u8], name: &str, file: &str) -> Result<Self> {
        let bad = |reason: String| HfError::invalid(file, reason);
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(bad(format!(
                "{} bytes is not a model configuration (over {MAX_CONFIG_BYTES})",
                bytes.len()
            )));
        }
        let raw: Map<String, Value> =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not a JSON object: {e}")))?;
        match raw.get("architectures") {
            Some(Value::Array(a)) if a.len() == 1 && a[0] == ARCHITECTURE => {}
            Some(other) => {
                return Err(bad(format!(
                    "architectures = {other} is not supported; podctl loads {ARCHITECTURE} checkpoints (Qwen3 dense models)"
                )));
            }
            None => {
                return Err(bad(format!(
                    "names no architectures; podctl loads {ARCHITECTURE} checkpoints, whose config.json says \
                     \"architectures\": [\"{ARCHITECTURE}\"]"
                )));
            }
        }
        if let Some(kind) = raw.get("model_type")
            && kind != "qwen3"
        {
            return Err(bad(format!("model_type = {kind} is not qwen3, the type of {ARCHITECTURE}")));
        }
        refuse_unsupported(&raw).map_err(bad)?;

        let mut dims = [0u64; 7];
        for (slot, (_, field, default)) in dims.iter_mut().zip(DIMENSIONS) {
            *slot = match (raw.get(field), default) {
                (None | Some(Value::Null), None) => 0, // num_key_value_heads: filled in below
                (None, Some(default)) => default,
                (Some(value), _) => value
                    .as_u64()
                    .filter(|&v| v > 0)
                    .ok_or_else(|| bad(format!("{field} = {value} is not a positive integer")))?,
            };
        }
        if dims[4] == 0 {
            dims[4] = dims[3];
        }
        let [vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size] =
            dims;
        let number = |field: &str, default: f64| -> Result<f64> {
            match raw.get(field) {
                None => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| bad(format!("{field} = {v} is not a number"))),
            }
        };
        let tie_embeddings = match raw.get("tie_word_embeddings") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(bad(format!("tie_word_embeddings = {other} is not true or false"))),
        };
        let model = ModelConfig {
            preset: format!("hf:{name}"),
            vocab_size,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            rope_theta: rope_theta(&raw).map_err(bad)?,
            rms_norm_eps: number("rms_norm_eps", 1e-6)?,
            tie_embeddings,
        };
        model.check().map_err(|(field, reason)| {
            bad(format!("{}: {reason}; podctl refuses a model of these dimensions", hf_field(&field)))
        })?;
        Ok(Self { model, raw })
    }

    /// The document an export writes: this one with the dimensions of `model` (which must be
    /// the same model), the weights' `dtype`, and the architecture named.
    pub fn for_export(&self, model: &ModelConfig, dtype: mesh::DType) -> Result<Map<String, Value>> {
        let ours = &self.model;
        let same = (
            ours.vocab_size,
            ours.hidden_size,
            ours.num_layers,
            ours.num_heads,
            ours.num_kv_heads,
            ours.head_dim,
            ours.intermediate_size,
            ours.tie_embeddings,
        ) == (
            model.vocab_size,
            model.hidden_size,
            model.num_layers,
            model.num_heads,
            model.num_kv_heads,
            model.head_dim,
            model.intermediate_size,
            model.tie_embeddings,
        );
        if !same {
            return Err(HfError::Mismatch(format!(
                "the checkpoint's model ({}) is not the one config.json describes ({}); export with the \
                 model directory the job started from",
                describe(model),
                describe(ours)
            )));
        }
        let mut raw = self.raw.clone();
        let key = if raw.contains_key("torch_dtype") { "torch_dtype" } else { "dtype" };
        raw.insert(key.into(), dtype_name(dtype).into());
        Ok(raw)
    }
}

/// A complete `config.json` for `model` when no source configuration is at hand (a model podctl
/// initialized itself): transformers' `Qwen3Config` fields, the rest at their defaults.
pub fn synthesize(model: &ModelConfig, dtype: mesh::DType) -> Map<String, Value> {
    let value = json!({
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": model.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": model.rope_theta},
        "tie_word_embeddings": model.tie_embeddings,
        "attention_bias": false,
        "use_sliding_window": false,
        "max_position_embeddings": 32768,
        "dtype": dtype_name(dtype),
    });
    match value {
        Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// The name transformers gives a dtype in `config.json`.
pub fn dtype_name(dtype: mesh::DType) -> &'static str {
    match dtype {
        mesh::DType::Float32 => "float32",
        mesh::DType::Bfloat16 => "bfloat16",
        mesh::DType::Float16 => "float16",
        other => other.name(),
    }
}

fn describe(m: &ModelConfig) -> String {
    format!(
        "vocab {}, hidden {}, {} layers, {}/{} heads of {}, intermediate {}, {}",
        m.vocab_size,
        m.hidden_size,
        m.num_layers,
        m.num_heads,
        m.num_kv_heads,
        m.head_dim,
        m.intermediate_size,
        if m.tie_embeddings { "tied head" } else { "untied head" }
    )
}

/// Refuses the settings of `Qwen3Config` that podctl's model does not implement.
fn refuse_unsupported(raw: &Map<String, Value>) -> Result<(), String> {
    let refuse =
        |field: &str, value: &Value, why: &str| Err(format!("{field} = {value} is not supported: {why}"));
    if let Some(v) = raw.get("hidden_act")
        && v != "silu"
    {
        return refuse("hidden_act", v, "podctl's MLP is SwiGLU (silu)");
    }
    if let Some(v) = raw.get("attention_bias")
        && v != &Value::Bool(false)
    {
        return refuse("attention_bias", v, "podctl's attention projections have no bias");
    }
    if let Some(v) = raw.get("use_sliding_window")
        && v != &Value::Bool(false)
    {
        return refuse("use_sliding_window", v, "podctl attends over the whole sequence");
    }
    if let Some(Value::Array(types)) = raw.get("layer_types")
        && let Some(other) = types.iter().find(|t| *t != "full_attention")
    {
        return refuse("layer_types", other, "podctl's layers are all full_attention");
    }
    if let Some(v) = raw.get("quantization_config")
        && !v.is_null()
    {
        return refuse("quantization_config", v, "podctl loads float weights (F32, BF16, F16)");
    }
    Ok(())
}

/// RoPE's base as transformers resolves it: `rope_parameters` (or the older `rope_scaling`)
/// with type `default`, else the top-level `rope_theta`, else 10000.
fn rope_theta(raw: &Map<String, Value>) -> Result<f64, String> {
    let top = match raw.get("rope_theta") {
        None => None,
        Some(v) => Some(v.as_f64().ok_or_else(|| format!("rope_theta = {v} is not a number"))?),
    };
    let parameters = ["rope_parameters", "rope_scaling"]
        .into_iter()
        .find_map(|field| raw.get(field).filter(|v| !v.is_null()).map(|v| (field, v)));
    let Some((field, parameters)) = parameters else { return Ok(top.unwrap_or(10_000.0)) };
    let Some(map) = parameters.as_object() else {
        return Err(format!("{field} = {parameters} is not an object"));
    };
    let kind = map.get("rope_type").or_else(|| map.get("type"));
    if let Some(kind) = kind
        && kind != "default"
    {
        return Err(format!(
            "{field}.rope_type = {kind} is not supported: podctl implements plain RoPE (rope_type default), \
             no scaling"
        ));
    }
    if let Some(factor) = map.get("partial_rotary_factor")
        && factor.as_f64() != Some(1.0)
    {
        return Err(format!(
            "{field}.partial_rotary_factor = {factor} is not supported: podctl rotates the whole head"
        ));
    }
    match map.get("rope_theta") {
        Some(v) => v.as_f64().ok_or_else(|| format!("{field}.rope_theta = {v} is not a number")),
        None => Ok(top.unwrap_or(10_000.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen/Qwen3-1.7B's published config.json (transformers 4.51's field names).
    const QWEN3_1_7B: &str = r#"{
      "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
      "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
      "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
      "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
      "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
    }"#;

    fn parse(text: &str) -> Result<HfConfig> {
        HfConfig::parse(text.as_bytes(), "Qwen3-1.7B", "config.json")
    }

    fn with(field: &str, value: Value) -> String {
        let mut raw: Map<String, Value> = serde_json::from_str(QWEN3_1_7B).unwrap();
        raw.insert(field.into(), value);
        serde_json::to_string(&raw).unwrap()
    }

    #[test]
    fn the_published_qwen3_1_7b_config_is_the_preset() {
        let config = parse(QWEN3_1_7B).unwrap();
        let preset = bundle::preset("qwen3-1.7b").unwrap();
        assert_eq!(config.model, ModelConfig { preset: "hf:Qwen3-1.7B".into(), ..preset });
    }

    #[test]
    fn transformers_5_rope_parameters_and_defaults_are_read_as_transformers_reads_them() {
        let mut raw: Map<String, Value> = serde_json::from_str(QWEN3_1_7B).unwrap();
        raw.remove("rope_theta");
        raw.remove("tie_word_embeddings");
        raw.remove("num_key_value_heads");
        raw.insert("rope_parameters".into(), json!({"rope_type": "default", "rope_theta": 5e5}));
        let model = parse(&serde_json::to_string(&raw).unwrap()).unwrap().model;
        assert_eq!((model.rope_theta, model.tie_embeddings, model.num_kv_heads), (5e5, false, 16));
        raw.remove("rope_parameters");
        raw.remove("rope_scaling");
        assert_eq!(parse(&serde_json::to_string(&raw).unwrap()).unwrap().model.rope_theta, 10_000.0);
    }

    #[test]
    fn what_podctl_does_not_implement_is_refused_by_name() {
        let cases = [
            (
                with("architectures", json!(["LlamaForCausalLM"])),
                "architectures = [\"LlamaForCausalLM\"] is not supported; podctl loads Qwen3ForCausalLM",
            ),
            (with("model_type", json!("llama")), "model_type = \"llama\" is not qwen3"),
            (with("attention_bias", json!(true)), "attention_bias = true is not supported"),
            (with("use_sliding_window", json!(true)), "use_sliding_window = true is not supported"),
            (with("hidden_act", json!("gelu")), "hidden_act = \"gelu\" is not supported"),
            (
                with("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0})),
                "rope_scaling.rope_type = \"yarn\" is not supported",
            ),
            (with("quantization_config", json!({"quant_method": "fp8"})), "quantization_config"),
            (with("vocab_size", json!(1u64 << 40)), "vocab_size: 1099511627776 is out of range"),
            (with("num_hidden_layers", json!(-2)), "num_hidden_layers = -2 is not a positive integer"),
            (with("head_dim", json!(127)), "head_dim: 127 is odd"),
            (with("intermediate_size", json!(1u64 << 21)), "intermediate_size: 2097152 is out of range"),
            (with("rms_norm_eps", json!("small")), "rms_norm_eps = \"small\" is not a number"),
            (with("tie_word_embeddings", json!(1)), "tie_word_embeddings = 1 is not true or false"),
            ("[1, 2]".to_string(), "not a JSON object"),
        ];
        for (text, want) in cases {
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.starts_with("config.json: ") && e.contains(want), "{want}: {e}");
        }
        let mut raw: Map<String, Value> = serde_json::from_str(QWEN3_1_7B).unwrap();
        raw.remove("architectures");
        let e = parse(&serde_json::to_string(&raw).unwrap()).unwrap_err().to_string();
        assert!(e.contains("names no architectures"), "{e}");
    }

    #[test]
    fn an_export_keeps_the_document_and_refuses_another_model() {
        let config = parse(QWEN3_1_7B).unwrap();
        let out = config.for_export(&config.model, mesh::DType::Float32).unwrap();
        assert_eq!(out["torch_dtype"], "float32");
        assert_eq!(out["max_window_layers"], 28);
        let other = ModelConfig { num_layers: 27, ..config.model.clone() };
        let e = config.for_export(&other, mesh::DType::Bfloat16).unwrap_err().to_string();
        assert!(e.contains("27 layers") && e.contains("28 layers"), "{e}");
        let made = synthesize(&config.model, mesh::DType::Bfloat16);
        let again =
            HfConfig::parse(&serde_json::to_vec(&made).unwrap(), "Qwen3-1.7B", "config.json").unwrap();
        assert_eq!(again.model, config.model);
    }
}
