//! Where devices live: the `dcn x ici` mesh, the hosts that make it up, and the arrays on it.

use crate::error::{CheckpointError, Result};
use mesh::{DType, IciMesh, MeshAxis, Sharding};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The name of the data-parallel axis across slices in the global mesh.
pub const DCN_AXIS: &str = "dcn";

/// Largest global mesh a checkpoint accepts: bounds every per-device loop, also for meshes read
/// from an untrusted manifest.
pub const MAX_DEVICES: usize = 1 << 16;

/// The devices of a save (or of a restore target) and the hosts that hold them.
///
/// The global mesh is `dcn x ici`: a `dcn` axis of `dcn` slices, major, followed by the ICI axes
/// of one slice. Global device `d` is the row-major position over that mesh, so slice `s` owns
/// devices `s * ici.num_devices()..(s + 1) * ici.num_devices()`. Each slice has
/// `hosts_per_slice` hosts holding consecutive equal runs of its devices; host `h` of slice `s`
/// has id `s * hosts_per_slice + h`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TopologyWire", into = "TopologyWire")]
pub struct Topology {
    dcn: usize,
    ici: IciMesh,
    hosts_per_slice: usize,
    mesh: IciMesh,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopologyWire {
    dcn: usize,
    ici: Vec<MeshAxis>,
    hosts_per_slice: usize,
}

impl Topology {
    /// A topology of `dcn` slices of `ici` devices, each slice spread over `hosts_per_slice`
    /// hosts.
    pub fn new(dcn: usize, ici: IciMesh, hosts_per_slice: usize) -> Result<Self> {
        let what = || format!("topology dcn({dcn}) x {ici} over {hosts_per_slice} host(s) per slice");
        if dcn == 0 || hosts_per_slice == 0 {
            return Err(CheckpointError::invalid(what(), "dcn and hosts_per_slice must be at least 1"));
        }
        if ici.axis_size(DCN_AXIS).is_some() {
            return Err(CheckpointError::invalid(
                what(),
                format!("the ICI mesh may not have an axis named '{DCN_AXIS}'; podctl adds that axis itself"),
            ));
        }
        let per_slice = ici.num_devices();
        let devices = dcn.checked_mul(per_slice).filter(|&n| n <= MAX_DEVICES);
        if devices.is_none() {
            return Err(CheckpointError::invalid(what(), format!("more than {MAX_DEVICES} devices")));
        }
        if !per_slice.is_multiple_of(hosts_per_slice) {
            return Err(CheckpointError::invalid(
                what(),
                format!("{per_slice} devices per slice do not split evenly over {hosts_per_slice} hosts"),
            ));
        }
        let axes = std::iter::once((DCN_AXIS.to_string(), dcn))
            .chain(ici.axes().iter().map(|a| (a.name.clone(), a.size)));
        let mesh = IciMesh::new(axes).map_err(|e| CheckpointError::invalid(what(), e.to_string()))?;
        Ok(Self { dcn, ici, hosts_per_slice, mesh })
    }

    /// One host with one slice of `ici`.
    pub fn single_host(ici: IciMesh) -> Result<Self> {
        Self::new(1, ici, 1)
    }

    /// The number of slices.
    pub fn dcn(&self) -> usize {
        self.dcn
    }

    /// The mesh inside one slice.
    pub fn ici(&self) -> &IciMesh {
        &self.ici
    }

    /// Hosts per slice.
    pub fn hosts_per_slice(&self) -> usize {
        self.hosts_per_slice
    }

    /// The global mesh: the `dcn` axis followed by the ICI axes. Shardings of saved arrays are
    /// written against it; one that does not name `dcn` is replicated across slices.
    pub fn mesh(&self) -> &IciMesh {
        &self.mesh
    }

    /// The number of hosts.
    pub fn num_hosts(&self) -> usize {
        self.dcn * self.hosts_per_slice
    }

    /// The number of devices in the global mesh.
    pub fn num_devices(&self) -> usize {
        self.mesh.num_devices()
    }

    fn devices_per_host(&self) -> usize {
        self.ici.num_devices() / self.hosts_per_slice
    }

