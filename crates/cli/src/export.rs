//! Exporting a job's bundle once, through the project's Python exporter, and caching it.
//!
//! The cache key is the SHA-256 of the exporter's sources and the export arguments, so a change
//! to either exports again and nothing else does.

use crate::toolchain::Toolchain;
use anyhow::{Context, Result, bail};
use job::JobSpec;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The exporter arguments that define a job's bundle (everything but `--out`).
pub fn export_args(job: &JobSpec, platform: &str) -> Vec<String> {
    let o = &job.optimizer;
    let t = &job.train;
    let mut levers = vec![("--attention", t.attention.clone())];
    if t.attention == "blockwise" || t.attention == "pallas" {
        levers.push(("--attention-block", t.attention_block.to_string()));
    }
    if let Some(lora) = &t.lora {
        levers.extend([
            ("--lora-rank", lora.rank.to_string()),
            ("--lora-alpha", lora.alpha.to_string()),
            ("--lora-targets", lora.targets.join(",")),
            ("--lora-base-dtype", lora.base_dtype.to_string()),
        ]);
    }
    // A preset by name, a Hugging Face model's shape as the manifest's model object. A loaded
    // spec always has its model's dimensions; without them the exporter refuses the name.
    let [model_flag, model] = match job.model_config() {
        Ok(config) => config.exporter_args(),
        Err(_) => ["--preset".to_string(), job.model.name()],
    };
    let mut args = vec![
        (model_flag.as_str(), model),
        ("--mesh", format!("fsdp={},tp={}", job.mesh.ici.fsdp, job.mesh.ici.tp)),
        ("--micro-batch", job.batch.micro.to_string()),
    ];
    match &job.grpo {
        None => {
            args.extend([
                ("--seq-len", job.seq_len.to_string()),
                ("--remat", t.remat.clone()),
                ("--loss-chunk", t.loss_chunk.to_string()),
            ]);
            // Held-out evaluation decodes through a `rollout` program with these buffers.
            if let Some(eval) = job.evaluation() {
                let (prompt_len, new_tokens) =
                    (eval.prompt_len.unwrap_or(0), eval.max_new_tokens.unwrap_or(0));
                args.extend([
                    ("--prompt-len", prompt_len.to_string()),
                    ("--max-new-tokens", new_tokens.to_string()),
                ]);
            }
        }
        // A GRPO row is prompt + completion (seq_len derived); its log-probs are chunked as
        // SFT's loss is.
        Some(g) => args.extend([
            ("--kind", "grpo".to_string()),
            ("--prompt-len", g.prompt_len.to_string()),
            ("--max-new-tokens", g.max_new_tokens.to_string()),
            ("--remat", t.remat.clone()),
            ("--logprob-chunk", t.loss_chunk.min(job.seq_len).to_string()),
            // A micro-batch holds whole groups (row r answers prompt r / generations), so each
            // prompt's forward and backward pass is computed once for its group.
            ("--prompt-group", prompt_group(job.batch.micro, g.generations).to_string()),
        ]),
    }
    args.extend([
        ("--param-dtype", t.param_dtype.to_string()),
        ("--compute-dtype", t.compute_dtype.to_string()),
        ("--platform", platform.to_string()),
        ("--b1", o.b1.to_string()),
        ("--b2", o.b2.to_string()),
        ("--eps", o.eps.to_string()),
        ("--weight-decay", o.weight_decay.to_string()),
        ("--max-grad-norm", o.max_grad_norm.to_string()),
    ]);
    args.extend(levers);
    let mut args: Vec<String> =
        args.into_iter().flat_map(|(flag, value)| [flag.to_string(), value]).collect();
    if t.offload() {
        args.push("--offload-optimizer".into());
    }
    args
}

/// The rows per prompt a GRPO bundle computes the prompt once for: the job's generations when
/// every micro-batch holds whole groups, else 1 (each row whole).
fn prompt_group(micro: u64, generations: u64) -> u64 {
    if generations > 1 && micro.is_multiple_of(generations) { generations } else { 1 }
}

/// Returns the cached bundle for `args`, exporting it first if needed.
pub fn ensure_bundle(tools: &Toolchain, args: &[String], on_export: impl FnOnce()) -> Result<PathBuf> {
    let key = cache_key(&tools.models_dir(), args)?;
    let dir = tools.cache.join("bundles").join(&key[..16]);
    if dir.join("manifest.json").exists() {
        return Ok(dir);
    }
    on_export();
    std::fs::create_dir_all(tools.cache.join("bundles"))
        .with_context(|| format!("creating the bundle cache {}", tools.cache.display()))?;
    let staging = tools.cache.join("bundles").join(format!(".{}-{}", &key[..16], std::process::id()));
    let output = Command::new(&tools.python)
        .args(["-m", "podctl_models.export"])
        .args(args)
        .arg("--out")
        .arg(&staging)
        .env("PYTHONPATH", tools.models_dir())
        .output()
        .with_context(|| format!("running the exporter with {}", tools.python.display()))?;
    if !output.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let message = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no message");
        bail!("exporting the bundle failed: {}", message.trim_start_matches("error: "));
    }
    // Rename into place so that a concurrent or interrupted export never leaves half a bundle.
    match std::fs::rename(&staging, &dir) {
        Ok(()) => Ok(dir),
        Err(_) if dir.join("manifest.json").exists() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(dir)
        }
        Err(e) => Err(e).with_context(|| format!("moving the bundle into {}", dir.display())),
    }
}

fn cache_key(models: &Path, args: &[String]) -> Result<String> {
    let mut files = Vec::new();
    collect_sources(&models.join("podctl_models"), &mut files)
        .with_context(|| format!("reading the exporter sources in {}", models.display()))?;
    files.sort();
    let mut hash = Sha256::new();
    for file in files {
        hash.update(file.strip_prefix(models).unwrap_or(&file).to_string_lossy().as_bytes());
        hash.update(std::fs::read(&file)?);
    }
    for arg in args {
        hash.update(arg.as_bytes());
        hash.update([0]);
    }
    Ok(hex::encode(hash.finalize()))
}

fn collect_sources(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_sources(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "py" || e == "json") {
            out.push(path);
        }
    }
    Ok(())
}
