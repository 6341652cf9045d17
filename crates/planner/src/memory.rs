//! The analytic memory model: per-device bytes of every program of a step, term by term.
//!
//! Each program's peak is what it holds at its busiest moment plus the train state that stays
//! resident on the device while it runs without being one of its arguments (the optimizer
//! moments during `grad_step`, the reference model during GRPO's programs). The step's peak is
//! the largest program peak. Terms are derived from what the programs in `models/` compute
//! (docs/PLANNER.md lists them with the evidence); nothing here is fitted per configuration.

use crate::hardware::{Accelerator, Platform};
use crate::shapes::{laid_out_bytes, largest_param_bytes, lora_bytes, param_bytes};
use crate::workload::{Attention, Candidate, Remat, Workload};
use mesh::DType;
use serde::{Deserialize, Serialize};

/// What a term is, for the breakdown table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TermKind {
    /// Train state on the device that this program does not take as an argument.
    Resident,
    /// An argument of the program (its own inputs; donated ones are reused for outputs).
    Argument,
    /// Scratch memory the compiler allocates while the program runs.
    Temporary,
    /// The compiled program itself.
    Code,
}

/// One line of a breakdown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    /// Short name, e.g. `optimizer state`.
    pub name: String,
    /// How it was computed, e.g. `AdamW mu + nu, float32, 1/8 of 1.72e9 params`.
    pub detail: String,
    /// What kind of memory it is.
    pub kind: TermKind,
    /// Bytes on one device.
    pub bytes: u64,
}

/// One program's estimated peak on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramEstimate {
    /// The bundle program, e.g. `grad_step`.
    pub program: String,
    /// Its terms; they add up to the program's peak including resident state.
    pub terms: Vec<Term>,
}

impl ProgramEstimate {
    /// The program's peak bytes per device, resident state included.
    pub fn bytes(&self) -> u64 {
        self.terms.iter().map(|t| t.bytes).sum()
    }
}

/// The analytic estimate for one candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    /// Every program whose peak can be the step's peak.
    pub programs: Vec<ProgramEstimate>,
}

impl MemoryEstimate {
    /// The step's peak bytes per device.
    pub fn peak(&self) -> u64 {
        self.programs.iter().map(ProgramEstimate::bytes).max().unwrap_or(0)
    }

    /// The program with the largest peak.
    pub fn peak_program(&self) -> &ProgramEstimate {
        self.programs.iter().max_by_key(|p| p.bytes()).expect("every estimate has a training program")
    }

    /// The estimate of one program, by name.
    pub fn program(&self, name: &str) -> Option<&ProgramEstimate> {
        self.programs.iter().find(|p| p.program == name)
    }
}

/// The programs whose peaks the planner compares, per kind. `init` and `zero_grads` hold less
/// than `apply_step`, and GRPO's `logprobs` computes a subset of `grpo_grad_step` over the same
/// rows, so none of them can be the step's peak.
pub fn peak_programs(workload: &Workload) -> &'static [&'static str] {
    if workload.is_grpo() {
        &["rollout", "grpo_grad_step", "apply_step"]
    } else {
        &["grad_step", "apply_step"]
    }
}

/// Per-device sizes of one candidate, in elements unless named `_bytes`.
struct Dims {
    platform: Platform,
    /// Rows per device.
    b: u64,
    seq: u64,
    layers: u64,
    hidden: u64,
    /// Query heads per device.
    heads: u64,
    /// Query width per device (heads x head_dim).
    q_width: u64,
    /// Key (and value) width per device.
    kv_width: u64,
    /// MLP width per device.
    mlp: u64,
    /// Vocabulary per device.
    vocab: u64,
    chunk: u64,
    compute: DType,
    /// The dtype the embedding and layer weights are stored in: the parameters', or LoRA's
    /// frozen base's.
    weights: DType,
    fsdp: u64,
    attention: Attention,
    /// Keys per pass of blockwise attention.
    block: u64,
    /// Query heads per device times the head width, per head.
    head_dim: u64,
}

