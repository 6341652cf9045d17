//! Prints the prompts a GRPO job's steps sample from, in podctl's order, one JSON line per
//! prompt: `{"step", "prompt", "tokens", "answer"}`, `tokens` being the ids the rollout sees
//! (the prompt as the job's `Prompter` lays it out, the last `grpo.prompt_len` of them when
//! longer, as `GrpoTask` cuts).
//!
//! `cargo run --release -p podctl-worker --example grpo_prompts -- JOB.yaml STEPS`
//!
//! The TRL side of `scripts/bench/grpo_vs_trl.sh` trains on exactly these prompts, so both sides
//! see the same texts and lengths at every step.

use data::{BatchSpec, Loader};
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [spec, steps] = args.as_slice() else {
        return Err("usage: grpo_prompts JOB.yaml STEPS".into());
    };
    let steps: u64 = steps.parse().map_err(|e| format!("STEPS {steps}: {e}"))?;
    let job = job::JobSpec::load(Path::new(spec))?;
    let grpo = job.grpo.as_ref().ok_or_else(|| format!("{spec} has no grpo: section"))?;
    let per_step = job.batch.global / grpo.generations;
    let loader = Loader::from_config(
        &job.data,
        BatchSpec::new(per_step as usize, 1, job.seq_len as usize)?,
        job.seed,
        &data::LocalFiles,
    )?;
    let prompter = loader.prompter().ok_or("the job's data has no tokenizer")?;
    let keep = grpo.prompt_len as usize;
    for step in 0..steps {
        for prompt in 0..per_step {
            let example = loader.prompts(step, prompt)?.remove(0);
            let tokens = prompter.prompt_ids(&example.prompt)?;
            let tokens = &tokens[tokens.len().saturating_sub(keep)..];
            let line = serde_json::json!({
                "step": step,
                "prompt": example.prompt.display(),
                "tokens": tokens,
                "answer": example.answer,
            });
            println!("{line}");
        }
    }
    Ok(())
}
