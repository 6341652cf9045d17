//! `xla.CompileOptionsProto`, hand-encoded: podctl sets a handful of fields and a protobuf
//! dependency for them would be larger than this file.
//!
//! Field numbers, checked against `xla/pjrt/proto/compile_options.proto` and
//! `xla/xla_data.proto`, and byte for byte against what JAX 0.10.2 serializes
//! (tests/fixtures/gen.py records it):
//! - `CompileOptionsProto.executable_build_options` = 3
//! - `ExecutableBuildOptionsProto`: `device_ordinal` = 1, `num_replicas` = 4,
//!   `num_partitions` = 5, `use_spmd_partitioning` = 6, `device_assignment` = 9,
//!   `use_shardy_partitioner` = 19
//! - `DeviceAssignmentProto`: `replica_count` = 1, `computation_count` = 2,
//!   `computation_devices` = 3, each a `ComputationDevice` with packed `replica_device_ids` = 1

use crate::error::{Error, Result};

/// How to compile a program: replicas, SPMD partitions and, optionally, which device runs what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    /// Number of replicas (data-parallel copies inside one program); at least 1.
    pub num_replicas: u32,
    /// Number of SPMD partitions (devices one replica is split over); at least 1.
    pub num_partitions: u32,
    /// Partition the program with the shardings in the module (SPMD) rather than MPMD.
    pub use_spmd_partitioning: bool,
    /// Use Shardy; JAX 0.10 lowers sharded modules with `sdy` attributes, which need it.
    pub use_shardy_partitioner: bool,
    /// `[replica][partition] -> device id`. `None` compiles generically, for any assignment
    /// (a client then runs partition p on its p-th device); JAX always passes one, and XLA's
    /// generated code differs slightly between the two, so pass JAX's to reproduce its numbers.
    pub device_assignment: Option<Vec<Vec<i64>>>,
}

impl Default for CompileOptions {
    /// One replica, one partition, no device assignment.
    fn default() -> Self {
        Self {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            use_shardy_partitioner: true,
            device_assignment: None,
        }
    }
}

impl CompileOptions {
    /// One replica split over `num_partitions` devices with SPMD partitioning and Shardy: how
    /// podctl compiles a slice's step.
    pub fn spmd(num_partitions: u32) -> Self {
        Self { num_partitions, use_spmd_partitioning: true, ..Self::default() }
    }

    /// The number of devices the program runs on.
    pub fn num_devices(&self) -> u64 {
        u64::from(self.num_replicas) * u64::from(self.num_partitions)
    }