    /// The host that holds global device `device` (which must be below [`Self::num_devices`]).
    pub fn host_of_device(&self, device: usize) -> usize {
        device / self.devices_per_host()
    }

    /// The global devices host `host` holds.
    pub fn devices_of_host(&self, host: usize) -> Range<usize> {
        let n = self.devices_per_host();
        host * n..(host + 1) * n
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dcn({}) x {} on {} host(s)", self.dcn, self.ici, self.num_hosts())
    }
}

impl TryFrom<TopologyWire> for Topology {
    type Error = CheckpointError;

    fn try_from(wire: TopologyWire) -> Result<Self> {
        let ici =
            IciMesh::try_from(wire.ici).map_err(|e| CheckpointError::invalid("ici mesh", e.to_string()))?;
        Self::new(wire.dcn, ici, wire.hosts_per_slice)
    }
}

impl From<Topology> for TopologyWire {
    fn from(t: Topology) -> Self {
        Self { dcn: t.dcn, ici: t.ici.axes().to_vec(), hosts_per_slice: t.hosts_per_slice }
    }
}

/// One array of the training state as the save sees it: its global shape and type, and how it
/// is split over the save's global mesh ([`Topology::mesh`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    /// A unique name, e.g. `params/layers/3/attn/wq`.
    pub name: String,
    /// The global shape.
    pub shape: Vec<u64>,
    /// The element type.
    pub dtype: DType,
    /// The partition spec over the global mesh (axes `dcn` and the ICI axes).
    pub sharding: Sharding,
}

impl ArraySpec {
    /// An array spec.
    pub fn new(name: impl Into<String>, shape: Vec<u64>, dtype: DType, sharding: Sharding) -> Self {
        Self { name: name.into(), shape, dtype, sharding }
    }

    /// The array's size in bytes, or `None` on overflow.
    pub fn num_bytes(&self) -> Option<u64> {
        self.shape.iter().try_fold(self.dtype.size() as u64, |acc, &d| acc.checked_mul(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ici(axes: &[(&str, usize)]) -> IciMesh {
        IciMesh::new(axes.iter().copied()).unwrap()
    }

    #[test]
    fn hosts_own_consecutive_devices_slice_major() {
        let t = Topology::new(2, ici(&[("fsdp", 2), ("tp", 2)]), 2).unwrap();
        assert_eq!(t.num_hosts(), 4);
        assert_eq!(t.num_devices(), 8);
        assert_eq!(t.devices_of_host(3), 6..8);
        assert_eq!(t.host_of_device(5), 2);
        assert_eq!(t.mesh().to_string(), "(dcn=2, fsdp=2, tp=2)");
    }

    #[test]
    fn bad_topologies_say_why() {
        let e = Topology::new(1, ici(&[("dcn", 2)]), 1).unwrap_err();
        assert!(e.to_string().contains("may not have an axis named 'dcn'"), "{e}");
        let e = Topology::new(1, ici(&[("fsdp", 3)]), 2).unwrap_err();
        assert!(e.to_string().contains("do not split evenly"), "{e}");
        let e = Topology::new(1 << 20, ici(&[("fsdp", 1 << 10)]), 1).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
        assert!(Topology::new(0, ici(&[("fsdp", 1)]), 1).is_err());
    }

    #[test]
    fn serde_round_trip_revalidates() {
        let t = Topology::new(2, ici(&[("fsdp", 2), ("tp", 2)]), 1).unwrap();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            json,
            r#"{"dcn":2,"ici":[{"name":"fsdp","size":2},{"name":"tp","size":2}],"hosts_per_slice":1}"#
        );
        assert_eq!(serde_json::from_str::<Topology>(&json).unwrap(), t);
        let bad = r#"{"dcn":2,"ici":[{"name":"fsdp","size":3}],"hosts_per_slice":2}"#;
        assert!(serde_json::from_str::<Topology>(bad).is_err());
    }

    #[test]
    fn array_bytes_are_checked() {
        let s = Sharding::replicated(2);
        assert_eq!(ArraySpec::new("a", vec![3, 5], DType::Float32, s.clone()).num_bytes(), Some(60));
        assert_eq!(ArraySpec::new("a", vec![u64::MAX, 2], DType::Float32, s).num_bytes(), None);
    }
}
