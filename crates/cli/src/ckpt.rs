//! `podctl ckpt`: list, show, verify, digest, export and remove the checkpoints under a root (`file://`, a plain
//! path, `s3://`, `gs://`), and import a Hugging Face model as one. Commits are read from the
//! `COMMITTED` markers, which the job writes after recording each commit, whether it ran
//! locally or under the coordinator.

use anyhow::{Context, Result, bail};
use checkpoint::{
    Checkpoint, CommitRecord, Limits, Storage, StoreCommitLog, StoreOptions, committed_newest_first,
};
use clap::Subcommand;
use std::path::PathBuf;
use worker::ckpt::split_uri;

#[derive(Subcommand)]
pub enum CkptCommand {
    /// Every checkpoint directory under a root, committed or not, oldest first.
    #[command(alias = "ls")]
    List {
        /// The checkpoint root, e.g. runs/tiny-arith/checkpoints or s3://bucket/prefix.
        uri: String,
        /// One JSON object: `{"root", "checkpoints": [{"step", "save_id", "uri", ...}]}`.
        #[arg(long)]
        json: bool,
    },
    /// A committed checkpoint's manifest: step, topology, data position, arrays.
    Show {
        /// A checkpoint directory, <root>/<step:012>-<save_id>.
        uri: String,
        /// The manifest as one JSON object (without the chunk CRCs).
        #[arg(long)]
        json: bool,
    },
    /// Reads every chunk of every committed checkpoint under a root (or of one checkpoint
    /// directory) and checks its CRC; fails if any does not verify.
    Verify {
        /// A checkpoint root or one checkpoint directory.
        uri: String,
        /// One JSON object: `{"ok", "checkpoints": [{"uri", "step", "ok", "error", ...}]}`.
        #[arg(long)]
        json: bool,
    },
    /// A SHA-256 of every array's contents (row-major, whatever the saved layout) and of the
    /// whole state: two checkpoints with equal digests hold bitwise the same state.
    Digest {
        /// A checkpoint directory, <root>/<step:012>-<save_id>.
        uri: String,
    },
    /// Writes a checkpoint's model weights. With --hf, a Hugging Face directory that
    /// transformers' from_pretrained loads (config.json, safetensors shards of at most 5 GB with
    /// their index, generation_config.json, the tokenizer files of the model the job started
    /// from); without, one safetensors file of podctl's names (`embed`, `layers/q_proj`, ...). A
    /// LoRA checkpoint's adapters are merged into its frozen base: W + alpha/rank x A @ B for
    /// every target projection.
    Export {
        /// A checkpoint directory, or a root (its newest committed checkpoint).
        uri: String,
        /// The file to write (model.safetensors), or with --hf a new directory.
        #[arg(long)]
        out: PathBuf,
        /// Write a Hugging Face model directory.
        #[arg(long)]
        hf: bool,
        /// With --hf: the Hugging Face directory the job started from (its config.json,
        /// generation_config.json and tokenizer files are carried over); by default the one a
        /// `podctl ckpt import` recorded, else config.json is made from the checkpoint's model.
        #[arg(long, requires = "hf")]
        from: Option<String>,
        /// float32 or bfloat16 (rounded to nearest even); bfloat16 with --hf, float32 without.
        #[arg(long)]
        dtype: Option<String>,
        /// With --hf: the largest shard, in bytes of tensor data (transformers' 5 GB).
        #[arg(long, requires = "hf", default_value_t = hf::export::DEFAULT_SHARD_BYTES)]
        max_shard_bytes: u64,
    },
    /// Converts a Hugging Face model directory (a local path, file://, s3://, gs://) into a
    /// podctl checkpoint at step 0 under a root: parameters in the job's dtype and zero AdamW
    /// moments, what a job starting from the model holds, so restarts and replacements restore
    /// it in podctl's format instead of converting the safetensors again.
    Import {
        /// The model directory (config.json and model.safetensors or sharded safetensors with
        /// model.safetensors.index.json).
        model: String,
        /// The checkpoint root to write to, e.g. runs/qwen3/checkpoints or gs://bucket/ckpt.
        root: String,
        /// The parameters' dtype: the job's train.param_dtype (float32 or bfloat16).
        #[arg(long, default_value = "float32")]
        dtype: String,
    },
    /// Removes one checkpoint: forgets its commit, deletes its marker, then its data.
    Rm {
        /// A checkpoint directory, <root>/<step:012>-<save_id>.
        uri: String,
    },
}