    /// Checks what the plugin would otherwise abort the process on.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: String| Err(Error::InvalidCompileOptions { field, reason });
        if self.num_replicas == 0 {
            return invalid("num_replicas", "is 0; use at least 1".into());
        }
        if self.num_partitions == 0 {
            return invalid("num_partitions", "is 0; use at least 1".into());
        }
        let Some(assignment) = &self.device_assignment else { return Ok(()) };
        if assignment.len() != self.num_replicas as usize {
            return invalid(
                "device_assignment",
                format!(
                    "has {} rows but num_replicas is {}; give one row per replica",
                    assignment.len(),
                    self.num_replicas
                ),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (replica, row) in assignment.iter().enumerate() {
            if row.len() != self.num_partitions as usize {
                return invalid(
                    "device_assignment",
                    format!(
                        "row {replica} has {} devices but num_partitions is {}; give one device per partition",
                        row.len(),
                        self.num_partitions
                    ),
                );
            }
            for &device in row {
                if device < 0 {
                    return invalid("device_assignment", format!("has negative device id {device}"));
                }
                if !seen.insert(device) {
                    return invalid(
                        "device_assignment",
                        format!(
                            "uses device {device} twice; every (replica, partition) needs its own device"
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// The serialized `xla.CompileOptionsProto`, after [`CompileOptions::validate`].
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let mut build = Vec::new();
        // device_ordinal = -1: not pinned to one device.
        put_int(&mut build, 1, -1);
        put_int(&mut build, 4, i64::from(self.num_replicas));
        put_int(&mut build, 5, i64::from(self.num_partitions));
        put_bool(&mut build, 6, self.use_spmd_partitioning);
        if let Some(assignment) = &self.device_assignment {
            put_bytes(&mut build, 9, &self.encode_assignment(assignment));
        }
        put_bool(&mut build, 19, self.use_shardy_partitioner);
        let mut options = Vec::new();
        put_bytes(&mut options, 3, &build);
        Ok(options)
    }

    fn encode_assignment(&self, assignment: &[Vec<i64>]) -> Vec<u8> {
        let mut message = Vec::new();
        put_int(&mut message, 1, i64::from(self.num_replicas));
        put_int(&mut message, 2, i64::from(self.num_partitions));
        // XLA stores the assignment per computation (partition), replicas inside.
        for partition in 0..self.num_partitions as usize {
            let mut ids = Vec::new();
            for row in assignment {
                put_varint(&mut ids, row[partition] as u64);
            }
            let mut computation = Vec::new();
            put_bytes(&mut computation, 1, &ids);
            put_bytes(&mut message, 3, &computation);
        }
        message
    }
}

const WIRE_VARINT: u64 = 0;
const WIRE_LEN: u64 = 2;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// An int32/int64 field; proto3 leaves out zeros, and negatives take ten bytes.
fn put_int(out: &mut Vec<u8>, field: u64, value: i64) {
    if value != 0 {
        put_varint(out, (field << 3) | WIRE_VARINT);
        put_varint(out, value as u64);
    }
}

fn put_bool(out: &mut Vec<u8>, field: u64, value: bool) {
    put_int(out, field, i64::from(value));
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_follow_protobuf() {
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        let mut out = Vec::new();
        put_int(&mut out, 1, -1);
        assert_eq!(out, [0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    }

    #[test]
    fn spmd_options_encode_the_build_options() {
        let bytes = CompileOptions::spmd(4).encode().unwrap();
        let mut build = vec![0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        build.extend_from_slice(&[0x20, 1, 0x28, 4, 0x30, 1, 0x98, 0x01, 1]);
        let mut expected = vec![0x1a, build.len() as u8];
        expected.extend_from_slice(&build);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn zero_counts_are_refused() {
        let options = CompileOptions { num_partitions: 0, ..CompileOptions::default() };
        let error = options.encode().unwrap_err();
        assert!(error.to_string().contains("num_partitions is 0"), "{error}");
        let options = CompileOptions { num_replicas: 0, ..CompileOptions::default() };
        assert!(matches!(options.encode(), Err(Error::InvalidCompileOptions { field: "num_replicas", .. })));
    }

    #[test]
    fn assignment_shape_must_match() {
        let rows = CompileOptions { device_assignment: Some(vec![vec![0, 1]]), ..CompileOptions::spmd(4) };
        let error = rows.encode().unwrap_err();
        assert!(error.to_string().contains("row 0 has 2 devices but num_partitions is 4"), "{error}");
        let replicas =
            CompileOptions { device_assignment: Some(vec![vec![0], vec![1]]), ..CompileOptions::spmd(1) };
        assert!(replicas.encode().unwrap_err().to_string().contains("2 rows but num_replicas is 1"));
        let twice = CompileOptions { device_assignment: Some(vec![vec![0, 0]]), ..CompileOptions::spmd(2) };
        assert!(twice.encode().unwrap_err().to_string().contains("uses device 0 twice"));
        let negative =
            CompileOptions { device_assignment: Some(vec![vec![-1]]), ..CompileOptions::default() };
        assert!(negative.encode().is_err());
    }

    #[test]
    fn assignment_is_stored_per_partition() {
        let options = CompileOptions {
            num_replicas: 2,
            device_assignment: Some(vec![vec![0, 1], vec![2, 3]]),
            ..CompileOptions::spmd(2)
        };
        // Partition 0 runs on devices [0, 2] (replica 0, 1), partition 1 on [1, 3].
        assert_eq!(
            options.encode_assignment(options.device_assignment.as_ref().unwrap()),
            [0x08, 2, 0x10, 2, 0x1a, 4, 0x0a, 2, 0, 2, 0x1a, 4, 0x0a, 2, 1, 3]
        );
    }
}
