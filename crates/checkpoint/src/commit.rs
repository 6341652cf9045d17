//! The commit protocol: host reports in, manifest out, commit recorded, marker written.
//!
//! A checkpoint becomes visible in exactly one step, [`CommitLog::record`], which happens only
//! after every host's object and the manifest are durably stored. The coordinator implements
//! the log over Raft; [`StoreCommitLog`] implements it with the `COMMITTED` markers themselves,
//! for local mode and offline tools. Either way the marker is written after the record, so
//! storage alone always tells which checkpoints are complete.

use crate::error::{CheckpointError, Result};
use crate::layout::{COMMITTED, MANIFEST, dir_name, host_object_name, parse_dir_name};
use crate::lineage::line_of;
use crate::manifest::{ArrayEntry, FORMAT, Limits, Manifest, ShardEntry};
use crate::save::{HostReport, SaveSpec};
use crate::store::Storage;
use serde::{Deserialize, Serialize};
use std::future::Future;

/// Largest commit marker read.
const MAX_MARKER_BYTES: u64 = 64 << 10;

/// The record of one committed checkpoint: enough to find it and to know its manifest is the
/// one that was committed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitRecord {
    /// The step saved.
    pub step: u64,
    /// The save's id.
    pub save_id: String,
    /// The bundle identity.
    pub bundle: String,
    /// The manifest's length in bytes.
    pub manifest_size: u64,
    /// The manifest's CRC32C.
    pub manifest_crc32c: u32,
}

impl CommitRecord {
    /// The checkpoint directory, `<step:012>-<save_id>`.
    pub fn dir(&self) -> String {
        dir_name(self.step, &self.save_id)
    }
}

/// Where commits are recorded. The coordinator implements it over its Raft log; a commit is
/// durable once `record` returns.
pub trait CommitLog: Send + Sync {
    /// Records a commit. Idempotent: recording the same commit twice is not an error.
    fn record(&self, commit: &CommitRecord) -> impl Future<Output = Result<()>> + Send;
    /// Every recorded commit, in any order.
    fn list(&self) -> impl Future<Output = Result<Vec<CommitRecord>>> + Send;
    /// Forgets a commit (retention). Forgetting an unknown commit is not an error.
    fn remove(&self, commit: &CommitRecord) -> impl Future<Output = Result<()>> + Send;
    /// Whether [`CommitLog::record`] writes the `COMMITTED` marker under `storage` itself, so
    /// [`finalize`] does not write it a second time.
    fn records_marker_in(&self, _storage: &Storage) -> bool {
        false
    }
}

/// Committed records sorted newest first: the newest line first ([`crate::lineage`]), then by
/// step, then save id, all descending.
pub async fn committed_newest_first(log: &impl CommitLog) -> Result<Vec<CommitRecord>> {
    let mut commits = log.list().await?;
    let key = |c: &CommitRecord| (line_of(&c.save_id).to_string(), c.step, c.save_id.clone());
    commits.sort_by_key(|c| std::cmp::Reverse(key(c)));
    commits.dedup();
    Ok(commits)
}

/// A commit log kept in the store as `COMMITTED` markers.
#[derive(Debug, Clone)]
pub struct StoreCommitLog {
    storage: Storage,
}

impl StoreCommitLog {
    /// The markers under `storage`'s root.
    pub fn new(storage: Storage) -> Self {
        Self { storage }
    }
}

impl CommitLog for StoreCommitLog {
    async fn record(&self, commit: &CommitRecord) -> Result<()> {
        write_marker(&self.storage, commit).await
    }

    async fn list(&self) -> Result<Vec<CommitRecord>> {
        let mut commits = Vec::new();
        for meta in self.storage.list_all().await? {
            let Some((dir, name)) = self.storage.split_key(&meta.location) else { continue };
            if name != COMMITTED {
                continue;
            }
            let Some((step, save_id)) = parse_dir_name(&dir) else { continue };
            let bad = |reason: String| CheckpointError::BadMarker { key: meta.location.to_string(), reason };
            if meta.size > MAX_MARKER_BYTES {
                return Err(bad(format!("{} bytes is over {MAX_MARKER_BYTES}", meta.size)));
            }
            let bytes = self.storage.get(&meta.location).await?;
            let commit: CommitRecord =
                serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a commit record: {e}")))?;
            if commit.step != step || commit.save_id != save_id {
                return Err(bad(format!("it records step {} save '{}'", commit.step, commit.save_id)));
            }
            commits.push(commit);
        }
        Ok(commits)
    }

    async fn remove(&self, commit: &CommitRecord) -> Result<()> {
        self.storage.delete(&self.storage.key(&commit.dir(), COMMITTED)).await
    }

    fn records_marker_in(&self, storage: &Storage) -> bool {
        self.storage.url() == storage.url()
    }
}

async fn write_marker(storage: &Storage, commit: &CommitRecord) -> Result<()> {
    let mut json = serde_json::to_vec_pretty(commit).expect("a commit record always serializes");
    json.push(b'\n');
    storage.put(&storage.key(&commit.dir(), COMMITTED), json.into()).await
}

