//! Lines of checkpoints under one root.
//!
//! A run that starts afresh begins a line; a run that resumes continues the line of the
//! checkpoint it resumed from. Saves are named `<line>.<attempt>`: the line is `r` and its start
//! time in milliseconds as 12 hex digits, so lines sort by age; the attempt tells the processes
//! (or submissions) of one line apart, so that no checkpoint directory is ever written twice.
//! Save ids without a line (written before lines existed) belong to the oldest line, `""`.
//!
//! Resuming takes the newest line first and, within it, the highest step
//! ([`crate::committed_newest_first`]); retention keeps and expires within one line
//! ([`crate::Retention::line`]), so a run that starts over beside an older line never deletes or
//! rewrites it.

/// The metadata key under which a save records what a run must match to resume from it (the
/// caller's notion: the job's model, trained shapes, dtype and seed).
pub const IDENTITY_KEY: &str = "identity";

/// The line a run starting now (Unix milliseconds) begins.
pub fn new_line(unix_millis: u64) -> String {
    format!("r{unix_millis:012x}")
}

/// The save id of `attempt` in `line`.
pub fn save_id(line: &str, attempt: &str) -> String {
    match line {
        "" => attempt.to_string(),
        line => format!("{line}.{attempt}"),
    }
}

/// The line a save id belongs to (`""` for a save id without one).
pub fn line_of(save_id: &str) -> &str {
    save_id.split_once('.').map_or("", |(line, _)| line)
}

/// A checkpoint root whose newest line is another job's: refused rather than mixed into, by the
/// single-slice launch and by the coordinator alike.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "checkpoint root {root} holds another job's checkpoints ({checkpoint}: {difference}); launch with \
     --start-over to train afresh beside them (nothing there is deleted or rewritten), or set \
     checkpoint.uri to another root"
)]
pub struct ForeignRoot {
    /// The root.
    pub root: String,
    /// Its newest checkpoint, the one that tells.
    pub checkpoint: String,
    /// What differs from this job ([`identity_difference`]).
    pub difference: String,
}

/// How a checkpoint's manifest differs from the identity a job records in its saves (under
/// [`IDENTITY_KEY`]), if it does: the checkpoint is then another job's. A checkpoint written
/// before saves recorded an identity is compared by its data order's seed alone.
pub fn identity_difference(manifest: &crate::Manifest, wanted: &serde_json::Value) -> Option<String> {
    let Some(recorded) = manifest.metadata.get(IDENTITY_KEY) else {
        let seed = manifest.data_position.seed;
        return (wanted.get("seed").and_then(|s| s.as_u64()) != Some(seed)).then(|| {
            format!("seed {seed}, this job's {}", wanted.get("seed").unwrap_or(&serde_json::Value::Null))
        });
    };
    let (Some(recorded), Some(wanted)) = (recorded.as_object(), wanted.as_object()) else {
        return (recorded != wanted).then(|| format!("{recorded}, this job's {wanted}"));
    };
    let keys: std::collections::BTreeSet<&String> = recorded.keys().chain(wanted.keys()).collect();
    let null = serde_json::Value::Null;
    let differences: Vec<String> = keys
        .into_iter()
        .filter_map(|k| {
            let (r, w) = (recorded.get(k).unwrap_or(&null), wanted.get(k).unwrap_or(&null));
            (r != w).then(|| format!("{k} {r}, this job's {w}"))
        })
        .collect();
    (!differences.is_empty()).then(|| differences.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_sort_by_age_and_save_ids_name_their_line() {
        let (older, newer) = (new_line(1_700_000_000_000), new_line(1_700_000_000_001));
        assert!(older < newer && older.len() == newer.len());
        let id = save_id(&newer, "l1a2b");
        assert_eq!(line_of(&id), newer);
        assert!(crate::layout::is_safe_segment(&id), "{id}");
        assert_eq!((line_of("g3"), save_id("", "g3")), ("", "g3".to_string()), "a save id before lines");
    }
}
