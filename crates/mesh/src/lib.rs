//! Logical device meshes, array shardings, and the index math between them.
//!
//! A slice runs one SPMD program over an ICI mesh such as `(fsdp=4, tp=2)`; podctl adds a
//! data-parallel `dcn` axis across slices. This crate owns the arithmetic every other crate
//! shares: which part of a global array a device holds ([`Sharding::shard_region`]), which devices
//! hold the same part ([`Sharding::replica_index`]), and copying rectangular regions between
//! row-major buffers ([`copy_region`]), which is how the worker scatters a host batch onto
//! devices and how a checkpoint is resharded on restore.
//!
//! **Architecture Invariant:** no I/O, no async, no dependency on another podctl crate. Device
//! indices here are positions in the mesh (row-major over its axes), never PJRT device ids.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod dtype;
mod region;

pub use dtype::DType;
pub use region::{Region, copy_region, for_each_run};

use serde::{Deserialize, Serialize};
use std::fmt;

/// Errors in a mesh or a sharding; each names what is wrong and how to fix it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MeshError {
    /// An axis of size zero, a duplicate axis name, or an empty mesh.
    #[error("invalid mesh {mesh}: {reason}")]
    InvalidMesh {
        /// The mesh as written.
        mesh: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The sharding has a different number of dimensions than the array.
    #[error("sharding {sharding} has {got} dimensions but the array has shape {shape:?}")]
    RankMismatch {
        /// The sharding as written.
        sharding: String,
        /// Its number of dimensions.
        got: usize,
        /// The array's shape.
        shape: Vec<u64>,
    },
    /// The sharding names an axis the mesh does not have.
    #[error("sharding {sharding} names axis '{axis}', which mesh {mesh} does not have")]
    UnknownAxis {
        /// The sharding as written.
        sharding: String,
        /// The unknown axis.
        axis: String,
        /// The mesh.
        mesh: String,
    },
    /// One mesh axis shards two dimensions (or one dimension twice).
    #[error("sharding {sharding} uses axis '{axis}' more than once")]
    AxisReused {
        /// The sharding as written.
        sharding: String,
        /// The axis used twice.
        axis: String,
    },
    /// A dimension is not a multiple of the number of shards along it.
    #[error(
        "dimension {dim} of shape {shape:?} has size {size}, which does not split into {shards} equal shards over axes {axes:?} of mesh {mesh}"
    )]
    NotDivisible {
        /// The dimension index.
        dim: usize,
        /// The array's shape.
        shape: Vec<u64>,
        /// The dimension's size.
        size: u64,
        /// The number of shards along it.
        shards: u64,
        /// The mesh axes it is split over.
        axes: Vec<String>,
        /// The mesh.
        mesh: String,
    },
}

/// One named axis of a mesh.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeshAxis {
    /// The axis name, e.g. `fsdp` or `tp`.
    pub name: String,
    /// The number of devices along it.
    pub size: usize,
}

/// The device grid inside one slice, e.g. `(fsdp=4, tp=2)`.
///
/// Device `d` sits at the row-major position of `d` over the axes, first axis major; this is
/// the order of JAX's default device mesh and of the device assignment podctl compiles with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<MeshAxis>", into = "Vec<MeshAxis>")]
pub struct IciMesh {
    axes: Vec<MeshAxis>,
}

impl IciMesh {
    /// Builds a mesh from `(name, size)` pairs, major axis first.
    pub fn new<S: Into<String>>(axes: impl IntoIterator<Item = (S, usize)>) -> Result<Self, MeshError> {
        let axes: Vec<MeshAxis> =
            axes.into_iter().map(|(name, size)| MeshAxis { name: name.into(), size }).collect();
        Self::try_from(axes)
    }

    /// A mesh of one device with the given axis names, each of size 1.
    pub fn single_device(names: &[&str]) -> Self {
        Self { axes: names.iter().map(|n| MeshAxis { name: n.to_string(), size: 1 }).collect() }
    }

    /// The axes, major first.
    pub fn axes(&self) -> &[MeshAxis] {
        &self.axes
    }

    /// The number of devices.
    pub fn num_devices(&self) -> usize {
        self.axes.iter().map(|a| a.size).product()
    }

    /// The size of the named axis, if the mesh has it.
    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.axes.iter().find(|a| a.name == name).map(|a| a.size)
    }

    /// The coordinate of `device` along every axis.
    pub fn coords(&self, device: usize) -> Vec<usize> {
        assert!(device < self.num_devices(), "device {device} is outside mesh {self}");
        let mut coords = vec![0; self.axes.len()];
        let mut rest = device;
        for (i, axis) in self.axes.iter().enumerate().rev() {
            coords[i] = rest % axis.size;
            rest /= axis.size;
        }
        coords
    }

    fn axis_index(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|a| a.name == name)
    }
}

impl TryFrom<Vec<MeshAxis>> for IciMesh {
    type Error = MeshError;

