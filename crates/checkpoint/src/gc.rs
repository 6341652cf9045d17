//! Retention and garbage collection, plus the listing and removal the CLI offers.
//!
//! [`plan_gc`] is a pure function of what is committed, what is stored, which saves are still
//! running and the time, so the rules are tested without a store: keep the last K commits and
//! every Nth step, always the newest commit; expire other commits; collect directories that
//! were never committed (a failed or killed save) unless their save is active or was touched
//! less than `min_orphan_age` ago; the caller's saves of a generation that ended
//! ([`Retention::own_saves`]) at once.
//!
//! A save is named by its step *and* its id: one attempt (a process, a coordinator's
//! generation) writes many steps under the same save id, so an id alone would protect every
//! checkpoint of the attempt that is still saving, and retention would never expire its own.

use crate::commit::{CommitLog, CommitRecord};
use crate::error::Result;
use crate::layout::{COMMITTED, parse_dir_name};
use crate::lineage::line_of;
use crate::store::Storage;
use object_store::path::Path;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Which committed checkpoints to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Keep this many of the newest commits (the newest is kept even when this is 0).
    pub keep_last: usize,
    /// Also keep every commit whose step is a multiple of this (0 turns it off).
    pub keep_every: u64,
    /// Leave uncommitted directories alone until their newest object is this old: a guard for
    /// saves run by someone who did not pass their id as active.
    pub min_orphan_age: Duration,
    /// Apply the rules within this line of checkpoints only ([`crate::lineage`]), never expiring
    /// another line's: a run keeps its own last K. `None`: every commit under the root.
    pub line: Option<String>,
    /// The caller's own saves, by generation: those of a generation that ended are abandoned
    /// and go at once, whatever their age. On a small disk, failed saves piling up for
    /// `min_orphan_age` filled it, and then no checkpoint could commit again. `None`: the age
    /// guard for every directory.
    pub own_saves: Option<OwnSaves>,
}

/// A coordinator job's saves: ids `<prefix><generation>` (`<line>.<attempt>g<generation>`).
///
/// Only a save of an ended generation is certain to be abandoned: the coordinator refuses every
/// report of an ended generation, so it never commits. One of the generation now running may
/// still commit below the newest commit (its reports went to a leader that died and reach the
/// next one after a later save's), so it keeps the age guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnSaves {
    /// What every one of the caller's save ids starts with, before the generation.
    pub prefix: String,
    /// The generation running now.
    pub generation: u64,
}

impl OwnSaves {
    /// Whether `save_id` is the caller's, from a generation before the running one.
    pub fn ended(&self, save_id: &str) -> bool {
        save_id
            .strip_prefix(&self.prefix)
            .and_then(|generation| generation.parse::<u64>().ok())
            .is_some_and(|generation| generation < self.generation)
    }
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            keep_last: 3,
            keep_every: 0,
            min_orphan_age: Duration::from_secs(3600),
            line: None,
            own_saves: None,
        }
    }
}

/// One checkpoint directory found in storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSave {
    /// The directory name.
    pub dir: String,
    /// Its step.
    pub step: u64,
    /// Its save id.
    pub save_id: String,
    /// Keys of the objects in it.
    pub objects: Vec<Path>,
    /// Total bytes of those objects.
    pub bytes: u64,
    /// When the newest of them was written, seconds since the Unix epoch.
    pub newest_write_unix: i64,
    /// Whether its `COMMITTED` marker is among them: committed by someone, whether or not the
    /// commit log at hand knows it (another submission's save, under a coordinator).
    pub marked: bool,
}

impl StoredSave {
    fn empty(dir: String, step: u64, save_id: String) -> Self {
        StoredSave {
            dir,
            step,
            save_id,
            objects: Vec::new(),
            bytes: 0,
            newest_write_unix: i64::MIN,
            marked: false,
        }
    }
}

/// What a garbage collection will do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// Commits kept.
    pub keep: Vec<CommitRecord>,
    /// Commits forgotten and deleted.
    pub expire: Vec<CommitRecord>,
    /// Uncommitted directories deleted.
    pub orphans: Vec<String>,
}

/// A save still running: its step and save id, the two parts of its directory's name.
pub type ActiveSave = (u64, String);

