//! The devices a plan is made for: how much memory a program may use on each, how fast they
//! compute and move bytes, and how podctl compiles for them ahead of time.

use crate::PlanError;
use serde::{Deserialize, Serialize};

/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// What XLA lets one program use on a TPU v6e chip: 31.25 GiB of its 32 GiB of HBM.
pub const V6E_HBM_LIMIT: u64 = 31 * GIB + GIB / 4;

/// The compiler family a program is compiled by. The analytic model follows each compiler's
/// buffer decisions (what it saves for the backward pass, how it pads arrays), so it needs to
/// know which one it is predicting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// XLA:TPU (libtpu): arrays padded to (8, 128) tiles, dots in bf16 by default.
    Tpu,
    /// XLA:CPU (the CPU PJRT plugin): no padding, dots in the operands' precision.
    Cpu,
}

impl Platform {
    /// The exporter's `--platform` value.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Tpu => "tpu",
            Platform::Cpu => "cpu",
        }
    }
}

/// One kind of slice: its devices, their memory limit and speed, and how to compile for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Accelerator {
    /// The name a user writes, e.g. `v6e-8` or `cpu-4`.
    pub name: String,
    /// Who compiles for it.
    pub platform: Platform,
    /// Devices in one slice (one host for a v6e-8).
    pub devices_per_slice: usize,
    /// Bytes one program may use on one device.
    pub memory_limit: u64,
    /// The PJRT topology to compile for without the devices (`v6e:2x4`); `None` compiles with a
    /// client on this machine's CPU devices.
    pub topology: Option<String>,
    /// Peak dense bf16 FLOP/s of one device.
    pub peak_flops: f64,
    /// Memory bandwidth of one device, bytes/s.
    pub memory_bandwidth: f64,
    /// Bandwidth of one device's links inside the slice (ICI), bytes/s, for collectives.
    pub ici_bandwidth: f64,
    /// Bandwidth between one device and its host's memory, bytes/s, for optimizer offload.
    #[serde(default = "default_host_bandwidth")]
    pub host_bandwidth: f64,
}

fn default_host_bandwidth() -> f64 {
    16e9
}

/// The TPU v6e slices of one host podctl knows: (name, chips, libtpu topology).
const V6E_SLICES: [(&str, usize, &str); 3] =
    [("v6e-1", 1, "v6e:1x1"), ("v6e-4", 4, "v6e:2x2"), ("v6e-8", 8, "v6e:2x4")];

impl Accelerator {
    /// A TPU v6e-8 host: 8 chips in a 2x4 torus, 31.25 GiB per chip for a program.
    pub fn v6e_8() -> Self {
        Self::v6e("v6e-8", 8, "v6e:2x4")
    }

    fn v6e(name: &str, chips: usize, topology: &str) -> Self {
        Self {
            name: name.to_string(),
            platform: Platform::Tpu,
            devices_per_slice: chips,
            memory_limit: V6E_HBM_LIMIT,
            topology: Some(topology.to_string()),
            // Published v6e figures: 918 TFLOP/s bf16, 1.6 TB/s HBM, 3,584 Gbps ICI per chip.
            peak_flops: 918e12,
            memory_bandwidth: 1.6e12,
            ici_bandwidth: 448e9,
            // PCIe between a chip and its host, shared by the host's chips: a conservative
            // 16 GB/s per chip for offloaded optimizer state.
            host_bandwidth: 16e9,
        }
    }

    /// `devices` virtual CPU devices of this machine, each allowed `memory_limit` bytes (local
    /// runs have no hard limit; the budget is the user's choice). Speeds are nominal: local
    /// plans rank candidates by memory, not time.
    pub fn cpu(devices: usize, memory_limit: u64) -> Self {
        Self {
            name: format!("cpu-{devices}"),
            platform: Platform::Cpu,
            devices_per_slice: devices,
            memory_limit,
            topology: None,
            peak_flops: 50e9,
            memory_bandwidth: 10e9,
            ici_bandwidth: 10e9,
            host_bandwidth: 10e9,
        }
    }

    /// Parses `v6e-8`, `v6e-4`, `v6e-1` or `cpu-N` (with `cpu_memory_limit` per device for
    /// the CPU); anything else is refused with the names that work.
    pub fn parse(name: &str, cpu_memory_limit: u64) -> Result<Self, PlanError> {
        if let Some(&(slice, chips, topology)) = V6E_SLICES.iter().find(|(n, _, _)| *n == name) {
            return Ok(Self::v6e(slice, chips, topology));
        }
        if let Some(count) = name.strip_prefix("cpu-")
            && let Ok(devices) = count.parse::<usize>()
            && devices > 0
        {
            return Ok(Self::cpu(devices, cpu_memory_limit));
        }
        Err(PlanError::UnknownTopology {
            name: name.to_string(),
            known: V6E_SLICES.iter().map(|(n, _, _)| n.to_string()).chain(["cpu-N".to_string()]).collect(),
        })
    }
}

/// Where a plan runs: `slices` copies of one accelerator slice joined by the data-centre
/// network, and the assumptions the step-time estimate makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// One slice.
    pub accelerator: Accelerator,
    /// Slices (hosts, for v6e-8): the `dcn` axis.
    pub slices: usize,
    /// Bytes/s one host sends and receives over the data-centre network.
    pub dcn_bandwidth: f64,
    /// The fraction of peak FLOP/s a training step reaches (model FLOPs utilization).
    pub mfu: f64,
}

impl Target {
    /// `slices` slices of `accelerator`, with 100 Gbit/s DCN per host and 40% MFU.
    pub fn new(accelerator: Accelerator, slices: usize) -> Self {
        Self { accelerator, slices, dcn_bandwidth: 12.5e9, mfu: 0.4 }
    }

    /// Devices over all slices.
    pub fn num_devices(&self) -> usize {
        self.accelerator.devices_per_slice * self.slices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_slices_and_names_them_when_unknown() {
        let v6e = Accelerator::parse("v6e-8", 0).unwrap();
        assert_eq!(v6e.devices_per_slice, 8);
        assert_eq!(v6e.topology.as_deref(), Some("v6e:2x4"));
        assert_eq!(v6e.memory_limit, 33_554_432_000);
        let cpu = Accelerator::parse("cpu-4", 1 << 30).unwrap();
        assert_eq!((cpu.platform, cpu.devices_per_slice, cpu.memory_limit), (Platform::Cpu, 4, 1 << 30));
        for bad in ["v5e-8", "v6e-16", "cpu-0", "cpu-x", ""] {
            let e = Accelerator::parse(bad, 0).unwrap_err().to_string();
            assert!(e.contains("v6e-1, v6e-4, v6e-8, cpu-N"), "{bad}: {e}");
        }
    }
}
