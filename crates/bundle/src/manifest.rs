//! The manifest's types and the checks that hold it to docs/BUNDLE.md.

use crate::{FORMAT, GRPO_PROGRAMS, OPTIONAL_PROGRAMS, TRAIN_PROGRAMS};
use mesh::{DType, IciMesh, Sharding};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// Who wrote the bundle.
    pub exporter: ExporterInfo,
    /// The platform the programs were lowered for: `cpu`, `tpu` or `cuda`.
    pub platform: String,
    /// The ICI mesh of one slice.
    pub mesh: IciMesh,
    /// The model architecture.
    pub model: ModelConfig,
    /// Batch shape, precision and memory options the programs were lowered with.
    pub train: TrainConfig,
    /// The optimizer baked into `apply_step`.
    pub optimizer: OptimizerConfig,
    /// The parameters in canonical order: the trainable ones (LoRA: the adapters).
    pub params: Vec<TensorSpec>,
    /// LoRA only: the frozen base (`frozen/<path>` for every model parameter), in canonical
    /// order; `init`'s first outputs and `grad_step`'s first inputs. Empty for full tuning.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frozen: Vec<TensorSpec>,
    /// The programs by name.
    pub programs: BTreeMap<String, ProgramSpec>,
}

/// The exporter's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExporterInfo {
    /// podctl_models version.
    pub version: String,
    /// The JAX version that lowered the programs.
    pub jax: String,
}

/// A Qwen3-family decoder's dimensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// The model's name: the preset the dimensions came from (`tiny`, `qwen3-1.7b`, ...), or
    /// `hf:<directory name>` for a Hugging Face model's `config.json`.
    pub preset: String,
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Width of the residual stream.
    pub hidden_size: u64,
    /// Decoder layers.
    pub num_layers: u64,
    /// Query heads.
    pub num_heads: u64,
    /// Key/value heads (grouped-query attention).
    pub num_kv_heads: u64,
    /// Width of one head.
    pub head_dim: u64,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: u64,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Whether the output projection is the embedding's transpose; when false the model has
    /// its own `lm_head` `[vocab, hidden]` (Qwen3-8B and larger).
    pub tie_embeddings: bool,
}

/// How the programs were lowered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// `sft` or `grpo`.
    pub kind: String,
    /// Rows per `grad_step` call, across the slice.
    pub micro_batch: u64,
    /// Tokens per row.
    pub seq_len: u64,
    /// Parameters, optimizer state and gradients.
    pub param_dtype: DType,
    /// Matmuls and activations.
    pub compute_dtype: DType,
    /// Rematerialization policy of the layer body: `none`, `dots` or `full`.
    pub remat: String,
    /// Time steps per chunk of the chunked loss.
    pub loss_chunk: u64,
    /// Attention implementation: `xla`, `blockwise` or `pallas`.
    pub attention: String,
    /// `blockwise` attention only: keys per block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_block: Option<u64>,
    /// LoRA adapters instead of full fine-tuning: `params` are the adapters, `frozen` the base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// AdamW's moments live in host memory (`pinned_host`) between steps; `apply_step` brings
    /// them to the device and back. TPU bundles only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optimizer_offload: bool,
    /// The `rollout` program's left-padded prompt buffer, in tokens: GRPO bundles, and SFT
    /// bundles that evaluate on held-out problems.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_len: Option<u64>,
    /// The `rollout` program's completion buffer, in tokens (see `prompt_len`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u64>,
    /// GRPO only: time steps per log-prob chunk; 0 computes all logits at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_chunk: Option<u64>,
    /// GRPO only: consecutive rows of a micro-batch that answer one prompt (the job's
    /// `generations`); the gradient and log-prob programs compute each such prompt once.
    /// Absent: every row is computed whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_group: Option<u64>,
}

/// LoRA adapters (docs/BUNDLE.md, "LoRA bundles").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Inner dimension of each adapter pair.
    pub rank: u64,
    /// The update `(x @ A) @ B` is scaled by `alpha / rank`.
    pub alpha: f64,
    /// The projections carrying adapters, e.g. `q_proj`.
    pub targets: Vec<String>,
    /// The frozen base's dtype.
    pub base_dtype: DType,
}

