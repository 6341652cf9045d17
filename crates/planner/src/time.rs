//! The step-time estimate. It is an estimate: FLOPs over peak at an assumed utilization, bytes
//! over nominal bandwidths, communication not overlapped with compute except where the device
//! waits for the slower of the two. It ranks candidates; it does not promise a number.

use crate::hardware::Target;
use crate::workload::{Attention, Candidate, Kind, Remat, Workload};
use serde::{Deserialize, Serialize};

/// Seconds of one optimizer step, by phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    /// Forward and backward passes (and GRPO's reference log-probs), slowest of compute and the
    /// ICI collectives they need.
    pub train: f64,
    /// GRPO's sampling: prefill plus memory-bound decode steps.
    pub rollout: f64,
    /// The gradient all-reduce between slices over the data-centre network.
    pub dcn: f64,
    /// Bytes each host sends over the data-centre network per step.
    pub dcn_bytes: u64,
    /// FLOPs of the whole step over all devices.
    pub flops: f64,
    /// Optimizer offload: AdamW state to the chips and back once per step.
    #[serde(default)]
    pub offload: f64,
}

impl StepTime {
    /// The whole step.
    pub fn total(&self) -> f64 {
        self.train + self.rollout + self.dcn + self.offload
    }
}

/// Estimated time of one optimizer step of `candidate` on `target`.
pub fn step_time(workload: &Workload, candidate: &Candidate, target: &Target) -> StepTime {
    let acc = &target.accelerator;
    let m = &workload.model;
    let layout = &candidate.layout;
    let (f, t) = (layout.fsdp as f64, layout.tp as f64);
    let devices = layout.devices_per_slice() as f64;
    let n = m.num_params() as f64;
    // The output head: the embedding when tied, else `lm_head`.
    let head = (m.vocab_size * m.hidden_size) as f64;
    // The weights that multiply activations: every parameter but an untied model's embedding,
    // which is only looked up (a tied embedding is also the head, the logits' matmul).
    let matmul = if m.tie_embeddings { n } else { n - head };
    let layer_params = matmul - head;
    let seq = workload.seq_len() as f64;
    let attn_width = (m.num_heads * m.head_dim) as f64;
    let layers = m.num_layers as f64;
    let c = workload.compute_dtype.size() as f64;
    let p = workload.param_dtype.size() as f64;

    // Per token: 2 FLOPs per matmul weight (the head's only matmul is the logits), plus the
    // two S x S attention matmuls. Plain and blockwise attention compute the full (masked)
    // square; the Pallas kernel skips the key blocks above the diagonal (about half). Blockwise
    // and Pallas recompute the scores in the backward (flash attention's backward).
    let attention_per_token = 4.0 * layers * seq * attn_width;
    let (attention_share, backward_recompute) = match candidate.attention {
        Attention::Xla => (1.0, 0.0),
        Attention::Blockwise => (1.0, 0.5),
        Attention::Pallas => (0.5, 0.5),
    };
    let attention = attention_share * attention_per_token;
    let forward_per_token = 2.0 * matmul + attention;
    let recompute_per_token = match candidate.remat {
        Remat::None => 0.0,
        Remat::Dots => attention,
        Remat::Full => 2.0 * layer_params + attention,
    } + backward_recompute * attention
        + 2.0 * head; // the chunked loss recomputes each chunk's logits
    // The backward computes each weight matmul's input gradient (2 FLOPs per weight) and its
    // weight gradient (2 more); LoRA's frozen weights need only the first, the adapters both.
    let (trained, trained_matmul) = match &workload.lora {
        None => (n, matmul),
        Some(lora) => (lora_params(m, lora) as f64, lora_params(m, lora) as f64),
    };
    let train_per_token =
        3.0 * attention + 2.0 * matmul + 2.0 * matmul + 2.0 * trained_matmul + recompute_per_token;
    let rows = workload.global_batch as f64;
    let tokens = rows * seq;
    let mut flops = tokens * train_per_token;
    if workload.is_grpo() {
        // The reference model's log-probs: one forward pass.
        flops += tokens * forward_per_token;
    }
    let slices = layout.dcn as f64;
    let per_device_flops = flops / (slices * devices);
    let accum = candidate.accum_steps(workload).max(1) as f64;
    // Every micro-batch also reads and writes the gradient accumulator once.
    let accumulator = 2.0 * trained * p / devices / acc.memory_bandwidth;
    let compute = per_device_flops / (acc.peak_flops * target.mfu) + accum * accumulator;

    // ICI per micro-batch: FSDP gathers the weights for the forward and the backward (again for
    // a full recompute) and reduce-scatters the gradient; TP all-reduces two activations per
    // layer forward and two backward.
    let gathered = (n * c / t) * (f - 1.0) / f;
    let gathers = if candidate.remat == Remat::Full { 3.0 } else { 2.0 };
    let fsdp_bytes = gathers * gathered + (trained * p / t) * (f - 1.0) / f;
    let rows_per_device = candidate.rows_per_device() as f64;
    let activation = rows_per_device * seq * m.hidden_size as f64 * c;
    let tp_bytes = 4.0 * layers * 2.0 * (t - 1.0) / t * activation;
    let ici = accum * (fsdp_bytes + tp_bytes) / acc.ici_bandwidth;
    let train = compute.max(ici);

    let rollout = match workload.kind {
        Kind::Grpo { prompt_len, max_new_tokens, .. } => {
            let prefill =
                rows * prompt_len as f64 * 2.0 * matmul / (slices * devices) / (acc.peak_flops * target.mfu);
            // Each decode step reads this device's weights and its KV cache (half full on
            // average) from memory, and gathers the FSDP-split weights over ICI.
            let weights = matmul * p / devices;
            let kv_width = (m.num_kv_heads * m.head_dim) as f64 / t;
            let kv = 2.0
                * layers
                * rows_per_device
                * (prompt_len as f64 + max_new_tokens as f64 / 2.0)
                * kv_width
                * c;
            let memory = (weights + kv) / acc.memory_bandwidth;
            let gather = gathered / acc.ici_bandwidth;
            prefill + accum * max_new_tokens as f64 * memory.max(gather)
        }
        Kind::Sft { .. } => 0.0,
    };

    // A ring all-reduce of the slice's whole gradient between slices: each host sends
    // 2 (dcn - 1) / dcn of it.
    let gradient_per_host = trained * p;
    let dcn_bytes =
        if layout.dcn > 1 { (2.0 * (slices - 1.0) / slices * gradient_per_host) as u64 } else { 0 };
    let dcn = dcn_bytes as f64 / target.dcn_bandwidth;
    // Offload: both moments of every trained parameter to the chips and back, once per step.
    let offload = match candidate.offload {
        true => 2.0 * 2.0 * trained * p / devices / acc.host_bandwidth,
        false => 0.0,
    };
    StepTime { train, rollout, dcn, dcn_bytes, flops, offload }
}

