//! `grpo.init_from`, resolved once at launch into the checkpoint directory it means, so that
//! every worker and every restart starts from the same one.

use crate::connect::ConnectArgs;
use anyhow::{Context, Result, bail};
use checkpoint::{Storage, StoreCommitLog, StoreOptions, committed_newest_first};
use job::JobSpec;
use std::path::{Path, PathBuf};
use worker::ckpt::split_uri;

/// What the launch must do before the job can start.
pub enum InitFrom {
    /// Nothing: `init_from` is a checkpoint directory now (or the job has none).
    Resolved,
    /// The SFT job spec `init_from` names has no committed checkpoint yet: train it first.
    TrainFirst {
        /// Its spec file.
        spec: PathBuf,
        /// Its checkpoint root.
        root: String,
    },
}

/// Rewrites `grpo.init_from` into the checkpoint directory it means: a checkpoint directory
/// as it is, the newest committed checkpoint of a root, or of an SFT job spec's (`*.yaml`)
/// root, which is trained first when it has none.
pub fn resolve(
    job: &mut JobSpec,
    connect: &ConnectArgs,
    runtime: &tokio::runtime::Handle,
) -> Result<InitFrom> {
    let Some(grpo) = &job.grpo else { return Ok(InitFrom::Resolved) };
    let Some(from) = grpo.init_from.clone() else { return Ok(InitFrom::Resolved) };
    let uri = match grpo.init_from_job() {
        Some(path) => {
            if connect.is_remote() {
                bail!(
                    "grpo.init_from {path}: a cluster's workers cannot train a local job spec first; \
                     train it, then set init_from to its checkpoint root (s3://, gs://)"
                );
            }
            let sft = JobSpec::load_with(Path::new(path), &crate::models::HfReader(runtime.clone()))
                .with_context(|| format!("grpo.init_from {path}"))?;
            if sft.grpo.is_some() || sft.model != job.model {
                bail!(
                    "grpo.init_from {path}: expected an SFT job of model {}, found a {} job of model {}",
                    job.model,
                    if sft.grpo.is_some() { "GRPO" } else { "SFT" },
                    sft.model
                );
            }
            let Some(root) = sft.checkpoint_uri() else {
                bail!(
                    "grpo.init_from {path}: that job saves no checkpoints; add `checkpoint: {{ every: N }}` to it"
                );
            };
            match newest_checkpoint(&root, runtime)? {
                Some(dir) => dir,
                None => return Ok(InitFrom::TrainFirst { spec: PathBuf::from(path), root }),
            }
        }
        None => {
            let uri = match from.contains("://") {
                true => from.clone(),
                false => format!("file://{}", std::path::absolute(&from)?.display()),
            };
            match split_uri(&uri) {
                (_, Some(_)) => uri,
                (root, None) => newest_checkpoint(root, runtime)?.with_context(|| {
                    format!("grpo.init_from {from}: no committed checkpoint under {root}; name a checkpoint, or a root that has one")
                })?,
            }
        }
    };
    job.grpo.as_mut().expect("checked above").init_from = Some(uri);
    Ok(InitFrom::Resolved)
}

/// The newest committed checkpoint's directory under `root`, if any.
fn newest_checkpoint(root: &str, runtime: &tokio::runtime::Handle) -> Result<Option<String>> {
    runtime.block_on(async {
        let storage = Storage::open(root, &StoreOptions::default())?;
        let log = StoreCommitLog::new(storage.clone());
        let newest = committed_newest_first(&log).await?.into_iter().next();
        Ok(newest.map(|commit| format!("{}/{}", storage.url().trim_end_matches('/'), commit.dir())))
    })
}
