//! The job spec: what to train, on which mesh, with which data.
//!
//! A job spec is YAML written by a user (`examples/*.yaml`). [`JobSpec::from_yaml`] parses it
//! (unknown fields are refused, so a typo never falls back to a default silently), resolves the
//! mesh (the short form `"(8,2)"` over `hosts`, and `mesh: auto`, which the planner's analytic
//! model chooses) and [`JobSpec::validate`] checks that the numbers fit together, with messages
//! that name the field and the fix. Everything derived from the spec (accumulation steps, the
//! ICI mesh, the learning rate at a step, the workload the planner sees) is a method here, so the
//! CLI, the coordinator and the workers agree.
//!
//! **Architecture Invariant:** no I/O beyond reading the spec file; no knowledge of PJRT,
//! gRPC or the bundle format. The planner is used through its pure, analytic side only.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod eval;
mod grpo;
mod kubernetes;
mod mesh_spec;
mod model;
mod overrides;
mod planning;
mod schedule;

pub use eval::EvalSpec;
pub use grpo::{GrpoSpec, RewardFunction, RewardKind};
pub use kubernetes::KubernetesSpec;
pub use mesh_spec::{IciSpec, MeshRequest, MeshSpec};
pub use model::{HfModelSpec, ModelReader, ModelSpec};
pub use overrides::Override;
pub use planning::{DEFAULT_DEVICE_MEMORY, MemorySize};
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
    /// A `--set FIELD=VALUE` cannot be applied, or what it sets is not valid.
    #[error("--set {set}: {reason}")]
    Override {
        /// The override as given.
        set: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

impl fault::Classify for JobError {
    fn fault(&self) -> fault::Fault {
        match self {
            JobError::Io { .. }
            | JobError::Yaml { .. }
            | JobError::Invalid { .. }
            | JobError::Override { .. } => fault::Fault::Input,
            JobError::Data(e) => e.fault(),
        }
    }
}

/// A training job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The job's name: lowercase letters, digits and `-` (it names pods and run directories).
    pub name: String,
    /// The model: a preset (`tiny`, `qwen3-1.7b`) or `{ hf: <Hugging Face model directory> }`.
    pub model: ModelSpec,
    /// How devices are arranged.
    pub mesh: MeshSpec,
    /// Rows per optimizer step and per device call.
    pub batch: BatchSpec,
    /// Tokens per row; derived for GRPO (prompt + completion).
    #[serde(default)]
    pub seq_len: u64,
    /// GRPO's rollouts, objective and rewards; absent for supervised fine-tuning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpo: Option<GrpoSpec>,
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
    /// Greedy held-out evaluation; a GRPO job whose data has held-out problems evaluates 256 of
    /// them before and after training when this is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalSpec>,
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
    /// How its pods queue on a Kubernetes cluster (a Kueue queue, a priority class).
    #[serde(default)]
    pub kubernetes: KubernetesSpec,
}

/// Batch sizes, in rows (sequences).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Rows per optimizer step, over all slices.
    pub global: u64,
    /// Rows per device call on one slice (the gradient is accumulated over calls). Absent (0)
    /// only with `mesh: auto`, which then chooses it.
    #[serde(default)]
    pub micro: u64,
}

/// Options of the exported step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainOptions {
    /// Rematerialization of the layer body: `none`, `dots` or `full`; `auto` (the default) lets
    /// `mesh: auto` choose, and is `none` with any other mesh.
    pub remat: String,
    /// Time steps per chunk of the chunked loss (for GRPO, of the log-probs); at least
    /// `seq_len` means a single chunk.
    pub loss_chunk: u64,
    /// Parameters, optimizer state and gradients.
    pub param_dtype: mesh::DType,
    /// Matmuls and activations.
    pub compute_dtype: mesh::DType,
    /// How each layer attends: `xla` (plain, `[T, T]` scores), `blockwise` (online softmax over
    /// key blocks, any platform) or `pallas` (TPU flash attention; blockwise on the CPU plugin);
    /// `auto` (the default) lets `mesh: auto` choose, and is `xla` with any other mesh.
    pub attention: String,
    /// Keys per block of `blockwise` attention.
    pub attention_block: u64,
    /// LoRA adapters instead of full fine-tuning; absent trains every parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraSpec>,
    /// Keep AdamW's moments in host memory between steps (TPU only: `pinned_host`). Absent:
    /// `mesh: auto` may turn it on for a TPU runtime; off with any other mesh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer_offload: Option<bool>,
}

