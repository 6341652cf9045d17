//! What to plan for: the model and its training workload, and the candidates a plan chooses
//! among (a layout of devices, a micro-batch, a rematerialization policy).

use crate::PlanError;
use bundle::ModelConfig;
use mesh::{DType, IciMesh};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a step computes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Kind {
    /// Supervised fine-tuning: `grad_step` over rows of `seq_len` tokens.
    Sft {
        /// Tokens per row.
        seq_len: u64,
    },
    /// GRPO: `rollout` samples `max_new_tokens` after a left-padded prompt of `prompt_len`,
    /// `logprobs` scores rows with the reference model, `grpo_grad_step` trains on them.
    Grpo {
        /// Tokens of the left-padded prompt buffer.
        prompt_len: u64,
        /// Tokens of the completion buffer (and decode steps at most).
        max_new_tokens: u64,
        /// Completions per prompt (the group); the global batch is prompts x this.
        generations: u64,
    },
}

/// A model and how it is trained, independent of the devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// The architecture.
    pub model: ModelConfig,
    /// SFT or GRPO, with the sequence shapes.
    pub kind: Kind,
    /// Rows (sequences) per optimizer step over all slices; for GRPO prompts x generations.
    pub global_batch: u64,
    /// Parameters, gradients and optimizer state.
    pub param_dtype: DType,
    /// Matmuls and activations.
    pub compute_dtype: DType,
    /// Time steps per chunk of the loss (SFT) or of the log-probs (GRPO); 0 = unchunked (GRPO
    /// only), which materializes `[rows, seq, vocab]` float32 logits.
    pub loss_chunk: u64,
    /// LoRA adapters instead of full fine-tuning. The job's choice (it changes what trains), so
    /// a plan never turns it on; `podctl plan` shows what it would buy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraShape>,
    /// Keys per block of blockwise attention.
    #[serde(default = "default_attention_block")]
    pub attention_block: u64,
}

fn default_attention_block() -> u64 {
    512
}

/// What LoRA changes in memory: the adapters' rank and projections, the frozen base's dtype.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraShape {
    /// Inner dimension of each adapter pair.
    pub rank: u64,
    /// The projections carrying adapters (`q_proj`, ..., `down_proj`).
    pub targets: Vec<String>,
    /// The frozen base's dtype.
    pub base_dtype: DType,
}

/// How each layer attends, as the exporter names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// Plain XLA attention: `[rows, heads, T, T]` float32 scores.
    Xla,
    /// Online softmax over blocks of keys, pure JAX: `[rows, heads, T, block]` at a time.
    Blockwise,
    /// The Pallas TPU flash-attention kernel (TPU only).
    Pallas,
}

impl Attention {
    /// All implementations.
    pub const ALL: [Attention; 3] = [Attention::Xla, Attention::Blockwise, Attention::Pallas];

    /// The exporter's `--attention` value.
    pub fn name(self) -> &'static str {
        match self {
            Attention::Xla => "xla",
            Attention::Blockwise => "blockwise",
            Attention::Pallas => "pallas",
        }
    }

    /// Parses `xla`, `blockwise` or `pallas`.
    pub fn parse(text: &str) -> Result<Self, PlanError> {
        Self::ALL.into_iter().find(|a| a.name() == text).ok_or_else(|| PlanError::Invalid {
            field: "attention",
            reason: format!("'{text}' is not one of xla, blockwise, pallas"),
        })
    }
}

impl fmt::Display for Attention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Workload {
    /// Tokens per row of the training programs.
    pub fn seq_len(&self) -> u64 {
        match self.kind {
            Kind::Sft { seq_len } => seq_len,
            Kind::Grpo { prompt_len, max_new_tokens, .. } => prompt_len + max_new_tokens,
        }
    }

    /// Whether this is GRPO.
    pub fn is_grpo(&self) -> bool {
        matches!(self.kind, Kind::Grpo { .. })
    }

    /// The loss (or log-prob) chunk in time steps: the whole sequence when unchunked.
    pub fn chunk(&self) -> u64 {
        if self.loss_chunk == 0 { self.seq_len() } else { self.loss_chunk.min(self.seq_len()) }
    }

