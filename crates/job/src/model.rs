//! `model:`: a preset's shape (initialized from the job's seed) or a Hugging Face model
//! directory whose `config.json` gives the shape and whose safetensors give the weights.
//!
//! ```yaml
//! model: qwen3-1.7b                      # a preset (tiny, small, qwen3-0.6b, qwen3-1.7b)
//! model: { hf: gs://bucket/Qwen3-1.7B }  # a Hugging Face directory: a local path, file://, s3://, gs://
//! ```
//!
//! The job crate does no I/O beyond the spec file, so a Hugging Face model's dimensions come
//! through a [`ModelReader`] its caller supplies (the CLI reads `config.json` with the `hf`
//! crate), and the spec then carries them (`model.config`): a spec submitted to the coordinator
//! and handed to workers needs no second read of the file.

use crate::JobError;
use bundle::ModelConfig;
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

/// The model a job trains.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ModelSpec {
    /// A preset's dimensions, e.g. `tiny` or `qwen3-1.7b`; parameters from `init(seed)`.
    Preset(String),
    /// A Hugging Face `Qwen3ForCausalLM` directory.
    Hf(HfModelSpec),
}

/// `model: { hf: <directory> }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfModelSpec {
    /// The model directory: a local path, `file:///dir`, `s3://bucket/prefix`, `gs://bucket/prefix`.
    pub hf: String,
    /// Its `config.json`'s dimensions, filled in when the spec is loaded; a spec passed on
    /// carries them. Not for users to write: the directory's own file is the truth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ModelConfig>,
}

/// Reads a Hugging Face model directory's dimensions (its `config.json`), for a spec naming one.
pub trait ModelReader {
    /// The model at `uri`, or a message naming the file and what is wrong.
    fn read_config(&self, uri: &str) -> Result<ModelConfig, String>;
}

/// The reader of callers that cannot read model directories ([`crate::JobSpec::from_yaml`]):
/// a spec whose Hugging Face model was not read yet is refused, saying who reads it.
pub(crate) struct NoReader;

impl ModelReader for NoReader {
    fn read_config(&self, uri: &str) -> Result<ModelConfig, String> {
        Err(format!(
            "'{uri}' is a Hugging Face model whose config.json this command does not read; `podctl plan` and \
             `podctl ckpt import` do"
        ))
    }
}

impl ModelSpec {
    /// The model's name: the preset, or `hf:<directory>`.
    pub fn name(&self) -> String {
        match self {
            ModelSpec::Preset(name) => name.clone(),
            ModelSpec::Hf(hf) => format!("hf:{}", hf.hf),
        }
    }

    /// The Hugging Face directory, if the model is one.
    pub fn hf_dir(&self) -> Option<&str> {
        match self {
            ModelSpec::Preset(_) => None,
            ModelSpec::Hf(hf) => Some(&hf.hf),
        }
    }

    /// The model's dimensions: the preset's, or those read from the directory's `config.json`.
    pub fn config(&self) -> Result<ModelConfig, JobError> {
        match self {
            ModelSpec::Preset(name) => {
                bundle::preset(name).map_err(|reason| JobError::Invalid { field: "model", reason })
            }
            ModelSpec::Hf(HfModelSpec { config: Some(config), .. }) => Ok(config.clone()),
            ModelSpec::Hf(HfModelSpec { hf, config: None }) => Err(JobError::Invalid {
                field: "model.hf",
                reason: format!("the dimensions of '{hf}' were not read; load the spec with a model reader"),
            }),
        }
    }

    /// Reads a Hugging Face model's dimensions with `reader` unless the spec carries them, and
    /// checks the directory's URI and the dimensions.
    pub(crate) fn resolve(&mut self, reader: &dyn ModelReader) -> Result<(), JobError> {
        let invalid = |field, reason: String| Err(JobError::Invalid { field, reason });
        let ModelSpec::Hf(spec) = self else { return Ok(()) };
        let uri = spec.hf.trim();
        if uri.is_empty() {
            return invalid(
                "model.hf",
                "is empty; name the model directory, e.g. gs://bucket/Qwen3-1.7B".into(),
            );
        }
        if uri.contains("://") && !["file://", "s3://", "gs://"].iter().any(|s| uri.starts_with(s)) {
            return invalid(
                "model.hf",
                format!(
                    "'{uri}' is not a model directory; use a local path, file:///dir, s3://bucket/prefix or gs://bucket/prefix"
                ),
            );
        }
        let config = match spec.config.take() {
            Some(config) => config,
            None => {
                reader.read_config(uri).map_err(|reason| JobError::Invalid { field: "model.hf", reason })?
            }
        };
        if let Err((field, reason)) = config.check() {
            return invalid("model.config", format!("{field}: {reason}"));
        }
        spec.config = Some(config);
        Ok(())
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl From<&str> for ModelSpec {
    fn from(name: &str) -> Self {
        ModelSpec::Preset(name.to_string())
    }
}

impl<'de> Deserialize<'de> for ModelSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ModelSpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a preset name (tiny, small, qwen3-0.6b, qwen3-1.7b) or { hf: <model directory> }",
                )
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<ModelSpec, E> {
                Ok(ModelSpec::Preset(name.to_string()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ModelSpec, A::Error> {
                HfModelSpec::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(ModelSpec::Hf)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}
