//! The manifest's types and the checks that hold it to docs/BUNDLE.md.

use crate::{FORMAT, TRAIN_PROGRAMS};
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
    /// The parameters in canonical order.
    pub params: Vec<TensorSpec>,
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
    /// The preset name the dimensions came from (`tiny`, `qwen3-1.7b`, ...).
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
    /// Whether the output projection is the embedding's transpose.
    pub tie_embeddings: bool,
}

/// How the programs were lowered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// `sft` (and later `grpo`).
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
    /// Attention implementation.
    pub attention: String,
}

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
}

impl TensorSpec {
    /// Bytes of the whole array.
    pub fn num_bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size() as u64
    }
}

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

/// What one position of a signature must hold.
enum Slot {
    /// One tensor per parameter, named `<prefix><path>`, shaped like the parameter.
    PerParam { prefix: &'static str, donated: bool },
    /// One named tensor.
    One { name: &'static str, dtype: DType, batch_shaped: bool, donated: bool },
}

fn scalar(name: &'static str, dtype: DType) -> Slot {
    Slot::One { name, dtype, batch_shaped: false, donated: false }
}

fn batch(name: &'static str, dtype: DType) -> Slot {
    Slot::One { name, dtype, batch_shaped: true, donated: false }
}

fn each(prefix: &'static str, donated: bool) -> Slot {
    Slot::PerParam { prefix, donated }
}

/// The signature docs/BUNDLE.md gives each training program: (inputs, outputs).
fn train_signature(program: &str) -> (Vec<Slot>, Vec<Slot>) {
    use DType::{Float32, Int32, Uint32};
    match program {
        "init" => (
            vec![scalar("seed", Uint32)],
            vec![each("params/", false), each("opt/mu/", false), each("opt/nu/", false)],
        ),
        "zero_grads" => (vec![], vec![each("grads/", false)]),
        "grad_step" => (
            vec![
                each("params/", false),
                each("grads/", true),
                batch("batch/tokens", Int32),
                batch("batch/targets", Int32),
                batch("batch/loss_mask", Float32),
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
        other => unreachable!("no signature for program {other}"),
    }
}

impl Manifest {
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
        if self.train.kind == "sft" {
            for name in TRAIN_PROGRAMS {
                let Some(program) = self.programs.get(name) else {
                    return Err((format!("programs.{name}"), "missing; every sft bundle has it".into()));
                };
                let (inputs, outputs) = train_signature(name);
                self.check_signature(&format!("programs.{name}.inputs"), &program.inputs, &inputs)?;
                self.check_signature(&format!("programs.{name}.outputs"), &program.outputs, &outputs)?;
            }
        }
        Ok(())
    }

    fn check_tensor(&self, field: &str, t: &TensorSpec) -> Result<(), Violation> {
        t.sharding
            .validate(&t.shape, &self.mesh)
            .map_err(|e| (format!("{field} ({})", t.name), e.to_string()))
    }

    fn check_signature(&self, field: &str, got: &[TensorSpec], want: &[Slot]) -> Result<(), Violation> {
        let mut at = 0;
        let mismatch = |i: usize, t: Option<&TensorSpec>, expected: String| {
            let found = t.map_or("nothing".to_string(), |t| {
                format!("'{}' {} {:?} donated={}", t.name, t.dtype, t.shape, t.donated)
            });
            Err((format!("{field}[{i}]"), format!("expected {expected}, found {found}")))
        };
        for slot in want {
            match *slot {
                Slot::PerParam { prefix, donated } => {
                    for p in &self.params {
                        let name = format!("{prefix}{}", &p.name["params/".len()..]);
                        let t = got.get(at);
                        let ok = t.is_some_and(|t| {
                            t.name == name
                                && t.shape == p.shape
                                && t.dtype == p.dtype
                                && t.sharding == p.sharding
                                && t.donated == donated
                        });
                        if !ok {
                            return mismatch(
                                at,
                                t,
                                format!(
                                    "'{name}' {} {:?} sharded {} donated={donated}",
                                    p.dtype, p.shape, p.sharding
                                ),
                            );
                        }
                        at += 1;
                    }
                }
                Slot::One { name, dtype, batch_shaped, donated } => {
                    let shape: Vec<u64> =
                        if batch_shaped { vec![self.train.micro_batch, self.train.seq_len] } else { vec![] };
                    let t = got.get(at);
                    if !t.is_some_and(|t| {
                        t.name == name && t.dtype == dtype && t.shape == shape && t.donated == donated
                    }) {
                        return mismatch(at, t, format!("'{name}' {dtype} {shape:?} donated={donated}"));
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