    /// `sft` or `grpo`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Sft { .. } => "sft",
            Kind::Grpo { .. } => "grpo",
        }
    }

    /// Checks the numbers that do not depend on the devices.
    pub fn validate(&self) -> Result<(), PlanError> {
        let invalid = |field: &'static str, reason: String| Err(PlanError::Invalid { field, reason });
        let m = &self.model;
        if m.num_layers == 0 || m.hidden_size == 0 || m.num_heads == 0 || m.num_kv_heads == 0 {
            return invalid("model", format!("preset '{}' has a zero dimension", m.preset));
        }
        if !m.num_heads.is_multiple_of(m.num_kv_heads) {
            return invalid(
                "model",
                format!("{} query heads do not group into {} key/value heads", m.num_heads, m.num_kv_heads),
            );
        }
        if self.global_batch == 0 {
            return invalid("global_batch", "is 0; train on at least one row per step".into());
        }
        match self.kind {
            Kind::Sft { seq_len } if seq_len < 2 => {
                return invalid("seq_len", format!("{seq_len} is too short; use at least 2"));
            }
            Kind::Grpo { prompt_len, max_new_tokens, generations } => {
                if prompt_len == 0 || max_new_tokens == 0 {
                    return invalid("grpo", "prompt_len and max_new_tokens must both be at least 1".into());
                }
                if generations == 0 || !self.global_batch.is_multiple_of(generations) {
                    return invalid(
                        "global_batch",
                        format!(
                            "{} rows are not whole groups of {generations} generations; use prompts x {generations}",
                            self.global_batch
                        ),
                    );
                }
            }
            Kind::Sft { .. } => {}
        }
        if self.loss_chunk == 0 && !self.is_grpo() {
            return invalid("loss_chunk", "is 0; the SFT loss is always chunked, use e.g. 64".into());
        }
        if self.loss_chunk != 0 && !self.seq_len().is_multiple_of(self.chunk()) {
            return invalid(
                "loss_chunk",
                format!(
                    "{} does not divide the {} tokens of a row; pick a divisor",
                    self.loss_chunk,
                    self.seq_len()
                ),
            );
        }
        if let Some(lora) = &self.lora {
            if lora.rank == 0 || lora.targets.is_empty() {
                return invalid("lora", "needs a positive rank and at least one target projection".into());
            }
            if self.is_grpo() {
                return invalid("lora", "LoRA bundles are SFT only".into());
            }
        }
        if self.attention_block == 0 {
            return invalid("attention_block", "is 0; use a number of keys per block, e.g. 512".into());
        }
        for (field, dtype) in [("param_dtype", self.param_dtype), ("compute_dtype", self.compute_dtype)] {
            if !matches!(dtype, DType::Float32 | DType::Bfloat16) {
                return invalid(field, format!("{dtype} is not supported; use float32 or bfloat16"));
            }
        }
        Ok(())
    }
}

/// A rematerialization policy of the layer body, as the exporter names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Remat {
    /// Save every residual the backward pass needs.
    None,
    /// Save the outputs of the weight matmuls; recompute attention and elementwise work.
    Dots,
    /// Save only each layer's input; recompute the whole layer in the backward pass.
    Full,
}

impl Remat {
    /// All policies, cheapest compute first.
    pub const ALL: [Remat; 3] = [Remat::None, Remat::Dots, Remat::Full];

    /// The exporter's `--remat` value.
    pub fn name(self) -> &'static str {
        match self {
            Remat::None => "none",
            Remat::Dots => "dots",
            Remat::Full => "full",
        }
    }

    /// Parses `none`, `dots` or `full`.
    pub fn parse(text: &str) -> Result<Self, PlanError> {
        Self::ALL.into_iter().find(|r| r.name() == text).ok_or_else(|| PlanError::Invalid {
            field: "remat",
            reason: format!("'{text}' is not one of none, dots, full"),
        })
    }
}