pub fn run(command: CkptCommand, runtime: &tokio::runtime::Handle) -> Result<()> {
    runtime.block_on(async move {
        match command {
            CkptCommand::List { uri, json } => list(&uri, json).await,
            CkptCommand::Show { uri, json } => show(&uri, json).await,
            CkptCommand::Verify { uri, json } => verify(&uri, json).await,
            CkptCommand::Digest { uri } => digest(&uri).await,
            CkptCommand::Export { uri, out, hf, from, dtype, max_shard_bytes } => match hf {
                true => export_hf(&uri, &out, from.as_deref(), dtype.as_deref(), max_shard_bytes).await,
                false => export(&uri, &out, dtype.as_deref().unwrap_or("float32")).await,
            },
            CkptCommand::Import { model, root, dtype } => import(&model, &root, &dtype).await,
            CkptCommand::Rm { uri } => rm(&uri).await,
        }
    })
}

/// The checkpoint directory a URI names below its root: (step, save id).
type NamedDir = Option<(u64, String)>;

/// Opens the root of `uri`; a local root must exist (opening one would create it).
fn open(uri: &str) -> Result<(Storage, StoreCommitLog, NamedDir)> {
    let (root, dir) = split_uri(uri);
    let local = match root.strip_prefix("file://") {
        Some(path) => Some(PathBuf::from(path)),
        None => (!root.contains("://")).then(|| PathBuf::from(root)),
    };
    if let Some(path) = local
        && !path.is_dir()
    {
        bail!("no checkpoint root at {}: the directory does not exist", path.display());
    }
    let storage = Storage::open(root, &StoreOptions::default())?;
    let log = StoreCommitLog::new(storage.clone());
    Ok((storage, log, dir))
}

/// The commit of the checkpoint directory `uri` names.
async fn commit_of(uri: &str, log: &StoreCommitLog, dir: NamedDir) -> Result<CommitRecord> {
    let Some((step, save_id)) = dir else {
        bail!(
            "{uri} is not a checkpoint directory; name one as <root>/<step:012>-<save_id> (see `podctl ckpt list`)"
        )
    };
    committed_newest_first(log)
        .await?
        .into_iter()
        .find(|c| c.step == step && c.save_id == save_id)
        .with_context(|| {
            format!("{uri} is not committed (no COMMITTED marker); `podctl ckpt list` shows its state")
        })
}

