//! The job spec: what to train, on which mesh, with which data.
//!
//! A job spec is YAML written by a user (`examples/*.yaml`). [`JobSpec::from_yaml`] parses it
//! (unknown fields are refused, so a typo never falls back to a default silently) and
//! [`JobSpec::validate`] checks that the numbers fit together, with messages that name the field
//! and the fix. Everything derived from the spec (accumulation steps, the ICI mesh, the learning
//! rate at a step) is a method here, so the CLI, the coordinator and the workers agree.
//!
//! **Architecture Invariant:** no I/O beyond reading the spec file; no knowledge of PJRT,
//! gRPC or the bundle format.
#![deny(missing_docs)]

mod schedule;

pub use schedule::{OptimizerSpec, Schedule};

use data::DataConfig;
use mesh::IciMesh;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why a job spec cannot run.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The spec file could not be read.
    #[error("cannot read job spec {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The YAML is malformed or does not match the spec's shape.
    #[error("job spec {path} is not valid: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line, column and a snippet.
        message: String,
    },
    /// A field's value does not work.
    #[error("job spec field `{field}`: {reason}")]
    Invalid {
        /// The field, e.g. `batch.micro`.
        field: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The data section is invalid.
    #[error("job spec: {0}")]
    Data(#[from] data::DataError),
}

/// A training job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The job's name: lowercase letters, digits and `-` (it names pods and run directories).
    pub name: String,
    /// The model preset, e.g. `tiny` or `qwen3-1.7b`.
    pub model: String,
    /// How devices are arranged.
    pub mesh: MeshSpec,
    /// Rows per optimizer step and per device call.
    pub batch: BatchSpec,
    /// Tokens per row.
    pub seq_len: u64,
    /// Optimizer steps to run.
    pub steps: u64,
    /// Seeds initialization and data order.
    #[serde(default)]
    pub seed: u64,
    /// AdamW and the learning-rate schedule.
    #[serde(default)]
    pub optimizer: OptimizerSpec,
    /// Where examples come from.
    pub data: DataConfig,
    /// Memory and precision options of the exported step.
    #[serde(default)]
    pub train: TrainOptions,
    /// The run directory (metrics, plots, local checkpoints); `runs/<name>` by default.
    #[serde(default)]
    pub output: Option<PathBuf>,
    /// A bundle exported beforehand; podctl exports one for the job when absent.
    #[serde(default)]
    pub bundle: Option<PathBuf>,
    /// When and where to save checkpoints; none are saved when absent.
    #[serde(default)]
    pub checkpoint: Option<CheckpointSpec>,
    /// Where the job runs.
    #[serde(default)]
    pub runtime: RuntimeSpec,
}

/// The mesh: `dcn` slices, each an ICI mesh `(fsdp, tp)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshSpec {
    /// Slices (data-parallel replicas over the data-centre network).
    #[serde(default = "one")]
    pub dcn: usize,
    /// The axes inside one slice.
    pub ici: IciSpec,
}

/// The axes inside one slice, in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IciSpec {
    /// Parameters and the batch are split over this axis (fully sharded data parallel).
    #[serde(default = "one")]
    pub fsdp: usize,
    /// Heads, the MLP and the vocabulary are split over this axis (tensor parallel).
    #[serde(default = "one")]
    pub tp: usize,
}

fn one() -> usize {
    1
}

/// Batch sizes, in rows (sequences).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Rows per optimizer step, over all slices.
    pub global: u64,
    /// Rows per device call on one slice (the gradient is accumulated over calls).
    pub micro: u64,
}

/// Options of the exported step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainOptions {
    /// Rematerialization of the layer body: `none`, `dots` or `full`.
    pub remat: String,
    /// Time steps per chunk of the chunked loss.
    pub loss_chunk: u64,
    /// Parameters, optimizer state and gradients.
    pub param_dtype: mesh::DType,
    /// Matmuls and activations.
    pub compute_dtype: mesh::DType,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            remat: "none".into(),
            loss_chunk: 64,
            param_dtype: mesh::DType::Float32,
            compute_dtype: mesh::DType::Float32,
        }
    }
}

/// Checkpoint schedule, place and retention.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Save after every this many steps (and after the last step).
    pub every: u64,
    /// The checkpoint root: `file://...`, `s3://bucket/prefix` or `gs://bucket/prefix`;
    /// `<output>/checkpoints` by default.
    #[serde(default)]
    pub uri: Option<String>,
    /// Keep the last this many committed checkpoints.
    #[serde(default = "default_keep")]
    pub keep: u32,
    /// Also keep every checkpoint whose step is a multiple of this (0: none).
    #[serde(default)]
    pub keep_every: u64,
}

fn default_keep() -> u32 {
    3
}

/// Where and how the job runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSpec {
    /// The PJRT plugin; found in the project's Python environment when absent.
    pub plugin: Option<PathBuf>,
    /// Devices each host has. Locally the CPU plugin makes as many as the mesh needs; on a
    /// TPU v6e-8 host this is 8, and the ICI mesh must use them all.
    pub devices_per_host: Option<usize>,
}