/// Decides what to keep and what to delete. `active` are the saves still running.
pub fn plan_gc(
    committed: &[CommitRecord],
    stored: &[StoredSave],
    retention: &Retention,
    active: &BTreeSet<ActiveSave>,
    now_unix: i64,
) -> GcPlan {
    let mut commits = committed.to_vec();
    commits.sort_by(|a, b| (b.step, &b.save_id).cmp(&(a.step, &a.save_id)));
    commits.dedup();
    let mut plan = GcPlan::default();
    if let Some(line) = &retention.line {
        let (own, others): (Vec<_>, Vec<_>) = commits.into_iter().partition(|c| line_of(&c.save_id) == line);
        plan.keep.extend(others);
        commits = own;
    }
    let newest_step = commits.first().map(|c| c.step);
    for (rank, c) in commits.into_iter().enumerate() {
        let keep = rank < retention.keep_last
            || Some(c.step) == newest_step
            || (retention.keep_every > 0 && c.step % retention.keep_every == 0)
            || active.contains(&(c.step, c.save_id.clone()));
        if keep { plan.keep.push(c) } else { plan.expire.push(c) }
    }
    let committed_dirs: BTreeSet<String> = committed.iter().map(CommitRecord::dir).collect();
    let min_age = i64::try_from(retention.min_orphan_age.as_secs()).unwrap_or(i64::MAX);
    for s in stored {
        let young = now_unix.saturating_sub(s.newest_write_unix) < min_age;
        let running = active.contains(&(s.step, s.save_id.clone()));
        let abandoned = retention.own_saves.as_ref().is_some_and(|own| own.ended(&s.save_id));
        if !committed_dirs.contains(&s.dir) && !s.marked && !running && (abandoned || !young) {
            plan.orphans.push(s.dir.clone());
        }
    }
    plan
}

/// Every checkpoint directory under the root, by step then save id; on `file://` including
/// directories that hold only a killed writer's staging files.
pub async fn scan(storage: &Storage) -> Result<Vec<StoredSave>> {
    let mut dirs: BTreeMap<(u64, String), StoredSave> = BTreeMap::new();
    for meta in storage.list_all().await? {
        let Some((dir, _)) = storage.split_key(&meta.location) else { continue };
        let Some((step, save_id)) = parse_dir_name(&dir) else { continue };
        let entry =
            dirs.entry((step, save_id.clone())).or_insert_with(|| StoredSave::empty(dir, step, save_id));
        entry.marked |= meta.location.filename() == Some(COMMITTED);
        entry.objects.push(meta.location);
        entry.bytes += meta.size;
        entry.newest_write_unix = entry.newest_write_unix.max(meta.last_modified.timestamp());
    }
    for (dir, newest) in storage.local_dirs()? {
        let Some((step, save_id)) = parse_dir_name(&dir) else { continue };
        let entry =
            dirs.entry((step, save_id.clone())).or_insert_with(|| StoredSave::empty(dir, step, save_id));
        entry.newest_write_unix = entry.newest_write_unix.max(newest);
    }
    Ok(dirs.into_values().collect())
}

/// What a garbage collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The plan that was carried out.
    pub plan: GcPlan,
    /// Objects deleted.
    pub objects_deleted: usize,
    /// Bytes freed.
    pub bytes_freed: u64,
}

/// Applies `retention` and removes orphans. `active` are the saves still running (step and save
/// id), which are never touched. A commit is forgotten before any of its objects is deleted, and its marker
/// goes before its data, so an interrupted collection never leaves a committed checkpoint with
/// missing pieces, only an orphan for the next run.
pub async fn gc(
    storage: &Storage,
    log: &impl CommitLog,
    retention: &Retention,
    active: &[ActiveSave],
) -> Result<GcReport> {
    let stored = scan(storage).await?;
    let committed = log.list().await?;
    let active: BTreeSet<ActiveSave> = active.iter().cloned().collect();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let plan = plan_gc(&committed, &stored, retention, &active, now);
    let mut report = GcReport::default();
    for commit in &plan.expire {
        // The log forgets a commit last: an expiry a failing store stops halfway stays in the
        // log, so the next run plans it again (every delete is idempotent). Forgotten first, a
        // commit whose marker then could not be deleted stayed committed for good: the soak's
        // bucket kept 8 such beyond `keep`.
        let dir = commit.dir();
        storage.delete(&storage.key(&dir, COMMITTED)).await?;
        if let Some(save) = stored.iter().find(|s| s.dir == dir) {
            delete_save(storage, save, &mut report).await?;
        }
        log.remove(commit).await?;
    }
    for dir in &plan.orphans {
        if let Some(save) = stored.iter().find(|s| &s.dir == dir) {
            delete_save(storage, save, &mut report).await?;
        }
    }
    report.plan = plan;
    Ok(report)
}

