//! The job as the planner sees it: the workload, the devices of a host, the candidate it runs;
//! `mesh: auto` resolved by the planner's analytic model; and the layout explained.

use crate::mesh_spec::{IciSpec, MeshRequest, MeshSpec};
use crate::{JobError, JobSpec};
use planner::{
    Accelerator, Attention, Candidate, Kind, Layout, LoraShape, PlanOptions, Platform, Remat, Target,
    Workload,
};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What one local (CPU) device may use when planning, unless `runtime.device_memory` says.
pub const DEFAULT_DEVICE_MEMORY: u64 = 4 << 30;

/// A byte count, written in a spec as `4GiB`, `512MiB`, `64KiB` or a plain number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SizeText", into = "u64")]
pub struct MemorySize(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeText {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeText> for MemorySize {
    type Error = String;

    fn try_from(value: SizeText) -> Result<Self, String> {
        let text = match value {
            SizeText::Bytes(bytes) => return Ok(Self(bytes)),
            SizeText::Text(text) => text,
        };
        let trimmed = text.trim();
        let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let scale: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            _ => 0,
        };
        match number.parse::<f64>() {
            Ok(value) if scale > 0 && value.is_finite() && value >= 0.0 => {
                Ok(Self((value * scale as f64).round() as u64))
            }
            _ => Err(format!("'{text}' is not a memory size; write e.g. 4GiB, 512MiB or a number of bytes")),
        }
    }
}

impl From<MemorySize> for u64 {
    fn from(size: MemorySize) -> u64 {
        size.0
    }
}

impl fmt::Display for MemorySize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&planner::format_bytes(self.0))
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> JobError {
    JobError::Invalid { field, reason: reason.into() }
}

impl JobSpec {
    /// The `runtime` checks: a known accelerator, a device-memory budget only for CPU devices,
    /// and a device count that agrees with the accelerator.
    pub(crate) fn check_runtime(&self) -> Result<(), JobError> {
        let runtime = &self.runtime;
        if runtime.devices_per_host == Some(0) {
            return Err(invalid("runtime.devices_per_host", "is 0; a host needs at least one device"));
        }
        if runtime.device_memory.is_some_and(|m| m.0 == 0) {
            return Err(invalid("runtime.device_memory", "is 0; give each device a budget such as 4GiB"));
        }
        let Some(name) = &runtime.accelerator else { return Ok(()) };
        if let Some(chips) = name.strip_prefix("v6e-").and_then(|c| c.parse::<usize>().ok())
            && chips > 8
        {
            return Err(invalid(
                "runtime.accelerator",
                format!(
                    "{name} is one slice of {chips} chips across several hosts, and training one slice across \
                     hosts is not built yet; what works is several single-host slices over DCN: \
                     runtime.accelerator: v6e-8 and mesh.dcn: {} for the same {} chips",
                    chips.div_ceil(8),
                    chips.div_ceil(8) * 8
                ),
            ));
        }
        let accelerator = Accelerator::parse(name, DEFAULT_DEVICE_MEMORY)
            .map_err(|e| invalid("runtime.accelerator", e.to_string()))?;
        if accelerator.platform == Platform::Tpu && runtime.device_memory.is_some() {
            return Err(invalid(
                "runtime.device_memory",
                format!(
                    "a {name} device may use {} (XLA's limit); device_memory budgets CPU devices, so drop it",
                    planner::format_bytes(accelerator.memory_limit)
                ),
            ));
        }
        if let Some(devices) = runtime.devices_per_host
            && devices != accelerator.devices_per_slice
        {
            return Err(invalid(
                "runtime.devices_per_host",
                format!(
                    "{devices}, but a {name} host has {} devices; drop devices_per_host or set it to {}",
                    accelerator.devices_per_slice, accelerator.devices_per_slice
                ),
            ));
        }
        Ok(())
    }