impl Dims {
    fn new(workload: &Workload, candidate: &Candidate, platform: Platform) -> Self {
        let m = &workload.model;
        let t = candidate.layout.tp as u64;
        Self {
            platform,
            b: candidate.rows_per_device().max(1),
            seq: workload.seq_len(),
            layers: m.num_layers,
            hidden: m.hidden_size,
            heads: m.num_heads / t,
            q_width: m.num_heads / t * m.head_dim,
            kv_width: m.num_kv_heads / t * m.head_dim,
            mlp: m.intermediate_size / t,
            vocab: m.vocab_size / t,
            chunk: workload.chunk(),
            compute: workload.compute_dtype,
            weights: workload.lora.as_ref().map_or(workload.param_dtype, |l| l.base_dtype),
            fsdp: candidate.layout.fsdp as u64,
            attention: candidate.attention,
            block: block_size(workload.seq_len(), workload.attention_block),
            head_dim: m.head_dim,
        }
    }

    /// Bytes of a `[rows, heads, seq, cols]` per-head array in `dtype`.
    fn per_head(&self, cols: u64, dtype: DType) -> u64 {
        laid_out_bytes(&[self.b, self.heads, self.seq, cols], dtype, self.platform)
    }

    /// What the backward needs of the attention itself when nothing is rematerialized: plain
    /// attention's f32 softmax output and probabilities; blockwise's per-query running max and
    /// denominator (f32); the Pallas kernel's max and denominator (f32, 128 lanes each) and the
    /// key/value heads it repeated to the query heads.
    fn attention_residuals(&self) -> u64 {
        match self.attention {
            Attention::Xla => self.scores(self.seq, DType::Float32) + self.scores(self.seq, self.compute),
            Attention::Blockwise => {
                2 * laid_out_bytes(&[self.b, self.heads, self.seq], DType::Float32, self.platform)
            }
            Attention::Pallas => {
                2 * self.per_head(128, DType::Float32) + 2 * self.per_head(self.head_dim, self.compute)
            }
        }
    }

    /// The attention's own working set in the backward pass: plain attention's score
    /// cotangents (f32 probabilities' and scores', and on TPU the scores' again in the compute
    /// dtype for the matmuls); for blockwise one key block's scores, probabilities and their
    /// cotangents plus the f32 query-gradient accumulator, where XLA:TPU holds only one f32 and
    /// one compute-dtype block (the recomputed block dies into its cotangents, as plain
    /// attention's scores do in `layer_backward`; its peak equals the Pallas program's at the
    /// same shapes, docs/PLANNER.md); the Pallas kernels' f32 gradients of the query, key and
    /// value heads.
    fn attention_backward(&self) -> u64 {
        let f32 = DType::Float32;
        match self.attention {
            Attention::Xla => {
                let scores = 2 * self.scores(self.seq, f32);
                match self.platform {
                    Platform::Tpu => scores + self.scores(self.seq, self.compute),
                    Platform::Cpu => scores,
                }
            }
            Attention::Blockwise => {
                let f32_blocks = match self.platform {
                    Platform::Tpu => 1,
                    Platform::Cpu => 3,
                };
                f32_blocks * self.per_head(self.block, f32)
                    + self.per_head(self.block, self.compute)
                    + self.rows(self.seq, self.q_width, f32)
            }
            Attention::Pallas => 3 * self.per_head(self.head_dim, f32),
        }
    }

    /// Bytes of a `[rows, seq, width]` activation in `dtype`.
    fn rows(&self, seq: u64, width: u64, dtype: DType) -> u64 {
        laid_out_bytes(&[self.b, seq, width], dtype, self.platform)
    }

    /// Bytes of the `[rows, heads, seq, seq]` attention scores in `dtype`.
    fn scores(&self, seq: u64, dtype: DType) -> u64 {
        laid_out_bytes(&[self.b, self.heads, seq, seq], dtype, self.platform)
    }

