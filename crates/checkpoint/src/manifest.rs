//! The manifest: the one document that says what a checkpoint holds and where, and the checks
//! that make an untrusted one safe to act on.
//!
//! The manifest is the last object a save writes. Restore believes nothing in it until
//! [`Manifest::check`] has passed: every count and size is bounded, every offset is checked
//! arithmetic, every shard lies inside an object whose real length was confirmed, shards tile
//! their array exactly, and byte ranges in an object never overlap. Only then are buffers sized.

use crate::error::{CheckpointError, Result};
use crate::layout::{is_safe_segment, validate_save_id};
use crate::topology::Topology;
use mesh::{DType, Region, Sharding};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// The format tag of manifests this crate writes and reads.
pub const FORMAT: &str = "podctl-checkpoint/1";

/// Smallest and largest chunk size, in bytes.
pub const CHUNK_SIZE_RANGE: std::ops::RangeInclusive<u64> = 1024..=(64 << 20);

/// Most dimensions an array may have.
pub const MAX_RANK: usize = 16;

/// Where the data loader stands, so a restore resumes with the same batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataPosition {
    /// The data order's seed.
    pub seed: u64,
    /// The next step whose batch the loader produces.
    pub step: u64,
}

/// A checkpoint's manifest (`manifest.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// The training step saved.
    pub step: u64,
    /// The save's id (unique per attempt).
    pub save_id: String,
    /// The bundle identity (hex) the state belongs to.
    pub bundle: String,
    /// The mesh and hosts the state was saved from.
    pub topology: Topology,
    /// The data loader's position.
    pub data_position: DataPosition,
    /// The RNG state, opaque bytes (hex in JSON).
    #[serde(with = "hex_bytes")]
    pub rng_state: Vec<u8>,
    /// Free-form metadata from the caller.
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// The CRC chunk size of every object, in bytes.
    pub chunk_size: u64,
    /// The stream objects, one per host.
    pub objects: Vec<ObjectEntry>,
    /// The arrays and where their shards are.
    pub arrays: Vec<ArrayEntry>,
}

/// One stream object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectEntry {
    /// Its name inside the checkpoint directory (one path segment).
    pub name: String,
    /// The host that wrote it.
    pub host: usize,
    /// Its length in bytes.
    pub size: u64,
    /// CRC32C of each `chunk_size` chunk, the last one possibly short.
    pub chunk_crc32c: Vec<u32>,
}

/// One array as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayEntry {
    /// Its unique name.
    pub name: String,
    /// The global shape.
    pub shape: Vec<u64>,
    /// The element type.
    pub dtype: DType,
    /// The sharding over the saved topology's global mesh.
    pub sharding: Sharding,
    /// Every distinct piece, stored once.
    pub shards: Vec<ShardEntry>,
}

/// Where one piece of an array is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    /// `[start, end)` per dimension, global coordinates.
    pub region: Vec<[u64; 2]>,
    /// Index into [`Manifest::objects`].
    pub object: usize,
    /// Byte offset in that object.
    pub offset: u64,
    /// Byte length (row-major elements of the region).
    pub length: u64,
}

impl ShardEntry {
    /// The region as a [`Region`].
    pub fn region(&self) -> Region {
        Region::new(self.region.iter().map(|&[s, e]| s..e).collect())
    }
}

/// Converts a region to its manifest form.
pub fn region_to_wire(region: &Region) -> Vec<[u64; 2]> {
    region.ranges().iter().map(|r| [r.start, r.end]).collect()
}

/// Bounds applied to a manifest before anything is sized from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest manifest read, in bytes.
    pub max_manifest_bytes: u64,
    /// Largest single array, in bytes.
    pub max_array_bytes: u64,
    /// Most arrays in one checkpoint.
    pub max_arrays: usize,
    /// Most stored pieces of one array.
    pub max_shards_per_array: usize,
    /// Largest stream object, in bytes.
    pub max_object_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_manifest_bytes: 64 << 20,
            max_array_bytes: 256 << 30,
            max_arrays: 100_000,
            max_shards_per_array: crate::topology::MAX_DEVICES,
            max_object_bytes: 16 << 40,
        }
    }
}