    fn try_from(axes: Vec<MeshAxis>) -> Result<Self, MeshError> {
        let describe = || IciMesh { axes: axes.clone() }.to_string();
        if axes.is_empty() {
            return Err(MeshError::InvalidMesh {
                mesh: describe(),
                reason: "a mesh needs at least one axis".into(),
            });
        }
        for (i, axis) in axes.iter().enumerate() {
            if axis.size == 0 {
                return Err(MeshError::InvalidMesh {
                    mesh: describe(),
                    reason: format!("axis '{}' has size 0; every axis needs at least one device", axis.name),
                });
            }
            if axes[..i].iter().any(|a| a.name == axis.name) {
                return Err(MeshError::InvalidMesh {
                    mesh: describe(),
                    reason: format!("axis '{}' appears twice; axis names must be unique", axis.name),
                });
            }
        }
        Ok(Self { axes })
    }
}

impl From<IciMesh> for Vec<MeshAxis> {
    fn from(mesh: IciMesh) -> Self {
        mesh.axes
    }
}

impl fmt::Display for IciMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(")?;
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{}={}", a.name, a.size)?;
        }
        write!(f, ")")
    }
}

/// How an array is split over an ICI mesh: for each dimension, the mesh axes it is split over
/// (major first; empty means the dimension is not split). This is JAX's `PartitionSpec`.
/// Axes that split no dimension replicate the array.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Sharding {
    dims: Vec<Vec<String>>,
}

impl Sharding {
    /// A sharding from per-dimension axis lists.
    pub fn new(dims: Vec<Vec<String>>) -> Self {
        Self { dims }
    }

    /// The sharding of a fully replicated array of the given rank.
    pub fn replicated(rank: usize) -> Self {
        Self { dims: vec![Vec::new(); rank] }
    }

    /// The per-dimension axis lists.
    pub fn dims(&self) -> &[Vec<String>] {
        &self.dims
    }

    /// Checks that the sharding applies to an array of `shape` on `mesh`.
    pub fn validate(&self, shape: &[u64], mesh: &IciMesh) -> Result<(), MeshError> {
        if self.dims.len() != shape.len() {
            return Err(MeshError::RankMismatch {
                sharding: self.to_string(),
                got: self.dims.len(),
                shape: shape.to_vec(),
            });
        }
        let mut seen: Vec<&str> = Vec::new();
        for (dim, axes) in self.dims.iter().enumerate() {
            let mut shards = 1u64;
            for axis in axes {
                let Some(size) = mesh.axis_size(axis) else {
                    return Err(MeshError::UnknownAxis {
                        sharding: self.to_string(),
                        axis: axis.clone(),
                        mesh: mesh.to_string(),
                    });
                };
                if seen.contains(&axis.as_str()) {
                    return Err(MeshError::AxisReused { sharding: self.to_string(), axis: axis.clone() });
                }
                seen.push(axis);
                shards *= size as u64;
            }
            if !shape[dim].is_multiple_of(shards) {
                return Err(MeshError::NotDivisible {
                    dim,
                    shape: shape.to_vec(),
                    size: shape[dim],
                    shards,
                    axes: axes.clone(),
                    mesh: mesh.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The number of shards along each dimension.
    pub fn shards_per_dim(&self, mesh: &IciMesh) -> Vec<u64> {
        self.dims
            .iter()
            .map(|axes| axes.iter().map(|a| mesh.axis_size(a).unwrap_or(1) as u64).product())
            .collect()
    }

    /// The shape of the piece each device holds.
    pub fn shard_shape(&self, shape: &[u64], mesh: &IciMesh) -> Vec<u64> {
        shape.iter().zip(self.shards_per_dim(mesh)).map(|(s, n)| s / n).collect()
    }

    /// The part of the global array of `shape` that `device` holds. The sharding must have
    /// passed [`Sharding::validate`] for this shape and mesh.
    pub fn shard_region(&self, shape: &[u64], mesh: &IciMesh, device: usize) -> Region {
        let coords = mesh.coords(device);
        let ranges = self
            .dims
            .iter()
            .zip(shape)
            .map(|(axes, &size)| {
                let (mut index, mut shards) = (0u64, 1u64);
                for axis in axes {
                    let i = mesh.axis_index(axis).expect("sharding was validated against this mesh");
                    index = index * mesh.axes[i].size as u64 + coords[i] as u64;
                    shards *= mesh.axes[i].size as u64;
                }
                let chunk = size / shards;
                index * chunk..(index + 1) * chunk
            })
            .collect();
        Region::new(ranges)
    }

    /// The number of devices that hold each distinct shard.
    pub fn num_replicas(&self, mesh: &IciMesh) -> usize {
        mesh.axes.iter().filter(|a| !self.uses_axis(&a.name)).map(|a| a.size).product()
    }

    /// Which copy of its shard `device` holds, in `0..num_replicas`: the row-major position of
    /// the device over the axes the sharding does not use. Replica 0 of every shard together
    /// covers the whole array exactly once.
    pub fn replica_index(&self, mesh: &IciMesh, device: usize) -> usize {
        let coords = mesh.coords(device);
        mesh.axes
            .iter()
            .zip(coords)
            .filter(|(a, _)| !self.uses_axis(&a.name))
            .fold(0, |acc, (a, c)| acc * a.size + c)
    }

    fn uses_axis(&self, name: &str) -> bool {
        self.dims.iter().flatten().any(|a| a == name)
    }
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "P(")?;
        for (i, axes) in self.dims.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            match axes.as_slice() {
                [] => write!(f, "None")?,
                [one] => write!(f, "{one}")?,
                many => write!(f, "({})", many.join(", "))?,
            }
        }
        write!(f, ")")
    }
}

#[cfg(test)]
// `vec![0..2]` is a rank-1 region here, not a mistaken range of elements.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    fn mesh(axes: &[(&str, usize)]) -> IciMesh {
        IciMesh::new(axes.iter().map(|&(n, s)| (n, s))).unwrap()
    }

