//! Who writes what: a pure, deterministic assignment of every distinct shard to one writer host.
//!
//! Every host and the finalizer compute the same plan from the same [`Topology`] and
//! [`ArraySpec`]s, so no coordination is needed to agree on it: a replicated shard is written
//! once, by one of the hosts that hold a copy, and the bytes are spread evenly over the hosts.

use crate::error::{CheckpointError, Result};
use crate::topology::{ArraySpec, Topology};
use mesh::Region;
use std::collections::{BTreeSet, HashMap};

/// One distinct piece of one array and the host chosen to write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedShard {
    /// Index of the array in the save's array list.
    pub array: usize,
    /// The piece, in global coordinates.
    pub region: Region,
    /// Its size in bytes.
    pub bytes: u64,
    /// Global devices holding this piece, ascending.
    pub devices: Vec<usize>,
    /// Hosts holding a copy, ascending.
    pub holders: Vec<usize>,
    /// The host that writes it.
    pub writer: usize,
}

/// The write plan of a save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritePlan {
    /// Every distinct (array, region), in array order, then by first holding device.
    pub shards: Vec<PlannedShard>,
    /// Bytes each host writes.
    pub host_bytes: Vec<u64>,
}

impl WritePlan {
    /// The shards `host` writes, in stream order (array order, then by first holding device).
    pub fn host_shards(&self, host: usize) -> impl Iterator<Item = &PlannedShard> {
        self.shards.iter().filter(move |s| s.writer == host)
    }
}

/// Checks the arrays against the topology: unique non-empty names, shardings valid on the
/// global mesh, sizes that fit in `u64`.
pub fn validate_arrays(topology: &Topology, arrays: &[ArraySpec]) -> Result<()> {
    let mut names = BTreeSet::new();
    for a in arrays {
        if a.name.is_empty() || a.name.len() > 1024 {
            return Err(CheckpointError::invalid(
                "array name",
                format!("'{}' must be 1..=1024 bytes", a.name),
            ));
        }
        if !names.insert(a.name.as_str()) {
            return Err(CheckpointError::invalid("array name", format!("'{}' appears twice", a.name)));
        }
        a.sharding.validate(&a.shape, topology.mesh()).map_err(|e| {
            CheckpointError::invalid(format!("sharding of array '{}'", a.name), e.to_string())
        })?;
        if a.num_bytes().is_none() {
            return Err(CheckpointError::invalid(
                format!("shape of array '{}'", a.name),
                format!("{:?} of {} overflows 64 bits of bytes", a.shape, a.dtype),
            ));
        }
    }
    Ok(())
}