impl LoraConfig {
    /// `alpha / rank`, what the adapters' product is multiplied by.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }
}

/// The memory kind of AdamW state in an `optimizer_offload` bundle.
pub const HOST_MEMORY_KIND: &str = "pinned_host";

/// AdamW as `apply_step` implements it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// Always `adamw` for now.
    pub name: String,
    /// First-moment decay.
    pub b1: f64,
    /// Second-moment decay.
    pub b2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay, on parameters of rank >= 2.
    pub weight_decay: f64,
    /// Global-norm clip; 0 disables it.
    pub max_grad_norm: f64,
}

/// One argument or result of a program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// The name, e.g. `params/layers/q_proj` (see docs/BUNDLE.md).
    pub name: String,
    /// The global shape.
    pub shape: Vec<u64>,
    /// The element type.
    pub dtype: DType,
    /// How it is split over the mesh.
    pub sharding: Sharding,
    /// Inputs only: whether the call consumes the buffer.
    #[serde(default)]
    pub donated: bool,
    /// Where the array lives: absent for device memory, [`HOST_MEMORY_KIND`] for AdamW state
    /// offloaded to the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_kind: Option<String>,
}

impl TensorSpec {
    /// Bytes of the whole array.
    pub fn num_bytes(&self) -> u64 {
        // Saturating: a validated manifest's tensors are at most MAX_TENSOR_BYTES.
        self.shape.iter().fold(self.dtype.size() as u64, |acc, &d| acc.saturating_mul(d))
    }
}

/// Largest tensor a manifest may declare, in bytes (256 TiB): far past any model, and small
/// enough that byte counts of whole tensors never overflow.
pub const MAX_TENSOR_BYTES: u64 = 1 << 48;

/// One program of the bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramSpec {
    /// StableHLO file, relative to the bundle directory.
    pub file: String,
    /// jax.export's serialized `Exported`, for JAX-side references.
    #[serde(default)]
    pub jax_file: Option<String>,
    /// Arguments in order.
    pub inputs: Vec<TensorSpec>,
    /// Results in order.
    pub outputs: Vec<TensorSpec>,
}

/// A failed check: the field at fault and what is wrong with it.
pub(crate) type Violation = (String, String);

/// A tensor as a signature mismatch names it.
fn describe(t: &TensorSpec) -> String {
    let memory = t.memory_kind.as_ref().map(|kind| format!(" in {kind}")).unwrap_or_default();
    format!("'{}' {} {:?} sharded {} donated={}{memory}", t.name, t.dtype, t.shape, t.sharding, t.donated)
}

