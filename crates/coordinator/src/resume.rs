//! The resume rule, applied once at submission: what the job's checkpoint root holds decides
//! where the job starts and which line of checkpoints its saves continue.
//!
//! The newest committed checkpoint that verifies (its manifest against the commit, every chunk's
//! CRC) is where the job resumes, the root's newest line first (`checkpoint::lineage`); the
//! newer ones that do not verify are passed over, each with its reason. A checkpoint of another
//! job (another model, dtype, LoRA or seed: the spec's `checkpoint_identity`) in the root's newest
//! line refuses the submission, naming `--start-over`; one in an older line is passed over.
//! Starting over begins a new line beside whatever is there and reads nothing.
//!
//! The leader does this itself, before proposing the job, so every node agrees on the outcome
//! (it goes through Raft inside the submission) and no worker has to: a cluster's workers come
//! and go, the root stays.

use crate::state::{CheckpointEntry, PassedOver};
use checkpoint::lineage::{ForeignRoot, identity_difference, line_of, new_line};
use checkpoint::{
    Checkpoint, CheckpointError, CommitRecord, Limits, Storage, StoreCommitLog, committed_newest_first,
};

/// What a submission found under its checkpoint root.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// The line of checkpoints the job's saves continue (the resumed one's) or begin.
    pub line: String,
    /// The line's committed checkpoints up to the one resumed from, oldest first: the job's
    /// catalog starts with them (the last is where it resumes), so retention keeps the line's
    /// last K across submissions. Empty for a fresh start.
    pub catalog: Vec<CheckpointEntry>,
    /// Newer committed checkpoints that were not taken, newest first.
    pub passed_over: Vec<PassedOver>,
}

impl Found {
    /// The checkpoint the job resumes from.
    pub fn resumed(&self) -> Option<&CheckpointEntry> {
        self.catalog.last()
    }
}

/// Why the root cannot be resumed from.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The root's newest line is another job's.
    #[error(transparent)]
    ForeignRoot(#[from] checkpoint::lineage::ForeignRoot),
    /// The root could not be listed.
    #[error("listing checkpoint root {root}: {source}")]
    Listing {
        /// The root.
        root: String,
        /// Why (boxed: it would double the size of every submission result).
        source: Box<CheckpointError>,
    },
}

/// Applies the resume rule to `storage` for a job recording `identity` in its saves; `now_ms`
/// (Unix milliseconds) names a new line.
pub async fn find(
    storage: &Storage,
    identity: &serde_json::Value,
    start_over: bool,
    now_ms: u64,
) -> Result<Found, ResumeError> {
    if start_over {
        return Ok(Found { line: new_line(now_ms), ..Found::default() });
    }
    let root = storage.url().trim_end_matches('/').to_string();
    let listing = |source| ResumeError::Listing { root: root.clone(), source: Box::new(source) };
    let commits = committed_newest_first(&StoreCommitLog::new(storage.clone())).await.map_err(listing)?;
    let newest_line = commits.first().map(|c| line_of(&c.save_id).to_string());
    let uri_of = |c: &CommitRecord| format!("{root}/{}", c.dir());
    let mut passed_over = Vec::new();
    for (index, commit) in commits.iter().enumerate() {
        let uri = uri_of(commit);
        let checkpoint = match Checkpoint::open(storage, commit, &Limits::default()).await {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                passed_over.push(PassedOver { step: commit.step, uri, reason: error.to_string() });
                continue;
            }
        };
        if let Some(difference) = identity_difference(checkpoint.manifest(), identity) {
            if newest_line.as_deref() == Some(line_of(&commit.save_id)) {
                return Err(ForeignRoot { root, checkpoint: uri, difference }.into());
            }
            let reason = format!("another job's checkpoint ({difference})");
            passed_over.push(PassedOver { step: commit.step, uri, reason });
            continue;
        }
        if let Err(error) = checkpoint.verify().await {
            tracing::warn!(checkpoint = %uri, %error, "passing over a checkpoint that does not verify");
            passed_over.push(PassedOver { step: commit.step, uri, reason: error.to_string() });
            continue;
        }
        let line = line_of(&commit.save_id).to_string();
        // The line's older checkpoints join the catalog unverified: retention counts them, and a
        // worker's restore checks every chunk it reads anyway.
        let mut catalog = vec![entry(commit, uri, &checkpoint)];
        for older in commits[index + 1..].iter().filter(|c| line_of(&c.save_id) == line) {
            if let Ok(checkpoint) = Checkpoint::open(storage, older, &Limits::default()).await {
                catalog.push(entry(older, uri_of(older), &checkpoint));
            }
        }
        catalog.truncate(crate::state::MAX_CHECKPOINTS_PER_JOB / 2);
        catalog.reverse();
        return Ok(Found { line, catalog, passed_over });
    }
    Ok(Found { line: new_line(now_ms), catalog: Vec::new(), passed_over })
}

fn entry(commit: &CommitRecord, uri: String, checkpoint: &Checkpoint) -> CheckpointEntry {
    CheckpointEntry {
        record: commit.clone(),
        uri,
        committed_unix: 0.0,
        bytes: checkpoint.manifest().objects.iter().map(|o| o.size).sum(),
    }
}