/// Builds the manifest of a save from its spec and every host's report, checking that the
/// reports are exactly what the write plan asked for.
pub fn build_manifest(spec: &SaveSpec, reports: &[HostReport]) -> Result<Manifest> {
    let dir = spec.dir();
    let bad = |reason: String| CheckpointError::BadReport { dir: dir.clone(), reason };
    let plan = spec.plan()?;
    let hosts = spec.topology.num_hosts();
    let mut by_host: Vec<Option<&HostReport>> = vec![None; hosts];
    for r in reports {
        if r.step != spec.step || r.save_id != spec.save_id {
            return Err(bad(format!("host {} reported step {} save '{}'", r.host, r.step, r.save_id)));
        }
        let slot =
            by_host.get_mut(r.host).ok_or_else(|| bad(format!("report from host {} of {hosts}", r.host)))?;
        if slot.replace(r).is_some() {
            return Err(bad(format!("host {} reported twice", r.host)));
        }
    }
    let chunk_size = reports.first().map_or(1 << 20, |r| r.chunk_size);
    let mut shards: Vec<Vec<ShardEntry>> = vec![Vec::new(); spec.arrays.len()];
    let mut objects = Vec::with_capacity(hosts);
    for (host, report) in by_host.iter().enumerate() {
        let report = report.ok_or_else(|| bad(format!("no report from host {host}; wait for every host")))?;
        if report.chunk_size != chunk_size {
            return Err(bad(format!(
                "host {host} used chunk size {}, host 0 used {chunk_size}",
                report.chunk_size
            )));
        }
        if report.object.name != host_object_name(host) || report.object.host != host {
            return Err(bad(format!("host {host} reported object '{}'", report.object.name)));
        }
        let planned: Vec<_> = plan.host_shards(host).collect();
        if planned.len() != report.shards.len() {
            return Err(bad(format!(
                "host {host} wrote {} shards, the plan gives it {}",
                report.shards.len(),
                planned.len()
            )));
        }
        let mut offset = 0u64;
        for (p, got) in planned.iter().zip(&report.shards) {
            let want_region = crate::manifest::region_to_wire(&p.region);
            let array = &spec.arrays[p.array];
            if got.array != array.name
                || got.region != want_region
                || got.length != p.bytes
                || got.offset != offset
            {
                return Err(bad(format!(
                    "host {host} reported array '{}' region {:?} at {}+{}, the plan has '{}' {:?} at {offset}+{}",
                    got.array, got.region, got.offset, got.length, array.name, want_region, p.bytes
                )));
            }
            shards[p.array].push(ShardEntry { region: want_region, object: host, offset, length: p.bytes });
            offset += p.bytes;
        }
        if report.object.size != offset {
            return Err(bad(format!(
                "host {host} reported {} bytes for {offset} bytes of shards",
                report.object.size
            )));
        }
        objects.push(report.object.clone());
    }
    let arrays = spec
        .arrays
        .iter()
        .zip(shards)
        .map(|(a, shards)| ArrayEntry {
            name: a.name.clone(),
            shape: a.shape.clone(),
            dtype: a.dtype,
            sharding: a.sharding.clone(),
            shards,
        })
        .collect();
    let manifest = Manifest {
        format: FORMAT.into(),
        step: spec.step,
        save_id: spec.save_id.clone(),
        bundle: spec.bundle.clone(),
        topology: spec.topology.clone(),
        data_position: spec.data_position,
        rng_state: spec.rng_state.clone(),
        metadata: spec.metadata.clone(),
        chunk_size,
        objects,
        arrays,
    };
    manifest.check(&dir, &Limits::default())?;
    Ok(manifest)
}