impl TrainOptions {
    /// Whether AdamW state is offloaded to host memory.
    pub fn offload(&self) -> bool {
        self.optimizer_offload == Some(true)
    }
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            remat: "auto".into(),
            loss_chunk: 64,
            param_dtype: mesh::DType::Float32,
            compute_dtype: mesh::DType::Float32,
            attention: "auto".into(),
            attention_block: 512,
            lora: None,
            optimizer_offload: None,
        }
    }
}

/// The projections LoRA adapters may sit on.
pub const LORA_TARGETS: [&str; 7] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// LoRA: low-rank adapters on chosen projections train; the base stays frozen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    /// Inner dimension of each adapter pair.
    pub rank: u64,
    /// The adapters' product is scaled by `alpha / rank`.
    #[serde(default = "default_lora_alpha")]
    pub alpha: f64,
    /// The projections with adapters; all seven by default.
    #[serde(default = "default_lora_targets")]
    pub targets: Vec<String>,
    /// The frozen base's dtype.
    #[serde(default = "default_lora_base_dtype")]
    pub base_dtype: mesh::DType,
}

fn default_lora_alpha() -> f64 {
    16.0
}

fn default_lora_targets() -> Vec<String> {
    LORA_TARGETS.iter().map(|t| t.to_string()).collect()
}

fn default_lora_base_dtype() -> mesh::DType {
    mesh::DType::Bfloat16
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
    /// The kind of host the job is planned for: `v6e-8`, `v6e-4`, `v6e-1` or `cpu-N`; this
    /// machine's CPU devices when absent.
    pub accelerator: Option<String>,
    /// What one CPU device may use, for planning local runs (`4GiB`, `512MiB`);
    /// [`DEFAULT_DEVICE_MEMORY`] when absent. TPU limits are fixed.
    pub device_memory: Option<MemorySize>,
}

impl JobSpec {
    /// Reads, parses, resolves and validates a spec file.
    pub fn load(path: &Path) -> Result<Self, JobError> {
        Self::from_yaml(&read(path)?, path)
    }

    /// Parses, resolves and validates spec text; `path` only labels errors. A Hugging Face
    /// model must carry its dimensions (a spec loaded before with [`JobSpec::from_yaml_with`]).
    pub fn from_yaml(text: &str, path: &Path) -> Result<Self, JobError> {
        Self::from_yaml_with(text, path, &model::NoReader)
    }

    /// Reads, parses, resolves and validates a spec file, reading a Hugging Face model's
    /// dimensions with `reader`.
    pub fn load_with(path: &Path, reader: &dyn ModelReader) -> Result<Self, JobError> {
        Self::from_yaml_with(&read(path)?, path, reader)
    }

    /// [`JobSpec::load_with`] with `overrides` (`--set`) applied to the file's fields first, so
    /// they are checked as the file is.
    pub fn load_overridden(
        path: &Path,
        overrides: &[Override],
        reader: &dyn ModelReader,
    ) -> Result<Self, JobError> {
        Self::from_yaml_overridden(&read(path)?, path, overrides, reader)
    }

    /// [`JobSpec::from_yaml_with`] with `overrides` applied to the text's fields first.
    pub fn from_yaml_overridden(
        text: &str,
        path: &Path,
        overrides: &[Override],
        reader: &dyn ModelReader,
    ) -> Result<Self, JobError> {
        if overrides.is_empty() {
            return Self::from_yaml_with(text, path, reader);
        }
        let text = overrides::apply(text, overrides, path)?;
        Self::from_yaml_with(&text, path, reader).map_err(|e| overrides::attribute(e, overrides))
    }

    /// [`JobSpec::from_yaml`], reading a Hugging Face model's dimensions with `reader`.
    pub fn from_yaml_with(text: &str, path: &Path, reader: &dyn ModelReader) -> Result<Self, JobError> {
        let mut spec: JobSpec = serde_saphyr::from_str(text)
            .map_err(|e| JobError::Yaml { path: path.into(), message: e.to_string() })?;
        spec.model.resolve(reader)?;
        spec.resolve()?;
        spec.validate()?;
        Ok(spec)
    }

    /// The model's dimensions (a preset's, or its Hugging Face `config.json`'s).
    pub fn model_config(&self) -> Result<bundle::ModelConfig, JobError> {
        self.model.config()
    }