impl Manifest {
    /// Parses and checks a manifest; `key` names it in errors.
    pub fn parse(key: &str, bytes: &[u8], limits: &Limits) -> Result<Self> {
        if bytes.len() as u64 > limits.max_manifest_bytes {
            return Err(CheckpointError::manifest(
                key,
                format!("{} bytes exceeds the limit of {}", bytes.len(), limits.max_manifest_bytes),
            ));
        }
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| CheckpointError::manifest(key, format!("not valid JSON: {e}")))?;
        manifest.check(key, limits)?;
        Ok(manifest)
    }

    /// The manifest as written: pretty JSON with fields in declaration order and maps sorted, so
    /// the same checkpoint always serializes to the same bytes.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a manifest always serializes");
        out.push(b'\n');
        out
    }

    /// The total bytes of array data.
    pub fn data_bytes(&self) -> u64 {
        self.objects.iter().map(|o| o.size).sum()
    }

    /// A human-readable summary for `show`: identity, mesh, data position, sizes, arrays.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "step {} (save {}), bundle {}", self.step, self.save_id, self.bundle);
        let _ = writeln!(out, "saved on {}", self.topology);
        let _ =
            writeln!(out, "data position: seed {} step {}", self.data_position.seed, self.data_position.step);
        let _ = writeln!(out, "rng state: {} bytes", self.rng_state.len());
        let chunks: usize = self.objects.iter().map(|o| o.chunk_crc32c.len()).sum();
        let _ = writeln!(
            out,
            "{} arrays, {} bytes in {} objects, {chunks} chunks of {} bytes",
            self.arrays.len(),
            self.data_bytes(),
            self.objects.len(),
            self.chunk_size
        );
        for o in &self.objects {
            let _ = writeln!(out, "  {} (host {}): {} bytes", o.name, o.host, o.size);
        }
        for (k, v) in &self.metadata {
            let _ = writeln!(out, "  metadata {k} = {v}");
        }
        for a in &self.arrays {
            let _ = writeln!(
                out,
                "  {} {}{:?} {} in {} shard(s)",
                a.name,
                a.dtype,
                a.shape,
                a.sharding,
                a.shards.len()
            );
        }
        out
    }

    /// The array named `name`, if present.
    pub fn array(&self, name: &str) -> Option<&ArrayEntry> {
        self.arrays.iter().find(|a| a.name == name)
    }

    /// Checks every structural promise the manifest makes (see the module docs). Object sizes
    /// are checked against storage separately, by whoever reads the objects.
    pub fn check(&self, key: &str, limits: &Limits) -> Result<()> {
        let bad = |reason: String| CheckpointError::manifest(key, reason);
        if self.format != FORMAT {
            return Err(bad(format!(
                "format '{}' is not '{FORMAT}'; use a podctl that reads it",
                self.format
            )));
        }
        validate_save_id(&self.save_id).map_err(|e| bad(e.to_string()))?;
        check_bundle_id(&self.bundle).map_err(|e| bad(e.to_string()))?;
        if !CHUNK_SIZE_RANGE.contains(&self.chunk_size) {
            return Err(bad(format!("chunk_size {} is outside {CHUNK_SIZE_RANGE:?}", self.chunk_size)));
        }
        let mut names = HashSet::new();
        for (i, o) in self.objects.iter().enumerate() {
            if !is_safe_segment(&o.name) {
                return Err(bad(format!(
                    "object {i} name '{}' is not a plain file name",
                    o.name.escape_debug()
                )));
            }
            if !names.insert(o.name.as_str()) {
                return Err(bad(format!("object name '{}' appears twice", o.name)));
            }
            if o.host >= self.topology.num_hosts() {
                return Err(bad(format!(
                    "object '{}' names host {} of {}",
                    o.name,
                    o.host,
                    self.topology.num_hosts()
                )));
            }
            if o.size > limits.max_object_bytes {
                return Err(bad(format!(
                    "object '{}' claims {} bytes, over the limit of {}",
                    o.name, o.size, limits.max_object_bytes
                )));
            }
            let chunks = o.size.div_ceil(self.chunk_size);
            if o.chunk_crc32c.len() as u64 != chunks {
                return Err(bad(format!(
                    "object '{}' of {} bytes needs {chunks} chunk CRCs, the manifest has {}",
                    o.name,
                    o.size,
                    o.chunk_crc32c.len()
                )));
            }
        }
        if self.arrays.len() > limits.max_arrays {
            return Err(bad(format!(
                "{} arrays exceeds the limit of {}",
                self.arrays.len(),
                limits.max_arrays
            )));
        }
        let mut array_names = HashSet::new();
        let mut extents: Vec<(usize, u64, u64)> = Vec::new();
        for a in &self.arrays {
            if !array_names.insert(a.name.as_str()) {
                return Err(bad(format!("array '{}' appears twice", a.name)));
            }
            self.check_array(a, limits, &mut extents)
                .map_err(|reason| bad(format!("array '{}': {reason}", a.name)))?;
        }
        extents.sort_unstable();
        for w in extents.windows(2) {
            let ((oa, _, ea), (ob, sb, _)) = (w[0], w[1]);
            if oa == ob && ea > sb {
                return Err(bad(format!(
                    "byte ranges overlap in object '{}' at offset {sb}",
                    self.objects[oa].name
                )));
            }
        }
        Ok(())
    }

    fn check_array(
        &self,
        a: &ArrayEntry,
        limits: &Limits,
        extents: &mut Vec<(usize, u64, u64)>,
    ) -> Result<(), String> {
        if a.shape.len() > MAX_RANK {
            return Err(format!("rank {} exceeds {MAX_RANK}", a.shape.len()));
        }
        if a.shape.contains(&0) {
            return Err(format!("shape {:?} has a zero dimension", a.shape));
        }
        a.sharding.validate(&a.shape, self.topology.mesh()).map_err(|e| e.to_string())?;
        let elem = a.dtype.size() as u64;
        let bytes = a.shape.iter().try_fold(elem, |acc, &d| acc.checked_mul(d));
        match bytes {
            Some(b) if b <= limits.max_array_bytes => {}
            _ => {
                return Err(format!(
                    "shape {:?} of {} exceeds the limit of {} bytes",
                    a.shape, a.dtype, limits.max_array_bytes
                ));
            }
        }
        if a.shards.is_empty() || a.shards.len() > limits.max_shards_per_array {
            return Err(format!("{} shards is outside 1..={}", a.shards.len(), limits.max_shards_per_array));
        }
        for (i, s) in a.shards.iter().enumerate() {
            if s.region.len() != a.shape.len() {
                return Err(format!("shard {i} has rank {} for shape {:?}", s.region.len(), a.shape));
            }
            for (d, (&[start, end], &size)) in s.region.iter().zip(&a.shape).enumerate() {
                if start >= end || end > size {
                    return Err(format!(
                        "shard {i} range {start}..{end} of dimension {d} is outside 0..{size}"
                    ));
                }
            }
            let region = s.region();
            let expected = region.num_elements().checked_mul(elem);
            if expected != Some(s.length) {
                return Err(format!(
                    "shard {i} has length {} but its region holds {expected:?} bytes",
                    s.length
                ));
            }
            let Some(object) = self.objects.get(s.object) else {
                return Err(format!("shard {i} names object {} of {}", s.object, self.objects.len()));
            };
            match s.offset.checked_add(s.length) {
                Some(end) if end <= object.size => extents.push((s.object, s.offset, end)),
                _ => {
                    return Err(format!(
                        "shard {i} at offset {} length {} runs past the end of '{}' ({} bytes)",
                        s.offset, s.length, object.name, object.size
                    ));
                }
            }
        }
        check_exact_cover(&a.shape, &a.shards).map_err(|e| format!("shards do not tile the array: {e}"))
    }
}