/// What one position of a signature must hold.
#[derive(Clone)]
enum Slot {
    /// One tensor per parameter, named `<prefix><path>`, shaped like the parameter.
    PerParam { prefix: &'static str, donated: bool },
    /// LoRA's frozen base, exactly the manifest's `frozen` list (empty for full tuning).
    Frozen,
    /// One named tensor: a scalar (replicated) or per-row (`[rows, ...]`, rows split over `fsdp`).
    One { name: &'static str, dtype: DType, shape: Vec<u64>, donated: bool },
    /// A small replicated vector: `[len]`, every device holding all of it.
    Replicated { name: &'static str, dtype: DType, len: u64 },
}

fn scalar(name: &'static str, dtype: DType) -> Slot {
    Slot::One { name, dtype, shape: vec![], donated: false }
}

fn rows(name: &'static str, dtype: DType, shape: &[u64]) -> Slot {
    Slot::One { name, dtype, shape: shape.to_vec(), donated: false }
}

fn each(prefix: &'static str, donated: bool) -> Slot {
    Slot::PerParam { prefix, donated }
}

/// The sharding docs/BUNDLE.md gives a non-parameter tensor of rank `rank`: scalars replicated,
/// anything else split over `fsdp` along its rows.
fn row_sharding(rank: usize) -> Sharding {
    let mut dims = vec![Vec::new(); rank];
    if let Some(first) = dims.first_mut() {
        first.push("fsdp".to_string());
    }
    Sharding::new(dims)
}

/// The shapes a kind's per-row tensors take.
struct Shapes {
    /// `[micro_batch]`.
    b: [u64; 1],
    /// `[micro_batch, seq_len]`.
    bs: [u64; 2],
    /// `[micro_batch, prompt_len]`.
    bp: [u64; 2],
    /// `[micro_batch, max_new_tokens]`.
    bn: [u64; 2],
    /// `[micro_batch, seq_len, vocab_size]`.
    bsv: [u64; 3],
}

/// The signature docs/BUNDLE.md gives each program: (inputs, outputs).
fn signature(program: &str, shapes: &Shapes) -> (Vec<Slot>, Vec<Slot>) {
    use DType::{Float32, Int32, Uint32};
    let Shapes { b, bs, bp, bn, .. } = shapes;
    let sequence = || {
        vec![
            rows("batch/tokens", Int32, bs),
            rows("batch/targets", Int32, bs),
            rows("batch/prompt_lengths", Int32, b),
        ]
    };
    match program {
        "init" => (
            vec![scalar("seed", Uint32)],
            vec![Slot::Frozen, each("params/", false), each("opt/mu/", false), each("opt/nu/", false)],
        ),
        "zero_grads" => (vec![], vec![each("grads/", false)]),
        "grad_step" => (
            vec![
                Slot::Frozen,
                each("params/", false),
                each("grads/", true),
                rows("batch/tokens", Int32, bs),
                rows("batch/targets", Int32, bs),
                rows("batch/loss_mask", Float32, bs),
            ],
            vec![each("grads/", false), scalar("loss_sum", Float32), scalar("token_count", Float32)],
        ),
        "apply_step" => (
            vec![
                each("params/", true),
                each("opt/mu/", true),
                each("opt/nu/", true),
                each("grads/", true),
                scalar("step", Int32),
                scalar("learning_rate", Float32),
                scalar("grad_scale", Float32),
            ],
            vec![
                each("params/", false),
                each("opt/mu/", false),
                each("opt/nu/", false),
                each("grads/", false),
                scalar("grad_norm", Float32),
            ],
        ),
        "rollout" => (
            vec![
                each("params/", false),
                rows("prompt/tokens", Int32, bp),
                rows("prompt/lengths", Int32, b),
                rows("sample/seeds", Uint32, b),
                scalar("sample/temperature", Float32),
                scalar("sample/top_p", Float32),
                Slot::Replicated { name: "sample/stop_ids", dtype: Int32, len: crate::STOP_IDS },
                scalar("sample/pad_id", Int32),
            ],
            vec![
                rows("completion/tokens", Int32, bn),
                rows("completion/lengths", Int32, b),
                rows("completion/logprobs", Float32, bn),
            ],
        ),
        "logprobs" => (
            [vec![each("params/", false)], sequence(), vec![scalar("sample/temperature", Float32)]].concat(),
            vec![rows("logprobs", Float32, bs)],
        ),
        "grpo_grad_step" => (
            [
                vec![each("params/", false), each("grads/", true)],
                sequence(),
                vec![
                    rows("batch/loss_mask", Float32, bs),
                    rows("batch/advantages", Float32, b),
                    rows("batch/old_logprobs", Float32, bs),
                    rows("batch/ref_logprobs", Float32, bs),
                    scalar("sample/temperature", Float32),
                    scalar("grpo/clip_low", Float32),
                    scalar("grpo/clip_high", Float32),
                    scalar("grpo/kl_beta", Float32),
                ],
            ]
            .concat(),
            [
                vec![each("grads/", false)],
                ["loss_sum", "token_count", "kl_sum", "clipped_count", "ratio_sum", "ratio_min", "ratio_max"]
                    .map(|name| scalar(name, Float32))
                    .into(),
            ]
            .concat(),
        ),
        "logits" => (
            vec![Slot::Frozen, each("params/", false), rows("batch/tokens", Int32, bs)],
            vec![rows("logits", Float32, &shapes.bsv)],
        ),
        other => unreachable!("no signature for program {other}"),
    }
}

impl Manifest {
    /// Parses `manifest.json` text and checks it against docs/BUNDLE.md, everything
    /// [`crate::Bundle::load`] checks short of reading the program files; `dir` names the bundle
    /// in errors.
    pub fn parse(text: &[u8], dir: &std::path::Path) -> Result<Self, crate::BundleError> {
        let manifest: Manifest = serde_json::from_slice(text)
            .map_err(|source| crate::BundleError::Parse { path: dir.join("manifest.json"), source })?;
        manifest.validate().map_err(|(field, reason)| crate::BundleError::Invalid {
            dir: dir.to_path_buf(),
            field,
            reason,
        })?;
        Ok(manifest)
    }

    pub(crate) fn validate(&self) -> Result<(), Violation> {
        if self.format != FORMAT {
            return Err((
                "format".into(),
                format!(
                    "'{}' is not a format this podctl reads ({FORMAT}); export the bundle again",
                    self.format
                ),
            ));
        }
        if self.train.micro_batch == 0 || self.train.seq_len == 0 {
            return Err(("train".into(), "micro_batch and seq_len must be positive".into()));
        }
        self.model.check().map_err(|(field, reason)| (format!("model.{field}"), reason))?;
        let mut names = HashSet::new();
        for (i, p) in self.params.iter().enumerate() {
            let field = format!("params[{i}]");
            if !p.name.starts_with("params/") {
                return Err((field, format!("'{}' must start with 'params/'", p.name)));
            }
            if !names.insert(&p.name) {
                return Err((field, format!("'{}' appears twice", p.name)));
            }
            self.check_tensor(&field, p)?;
        }
        for (i, f) in self.frozen.iter().enumerate() {
            let field = format!("frozen[{i}]");
            if !f.name.starts_with("frozen/") {
                return Err((field, format!("'{}' must start with 'frozen/'", f.name)));
            }
            if !names.insert(&f.name) {
                return Err((field, format!("'{}' appears twice", f.name)));
            }
            self.check_tensor(&field, f)?;
        }
        self.check_levers()?;
        for (name, program) in &self.programs {
            for (i, t) in program.inputs.iter().enumerate() {
                self.check_tensor(&format!("programs.{name}.inputs[{i}]"), t)?;
            }
            for (i, t) in program.outputs.iter().enumerate() {
                self.check_tensor(&format!("programs.{name}.outputs[{i}]"), t)?;
                if t.donated {
                    return Err((
                        format!("programs.{name}.outputs[{i}]"),
                        "outputs cannot be donated".into(),
                    ));
                }
            }
        }
        let programs: &[&str] = match self.train.kind.as_str() {
            "sft" => &TRAIN_PROGRAMS,
            "grpo" => &GRPO_PROGRAMS,
            other => {
                return Err((
                    "train.kind".into(),
                    format!("'{other}' is not a kind this podctl runs (sft, grpo); export the bundle again"),
                ));
            }
        };
        let shapes = self.check_grpo_train()?;
        for name in programs {
            let Some(program) = self.programs.get(*name) else {
                return Err((
                    format!("programs.{name}"),
                    format!("missing; every {} bundle has it", self.train.kind),
                ));
            };
            let (inputs, outputs) = signature(name, &shapes);
            self.check_signature(&format!("programs.{name}.inputs"), &program.inputs, &inputs)?;
            self.check_signature(&format!("programs.{name}.outputs"), &program.outputs, &outputs)?;
        }
        let decodes = (self.train.kind == "sft" && self.train.prompt_len.is_some()).then_some("rollout");
        for name in OPTIONAL_PROGRAMS.into_iter().chain(decodes) {
            if let Some(program) = self.programs.get(name) {
                let (inputs, outputs) = signature(name, &shapes);
                self.check_signature(&format!("programs.{name}.inputs"), &program.inputs, &inputs)?;
                self.check_signature(&format!("programs.{name}.outputs"), &program.outputs, &outputs)?;
            }
        }
        if self.train.kind == "grpo" && self.programs.contains_key("grad_step") {
            return Err((
                "programs.grad_step".into(),
                "a grpo bundle has grpo_grad_step instead; export the bundle again".into(),
            ));
        }
        Ok(())
    }

    /// Checks LoRA against the `frozen` list and the adapters' names, and where offloaded
    /// optimizer state can live.
    fn check_levers(&self) -> Result<(), Violation> {
        let t = &self.train;
        match (&t.lora, self.frozen.is_empty()) {
            (None, true) => {}
            (None, false) => {
                return Err(("frozen".into(), "only LoRA bundles (train.lora) have a frozen base".into()));
            }
            (Some(_), true) => {
                return Err(("frozen".into(), "missing; a LoRA bundle lists its frozen base".into()));
            }
            (Some(lora), false) => {
                if t.kind != "sft" {
                    return Err((
                        "train.lora".into(),
                        format!("LoRA bundles are sft only, this one is {}; export it again", t.kind),
                    ));
                }
                if lora.rank == 0 || lora.alpha.is_nan() || lora.alpha <= 0.0 {
                    return Err(("train.lora".into(), "rank and alpha must be positive".into()));
                }
                for (i, p) in self.params.iter().enumerate() {
                    let adapter = &p.name["params/".len()..];
                    let base = adapter.strip_suffix(".lora_a").or_else(|| adapter.strip_suffix(".lora_b"));
                    let known = base.is_some_and(|base| {
                        let target = base.strip_prefix("layers/").unwrap_or(base);
                        lora.targets.iter().any(|t| t == target)
                            && self.frozen.iter().any(|f| f.name["frozen/".len()..] == *base)
                    });
                    if !known {
                        return Err((
                            format!("params[{i}]"),
                            format!(
                                "'{}' is not an adapter (<frozen path>.lora_a or .lora_b) of a target in train.lora.targets",
                                p.name
                            ),
                        ));
                    }
                }
            }
        }
        if t.optimizer_offload && self.platform == "cpu" {
            return Err((
                "train.optimizer_offload".into(),
                "a cpu bundle cannot keep AdamW state in host memory (pinned_host is a TPU memory kind); \
                 export it without optimizer offload"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Checks the rollout buffers of a GRPO bundle (and their absence elsewhere); returns the
    /// shapes the signatures use.
    fn check_grpo_train(&self) -> Result<Shapes, Violation> {
        let t = &self.train;
        let b = t.micro_batch;
        let bsv = [b, t.seq_len, self.model.vocab_size];
        let buffers = [
            ("prompt_len", t.prompt_len),
            ("max_new_tokens", t.max_new_tokens),
            ("logprob_chunk", t.logprob_chunk),
        ];
        if t.kind != "grpo" && t.prompt_group.is_some() {
            return Err(("train.prompt_group".into(), "only grpo bundles have it".into()));
        }
        if let Some(group) = t.prompt_group
            && (group == 0 || !b.is_multiple_of(group))
        {
            return Err((
                "train.prompt_group".into(),
                format!("{group} does not divide micro_batch = {b}; export the bundle again"),
            ));
        }
        if t.kind != "grpo" {
            // An SFT bundle decodes only for held-out evaluation: both buffers and `rollout`, or
            // none of them.
            let decodes = self.programs.contains_key("rollout");
            return match (t.prompt_len, t.max_new_tokens, t.logprob_chunk) {
                (_, _, Some(_)) => Err(("train.logprob_chunk".into(), "only grpo bundles have it".into())),
                (None, None, None) if !decodes => {
                    Ok(Shapes { b: [b], bs: [b, t.seq_len], bp: [b, 0], bn: [b, 0], bsv })
                }
                (Some(p), Some(n), None) if decodes && p > 0 && n > 0 => {
                    Ok(Shapes { b: [b], bs: [b, t.seq_len], bp: [b, p], bn: [b, n], bsv })
                }
                _ => Err((
                    "train.prompt_len".into(),
                    "an sft bundle has both rollout buffers (prompt_len, max_new_tokens > 0) and the \
                     rollout program, or none of them; export it again"
                        .into(),
                )),
            };
        }
        let [(_, Some(p)), (_, Some(n)), (_, Some(chunk))] = buffers else {
            let (field, _) = buffers.iter().find(|(_, value)| value.is_none()).expect("one is missing");
            return Err((format!("train.{field}"), "missing; a grpo bundle has it, export it again".into()));
        };
        if p == 0 || n == 0 {
            let field = if p == 0 { "prompt_len" } else { "max_new_tokens" };
            return Err((format!("train.{field}"), "is 0; the rollout buffers must be positive".into()));
        }
        if t.seq_len != p + n {
            return Err((
                "train.seq_len".into(),
                format!("{} is not prompt_len + max_new_tokens = {p} + {n}", t.seq_len),
            ));
        }
        let loss_chunk = if chunk == 0 { t.seq_len } else { chunk };
        if t.loss_chunk != loss_chunk {
            return Err((
                "train.loss_chunk".into(),
                format!("{} is not logprob_chunk (or seq_len when that is 0) = {loss_chunk}", t.loss_chunk),
            ));
        }
        Ok(Shapes { b: [b], bs: [b, t.seq_len], bp: [b, p], bn: [b, n], bsv })
    }

    fn check_tensor(&self, field: &str, t: &TensorSpec) -> Result<(), Violation> {
        let bytes = t.shape.iter().try_fold(t.dtype.size() as u64, |acc, &d| acc.checked_mul(d));
        if bytes.is_none_or(|b| b > MAX_TENSOR_BYTES) {
            return Err((
                format!("{field} ({})", t.name),
                format!(
                    "shape {:?} of {} is over {MAX_TENSOR_BYTES} bytes; the manifest is corrupt, export the bundle again",
                    t.shape, t.dtype
                ),
            ));
        }
        t.sharding
            .validate(&t.shape, &self.mesh)
            .map_err(|e| (format!("{field} ({})", t.name), e.to_string()))
    }

    fn check_signature(&self, field: &str, got: &[TensorSpec], want: &[Slot]) -> Result<(), Violation> {
        let mut at = 0;
        let mismatch = |i: usize, t: Option<&TensorSpec>, expected: String| {
            let found = t.map_or("nothing".to_string(), describe);
            Err((format!("{field}[{i}]"), format!("expected {expected}, found {found}")))
        };
        for slot in want {
            match *slot {
                Slot::PerParam { prefix, donated } => {
                    // Offloaded AdamW state lives in host memory; everything else on the device.
                    let memory_kind = (self.train.optimizer_offload && prefix.starts_with("opt/"))
                        .then(|| HOST_MEMORY_KIND.to_string());
                    for p in &self.params {
                        let want = TensorSpec {
                            name: format!("{prefix}{}", &p.name["params/".len()..]),
                            donated,
                            memory_kind: memory_kind.clone(),
                            ..p.clone()
                        };
                        let t = got.get(at);
                        if t != Some(&want) {
                            return mismatch(at, t, describe(&want));
                        }
                        at += 1;
                    }
                }
                Slot::Frozen => {
                    for want in &self.frozen {
                        let t = got.get(at);
                        if t != Some(want) {
                            return mismatch(at, t, describe(want));
                        }
                        at += 1;
                    }
                }
                Slot::One { name, dtype, ref shape, donated } => {
                    let want = TensorSpec {
                        name: name.to_string(),
                        shape: shape.clone(),
                        dtype,
                        sharding: row_sharding(shape.len()),
                        donated,
                        memory_kind: None,
                    };
                    let t = got.get(at);
                    if t != Some(&want) {
                        return mismatch(at, t, describe(&want));
                    }
                    at += 1;
                }
                Slot::Replicated { name, dtype, len } => {
                    let want = TensorSpec {
                        name: name.to_string(),
                        shape: vec![len],
                        dtype,
                        sharding: Sharding::new(vec![Vec::new()]),
                        donated: false,
                        memory_kind: None,
                    };
                    let t = got.get(at);
                    if t != Some(&want) {
                        return mismatch(at, t, describe(&want));
                    }
                    at += 1;
                }
            }
        }
        if at != got.len() {
            return Err((
                format!("{field}[{at}]"),
                format!("unexpected extra tensor '{}'; the signature has {at} entries", got[at].name),
            ));
        }
        Ok(())
    }
}