/// Parameters LoRA trains: `r x (in + out)` per layer of each target projection.
fn lora_params(model: &bundle::ModelConfig, lora: &crate::workload::LoraShape) -> u64 {
    crate::shapes::lora_shapes(model, lora).iter().map(|(_, shape, _)| shape.iter().product::<u64>()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{Accelerator, Target};
    use crate::workload::Layout;
    use mesh::DType;

    fn sft(model: &str, global_batch: u64) -> Workload {
        Workload {
            model: bundle::preset(model).unwrap(),
            kind: Kind::Sft { seq_len: 2048 },
            global_batch,
            param_dtype: DType::Float32,
            compute_dtype: DType::Bfloat16,
            loss_chunk: 256,
            lora: None,
            attention_block: 512,
        }
    }

    fn candidate(dcn: usize, fsdp: usize, tp: usize, micro_batch: u64, remat: Remat) -> Candidate {
        Candidate::new(Layout { dcn, fsdp, tp }, micro_batch, remat)
    }

    #[test]
    fn flops_follow_six_n_t_and_remat_costs_more() {
        let w = sft("qwen3-1.7b", 64);
        let target = Target::new(Accelerator::v6e_8(), 1);
        let none = step_time(&w, &candidate(1, 4, 2, 16, Remat::None), &target);
        let tokens = 64.0 * 2048.0;
        let six_nt = 6.0 * w.model.num_params() as f64 * tokens;
        assert!(none.flops > six_nt && none.flops < 1.3 * six_nt, "{} vs {six_nt}", none.flops);
        let full = step_time(&w, &candidate(1, 4, 2, 16, Remat::Full), &target);
        assert!(full.train > none.train);
        assert_eq!((none.rollout, none.dcn, none.dcn_bytes), (0.0, 0.0, 0));
    }

    #[test]
    fn an_untied_head_adds_its_logits_matmul_and_nothing_for_the_lookup() {
        let tied = sft("qwen3-1.7b", 64);
        let mut untied = tied.clone();
        untied.model.tie_embeddings = false;
        let target = Target::new(Accelerator::v6e_8(), 1);
        let c = candidate(1, 4, 2, 16, Remat::None);
        let (a, b) = (step_time(&tied, &c, &target), step_time(&untied, &c, &target));
        // The same matmuls (the head is lm_head instead of the embedding), a gradient one
        // embedding larger.
        assert_eq!(a.flops, b.flops);
        let target = Target::new(Accelerator::v6e_8(), 2);
        let c = candidate(2, 4, 2, 16, Remat::None);
        let (a, b) = (step_time(&tied, &c, &target), step_time(&untied, &c, &target));
        assert_eq!(b.dcn_bytes - a.dcn_bytes, 151_936 * 2048 * 4);
    }

    #[test]
    fn dcn_sends_the_gradient_twice_over_minus_one_share() {
        let w = sft("qwen3-1.7b", 64);
        let target = Target::new(Accelerator::v6e_8(), 2);
        let a = step_time(&w, &candidate(2, 4, 2, 16, Remat::Dots), &target);
        let b = step_time(&w, &candidate(2, 2, 4, 16, Remat::Dots), &target);
        let gradient = w.model.num_params() * 4;
        assert_eq!(a.dcn_bytes, gradient);
        assert_eq!(a.dcn_bytes, b.dcn_bytes);
        assert!(a.dcn > 0.0 && a.total() > a.train);
    }

    #[test]
    fn more_micro_batches_cost_more_weight_gathers() {
        let w = sft("qwen3-1.7b", 64);
        let target = Target::new(Accelerator::v6e_8(), 1);
        let small = step_time(&w, &candidate(1, 8, 1, 8, Remat::Dots), &target);
        let large = step_time(&w, &candidate(1, 8, 1, 32, Remat::Dots), &target);
        assert!(small.train >= large.train);
    }
}