    /// Fills in what the spec leaves to podctl: a GRPO row's length and its default evaluation,
    /// the axes of a short-form or `auto` mesh (with the micro-batch and remat policy the planner
    /// picks), and the remat policy `auto` means with a fixed mesh.
    fn resolve(&mut self) -> Result<(), JobError> {
        if self.eval.is_none() && self.grpo.is_some() && self.data.has_held_out() {
            self.eval = Some(EvalSpec::default());
        }
        let invalid = |field, reason: String| Err(JobError::Invalid { field, reason });
        match &self.grpo {
            Some(g) => {
                let total = g.prompt_len + g.max_new_tokens;
                if self.seq_len == 0 {
                    self.seq_len = total;
                } else if self.seq_len != total {
                    return invalid(
                        "seq_len",
                        format!(
                            "{} but a GRPO row is grpo.prompt_len + grpo.max_new_tokens = {total} tokens; \
                             drop seq_len (it is derived) or set it to {total}",
                            self.seq_len
                        ),
                    );
                }
            }
            None if self.seq_len == 0 => {
                return invalid(
                    "seq_len",
                    "is missing (or 0); set the tokens per row, e.g. seq_len: 128".into(),
                );
            }
            None => {}
        }
        self.check_basics()?;
        match self.mesh.request.clone() {
            MeshRequest::Axes => {}
            MeshRequest::Shape { data, tp, hosts } => {
                if data % hosts != 0 {
                    let divisors: Vec<String> =
                        (1..=data).filter(|h| data % h == 0).map(|h| h.to_string()).collect();
                    return invalid(
                        "mesh.hosts",
                        format!(
                            "({data},{tp}) over {hosts} hosts: the data axis of {data} devices does not split \
                             into {hosts} equal hosts; use hosts {} or a data size that is a multiple of {hosts}",
                            divisors.join(", ")
                        ),
                    );
                }
                self.mesh.dcn = hosts;
                self.mesh.ici = IciSpec { fsdp: data / hosts, tp };
            }
            MeshRequest::Auto { hosts, .. } => self.plan_mesh(hosts)?,
        }
        if self.train.remat == "auto" {
            self.train.remat = "none".into();
        }
        if self.train.attention == "auto" {
            self.train.attention = "xla".into();
        }
        self.train.optimizer_offload.get_or_insert(false);
        Ok(())
    }

    /// Checks that the fields fit together.
    pub fn validate(&self) -> Result<(), JobError> {
        self.check_basics()?;
        self.check_layout()
    }

    /// The checks that do not depend on the mesh.
    fn check_basics(&self) -> Result<(), JobError> {
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
        self.model_config()?;
        if self.batch.global == 0 {
            return invalid("batch.global", "is 0; train on at least one row per step".into());
        }
        if let Some(g) = &self.grpo {
            g.validate(&self.data)?;
            if !self.batch.global.is_multiple_of(g.generations) {
                return invalid(
                    "batch.global",
                    format!(
                        "{} rows are not whole groups of grpo.generations = {}; use prompts x {}, e.g. {}",
                        self.batch.global,
                        g.generations,
                        g.generations,
                        (self.batch.global / g.generations).max(1) * g.generations
                    ),
                );
            }
        }
        if self.seq_len < 2 {
            return invalid("seq_len", format!("{} is too short; use at least 2", self.seq_len));
        }
        if self.steps == 0 {
            return invalid("steps", "is 0; train for at least one step".into());
        }
        if !["auto", "none", "dots", "full"].contains(&self.train.remat.as_str()) {
            return invalid(
                "train.remat",
                format!("'{}' is not one of auto, none, dots, full", self.train.remat),
            );
        }
        self.check_levers()?;
        if self.train.loss_chunk == 0 {
            return invalid("train.loss_chunk", "is 0; use a positive number of time steps".into());
        }
        // A chunk as long as the sequence or longer is one chunk: only a shorter one must divide it.
        if !self.seq_len.is_multiple_of(self.train.loss_chunk.min(self.seq_len)) {
            let divisor =
                (1..=self.train.loss_chunk.min(self.seq_len)).rev().find(|c| self.seq_len.is_multiple_of(*c));
            return invalid(
                "train.loss_chunk",
                format!(
                    "{} does not divide seq_len = {}; set it to a divisor of {}, e.g. {}",
                    self.train.loss_chunk,
                    self.seq_len,
                    self.seq_len,
                    divisor.unwrap_or(1)
                ),
            );
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
            // URL parsing would resolve `..` silently (file://) where the store refuses it
            // (s3://, gs://): refuse it here, for every scheme, so the root is what it says.
            if let Some(uri) = &checkpoint.uri
                && let Some((_, rest)) = uri.split_once("://")
                && rest.split(['/', '\\', '?', '#']).any(|s| s == "." || s == "..")
            {
                return invalid(
                    "checkpoint.uri",
                    format!("'{uri}' has a '.' or '..' segment; write the checkpoint root without them"),
                );
            }
        }
        self.check_runtime()?;
        self.kubernetes.validate()?;
        self.optimizer.validate(self.steps)?;
        self.data.validate()?;
        if let Some(eval) = &self.eval {
            eval.validate(&self.data, self.grpo.is_some())?;
        }
        if self.evaluation().is_some() && self.train.lora.is_some() {
            return Err(JobError::Invalid {
                field: "eval",
                reason: "held-out evaluation of a LoRA job is not supported yet; set eval.problems: 0 or \
                         drop train.lora"
                    .into(),
            });
        }
        Ok(())
    }