async fn list(uri: &str, json: bool) -> Result<()> {
    let (storage, log, dir) = open(uri)?;
    if dir.is_some() {
        bail!("{uri} is a checkpoint directory; list its root, or use `podctl ckpt show {uri}`");
    }
    let listed = checkpoint::list(&storage, &log).await?;
    if json {
        let root = storage.url().trim_end_matches('/');
        let checkpoints: Vec<_> = listed
            .iter()
            .map(|l| {
                serde_json::json!({
                    "step": l.step,
                    "save_id": l.save_id,
                    "uri": format!("{root}/{}", l.dir),
                    "committed": l.committed,
                    "objects": l.objects,
                    "bytes": l.bytes,
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "root": root, "checkpoints": checkpoints }));
        return Ok(());
    }
    if listed.is_empty() {
        println!("no checkpoints under {}", storage.url());
        return Ok(());
    }
    println!("{:>12}  {:<24} {:<11} {:>7} {:>12}", "STEP", "SAVE", "STATE", "OBJECTS", "BYTES");
    for l in listed {
        let state = if l.committed { "committed" } else { "uncommitted" };
        println!("{:>12}  {:<24} {state:<11} {:>7} {:>12}", l.step, l.save_id, l.objects, l.bytes);
    }
    Ok(())
}

async fn show(uri: &str, json: bool) -> Result<()> {
    let (storage, log, dir) = open(uri)?;
    let commit = commit_of(uri, &log, dir).await?;
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await?;
    match json {
        true => println!("{}", manifest_json(&checkpoint, storage.url())),
        false => print!("{}", checkpoint.manifest().summary()),
    }
    Ok(())
}

/// `podctl ckpt show --json`: the manifest without its per-chunk CRCs (thousands of numbers
/// that say nothing to a script; `verify` checks them), with the sizes summed.
fn manifest_json(checkpoint: &Checkpoint, root: &str) -> serde_json::Value {
    let m = checkpoint.manifest();
    serde_json::json!({
        "uri": format!("{}/{}", root.trim_end_matches('/'), checkpoint.commit().dir()),
        "step": m.step,
        "save_id": m.save_id,
        "bundle": m.bundle,
        "topology": m.topology,
        "data_position": m.data_position,
        "metadata": m.metadata,
        "chunk_size": m.chunk_size,
        "bytes": m.objects.iter().map(|o| o.size).sum::<u64>(),
        "objects": m.objects.iter().map(|o| serde_json::json!({
            "name": o.name, "host": o.host, "size": o.size, "chunks": o.chunk_crc32c.len(),
        })).collect::<Vec<_>>(),
        "arrays": m.arrays.iter().map(|a| serde_json::json!({
            "name": a.name, "shape": a.shape, "dtype": a.dtype, "sharding": a.sharding, "shards": a.shards.len(),
        })).collect::<Vec<_>>(),
    })
}

async fn digest(uri: &str) -> Result<()> {
    use sha2::{Digest, Sha256};
    let (storage, log, dir) = open(uri)?;
    let commit = commit_of(uri, &log, dir).await?;
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await?;
    let mut state = Sha256::new();
    for array in &checkpoint.manifest().arrays {
        let bytes = checkpoint.read_region(&array.name, &mesh::Region::full(&array.shape)).await?;
        let sum = Sha256::digest(&bytes);
        state.update(array.name.as_bytes());
        state.update(sum);
        println!("{}  {}", hex::encode(sum), array.name);
    }
    println!("{}  state at step {}", hex::encode(state.finalize()), commit.step);
    Ok(())
}

async fn verify(uri: &str, json: bool) -> Result<()> {
    let (storage, log, dir) = open(uri)?;
    let commits = match dir {
        Some(_) => vec![commit_of(uri, &log, dir).await?],
        None => committed_newest_first(&log).await?,
    };
    if commits.is_empty() {
        bail!("no committed checkpoints under {uri}");
    }
    let mut failed = 0;
    let mut results = Vec::new();
    for commit in &commits {
        let at = format!("{}/{}", storage.url().trim_end_matches('/'), commit.dir());
        let checked = async {
            let checkpoint = Checkpoint::open(&storage, commit, &Limits::default()).await?;
            checkpoint.verify().await
        };
        let result = checked.await;
        match (&result, json) {
            (Ok(report), false) => println!(
                "ok       {at}: {} objects, {} chunks, {} bytes",
                report.objects, report.chunks, report.bytes
            ),
            (Err(e), false) => println!("CORRUPT  {at}: {e}"),
            (_, true) => {}
        }
        failed += usize::from(result.is_err());
        results.push(match result {
            Ok(report) => serde_json::json!({
                "uri": at, "step": commit.step, "ok": true, "objects": report.objects,
                "chunks": report.chunks, "bytes": report.bytes,
            }),
            Err(e) => {
                serde_json::json!({ "uri": at, "step": commit.step, "ok": false, "error": e.to_string() })
            }
        });
    }
    if json {
        println!("{}", serde_json::json!({ "ok": failed == 0, "checkpoints": results }));
    }
    if failed > 0 {
        let error =
            anyhow::anyhow!("{failed} of {} committed checkpoint(s) failed verification", commits.len());
        return Err(crate::exit::Classified::failed(error));
    }
    Ok(())
}

fn float_dtype(dtype: &str) -> Result<mesh::DType> {
    match dtype {
        "float32" => Ok(mesh::DType::Float32),
        "bfloat16" => Ok(mesh::DType::Bfloat16),
        other => bail!("--dtype {other}: write float32 or bfloat16"),
    }
}

/// The checkpoint `uri` names, or the newest committed one under the root it names.
async fn named_or_newest(uri: &str) -> Result<(Storage, Checkpoint)> {
    let (storage, log, dir) = open(uri)?;
    let commit = match dir {
        Some(_) => commit_of(uri, &log, dir).await?,
        None => committed_newest_first(&log)
            .await?
            .into_iter()
            .next()
            .with_context(|| format!("no committed checkpoint under {uri} to export"))?,
    };
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await?;
    Ok((storage, checkpoint))
}

async fn export(uri: &str, out: &std::path::Path, dtype: &str) -> Result<()> {
    let dtype = float_dtype(dtype)?;
    let (storage, checkpoint) = named_or_newest(uri).await?;
    let commit = checkpoint.commit().clone();
    let report = checkpoint::export::export_weights(&checkpoint, storage.url(), out, dtype).await?;
    let merged = match report.merged.len() {
        0 => String::new(),
        n => format!(", LoRA adapters merged into {n} weights ({})", report.merged.join(", ")),
    };
    println!(
        "wrote {} tensors of step {} to {} ({} bytes, {dtype}{merged})",
        report.tensors.len(),
        commit.step,
        out.display(),
        report.bytes
    );
    Ok(())
}

async fn export_hf(
    uri: &str,
    out: &std::path::Path,
    from: Option<&str>,
    dtype: Option<&str>,
    max_shard_bytes: u64,
) -> Result<()> {
    let dtype = float_dtype(dtype.unwrap_or("bfloat16"))?;
    let (storage, checkpoint) = named_or_newest(uri).await?;
    let from = from.map(String::from).or_else(|| hf::export::recorded_source(&checkpoint));
    let source = match &from {
        Some(dir) => Some(hf::Location::parse(dir, &StoreOptions::default()).with_context(|| {
            format!("the model directory to take config.json and the tokenizer from ({dir})")
        })?),
        None => None,
    };
    let options = hf::export::ExportOptions { dtype, max_shard_bytes };
    let report =
        hf::export::export_checkpoint(&checkpoint, storage.url(), out, source.as_ref(), &options).await?;
    let bytes: u64 = report.files.iter().map(|(_, b)| b).sum();
    let merged = match report.merged.len() {
        0 => String::new(),
        n => format!(", LoRA adapters merged into {n} weights"),
    };
    println!(
        "wrote {} ({} tensors of step {} in {} file(s), {bytes} bytes, {dtype}{merged}); copied {} from {}",
        out.display(),
        report.tensors,
        checkpoint.commit().step,
        report.files.len(),
        if report.copied.is_empty() { "nothing".to_string() } else { report.copied.join(", ") },
        from.as_deref().unwrap_or("no source directory (config.json made from the checkpoint's model)")
    );
    Ok(())
}

async fn import(model: &str, root: &str, dtype: &str) -> Result<()> {
    let dtype = float_dtype(dtype)?;
    let model = hf::HfModel::open(model, &StoreOptions::default()).await?;
    let storage = Storage::open(root, &StoreOptions::default())?;
    let report =
        hf::import::import_checkpoint(&model, &storage, &hf::import::ImportOptions { dtype }).await?;
    let at = format!("{}/{}", storage.url().trim_end_matches('/'), report.dir);
    if report.already {
        println!("{} is already imported at {at}", model.location().uri());
    } else {
        println!(
            "imported {} ({} parameters, {}) into {at}: {} arrays, {} bytes of parameters, written as {} shards",
            model.location().uri(),
            model.model().num_params(),
            dtype,
            report.arrays,
            report.param_bytes,
            report.writers
        );
    }
    Ok(())
}

async fn rm(uri: &str) -> Result<()> {
    let (storage, log, dir) = open(uri)?;
    let Some((step, save_id)) = dir else {
        bail!(
            "{uri} is not a checkpoint directory; name one as <root>/<step:012>-<save_id> (see `podctl ckpt list`)"
        )
    };
    let deleted = checkpoint::remove(&storage, &log, step, &save_id).await?;
    println!("removed {uri} ({deleted} objects)");
    Ok(())
}