    /// What the backward pass keeps of one layer under `remat`, read off the compiled
    /// programs (docs/PLANNER.md has the list): with `none` the softmax output (f32) and the
    /// probabilities, the f32 inputs of the three RMSNorms and the normed values, q/k/v at
    /// three stages, the attention output and four MLP-width values (gate, up, silu(gate) and
    /// their product) plus two of their intermediates; with `dots` the outputs of the weight
    /// matmuls that the backward needs (q, k, v, o, gate, up) and the layer input; with `full`
    /// the layer input only.
    fn saved_per_layer(&self, remat: Remat) -> u64 {
        let (c, f32) = (self.compute, DType::Float32);
        let s = self.seq;
        match remat {
            Remat::None => {
                self.attention_residuals()
                    + 2 * self.rows(s, self.hidden, f32)
                    + 4 * self.rows(s, self.hidden, c)
                    + self.rows(s, self.q_width, f32)
                    + 3 * self.rows(s, self.q_width, c)
                    + self.rows(s, self.kv_width, f32)
                    + 3 * self.rows(s, self.kv_width, c)
                    + 6 * self.rows(s, self.mlp, c)
            }
            Remat::Dots => {
                2 * self.rows(s, self.hidden, c)
                    + self.rows(s, self.q_width, c)
                    + 2 * self.rows(s, self.kv_width, c)
                    + 2 * self.rows(s, self.mlp, c)
            }
            Remat::Full => self.rows(s, self.hidden, c),
        }
    }

    /// The attention part of what `none` saves: everything but the MLP-width values and the
    /// f32 input of the post-attention norm and its normed values.
    fn attention_saved(&self) -> u64 {
        let (c, f32) = (self.compute, DType::Float32);
        let s = self.seq;
        self.attention_residuals()
            + self.rows(s, self.hidden, f32)
            + 2 * self.rows(s, self.hidden, c)
            + self.rows(s, self.q_width, f32)
            + 3 * self.rows(s, self.q_width, c)
            + self.rows(s, self.kv_width, f32)
            + 3 * self.rows(s, self.kv_width, c)
    }

    /// The working set of one layer's backward pass on top of what is saved: what `remat`
    /// recomputes plus the cotangents of the attention scores (the probabilities' and the
    /// scores' in f32, and on TPU the scores' cotangent again in the compute dtype for the
    /// matmuls). XLA:TPU recomputes the whole layer before its backward starts; XLA:CPU
    /// recomputes as the backward goes, so only the attention half is live at once there.
    ///
    /// When XLA:TPU recomputes plain attention (`dots`, `full`), the recomputed softmax output
    /// and probabilities die into the cotangents that replace them: its buffer assignment
    /// holds one f32 and one compute-dtype score-sized array at a time, not the five the
    /// recomputation and the cotangents would be apart (qwen3-1.7b GRPO, 8 rows of 2304 tokens
    /// on (8,1) with `full`: 2.53 + 1.27 GiB of scores at the peak, docs/PLANNER.md).
    fn layer_backward(&self, remat: Remat) -> u64 {
        let recomputed = match self.platform {
            Platform::Tpu => self.saved_per_layer(Remat::None) - self.saved_per_layer(remat),
            Platform::Cpu if remat == Remat::None => 0,
            Platform::Cpu => self.attention_saved(),
        };
        match (self.platform, self.attention) {
            (Platform::Tpu, Attention::Xla) if remat != Remat::None => {
                recomputed - self.attention_residuals()
                    + self.scores(self.seq, DType::Float32)
                    + self.scores(self.seq, self.compute)
            }
            _ => recomputed + self.attention_backward(),
        }
    }

    /// The chunked loss (or log-prob) scan's working set: one chunk's f32 logits, their
    /// exponentials and their cotangent.
    fn logits_working_set(&self) -> u64 {
        3 * self.rows(self.chunk, self.vocab, DType::Float32)
    }

    /// The f32 accumulator of the embedding's gradient over the loss chunks: one device's
    /// vocabulary rows at full width (the rows of the batch are split over `fsdp`, so each
    /// device sums a partial gradient until the reduction after the scan).
    fn embedding_gradient(&self) -> u64 {
        laid_out_bytes(&[self.vocab, self.hidden], DType::Float32, self.platform)
    }