impl fmt::Display for Remat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How devices are arranged: `dcn` slices, each an ICI mesh `(fsdp, tp)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Layout {
    /// Slices (data-parallel replicas across the data-centre network).
    pub dcn: usize,
    /// Parameters and rows split over this axis inside a slice.
    pub fsdp: usize,
    /// Heads, MLP width and vocabulary split over this axis inside a slice.
    pub tp: usize,
}

impl Layout {
    /// Devices in one slice.
    pub fn devices_per_slice(&self) -> usize {
        self.fsdp * self.tp
    }

    /// The ICI mesh one bundle is lowered for.
    pub fn ici_mesh(&self) -> IciMesh {
        IciMesh::new([("fsdp", self.fsdp), ("tp", self.tp)]).expect("layout axes are positive and distinct")
    }

    /// The user-facing pair `(data, tp)`, data = dcn x fsdp, as the seeds write meshes.
    pub fn pair(&self) -> (usize, usize) {
        (self.dcn * self.fsdp, self.tp)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (data, tp) = self.pair();
        if self.dcn == 1 {
            write!(f, "({data},{tp})")
        } else {
            write!(f, "({data},{tp}) = dcn {} x ici({},{})", self.dcn, self.fsdp, self.tp)
        }
    }
}

/// One configuration a plan considers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Candidate {
    /// The device arrangement.
    pub layout: Layout,
    /// Rows per device call on one slice (what a bundle is lowered for).
    pub micro_batch: u64,
    /// The layer body's rematerialization.
    pub remat: Remat,
    /// How each layer attends.
    pub attention: Attention,
    /// AdamW state in host memory between steps (TPU).
    pub offload: bool,
}

impl Candidate {
    /// `layout`, `micro_batch` and `remat` with plain attention and no offload.
    pub fn new(layout: Layout, micro_batch: u64, remat: Remat) -> Self {
        Self { layout, micro_batch, remat, attention: Attention::Xla, offload: false }
    }

    /// The memory levers in words: `remat dots, attention blockwise, offload`.
    pub fn levers(&self) -> String {
        let mut text = format!("remat {}, attention {}", self.remat, self.attention);
        if self.offload {
            text.push_str(", optimizer offload");
        }
        text
    }

    /// Rows each device holds in one call.
    pub fn rows_per_device(&self) -> u64 {
        self.micro_batch / self.layout.fsdp as u64
    }

    /// Micro-batches each slice runs per optimizer step.
    pub fn accum_steps(&self, workload: &Workload) -> u64 {
        workload.global_batch / (self.micro_batch * self.layout.dcn as u64)
    }
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} mb={} remat={}", self.layout, self.micro_batch, self.remat)?;
        if self.attention != Attention::Xla {
            write!(f, " attention={}", self.attention)?;
        }
        if self.offload {
            write!(f, " offload")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(kind: Kind, global_batch: u64, loss_chunk: u64) -> Workload {
        Workload {
            model: bundle::preset("tiny").unwrap(),
            kind,
            global_batch,
            param_dtype: DType::Float32,
            compute_dtype: DType::Float32,
            loss_chunk,
            lora: None,
            attention_block: 512,
        }
    }

    #[test]
    fn grpo_rows_are_prompt_plus_completion() {
        let w = workload(Kind::Grpo { prompt_len: 256, max_new_tokens: 2048, generations: 8 }, 256, 256);
        w.validate().unwrap();
        assert_eq!((w.seq_len(), w.chunk(), w.kind_name()), (2304, 256, "grpo"));
        let unchunked = workload(Kind::Grpo { prompt_len: 32, max_new_tokens: 96, generations: 8 }, 64, 0);
        assert_eq!(unchunked.chunk(), 128);
    }

    #[test]
    fn invalid_workloads_name_the_field() {
        let cases = [
            (workload(Kind::Sft { seq_len: 128 }, 0, 64), "global_batch"),
            (workload(Kind::Sft { seq_len: 1 }, 8, 64), "seq_len"),
            (workload(Kind::Sft { seq_len: 128 }, 8, 0), "loss_chunk"),
            (workload(Kind::Sft { seq_len: 128 }, 8, 48), "does not divide the 128 tokens"),
            (
                workload(Kind::Grpo { prompt_len: 8, max_new_tokens: 8, generations: 8 }, 12, 16),
                "whole groups",
            ),
        ];
        for (w, needle) in cases {
            let e = w.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn layouts_print_as_the_seeds_write_meshes() {
        assert_eq!(Layout { dcn: 1, fsdp: 4, tp: 2 }.to_string(), "(4,2)");
        assert_eq!(Layout { dcn: 2, fsdp: 4, tp: 2 }.to_string(), "(8,2) = dcn 2 x ici(4,2)");
        assert_eq!(Remat::parse("dots").unwrap(), Remat::Dots);
        assert!(Remat::parse("some").unwrap_err().to_string().contains("none, dots, full"));
    }
}