    fn spec(dims: &[&[&str]]) -> Sharding {
        Sharding::new(dims.iter().map(|d| d.iter().map(|s| s.to_string()).collect()).collect())
    }

    #[test]
    fn coords_are_row_major_first_axis_major() {
        let m = mesh(&[("fsdp", 2), ("tp", 2)]);
        assert_eq!(m.coords(0), vec![0, 0]);
        assert_eq!(m.coords(1), vec![0, 1]);
        assert_eq!(m.coords(2), vec![1, 0]);
        assert_eq!(m.coords(3), vec![1, 1]);
    }

    #[test]
    fn shard_regions_tile_the_array() {
        let m = mesh(&[("fsdp", 2), ("tp", 2)]);
        let s = spec(&[&["fsdp"], &["tp"]]);
        s.validate(&[8, 6], &m).unwrap();
        let r: Vec<_> = (0..4).map(|d| s.shard_region(&[8, 6], &m, d)).collect();
        assert_eq!(r[0], Region::new(vec![0..4, 0..3]));
        assert_eq!(r[1], Region::new(vec![0..4, 3..6]));
        assert_eq!(r[2], Region::new(vec![4..8, 0..3]));
        assert_eq!(r[3], Region::new(vec![4..8, 3..6]));
    }

    #[test]
    fn two_axes_on_one_dimension_split_major_first() {
        let m = mesh(&[("fsdp", 2), ("tp", 2)]);
        let s = spec(&[&["tp", "fsdp"]]);
        s.validate(&[8], &m).unwrap();
        // device 1 = (fsdp 0, tp 1): index = tp*2 + fsdp = 2
        assert_eq!(s.shard_region(&[8], &m, 1), Region::new(vec![4..6]));
        assert_eq!(s.shard_region(&[8], &m, 2), Region::new(vec![2..4]));
    }

    #[test]
    fn replicas_count_the_unused_axes() {
        let m = mesh(&[("fsdp", 2), ("tp", 2)]);
        let s = spec(&[&["fsdp"], &[]]);
        assert_eq!(s.num_replicas(&m), 2);
        assert_eq!((0..4).map(|d| s.replica_index(&m, d)).collect::<Vec<_>>(), vec![0, 1, 0, 1]);
        let full = Sharding::replicated(2);
        assert_eq!(full.num_replicas(&m), 4);
        assert_eq!(full.replica_index(&m, 3), 3);
    }

    #[test]
    fn validation_names_the_problem() {
        let m = mesh(&[("fsdp", 4), ("tp", 2)]);
        let e = spec(&[&["fsdp"], &["tp"]]).validate(&[6, 4], &m).unwrap_err();
        assert!(e.to_string().contains("does not split into 4 equal shards"), "{e}");
        let e = spec(&[&["dp"]]).validate(&[8], &m).unwrap_err();
        assert!(matches!(e, MeshError::UnknownAxis { .. }), "{e}");
        let e = spec(&[&["tp"], &["tp"]]).validate(&[8, 8], &m).unwrap_err();
        assert!(matches!(e, MeshError::AxisReused { .. }), "{e}");
        let e = spec(&[&["tp"]]).validate(&[8, 8], &m).unwrap_err();
        assert!(matches!(e, MeshError::RankMismatch { .. }), "{e}");
        assert!(IciMesh::new([("a", 2), ("a", 2)]).is_err());
        assert!(IciMesh::new([("a", 0)]).is_err());
    }

    #[test]
    fn serde_round_trips_as_plain_lists() {
        let m = mesh(&[("fsdp", 2), ("tp", 2)]);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"[{"name":"fsdp","size":2},{"name":"tp","size":2}]"#);
        assert_eq!(serde_json::from_str::<IciMesh>(&json).unwrap(), m);
        assert!(serde_json::from_str::<IciMesh>(r#"[{"name":"x","size":0}]"#).is_err());
        let s: Sharding = serde_json::from_str(r#"[["fsdp"],[]]"#).unwrap();
        assert_eq!(s.to_string(), "P(fsdp, None)");
    }
}