    /// The compute-dtype copy of the embedding gradient that the reduction after the loss scan
    /// sends (the chunk's logits and the gathered embedding are gone by then).
    fn embedding_gradient_copy(&self) -> u64 {
        laid_out_bytes(&[self.vocab, self.hidden], self.compute, self.platform)
    }

    /// The attention mask. XLA:TPU fuses it into the masking and keeps only the mask itself,
    /// `[S, S]` for SFT and one per row for GRPO's left-padded rows. XLA:CPU also broadcasts the
    /// mask and the f32 fill value to the scores' shape once for the forward pass, which stays
    /// live beside the saved scores when nothing is rematerialized.
    fn attention_mask(&self, per_row: bool, remat: Remat) -> u64 {
        let rows = if per_row { self.b } else { 1 };
        match (self.attention, self.platform) {
            (Attention::Xla, Platform::Cpu) if remat == Remat::None => {
                self.scores(self.seq, DType::Float32) + self.scores(self.seq, DType::Bool)
            }
            (Attention::Xla, _) => laid_out_bytes(&[rows, self.seq, self.seq], DType::Bool, self.platform),
            // One key block's visibility at a time.
            (Attention::Blockwise, _) => {
                laid_out_bytes(&[rows, self.seq, self.block], DType::Bool, self.platform)
            }
            // Segment ids per row, inside the kernel's blocks.
            (Attention::Pallas, _) => 0,
        }
    }

    /// The embedding gathered over `fsdp` in the compute dtype, for the logits matmul.
    fn gathered_embedding(&self) -> u64 {
        if self.fsdp == 1 && self.compute == self.weights {
            0
        } else {
            laid_out_bytes(&[self.vocab, self.hidden], self.compute, self.platform)
        }
    }
}

/// The largest divisor of `seq` not above `block`: the keys per pass of blockwise attention
/// (the exporter's `attention.block_size`).
pub fn block_size(seq: u64, block: u64) -> u64 {
    let mut b = block.min(seq).max(1);
    while !seq.is_multiple_of(b) {
        b -= 1;
    }
    b
}

