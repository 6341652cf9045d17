//! `--set field.path=value`: spec fields overridden from the command line (SkyPilot's `--env`,
//! Helm's `--set`). The overrides are applied to the spec's YAML tree before it is parsed, so an
//! overridden field is checked exactly as one written in the file: unknown fields are refused,
//! types and values validated, and every error names the field (and the `--set` it came from).
//!
//! A value is read as YAML (`3e-3` a number, `true` a boolean, `[1, 2]` a list, `{ hf: dir }` a
//! mapping, anything else a string); the path walks mappings by key and lists by index
//! (`data.files.0=...`). A scalar on the way becomes a mapping (`model.hf=DIR` over `model:
//! tiny`), and missing mappings are created (`checkpoint.every=10` without a `checkpoint:`).

use crate::JobError;
use serde_json::{Map, Value};

/// One `--set FIELD=VALUE`.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The field's path, split at the dots.
    path: Vec<String>,
    /// The value, read as YAML.
    value: Value,
    /// As given, for messages.
    text: String,
}

impl Override {
    /// Parses `FIELD=VALUE`.
    pub fn parse(text: &str) -> Result<Self, JobError> {
        let bad = |reason: &str| JobError::Override { set: text.to_string(), reason: reason.to_string() };
        let Some((field, value)) = text.split_once('=') else {
            return Err(bad("write FIELD=VALUE, e.g. optimizer.lr=1e-3"));
        };
        let path: Vec<String> = field.trim().split('.').map(str::to_string).collect();
        if path.iter().any(String::is_empty) {
            return Err(bad("the field is empty or has an empty part; write e.g. batch.micro=4"));
        }
        let value = match value.trim() {
            "" => Value::String(String::new()),
            value => {
                serde_saphyr::from_str::<Value>(value).unwrap_or_else(|_| Value::String(value.to_string()))
            }
        };
        Ok(Self { path, value, text: text.to_string() })
    }

    /// The field, dotted (`optimizer.lr`).
    pub fn field(&self) -> String {
        self.path.join(".")
    }

    /// Whether a problem with `field` (as validation names it) may come from this override.
    fn touches(&self, field: &str) -> bool {
        let mine = self.field();
        field == mine || field.starts_with(&format!("{mine}.")) || mine.starts_with(&format!("{field}."))
    }

    /// Sets the field in `tree`.
    fn apply(&self, tree: &mut Value) -> Result<(), JobError> {
        let mut node = tree;
        for (depth, key) in self.path.iter().enumerate() {
            let last = depth + 1 == self.path.len();
            node = match node {
                Value::Array(items) => {
                    let at = self.path[..depth].join(".");
                    let index: usize = key.parse().map_err(|_| JobError::Override {
                        set: self.text.clone(),
                        reason: format!("`{at}` is a list: index it with a number, e.g. {at}.0"),
                    })?;
                    let len = items.len();
                    items.get_mut(index).ok_or_else(|| JobError::Override {
                        set: self.text.clone(),
                        reason: format!(
                            "`{at}` has {len} items; indices run from 0 to {}",
                            len.saturating_sub(1)
                        ),
                    })?
                }
                other => {
                    if !other.is_object() {
                        *other = Value::Object(Map::new());
                    }
                    let map = other.as_object_mut().expect("made a mapping above");
                    map.entry(key.clone()).or_insert(Value::Null)
                }
            };
            if last {
                *node = self.value.clone();
            }
        }
        Ok(())
    }
}

/// `text` (a spec's YAML) with `overrides` applied, as YAML text (JSON, which YAML reads).
pub(crate) fn apply(text: &str, overrides: &[Override], path: &std::path::Path) -> Result<String, JobError> {
    let mut tree: Value = serde_saphyr::from_str(text)
        .map_err(|e| JobError::Yaml { path: path.into(), message: e.to_string() })?;
    if tree.is_null() {
        tree = Value::Object(Map::new());
    }
    for o in overrides {
        o.apply(&mut tree)?;
    }
    Ok(serde_json::to_string_pretty(&tree).expect("a YAML tree serializes"))
}

/// `error` from a spec with `overrides` applied, naming the `--set` behind it: the one that
/// touches the field the error names, else every one (a field can be wrong with another's
/// value: `batch.micro` that `batch.global` is not a multiple of).
pub(crate) fn attribute(error: JobError, overrides: &[Override]) -> JobError {
    let culprit = match &error {
        JobError::Invalid { field, .. } => overrides.iter().rev().find(|o| o.touches(field)),
        JobError::Yaml { message, .. } => {
            overrides.iter().rev().find(|o| o.path.iter().any(|key| message.contains(&format!("`{key}`"))))
        }
        _ => None,
    };
    let set = match culprit {
        Some(o) => o.text.clone(),
        None => overrides.iter().map(|o| o.text.as_str()).collect::<Vec<_>>().join(" --set "),
    };
    JobError::Override { set, reason: error.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobSpec;
    use std::path::Path;

    const SPEC: &str = "name: t\nmodel: tiny\nmesh: { ici: { fsdp: 1, tp: 1 } }\nbatch: { global: 8, micro: 4 }\n\
                        seq_len: 32\nsteps: 10\ndata: { kind: arithmetic, digits: [2, 3] }\n";

    fn load(sets: &[&str]) -> Result<JobSpec, JobError> {
        let overrides: Vec<Override> = sets.iter().map(|s| Override::parse(s)).collect::<Result<_, _>>()?;
        JobSpec::from_yaml_overridden(SPEC, Path::new("t.yaml"), &overrides, &crate::model::NoReader)
    }

    #[test]
    fn overrides_set_nested_fields_with_yaml_values() {
        let job =
            load(&["steps=25", "optimizer.lr=1e-3", "batch.micro=2", "checkpoint.every=5", "name=other"])
                .unwrap();
        assert_eq!((job.steps, job.batch.micro, job.name.as_str()), (25, 2, "other"));
        assert_eq!(job.optimizer.lr, 1e-3);
        assert_eq!(job.checkpoint.as_ref().unwrap().every, 5);
        // Lists by index, and whole lists as YAML.
        assert_eq!(load(&["data.digits.1=4"]).unwrap(), load(&["data.digits=[2, 4]"]).unwrap());
        assert_eq!(load(&[]).unwrap(), JobSpec::from_yaml(SPEC, Path::new("t.yaml")).unwrap());
    }

    #[test]
    fn overridden_fields_are_validated_like_the_file_and_named() {
        let error = load(&["optimizer.lrr=1"]).unwrap_err().to_string();
        assert!(error.starts_with("--set optimizer.lrr=1: ") && error.contains("lrr"), "{error}");
        let error = load(&["batch.micro=3"]).unwrap_err().to_string();
        assert!(error.starts_with("--set batch.micro=3: job spec field `batch"), "{error}");
        let error = load(&["steps=many"]).unwrap_err().to_string();
        assert!(error.contains("--set steps=many"), "{error}");
        let error = load(&["data.digits.7=1"]).unwrap_err().to_string();
        assert_eq!(error, "--set data.digits.7=1: `data.digits` has 2 items; indices run from 0 to 1");
        let error = load(&["data.digits.x=1"]).unwrap_err().to_string();
        assert!(error.contains("index it with a number"), "{error}");
        for bad in ["steps", "=3", "a..b=1"] {
            let error = Override::parse(bad).unwrap_err().to_string();
            assert!(error.starts_with(&format!("--set {bad}: ")), "{error}");
        }
    }
}