    /// The held-out evaluation the job runs, `None` when it runs none.
    pub fn evaluation(&self) -> Option<&EvalSpec> {
        self.eval.as_ref().filter(|eval| eval.problems > 0)
    }

    /// The checks of a resolved mesh against the model, the hosts and the batch.
    fn check_layout(&self) -> Result<(), JobError> {
        let invalid = |field, reason: String| Err(JobError::Invalid { field, reason });
        let model = self.model_config()?;
        let MeshSpec { dcn, ici: IciSpec { fsdp, tp }, .. } = self.mesh;
        for (field, value) in [("mesh.dcn", dcn), ("mesh.ici.fsdp", fsdp), ("mesh.ici.tp", tp)] {
            if value == 0 {
                return invalid(field, "is 0; every mesh axis needs at least one device".into());
            }
        }
        if self.train.lora.is_some() && dcn > 1 {
            return invalid(
                "train.lora",
                format!(
                    "LoRA runs on one slice for now (the base is saved and restored by one host), but \
                     mesh.dcn = {dcn}; use mesh.dcn = 1 or drop `lora:`"
                ),
            );
        }
        if let Some((devices, what)) = self.host_devices()?
            && fsdp * tp != devices
        {
            return invalid(
                "mesh.ici",
                format!(
                    "(fsdp={fsdp}, tp={tp}) uses {} devices per slice, but {what} has {devices}; \
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
                let devices = fsdp * tp;
                let fits: Vec<String> = (1..=devices)
                    .rev()
                    .filter(|f| devices % f == 0)
                    .map(|f| (f, (devices / f) as u64))
                    .filter(|&(_, t)| {
                        [model.num_heads, model.num_kv_heads, model.intermediate_size, model.vocab_size]
                            .iter()
                            .all(|size| size % t == 0)
                    })
                    .map(|(f, t)| format!("({f},{t})"))
                    .collect();
                return invalid(
                    "mesh.ici.tp",
                    format!(
                        "{tp} does not divide the {what} of {} ({size}); use a tp that divides {size}: \
                         meshes of {devices} devices that divide the model are {}",
                        self.model,
                        fits.join(", ")
                    ),
                );
            }
        }
        let BatchSpec { global, micro } = self.batch;
        if micro == 0 {
            return invalid(
                "batch.micro",
                format!(
                    "is missing (or 0); set the rows per device call, a multiple of mesh.ici.fsdp={fsdp}, \
                     or use mesh: auto to let the planner choose"
                ),
            );
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
        if let Some(g) = &self.grpo
            && !(global / dcn as u64).is_multiple_of(g.generations)
        {
            return invalid(
                "batch.global",
                format!(
                    "{global} rows over mesh.dcn = {dcn} slices is {} per slice, not whole groups of \
                     grpo.generations = {}: every completion of a prompt stays on its slice; use a global \
                     batch that is a multiple of {}",
                    global / dcn as u64,
                    g.generations,
                    g.generations * dcn as u64
                ),
            );
        }
        if self.train.remat == "auto" || self.train.attention == "auto" {
            return invalid(
                "train",
                "remat and attention `auto` are resolved when the spec is parsed; load it with from_yaml"
                    .into(),
            );
        }
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

    /// What a checkpoint must match for this job to resume from it: the model, the trained
    /// parameters' dtype and LoRA adapters (so their shapes), and the seed (so the data order).
    /// Not the mesh, the batch or the schedule: a run may resume on another mesh or with more
    /// steps. Saves record it; a root whose newest checkpoints record another is another job's.
    pub fn checkpoint_identity(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "param_dtype": self.train.param_dtype,
            "lora": self.train.lora,
            "seed": self.seed,
        })
    }

    /// Serializes the spec back to YAML-compatible JSON text (JSON is YAML), e.g. to submit it.
    pub fn to_yaml(&self) -> String {
        serde_json::to_string_pretty(self).expect("job specs serialize")
    }
}

fn read(path: &Path) -> Result<String, JobError> {
    std::fs::read_to_string(path).map_err(|source| JobError::Io { path: path.into(), source })
}

/// The `(fsdp, tp)` pairs that use exactly `devices` devices, for error messages.
fn tilings(devices: usize) -> String {
    (1..=devices)
        .filter(|f| devices.is_multiple_of(*f))
        .map(|f| format!("({f},{})", devices / f))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
