//! Micro-batches per second for the synthetic arithmetic task (micro_batch 32, seq_len 128,
//! character tokenizer): the loader must be far faster than a train step.
//!
//! `cargo run --release -p podctl-data --example loader_throughput [micro-batches]`

use anyhow::Context;
use podctl_data::{ArithmeticConfig, BatchSpec, DataConfig, Loader};
use std::hint::black_box;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let count: u64 = match std::env::args().nth(1) {
        Some(arg) => arg.parse().with_context(|| format!("micro-batch count {arg:?} is not a number"))?,
        None => 5_000,
    };
    let (micro_batch, seq_len) = (32, 128);
    let spec = BatchSpec::new(micro_batch * 8, micro_batch, seq_len)?;
    let loader = Loader::from_config(
        &DataConfig::Arithmetic(ArithmeticConfig::default()),
        spec,
        0,
        &podctl_data::LocalFiles,
    )?;
    let per_step = spec.micro_batches_per_step();

    let start = Instant::now();
    let (mut tokens, mut truncated) = (0u64, 0usize);
    for i in 0..count {
        let batch = loader.micro_batch(i / per_step, i % per_step)?;
        tokens += batch.token_count();
        truncated += batch.truncated_rows;
        black_box(&batch);
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "arithmetic/char micro_batch {micro_batch} seq_len {seq_len}: {count} micro-batches in {seconds:.3} s = \
         {:.0} micro-batches/s ({:.0} examples/s, {:.1} answer tokens/row, {truncated} truncated rows)",
        count as f64 / seconds,
        (count * micro_batch as u64) as f64 / seconds,
        tokens as f64 / (count * micro_batch as u64) as f64,
    );

    let start = Instant::now();
    for step in 0..count / per_step {
        black_box(loader.prompts(step, 0)?);
    }
    let seconds = start.elapsed().as_secs_f64();
    println!("arithmetic prompts (GRPO): {:.0} micro-batches/s", (count / per_step) as f64 / seconds);
    Ok(())
}