/// Assigns every distinct shard of `arrays` to one writer among the hosts holding it.
///
/// Shards with the fewest holders are placed first (they have no choice), then larger before
/// smaller, each on the holder that has the fewest bytes so far (lowest host id on ties): a
/// greedy longest-processing-time balance that is a pure function of its inputs.
pub fn plan_writes(topology: &Topology, arrays: &[ArraySpec]) -> Result<WritePlan> {
    validate_arrays(topology, arrays)?;
    let mesh = topology.mesh();
    let mut shards = Vec::new();
    for (index, array) in arrays.iter().enumerate() {
        let mut by_region: HashMap<Region, usize> = HashMap::new();
        let first = shards.len();
        for device in 0..topology.num_devices() {
            let region = array.sharding.shard_region(&array.shape, mesh, device);
            let host = topology.host_of_device(device);
            let slot = *by_region.entry(region.clone()).or_insert_with(|| {
                let bytes = region.num_elements() * array.dtype.size() as u64;
                shards.push(PlannedShard {
                    array: index,
                    region,
                    bytes,
                    devices: Vec::new(),
                    holders: Vec::new(),
                    writer: host,
                });
                shards.len() - 1
            });
            let shard = &mut shards[slot];
            shard.devices.push(device);
            if shard.holders.last() != Some(&host) {
                shard.holders.push(host);
            }
        }
        debug_assert!(shards[first..].iter().all(|s| s.holders.windows(2).all(|w| w[0] < w[1])));
    }

    let mut order: Vec<usize> = (0..shards.len()).collect();
    order.sort_by_key(|&i| (shards[i].holders.len(), std::cmp::Reverse(shards[i].bytes), i));
    let mut host_bytes = vec![0u64; topology.num_hosts()];
    for i in order {
        let shard = &mut shards[i];
        let writer = *shard
            .holders
            .iter()
            .min_by_key(|&&h| (host_bytes[h], h))
            .expect("every shard is held by at least one device");
        shard.writer = writer;
        host_bytes[writer] += shard.bytes;
    }
    Ok(WritePlan { shards, host_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh::{DType, IciMesh, Sharding};

    fn spec(dims: &[&[&str]]) -> Sharding {
        Sharding::new(dims.iter().map(|d| d.iter().map(|s| s.to_string()).collect()).collect())
    }

    fn hsdp() -> Topology {
        Topology::new(2, IciMesh::new([("fsdp", 2), ("tp", 2)]).unwrap(), 1).unwrap()
    }

    #[test]
    fn sharded_arrays_are_written_by_their_only_holder() {
        // Sharded over every axis, dcn included: each piece has one holder.
        let a = ArraySpec::new("w", vec![4, 4, 2], DType::Float32, spec(&[&["dcn"], &["fsdp"], &["tp"]]));
        let plan = plan_writes(&hsdp(), &[a]).unwrap();
        assert_eq!(plan.shards.len(), 8);
        assert!(plan.shards.iter().all(|s| s.holders.len() == 1 && s.writer == s.holders[0]));
        assert_eq!(plan.host_bytes, vec![64, 64]);
    }

    #[test]
    fn replicas_are_written_once_and_balanced() {
        // Replicated across slices (HSDP): every piece has two holders; 20 arrays of unequal size.
        let arrays: Vec<_> = (0..20)
            .map(|i| {
                let rows = 4 * (i as u64 % 7 + 1);
                ArraySpec::new(format!("a{i}"), vec![rows, 8], DType::Float32, spec(&[&["fsdp"], &["tp"]]))
            })
            .collect();
        let total: u64 = arrays.iter().map(|a| a.num_bytes().unwrap()).sum();
        let plan = plan_writes(&hsdp(), &arrays).unwrap();
        assert_eq!(plan.shards.len(), 20 * 4, "each distinct piece appears once");
        assert_eq!(plan.host_bytes.iter().sum::<u64>(), total, "nothing is written twice");
        let (lo, hi) =
            (plan.host_bytes[0].min(plan.host_bytes[1]), plan.host_bytes[0].max(plan.host_bytes[1]));
        let largest = plan.shards.iter().map(|s| s.bytes).max().unwrap();
        assert!(hi - lo <= largest, "imbalance {} exceeds the largest shard {largest}", hi - lo);
        for s in &plan.shards {
            assert_eq!(s.holders, vec![0, 1]);
            assert_eq!(s.devices.len(), 2);
        }
    }

    #[test]
    fn fully_replicated_scalars_spread_over_hosts() {
        let t = Topology::new(4, IciMesh::new([("fsdp", 2)]).unwrap(), 2).unwrap();
        let arrays: Vec<_> = (0..8)
            .map(|i| ArraySpec::new(format!("s{i}"), vec![], DType::Int32, Sharding::replicated(0)))
            .collect();
        let plan = plan_writes(&t, &arrays).unwrap();
        assert_eq!(plan.host_bytes, vec![4; 8]);
    }

    #[test]
    fn the_plan_is_deterministic() {
        let arrays: Vec<_> = (0..50)
            .map(|i| {
                ArraySpec::new(
                    format!("a{i}"),
                    vec![4 * (i % 5 + 1), 6],
                    DType::Bfloat16,
                    spec(&[&["fsdp"], &[]]),
                )
            })
            .collect();
        let a = plan_writes(&hsdp(), &arrays).unwrap();
        let b = plan_writes(&hsdp(), &arrays).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn bad_arrays_are_named() {
        let t = hsdp();
        let dup = ArraySpec::new("x", vec![4], DType::Float32, spec(&[&["fsdp"]]));
        let e = plan_writes(&t, &[dup.clone(), dup]).unwrap_err();
        assert!(e.to_string().contains("'x' appears twice"), "{e}");
        let bad = ArraySpec::new("y", vec![3], DType::Float32, spec(&[&["fsdp"]]));
        let e = plan_writes(&t, &[bad]).unwrap_err();
        assert!(e.to_string().contains("sharding of array 'y'"), "{e}");
    }
}