impl JobSpec {
    /// Reads, parses and validates a spec file.
    pub fn load(path: &Path) -> Result<Self, JobError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| JobError::Io { path: path.into(), source })?;
        Self::from_yaml(&text, path)
    }

    /// Parses and validates spec text; `path` only labels errors.
    pub fn from_yaml(text: &str, path: &Path) -> Result<Self, JobError> {
        let spec: JobSpec = serde_saphyr::from_str(text)
            .map_err(|e| JobError::Yaml { path: path.into(), message: e.to_string() })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks that the fields fit together.
    pub fn validate(&self) -> Result<(), JobError> {
        let invalid = |field, reason: String| Err(JobError::Invalid { field, reason });
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 63
            && self.name.starts_with(|c: char| c.is_ascii_lowercase())
            && self.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !name_ok {
            return invalid(
                "name",
                format!(
                    "'{}' is not a job name: use 1-63 lowercase letters, digits and '-', starting with a letter",
                    self.name
                ),
            );
        }
        let model = match bundle::preset(&self.model) {
            Ok(model) => model,
            Err(reason) => return invalid("model", reason),
        };
        let MeshSpec { dcn, ici: IciSpec { fsdp, tp } } = self.mesh;
        for (field, value) in [("mesh.dcn", dcn), ("mesh.ici.fsdp", fsdp), ("mesh.ici.tp", tp)] {
            if value == 0 {
                return invalid(field, "is 0; every mesh axis needs at least one device".into());
            }
        }
        if let Some(devices) = self.runtime.devices_per_host
            && fsdp * tp != devices
        {
            return invalid(
                "mesh.ici",
                format!(
                    "(fsdp={fsdp}, tp={tp}) uses {} devices per slice, but each host has {devices}; \
                     choose axes whose product is {devices}: {}",
                    fsdp * tp,
                    tilings(devices)
                ),
            );
        }
        for (what, size) in [
            ("query heads", model.num_heads),
            ("key/value heads", model.num_kv_heads),
            ("MLP width", model.intermediate_size),
            ("vocabulary", model.vocab_size),
        ] {
            if size % tp as u64 != 0 {
                return invalid(
                    "mesh.ici.tp",
                    format!(
                        "{tp} does not divide the {what} of {} ({size}); use a tp that divides {size}",
                        self.model
                    ),
                );
            }
        }
        let BatchSpec { global, micro } = self.batch;
        if micro == 0 || global == 0 {
            return invalid("batch", "global and micro must both be at least 1".into());
        }
        if micro % fsdp as u64 != 0 {
            return invalid(
                "batch.micro",
                format!("{micro} does not split over mesh.ici.fsdp={fsdp}; use a multiple of {fsdp}"),
            );
        }
        let per_step = micro * dcn as u64;
        if global % per_step != 0 {
            return invalid(
                "batch.global",
                format!(
                    "{global} is not a multiple of batch.micro x mesh.dcn = {micro} x {dcn} = {per_step}; \
                     use e.g. {}",
                    (global / per_step).max(1) * per_step
                ),
            );
        }
        if self.seq_len < 2 {
            return invalid("seq_len", format!("{} is too short; use at least 2", self.seq_len));
        }
        if self.steps == 0 {
            return invalid("steps", "is 0; train for at least one step".into());
        }
        if !["none", "dots", "full"].contains(&self.train.remat.as_str()) {
            return invalid("train.remat", format!("'{}' is not one of none, dots, full", self.train.remat));
        }
        if self.train.loss_chunk == 0 {
            return invalid("train.loss_chunk", "is 0; use a positive number of time steps".into());
        }
        if let Some(checkpoint) = &self.checkpoint {
            if checkpoint.every == 0 {
                return invalid(
                    "checkpoint.every",
                    "is 0; save every N >= 1 steps, or drop `checkpoint:`".into(),
                );
            }
            if checkpoint.keep == 0 {
                return invalid("checkpoint.keep", "is 0; keep at least the latest checkpoint".into());
            }
            if let Some(uri) = &checkpoint.uri
                && !["file://", "s3://", "gs://"].iter().any(|scheme| uri.starts_with(scheme))
            {
                return invalid(
                    "checkpoint.uri",
                    format!(
                        "'{uri}' is not a checkpoint location; use file:///path, s3://bucket/prefix or gs://bucket/prefix"
                    ),
                );
            }
        }
        self.optimizer.validate(self.steps)?;
        self.data.validate()?;
        Ok(())
    }

    /// The ICI mesh of one slice.
    pub fn ici_mesh(&self) -> IciMesh {
        IciMesh::new([("fsdp", self.mesh.ici.fsdp), ("tp", self.mesh.ici.tp)])
            .expect("validated axes are positive and distinct")
    }

    /// Micro-batches each slice runs per optimizer step.
    pub fn accum_steps(&self) -> u64 {
        self.batch.global / (self.batch.micro * self.mesh.dcn as u64)
    }

    /// Micro-batches in one global step, over all slices.
    pub fn micro_batches_per_step(&self) -> u64 {
        self.batch.global / self.batch.micro
    }

    /// The run directory.
    pub fn output_dir(&self) -> PathBuf {
        self.output.clone().unwrap_or_else(|| PathBuf::from("runs").join(&self.name))
    }

    /// The checkpoint root URI, when the job saves checkpoints.
    pub fn checkpoint_uri(&self) -> Option<String> {
        let checkpoint = self.checkpoint.as_ref()?;
        Some(checkpoint.uri.clone().unwrap_or_else(|| {
            let dir = self.output_dir().join("checkpoints");
            let dir = std::path::absolute(&dir).unwrap_or(dir);
            format!("file://{}", dir.display())
        }))
    }

    /// Serializes the spec back to YAML-compatible JSON text (JSON is YAML), e.g. to submit it.
    pub fn to_yaml(&self) -> String {
        serde_json::to_string_pretty(self).expect("job specs serialize")
    }
}

/// The `(fsdp, tp)` pairs that use exactly `devices` devices, for error messages.
fn tilings(devices: usize) -> String {
    (1..=devices)
        .filter(|f| devices % f == 0)
        .map(|f| format!("({f},{})", devices / f))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