/// Commits a save once every host has reported: checks the reports against the plan and the
/// stored object sizes, writes `manifest.json`, records the commit in `log`, then writes the
/// `COMMITTED` marker (once: a [`StoreCommitLog`] of `storage` wrote it as the record). Returns
/// the commit record.
pub async fn finalize(
    storage: &Storage,
    spec: &SaveSpec,
    reports: &[HostReport],
    log: &impl CommitLog,
) -> Result<CommitRecord> {
    let manifest = build_manifest(spec, reports)?;
    let dir = spec.dir();
    for object in &manifest.objects {
        let key = storage.key(&dir, &object.name);
        let meta = storage.head(&key).await?;
        if meta.size != object.size {
            return Err(CheckpointError::SizeMismatch {
                key: key.to_string(),
                reason: format!("stored {} bytes, host {} reported {}", meta.size, object.host, object.size),
            });
        }
    }
    let json = manifest.to_json();
    let commit = CommitRecord {
        step: spec.step,
        save_id: spec.save_id.clone(),
        bundle: spec.bundle.clone(),
        manifest_size: json.len() as u64,
        manifest_crc32c: crc32c::crc32c(&json),
    };
    fault::fail_point!("checkpoint::manifest_put");
    storage.put(&storage.key(&dir, MANIFEST), json.into()).await?;
    fault::fail_point!("checkpoint::commit_record");
    log.record(&commit).await?;
    fault::fail_point!("checkpoint::commit_marker");
    if !log.records_marker_in(storage) {
        write_marker(storage, &commit).await?;
    }
    Ok(commit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::DataPosition;
    use crate::save::{SaveOptions, ShardBuffer, save_host};
    use crate::topology::{ArraySpec, Topology};
    use bytes::Bytes;
    use mesh::{DType, IciMesh, Sharding};

    fn spec() -> SaveSpec {
        let topology = Topology::new(2, IciMesh::new([("fsdp", 2)]).unwrap(), 1).unwrap();
        let sharding = Sharding::new(vec![vec!["fsdp".into()]]);
        SaveSpec {
            step: 3,
            save_id: "a".into(),
            topology,
            arrays: vec![
                ArraySpec::new("x", vec![8], DType::Float32, sharding.clone()),
                ArraySpec::new("y", vec![4], DType::Float32, sharding),
            ],
            bundle: "00ff".into(),
            data_position: DataPosition { seed: 5, step: 3 },
            rng_state: vec![9],
            metadata: Default::default(),
        }
    }

    fn buffers(spec: &SaveSpec, host: usize) -> Vec<ShardBuffer> {
        let mesh = spec.topology.mesh();
        let mut out = Vec::new();
        for a in &spec.arrays {
            for d in spec.topology.devices_of_host(host) {
                let r = a.sharding.shard_region(&a.shape, mesh, d);
                let data: Vec<u8> =
                    (0..r.num_elements() * 4).map(|i| (i + r.ranges()[0].start) as u8).collect();
                out.push(ShardBuffer { array: a.name.clone(), device: d, data: Bytes::from(data) });
            }
        }
        out
    }

    async fn reports(storage: &Storage, spec: &SaveSpec) -> Vec<HostReport> {
        let mut out = Vec::new();
        for host in 0..2 {
            out.push(
                save_host(storage, spec, host, buffers(spec, host), &SaveOptions::default()).await.unwrap(),
            );
        }
        out
    }

    #[tokio::test]
    async fn commit_writes_manifest_then_marker_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(dir.path().to_str().unwrap(), &Default::default()).unwrap();
        let log = StoreCommitLog::new(storage.clone());
        let spec = spec();
        let reports = reports(&storage, &spec).await;
        // Replicated across 2 slices: 4 distinct pieces, 2 per host.
        assert_eq!(reports.iter().map(|r| r.shards.len()).collect::<Vec<_>>(), vec![2, 2]);
        assert!(log.list().await.unwrap().is_empty());
        let commit = finalize(&storage, &spec, &reports, &log).await.unwrap();
        assert_eq!(log.list().await.unwrap(), vec![commit.clone()]);
        let manifest = storage.get(&storage.key(&spec.dir(), MANIFEST)).await.unwrap();
        assert_eq!(crc32c::crc32c(&manifest), commit.manifest_crc32c);
        assert!(dir.path().join("000000000003-a/COMMITTED").is_file());
        // The record was the marker: finalize does not write it again.
        assert!(log.records_marker_in(&storage));
        let elsewhere = tempfile::tempdir().unwrap();
        let other = Storage::open(elsewhere.path().to_str().unwrap(), &Default::default()).unwrap();
        assert!(!log.records_marker_in(&other));
    }

    #[tokio::test]
    async fn reports_that_do_not_match_the_plan_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(dir.path().to_str().unwrap(), &Default::default()).unwrap();
        let log = StoreCommitLog::new(storage.clone());
        let spec = spec();
        let reports = reports(&storage, &spec).await;

        let e = finalize(&storage, &spec, &reports[..1], &log).await.unwrap_err();
        assert!(e.to_string().contains("no report from host 1"), "{e}");
        let mut twice = reports.clone();
        twice[1].host = 0;
        assert!(
            finalize(&storage, &spec, &twice, &log).await.unwrap_err().to_string().contains("reported twice")
        );
        let mut moved = reports.clone();
        moved[0].shards[1].offset += 4;
        assert!(
            finalize(&storage, &spec, &moved, &log).await.unwrap_err().to_string().contains("the plan has")
        );
        let mut grown = reports.clone();
        grown[0].object.size += 1;
        assert!(finalize(&storage, &spec, &grown, &log).await.is_err());
        assert!(log.list().await.unwrap().is_empty(), "nothing was committed");
        assert!(!dir.path().join("000000000003-a/manifest.json").exists());
    }

    #[tokio::test]
    async fn a_marker_that_disagrees_with_its_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(dir.path().to_str().unwrap(), &Default::default()).unwrap();
        let log = StoreCommitLog::new(storage.clone());
        let forged = CommitRecord {
            step: 9,
            save_id: "b".into(),
            bundle: "00".into(),
            manifest_size: 1,
            manifest_crc32c: 0,
        };
        let json = serde_json::to_vec(&forged).unwrap();
        storage.put(&storage.key("000000000003-a", COMMITTED), json.into()).await.unwrap();
        let e = log.list().await.unwrap_err();
        assert!(e.to_string().contains("records step 9"), "{e}");
    }
}