/// Shards tile an array exactly when, along every dimension, their ranges partition the
/// dimension, and the shards are exactly the distinct products of those ranges. This is the
/// shape every sharding produces, and it is checked in O(n log n) rather than pairwise.
fn check_exact_cover(shape: &[u64], shards: &[ShardEntry]) -> Result<(), String> {
    let mut cells: u64 = 1;
    for (d, &size) in shape.iter().enumerate() {
        let ranges: BTreeSet<[u64; 2]> = shards.iter().map(|s| s.region[d]).collect();
        let mut next = 0;
        for &[start, end] in &ranges {
            if start != next {
                return Err(format!("dimension {d}: ranges leave a gap or overlap at {next}..{start}"));
            }
            next = end;
        }
        if next != size {
            return Err(format!("dimension {d}: ranges end at {next}, not {size}"));
        }
        cells = cells.saturating_mul(ranges.len() as u64);
    }
    let distinct: HashSet<&Vec<[u64; 2]>> = shards.iter().map(|s| &s.region).collect();
    if distinct.len() != shards.len() {
        return Err("a region is stored twice".into());
    }
    if cells != shards.len() as u64 {
        return Err(format!("{} shards for a grid of {cells} cells", shards.len()));
    }
    Ok(())
}

/// Checks a bundle identity: 1 to 128 lowercase or uppercase hex digits.
pub fn check_bundle_id(bundle: &str) -> Result<()> {
    if bundle.is_empty() || bundle.len() > 128 || !bundle.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(CheckpointError::invalid(
            format!("bundle identity '{}'", bundle.escape_debug()),
            "must be 1..=128 hex digits (the bundle's content hash)",
        ));
    }
    Ok(())
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use mesh::IciMesh;

    /// A small valid manifest: one 4x4 float32 array in two row shards of one 64-byte object.
    pub(crate) fn sample() -> Manifest {
        let topology = Topology::new(1, IciMesh::new([("fsdp", 2)]).unwrap(), 1).unwrap();
        Manifest {
            format: FORMAT.into(),
            step: 7,
            save_id: "s1".into(),
            bundle: "abcdef01".into(),
            topology,
            data_position: DataPosition { seed: 1, step: 7 },
            rng_state: vec![1, 2, 255],
            metadata: BTreeMap::from([("loss".to_string(), serde_json::json!(1.5))]),
            chunk_size: 1024,
            objects: vec![ObjectEntry {
                name: "host-0.shards".into(),
                host: 0,
                size: 64,
                chunk_crc32c: vec![0],
            }],
            arrays: vec![ArrayEntry {
                name: "w".into(),
                shape: vec![4, 4],
                dtype: DType::Float32,
                sharding: Sharding::new(vec![vec!["fsdp".into()], vec![]]),
                shards: vec![
                    ShardEntry { region: vec![[0, 2], [0, 4]], object: 0, offset: 0, length: 32 },
                    ShardEntry { region: vec![[2, 4], [0, 4]], object: 0, offset: 32, length: 32 },
                ],
            }],
        }
    }

    fn refused(m: &Manifest) -> String {
        m.check("ck/manifest.json", &Limits::default()).unwrap_err().to_string()
    }

    #[test]
    fn a_valid_manifest_round_trips_bitwise() {
        let m = sample();
        m.check("k", &Limits::default()).unwrap();
        let json = m.to_json();
        let back = Manifest::parse("k", &json, &Limits::default()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.to_json(), json);
        assert!(String::from_utf8(json).unwrap().contains("\"rng_state\": \"0102ff\""));
        let summary = m.summary();
        assert!(summary.contains("step 7 (save s1), bundle abcdef01"), "{summary}");
        assert!(summary.contains("w float32[4, 4] P(fsdp, None) in 2 shard(s)"), "{summary}");
    }

    #[test]
    fn absurd_sizes_are_refused() {
        let mut m = sample();
        m.arrays[0].shape = vec![1 << 18, 1 << 20];
        m.arrays[0].shards[0].region = vec![[0, 1 << 17], [0, 1 << 20]];
        m.arrays[0].shards[1].region = vec![[1 << 17, 1 << 18], [0, 1 << 20]];
        let e = refused(&m);
        assert!(e.contains("exceeds the limit of"), "{e}");

        let mut m = sample();
        m.objects[0].size = 1 << 50;
        assert!(refused(&m).contains("over the limit"));

        let mut m = sample();
        m.arrays[0].shards[1].offset = u64::MAX - 8;
        assert!(refused(&m).contains("runs past the end"));

        let mut m = sample();
        m.objects[0].chunk_crc32c = vec![0; 3];
        assert!(refused(&m).contains("needs 1 chunk CRCs"));
    }

    #[test]
    fn overlaps_gaps_and_duplicates_are_refused() {
        let mut m = sample();
        m.objects[0].size = 80;
        m.arrays[0].shards[1].offset = 16;
        assert!(refused(&m).contains("byte ranges overlap"), "{}", refused(&m));

        let mut m = sample();
        m.arrays[0].shards[1].region = vec![[0, 2], [0, 4]];
        assert!(refused(&m).contains("do not tile"));

        let mut m = sample();
        m.arrays[0].shards.pop();
        assert!(refused(&m).contains("do not tile"));

        let mut m = sample();
        m.arrays[0].shards[1].length = 16;
        assert!(refused(&m).contains("has length 16"));
    }

    #[test]
    fn keys_stay_under_the_root() {
        for name in ["../escape", "/etc/passwd", "a/b", "..", ""] {
            let mut m = sample();
            m.objects[0].name = name.into();
            assert!(refused(&m).contains("not a plain file name"), "{name}");
        }
        let mut m = sample();
        m.save_id = "../x".into();
        assert!(refused(&m).contains("save id"));
    }

    #[test]
    fn unknown_fields_and_huge_manifests_are_refused() {
        let mut v: serde_json::Value = serde_json::from_slice(&sample().to_json()).unwrap();
        v["extra"] = serde_json::json!(1);
        let e = Manifest::parse("k", &serde_json::to_vec(&v).unwrap(), &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let limits = Limits { max_manifest_bytes: 10, ..Limits::default() };
        let e = Manifest::parse("k", &sample().to_json(), &limits).unwrap_err();
        assert!(e.to_string().contains("exceeds the limit of 10"), "{e}");
    }

    #[test]
    fn exact_cover_accepts_grids_only() {
        let shard = |r: Vec<[u64; 2]>| ShardEntry { region: r, object: 0, offset: 0, length: 0 };
        let grid: Vec<_> =
            [[0, 2], [2, 4]].iter().flat_map(|&a| [[0, 3], [3, 6]].map(move |b| shard(vec![a, b]))).collect();
        check_exact_cover(&[4, 6], &grid).unwrap();
        assert!(check_exact_cover(&[4, 6], &grid[..3]).is_err());
        check_exact_cover(&[], &[shard(vec![])]).unwrap();
        assert!(check_exact_cover(&[], &[shard(vec![]), shard(vec![])]).is_err());
    }
}
