//! Object names: `<root>/<step:012>-<save_id>/{host-<h>.shards, manifest.json, COMMITTED}`.
//!
//! Zero-padded steps make a plain listing sort by step. Every name that comes from a manifest
//! or a listing is checked here before it becomes a key, so nothing is ever read or deleted
//! outside the root.

use crate::error::{CheckpointError, Result};

/// The manifest's name inside a checkpoint directory; written after every host stream.
pub const MANIFEST: &str = "manifest.json";
/// The commit marker's name inside a checkpoint directory; written after the commit is recorded.
pub const COMMITTED: &str = "COMMITTED";

/// Longest accepted save id.
pub const MAX_SAVE_ID_LEN: usize = 64;

/// Checks a save id: 1 to 64 of `[A-Za-z0-9_.-]`, not starting with `.`.
pub fn validate_save_id(save_id: &str) -> Result<()> {
    if save_id.is_empty() || save_id.len() > MAX_SAVE_ID_LEN {
        return Err(CheckpointError::invalid(
            format!("save id '{save_id}'"),
            format!("must be 1..={MAX_SAVE_ID_LEN} characters"),
        ));
    }
    if !is_safe_segment(save_id) {
        return Err(CheckpointError::invalid(
            format!("save id '{save_id}'"),
            "use only letters, digits, '_', '-' and '.', and do not start with '.'",
        ));
    }
    Ok(())
}

/// Whether `name` is one safe path segment: `[A-Za-z0-9_.-]+`, not starting with `.` (so never
/// `.` or `..`), no `/`, no `\`.
pub fn is_safe_segment(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The directory name of a checkpoint.
pub fn dir_name(step: u64, save_id: &str) -> String {
    format!("{step:012}-{save_id}")
}

/// Parses a directory name back into `(step, save_id)`; `None` for anything else found under
/// the root (foreign objects are left alone).
pub fn parse_dir_name(name: &str) -> Option<(u64, String)> {
    let (step, save_id) = name.split_once('-')?;
    if step.len() < 12 || !step.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let step: u64 = step.parse().ok()?;
    validate_save_id(save_id).ok()?;
    (dir_name(step, save_id) == name).then(|| (step, save_id.to_string()))
}

/// The stream object of `host`.
pub fn host_object_name(host: usize) -> String {
    format!("host-{host}.shards")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_step() {
        assert_eq!(dir_name(42, "g3-a1"), "000000000042-g3-a1");
        assert_eq!(parse_dir_name("000000000042-g3-a1"), Some((42, "g3-a1".into())));
        assert!(dir_name(9, "x") < dir_name(10, "x"));
        assert_eq!(host_object_name(7), "host-7.shards");
    }

    #[test]
    fn foreign_and_hostile_names_are_rejected() {
        for name in [
            "42-x",
            "000000000042",
            "000000000042-",
            "000000000042-../x",
            "0000000000x2-a",
            "000000000042-..",
        ] {
            assert_eq!(parse_dir_name(name), None, "{name}");
        }
        for id in ["", "..", ".hidden", "a/b", "a\\b", "/abs", &"x".repeat(65)] {
            assert!(validate_save_id(id).is_err(), "{id}");
        }
        assert!(validate_save_id("gen-3.attempt_1").is_ok());
        assert!(!is_safe_segment(".."));
        assert!(!is_safe_segment("a/../b"));
    }
}