async fn delete_save(storage: &Storage, save: &StoredSave, report: &mut GcReport) -> Result<()> {
    // The marker first: a directory whose deletion is interrupted must not look committed.
    let marker = storage.key(&save.dir, COMMITTED);
    storage.delete(&marker).await?;
    for key in save.objects.iter().filter(|k| **k != marker) {
        storage.delete(key).await?;
    }
    report.objects_deleted += save.objects.len();
    report.bytes_freed += save.bytes;
    storage.sweep_local_dir(&save.dir)
}

/// One checkpoint directory as the CLI lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Its step.
    pub step: u64,
    /// Its save id.
    pub save_id: String,
    /// Its directory.
    pub dir: String,
    /// Whether the log records it as committed.
    pub committed: bool,
    /// Objects stored.
    pub objects: usize,
    /// Bytes stored.
    pub bytes: u64,
}

/// Every checkpoint directory, committed or not, by step.
pub async fn list(storage: &Storage, log: &impl CommitLog) -> Result<Vec<Listing>> {
    let committed: BTreeSet<String> = log.list().await?.iter().map(CommitRecord::dir).collect();
    Ok(scan(storage)
        .await?
        .into_iter()
        .map(|s| Listing {
            committed: committed.contains(&s.dir),
            step: s.step,
            save_id: s.save_id,
            dir: s.dir,
            objects: s.objects.len(),
            bytes: s.bytes,
        })
        .collect())
}