    /// The memory levers of `train`: a known attention implementation, a LoRA that can work,
    /// and optimizer offload only where there is host memory to offload to (a TPU).
    pub(crate) fn check_levers(&self) -> Result<(), JobError> {
        let t = &self.train;
        if !["auto", "xla", "blockwise", "pallas"].contains(&t.attention.as_str()) {
            return Err(invalid(
                "train.attention",
                format!("'{}' is not one of auto, xla, blockwise, pallas", t.attention),
            ));
        }
        if t.attention_block == 0 {
            return Err(invalid("train.attention_block", "is 0; use a number of keys per block, e.g. 512"));
        }
        if let Some(lora) = &t.lora {
            if lora.rank == 0 {
                return Err(invalid(
                    "train.lora.rank",
                    "is 0; use a rank such as 16 or 64, or drop `lora:` to train every parameter",
                ));
            }
            if !(lora.alpha > 0.0 && lora.alpha.is_finite()) {
                return Err(invalid("train.lora.alpha", format!("{} must be positive", lora.alpha)));
            }
            if lora.targets.is_empty() {
                return Err(invalid(
                    "train.lora.targets",
                    format!("is empty; name projections from {}", crate::LORA_TARGETS.join(", ")),
                ));
            }
            for (i, target) in lora.targets.iter().enumerate() {
                if !crate::LORA_TARGETS.contains(&target.as_str()) || lora.targets[..i].contains(target) {
                    return Err(invalid(
                        "train.lora.targets",
                        format!(
                            "'{target}' is not a projection or appears twice; name each once, from {}",
                            crate::LORA_TARGETS.join(", ")
                        ),
                    ));
                }
            }
            if !matches!(lora.base_dtype, mesh::DType::Float32 | mesh::DType::Bfloat16) {
                return Err(invalid(
                    "train.lora.base_dtype",
                    format!("{} is not supported; use bfloat16 or float32", lora.base_dtype),
                ));
            }
            if self.grpo.is_some() {
                return Err(invalid(
                    "train.lora",
                    "LoRA bundles train SFT jobs only for now; drop `lora:` or `grpo:`",
                ));
            }
        }
        if t.offload() {
            let tpu = self
                .runtime
                .accelerator
                .as_deref()
                .map(|name| Accelerator::parse(name, DEFAULT_DEVICE_MEMORY));
            if !matches!(tpu, Some(Ok(ref a)) if a.platform == Platform::Tpu) {
                return Err(invalid(
                    "train.optimizer_offload",
                    "keeps AdamW state in TPU host memory (pinned_host), which the CPU plugin does not have; \
                     set runtime.accelerator to a TPU (v6e-8, v6e-4, v6e-1) or drop optimizer_offload",
                ));
            }
        }
        Ok(())
    }

    /// The devices of one host, when the spec says (`runtime.devices_per_host` or
    /// `runtime.accelerator`), with words for messages.
    pub(crate) fn host_devices(&self) -> Result<Option<(usize, String)>, JobError> {
        if let Some(devices) = self.runtime.devices_per_host {
            return Ok(Some((devices, "each host".into())));
        }
        match &self.runtime.accelerator {
            Some(name) => {
                let accelerator = Accelerator::parse(name, DEFAULT_DEVICE_MEMORY)
                    .map_err(|e| invalid("runtime.accelerator", e.to_string()))?;
                Ok(Some((accelerator.devices_per_slice, format!("a {name} host"))))
            }
            None => Ok(None),
        }
    }

    /// The accelerator of one host: `runtime.accelerator`, else this machine's CPU with
    /// `runtime.devices_per_host` devices (or the mesh's), each allowed `runtime.device_memory`.
    pub fn accelerator(&self) -> Result<Accelerator, JobError> {
        let memory = self.runtime.device_memory.map_or(DEFAULT_DEVICE_MEMORY, |m| m.0);
        if let Some(name) = &self.runtime.accelerator {
            return Accelerator::parse(name, memory)
                .map_err(|e| invalid("runtime.accelerator", e.to_string()));
        }
        let devices = self.runtime.devices_per_host.or_else(|| {
            let devices = self.mesh.devices_per_slice();
            (devices > 0).then_some(devices)
        });
        match devices {
            Some(devices) => Ok(Accelerator::cpu(devices, memory)),
            None => Err(invalid(
                "runtime.devices_per_host",
                "is missing: mesh: auto needs the devices of a host; set runtime.devices_per_host (CPU \
                 devices of this machine, e.g. 4) or runtime.accelerator (v6e-8, v6e-4, v6e-1)",
            )),
        }
    }

    /// What the planner plans: the model, SFT or GRPO shapes, the batch and the dtypes.
    pub fn workload(&self) -> Result<Workload, JobError> {
        let model = self.model_config()?;
        let kind = match &self.grpo {
            Some(g) => Kind::Grpo {
                prompt_len: g.prompt_len,
                max_new_tokens: g.max_new_tokens,
                generations: g.generations,
            },
            None => Kind::Sft { seq_len: self.seq_len },
        };
        Ok(Workload {
            model,
            kind,
            global_batch: self.batch.global,
            param_dtype: self.train.param_dtype,
            compute_dtype: self.train.compute_dtype,
            loss_chunk: self.train.loss_chunk,
            lora: self.train.lora.as_ref().map(|lora| LoraShape {
                rank: lora.rank,
                targets: lora.targets.clone(),
                base_dtype: lora.base_dtype,
            }),
            attention_block: self.train.attention_block,
        })
    }