/// The analytic estimate of every program of `candidate`'s step that can be its peak.
pub fn estimate(workload: &Workload, candidate: &Candidate, accelerator: &Accelerator) -> MemoryEstimate {
    let platform = accelerator.platform;
    let d = Dims::new(workload, candidate, platform);
    let layout = &candidate.layout;
    let m = &workload.model;
    let devices = layout.devices_per_slice();
    let pdtype = workload.param_dtype;
    let term = |name: &str, detail: String, kind, bytes| Term { name: name.into(), detail, kind, bytes };

    // What trains (every parameter, or LoRA's adapters) and, for LoRA, the frozen base.
    let (params, layer_params, largest, share) = match &workload.lora {
        None => {
            let (all, layers) = param_bytes(m, layout, pdtype, platform);
            let share = format!("{pdtype}, {} params over {devices} devices", m.num_params());
            (all, layers, largest_param_bytes(m, layout, pdtype, platform), share)
        }
        Some(lora) => {
            let (all, largest) = lora_bytes(m, lora, layout, pdtype, platform);
            let share = format!("{pdtype}, LoRA rank {} adapters on {}", lora.rank, lora.targets.join(","));
            (all, all, largest, share)
        }
    };
    let frozen = workload.lora.as_ref().map(|lora| {
        let (all, layers) = param_bytes(m, layout, lora.base_dtype, platform);
        let detail = format!(
            "{}, {} params over {devices} devices, no gradient or moments",
            lora.base_dtype,
            m.num_params()
        );
        (all, layers, detail)
    });
    let moments = if candidate.offload {
        term(
            "optimizer state",
            format!(
                "AdamW mu + nu in host memory (offload): {} per device off the chip",
                crate::report::format_bytes(2 * params)
            ),
            TermKind::Resident,
            0,
        )
    } else {
        term("optimizer state", format!("AdamW mu + nu, {share}"), TermKind::Resident, 2 * params)
    };

    let resident = |args_hold_params: bool, args_hold_grads: bool, args_hold_base: bool| {
        let mut terms = Vec::new();
        if !args_hold_params {
            terms.push(term("parameters", share.clone(), TermKind::Resident, params));
        }
        terms.push(moments.clone());
        if !args_hold_grads {
            terms.push(term("gradients", format!("accumulator, {share}"), TermKind::Resident, params));
        }
        if let (Some((base, _, detail)), false) = (&frozen, args_hold_base) {
            terms.push(term("frozen base", format!("LoRA base, {detail}"), TermKind::Resident, *base));
        }
        if workload.is_grpo() {
            terms.push(term("reference model", format!("frozen copy, {share}"), TermKind::Resident, params));
        }
        terms
    };
    let code = |program: &str| {
        // Code size hardly depends on the shapes; these are what the compilers produced for
        // these programs (XLA:CPU reports none).
        let bytes = match (platform, program) {
            (Platform::Cpu, _) => 0,
            (Platform::Tpu, "apply_step") => 4 << 20,
            (Platform::Tpu, _) => 20 << 20,
        };
        term("program code", "compiled program".into(), TermKind::Code, bytes)
    };
    // The layer weights cast to the compute dtype inside the layer body (saved for the backward).
    let cast = |bytes: u64, from: DType| {
        if from == workload.compute_dtype {
            0
        } else {
            bytes / from.size() as u64 * workload.compute_dtype.size() as u64
        }
    };
    let weight_copies = match &frozen {
        None => cast(layer_params, pdtype),
        Some((_, base_layers, _)) => cast(*base_layers, d.weights) + cast(layer_params, pdtype),
    };

    // The output head (the logits' matmul): the embedding, or an untied model's `lm_head` of the
    // same shape and sharding. Its gradient over the loss chunks is the f32 accumulator below;
    // an untied embedding's own gradient (the lookup's, after the layer scan) is no larger than
    // what the loss backward holds, so it never sets the peak.
    let (head, head_gradient) = match m.tie_embeddings {
        true => ("embedding", "embedding gradient"),
        false => ("lm_head", "lm_head gradient"),
    };
    // The local shard of the head cast to the compute dtype (before it is gathered).
    let embedding_copy = if workload.compute_dtype == d.weights {
        0
    } else {
        laid_out_bytes(&[d.vocab, m.hidden_size / d.fsdp], workload.compute_dtype, platform)
    };
    let mut programs = Vec::new();

    // The training program: grad_step (SFT) or grpo_grad_step.
    let train_name = if workload.is_grpo() { "grpo_grad_step" } else { "grad_step" };
    let mut train = resident(true, true, true);
    if let Some((base, _, detail)) = &frozen {
        train.push(term("frozen base", format!("LoRA base, {detail}"), TermKind::Argument, *base));
    }
    train.push(term("parameters", share.clone(), TermKind::Argument, params));
    train.push(term("gradients", format!("accumulator (donated), {share}"), TermKind::Argument, params));
    let batch_row_bytes = if workload.is_grpo() { 4 * 5 } else { 4 * 3 };
    train.push(term(
        "batch",
        format!("{} rows x {} tokens, {} bytes/token", candidate.micro_batch, d.seq, batch_row_bytes),
        TermKind::Argument,
        laid_out_bytes(&[d.b, d.seq], DType::Float32, platform) * batch_row_bytes / 4,
    ));
    train.push(term(
        "saved activations",
        format!(
            "remat {}, attention {}: {} layers x {} rows x {} tokens",
            candidate.remat, candidate.attention, d.layers, d.b, d.seq
        ),
        TermKind::Temporary,
        d.layers * d.saved_per_layer(candidate.remat),
    ));
    if weight_copies > 0 {
        train.push(term(
            "weight copies",
            format!("layer weights cast to {} for the matmuls", workload.compute_dtype),
            TermKind::Temporary,
            weight_copies,
        ));
    }
    let mask = d.attention_mask(workload.is_grpo(), candidate.remat);
    if mask > 0 {
        let cols = if candidate.attention == Attention::Xla { d.seq } else { d.block };
        train.push(term(
            "attention mask",
            format!("{} x {cols} causal mask{}", d.seq, if workload.is_grpo() { " per row" } else { "" }),
            TermKind::Temporary,
            mask,
        ));
    }
    // The backward pass has two phases, and the larger one sets the peak: the loss (or
    // log-prob) scan's backward, then the scan over layers, with the stacked f32 gradient of the
    // layer weights it fills and one layer's working set. During the loss scan the f32
    // embedding-gradient accumulator, the gathered embedding and one chunk of logits are live;
    // after it, the accumulator and its compute-dtype copy for the reduction. GRPO's per-token
    // log-prob scan peaks as high as SFT's loss scan at the same shapes (libtpu's peaks for
    // qwen3-0.6b, docs/PLANNER.md). LoRA's embedding is frozen: no gradient, only the gathered
    // embedding.
    let (accumulator, copy) = match frozen {
        None => (d.embedding_gradient(), d.embedding_gradient_copy()),
        Some(_) => (0, 0),
    };
    let logits = d.logits_working_set();
    let in_scan = d.gathered_embedding() + logits;
    let layer_gradients = layer_params / pdtype.size() as u64 * 4;
    let layer_backward = d.layer_backward(candidate.remat);
    let loss_chunk =
        if workload.loss_chunk == 0 { "unchunked".to_string() } else { format!("chunks of {}", d.chunk) };
    let (loss_total, layers_total) = (accumulator + in_scan.max(copy), layer_gradients + layer_backward);
    if loss_total >= layers_total {
        let instead =
            format!("(the layer backward needs {} instead)", crate::report::format_bytes(layers_total));
        let partial_sums = format!("f32 [{} x {}] partial sums", d.vocab, d.hidden);
        if in_scan >= copy {
            let what = match frozen {
                None => format!(
                    "loss backward: {partial_sums}, the {head} gathered in {}",
                    workload.compute_dtype
                ),
                Some(_) => format!("loss backward: the frozen {head} gathered in {}", workload.compute_dtype),
            };
            train.push(term(
                head_gradient,
                format!("{what} {instead}"),
                TermKind::Temporary,
                accumulator + d.gathered_embedding(),
            ));
            train.push(term(
                "logits",
                format!("loss backward: f32 [{} x {} x {}] x3, {loss_chunk}", d.b, d.chunk, d.vocab),
                TermKind::Temporary,
                logits,
            ));
        } else {
            train.push(term(
                head_gradient,
                format!(
                    "after the loss backward: {partial_sums} and their {} copy for the reduction {instead}",
                    workload.compute_dtype
                ),
                TermKind::Temporary,
                accumulator + copy,
            ));
        }
    } else {
        train.push(term(
            "layer gradients",
            format!(
                "layer backward: stacked f32 gradient of the {} (the loss backward needs {} instead)",
                if frozen.is_some() { "adapters" } else { "layer weights" },
                crate::report::format_bytes(loss_total)
            ),
            TermKind::Temporary,
            layer_gradients,
        ));
        train.push(term(
            "layer backward",
            format!(
                "layer backward: one layer under remat {} + attention {}'s working set",
                candidate.remat, candidate.attention
            ),
            TermKind::Temporary,
            layer_backward,
        ));
    }
    train.push(code(train_name));
    programs.push(ProgramEstimate { program: train_name.into(), terms: train });

    if let crate::workload::Kind::Grpo { prompt_len, max_new_tokens, .. } = workload.kind {
        let mut rollout = resident(true, false, false);
        rollout.push(term("parameters", share.clone(), TermKind::Argument, params));
        let total = prompt_len + max_new_tokens;
        let cache =
            2 * d.layers * laid_out_bytes(&[d.b, total, d.kv_width], workload.compute_dtype, platform);
        rollout.push(term(
            "KV cache",
            format!(
                "keys + values, {} layers x {} rows x {total} tokens x {} wide, {}",
                d.layers, d.b, d.kv_width, workload.compute_dtype
            ),
            TermKind::Temporary,
            cache,
        ));
        // The padded cache is copied into the decode loop's state when the loop starts, so two
        // caches are live at that moment (the prompt's unpadded keys and values are gone by then;
        // one layer of prefill attention is far smaller).
        rollout.push(term(
            "KV cache copy",
            "the padded cache copied into the decode loop's state".into(),
            TermKind::Temporary,
            cache,
        ));
        if weight_copies > 0 {
            rollout.push(term(
                "weight copies",
                format!("layer weights cast to {}", workload.compute_dtype),
                TermKind::Temporary,
                weight_copies,
            ));
        }
        rollout.push(term(
            "decode logits",
            format!(
                "f32 [{} x {}] per step, the {head} cast to {} and gathered",
                d.b, d.vocab, workload.compute_dtype
            ),
            TermKind::Temporary,
            3 * laid_out_bytes(&[d.b, d.vocab], DType::Float32, platform)
                + d.gathered_embedding()
                + embedding_copy,
        ));
        rollout.push(code("rollout"));
        programs.push(ProgramEstimate { program: "rollout".into(), terms: rollout });
    }

    let mut apply = Vec::new();
    apply.push(term("parameters", share.clone(), TermKind::Argument, params));
    if candidate.offload {
        apply.push(moments.clone());
        // One parameter's moments on the device at a time, in and out (programs.OffloadChain).
        apply.push(term(
            "moments in flight",
            "the largest parameter's mu + nu brought in and sent back".into(),
            TermKind::Temporary,
            4 * largest,
        ));
    } else {
        apply.push(term(
            "optimizer state",
            format!("AdamW mu + nu, {share}"),
            TermKind::Argument,
            2 * params,
        ));
    }
    apply.push(term("gradients", format!("accumulator, {share}"), TermKind::Argument, params));
    if let Some((base, _, detail)) = &frozen {
        apply.push(term("frozen base", format!("LoRA base, {detail}"), TermKind::Resident, *base));
    }
    if workload.is_grpo() {
        apply.push(term("reference model", format!("frozen copy, {share}"), TermKind::Resident, params));
    }
    apply.push(code("apply_step"));
    programs.push(ProgramEstimate { program: "apply_step".into(), terms: apply });

    MemoryEstimate { programs }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Kind, Layout};

    #[test]
    fn an_untied_head_costs_its_shard_in_every_copy_of_the_state() {
        let tied = Workload {
            model: bundle::preset("qwen3-1.7b").unwrap(),
            kind: Kind::Grpo { prompt_len: 256, max_new_tokens: 512, generations: 8 },
            global_batch: 64,
            param_dtype: DType::Float32,
            compute_dtype: DType::Bfloat16,
            loss_chunk: 256,
            lora: None,
            attention_block: 512,
        };
        let untied = Workload {
            model: bundle::ModelConfig { tie_embeddings: false, ..tied.model.clone() },
            ..tied.clone()
        };
        let candidate = Candidate::new(Layout { dcn: 1, fsdp: 4, tp: 2 }, 16, Remat::Dots);
        let accelerator = Accelerator::v6e_8();
        let (a, b) = (estimate(&tied, &candidate, &accelerator), estimate(&untied, &candidate, &accelerator));
        let shard = laid_out_bytes(&[151_936 / 2, 2048 / 4], DType::Float32, Platform::Tpu);
        // Parameters, gradients, mu, nu and the GRPO reference model.
        for program in ["grpo_grad_step", "apply_step", "rollout"] {
            let grown = b.program(program).unwrap().bytes() - a.program(program).unwrap().bytes();
            assert_eq!(grown, 5 * shard, "{program}");
        }
        let names: Vec<&str> =
            b.program("grpo_grad_step").unwrap().terms.iter().map(|t| t.name.as_str()).collect();
        assert!(names.contains(&"lm_head gradient") || names.contains(&"layer gradients"), "{names:?}");
    }
}