/// Removes one checkpoint (committed or not): forgets the commit, then deletes the marker, then
/// the data. Returns the number of objects deleted.
pub async fn remove(storage: &Storage, log: &impl CommitLog, step: u64, save_id: &str) -> Result<usize> {
    crate::layout::validate_save_id(save_id)?;
    let dir = crate::layout::dir_name(step, save_id);
    for commit in log.list().await?.into_iter().filter(|c| c.dir() == dir) {
        log.remove(&commit).await?;
    }
    let mut report = GcReport::default();
    let Some(save) = scan(storage).await?.into_iter().find(|s| s.dir == dir) else {
        return Err(crate::error::CheckpointError::NotFound {
            what: format!("checkpoint {dir} under {}", storage.url()),
            hint: "see `list` for what is stored".into(),
        });
    };
    delete_save(storage, &save, &mut report).await?;
    Ok(report.objects_deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(step: u64) -> CommitRecord {
        CommitRecord {
            step,
            save_id: format!("s{step}"),
            bundle: "00".into(),
            manifest_size: 1,
            manifest_crc32c: 0,
        }
    }

    fn stored(step: u64, written: i64) -> StoredSave {
        StoredSave {
            dir: crate::layout::dir_name(step, &format!("s{step}")),
            step,
            save_id: format!("s{step}"),
            objects: vec![],
            bytes: 0,
            newest_write_unix: written,
            marked: false,
        }
    }

    fn steps(records: &[CommitRecord]) -> Vec<u64> {
        records.iter().map(|c| c.step).collect()
    }

    const NOW: i64 = 1_000_000;

    #[test]
    fn keeps_the_last_k_and_every_nth() {
        let committed: Vec<_> = [100, 200, 300, 400, 500, 600].map(commit).to_vec();
        let r =
            Retention { keep_last: 2, keep_every: 300, min_orphan_age: Duration::ZERO, ..Default::default() };
        let plan = plan_gc(&committed, &[], &r, &BTreeSet::new(), NOW);
        assert_eq!(steps(&plan.keep), vec![600, 500, 300]);
        assert_eq!(steps(&plan.expire), vec![400, 200, 100]);
    }

    #[test]
    fn never_expires_the_newest() {
        let committed: Vec<_> = [1, 2, 3].map(commit).to_vec();
        let r = Retention { keep_last: 0, min_orphan_age: Duration::ZERO, ..Default::default() };
        let plan = plan_gc(&committed, &[], &r, &BTreeSet::new(), NOW);
        assert_eq!(steps(&plan.keep), vec![3]);
        assert_eq!(steps(&plan.expire), vec![2, 1]);
    }

    #[test]
    fn a_line_keeps_its_own_last_k_and_never_expires_another_line() {
        let line = |l: &str, step: u64| CommitRecord { save_id: format!("{l}.a"), ..commit(step) };
        let committed =
            vec![line("r1", 100), line("r1", 200), line("r1", 300), line("r2", 10), line("r2", 20)];
        let r = Retention {
            keep_last: 1,
            keep_every: 0,
            min_orphan_age: Duration::ZERO,
            line: Some("r2".into()),
            own_saves: None,
        };
        let plan = plan_gc(&committed, &[], &r, &BTreeSet::new(), NOW);
        assert_eq!(steps(&plan.expire), vec![10], "only the line's own older commits expire");
        let mut kept = steps(&plan.keep);
        kept.sort();
        assert_eq!(kept, vec![20, 100, 200, 300]);
    }

    #[test]
    fn orphans_are_collected_unless_active_or_young() {
        let committed = vec![commit(100)];
        let saves = vec![stored(100, 0), stored(200, 0), stored(300, 0), stored(400, NOW - 10)];
        let r = Retention { keep_last: 1, min_orphan_age: Duration::from_secs(60), ..Default::default() };
        let active = BTreeSet::from([(300, "s300".to_string())]);
        let plan = plan_gc(&committed, &saves, &r, &active, NOW);
        assert_eq!(plan.orphans, vec![crate::layout::dir_name(200, "s200")]);
        assert_eq!(steps(&plan.keep), vec![100]);
        assert!(plan.expire.is_empty());
    }

    #[test]
    fn an_attempt_still_saving_expires_its_own_older_commits() {
        // A coordinator's generation saves every step under one id, `<line>.s<nonce>g<gen>`.
        let attempt = |step: u64| CommitRecord { save_id: "r1.s0a0b0c0dg1".into(), ..commit(step) };
        let committed: Vec<_> = [10, 20, 30, 40, 50, 60].map(attempt).to_vec();
        let running = stored(70, NOW);
        let running = StoredSave {
            save_id: "r1.s0a0b0c0dg1".into(),
            dir: crate::layout::dir_name(70, "r1.s0a0b0c0dg1"),
            ..running
        };
        let r = Retention { keep_last: 3, min_orphan_age: Duration::ZERO, ..Default::default() };
        let active = BTreeSet::from([(70, "r1.s0a0b0c0dg1".to_string())]);
        let plan = plan_gc(&committed, &[running], &r, &active, NOW);
        assert_eq!(steps(&plan.keep), vec![60, 50, 40]);
        assert_eq!(steps(&plan.expire), vec![30, 20, 10]);
        assert!(plan.orphans.is_empty(), "the running save is left alone: {:?}", plan.orphans);
    }

    #[test]
    fn the_callers_saves_of_an_ended_generation_go_at_once_and_no_one_elses() {
        let own = "r1.s0a0b0c0dg";
        let save = |step: u64, id: &str| StoredSave {
            save_id: id.into(),
            dir: crate::layout::dir_name(step, id),
            ..stored(step, NOW - 1)
        };
        let committed = vec![CommitRecord { save_id: format!("{own}3"), ..commit(100) }];
        let saves = vec![
            save(80, &format!("{own}2")),  // an ended generation's: abandoned
            save(120, &format!("{own}1")), // above the newest commit, still of an ended one
            save(90, &format!("{own}3")),  // this generation's below the commit: may still commit
            save(95, &format!("{own}3")),  // running
            save(90, &format!("{own}31")), // a later generation's (a prefix is not a number)
            save(90, "r1.s1f1f1f1fg1"),    // another submission's: only the age guard
        ];
        let r = Retention {
            min_orphan_age: Duration::from_secs(60),
            own_saves: Some(OwnSaves { prefix: own.into(), generation: 3 }),
            ..Default::default()
        };
        let active = BTreeSet::from([(95, format!("{own}3"))]);
        let plan = plan_gc(&committed, &saves, &r, &active, NOW);
        assert_eq!(plan.orphans, vec![saves[0].dir.clone(), saves[1].dir.clone()]);
        // Once old enough, this generation's failed save goes too; the running one never.
        let later = plan_gc(&committed, &saves, &r, &active, NOW + 61);
        assert_eq!(later.orphans.len(), 5, "{:?}", later.orphans);
        assert!(!later.orphans.contains(&saves[3].dir));
        // Without `own_saves` they wait for the age guard like any other.
        let guarded = plan_gc(&committed, &saves, &Retention { own_saves: None, ..r }, &active, NOW);
        assert!(guarded.orphans.is_empty(), "{:?}", guarded.orphans);
    }

    #[test]
    fn a_directory_with_a_commit_marker_is_never_an_orphan() {
        // Committed by another submission: this job's log does not know it, its marker does.
        let saves = vec![StoredSave { marked: true, ..stored(50, 0) }, stored(60, 0)];
        let r = Retention { keep_last: 1, min_orphan_age: Duration::ZERO, ..Default::default() };
        let plan = plan_gc(&[commit(100)], &saves, &r, &BTreeSet::new(), NOW);
        assert_eq!(plan.orphans, vec![crate::layout::dir_name(60, "s60")]);
    }
}