    /// The layout of the resolved mesh.
    pub fn layout(&self) -> Layout {
        Layout { dcn: self.mesh.dcn, fsdp: self.mesh.ici.fsdp, tp: self.mesh.ici.tp }
    }

    /// The configuration this job runs, as a planner candidate.
    pub fn candidate(&self) -> Result<Candidate, JobError> {
        let remat = Remat::parse(&self.train.remat).map_err(|e| invalid("train.remat", e.to_string()))?;
        let attention =
            Attention::parse(&self.train.attention).map_err(|e| invalid("train.attention", e.to_string()))?;
        Ok(Candidate {
            layout: self.layout(),
            micro_batch: self.batch.micro,
            remat,
            attention,
            offload: self.train.offload(),
        })
    }

    /// The layout in words (the mesh explained), then which device of which host holds which
    /// shard of each parameter.
    pub fn describe_layout(&self) -> Result<String, JobError> {
        let model = self.model_config()?;
        let shards =
            planner::render_layout(&self.layout(), &planner::param_shapes(&model), self.train.param_dtype);
        Ok(format!("{}\n{shards}", self.mesh.explain()))
    }

    /// `mesh: auto`: the planner's analytic choice for `hosts` hosts of the job's accelerator.
    /// `batch.micro` and `train.remat`, when the spec sets them, pin those choices.
    pub(crate) fn plan_mesh(&mut self, hosts: usize) -> Result<(), JobError> {
        let target = Target::new(self.accelerator()?, hosts);
        let workload = self.workload()?;
        let mut options = PlanOptions::default();
        if self.batch.micro != 0 {
            options.micro_batches = Some(vec![self.batch.micro]);
        }
        if self.train.remat != "auto" {
            options.remats =
                vec![Remat::parse(&self.train.remat).map_err(|e| invalid("train.remat", e.to_string()))?];
        }
        if self.train.attention != "auto" {
            options.attentions = vec![
                Attention::parse(&self.train.attention)
                    .map_err(|e| invalid("train.attention", e.to_string()))?,
            ];
        }
        if let Some(offload) = self.train.optimizer_offload {
            options.offloads = vec![offload];
        }
        let plan = planner::plan_analytic(&workload, &target, &options)
            .map_err(|e| invalid("mesh", format!("auto: {e}")))?;
        let Some(row) = plan.chosen() else {
            return Err(invalid(
                "mesh",
                format!(
                    "auto: no candidate fits {} x {}; run `podctl plan` to see every candidate",
                    hosts, target.accelerator.name
                ),
            ));
        };
        let c = row.candidate;
        let choice = format!(
            "the planner chose micro-batch {} and {} ({} accumulation steps): {} per device of the {} \
             a {} device may use, by the analytic model",
            c.micro_batch,
            c.levers(),
            c.accum_steps(&workload),
            planner::format_bytes(row.peak()),
            planner::format_bytes(plan.limit()),
            target.accelerator.name
        );
        self.mesh = MeshSpec {
            dcn: c.layout.dcn,
            ici: IciSpec { fsdp: c.layout.fsdp, tp: c.layout.tp },
            request: MeshRequest::Auto { hosts, choice: Some(choice) },
        };
        self.batch.micro = c.micro_batch;
        self.train.remat = c.remat.name().into();
        self.train.attention = c.attention.name().into();
        self.train.optimizer_offload = Some(c.offload);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(yaml: &str) -> Result<u64, String> {
        serde_saphyr::from_str::<MemorySize>(yaml).map(|m| m.0).map_err(|e| e.to_string())
    }

    #[test]
    fn memory_sizes_take_binary_units_or_bytes() {
        assert_eq!(size("4GiB"), Ok(4 << 30));
        assert_eq!(size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(size("512MiB"), Ok(512 << 20));
        assert_eq!(size("1048576"), Ok(1 << 20));
        for bad in ["4GB", "lots", "-1GiB", "GiB"] {
            let e = size(bad).unwrap_err();
            assert!(e.contains("is not a memory size; write e.g. 4GiB"), "{bad}: {e}");
        }
        assert_eq!(MemorySize(3 << 30).to_string(), "3.00 GiB");
    }
}
