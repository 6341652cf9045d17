//! The Rust worker's steady-state step time next to JAX's own jit loop running the same exported
//! programs on the same CPU devices, measured in one run, as ratios (goal: <= 1.0 at equal
//! compiler settings).
//!
//! `cargo bench -p podctl-worker --bench step_time [-- --steps N --trials T --mesh fsdp=2,tp=2
//! --clients jaxlib,jaxlib-no-ynn,plugin]`
//!
//! Both sides run `accum` grad steps and one apply step per step with the state on device; the
//! Rust side also builds and uploads every micro-batch from the data loader, as training does,
//! while JAX's loop reuses one batch already on device. Trials alternate between the sides so
//! that background load hits all alike; each side's best trial is reported.
//!
//! The gap between two XLA CPU clients is mostly their compilers' defaults, not their runtimes:
//! jaxlib's own CPU client hands dots (and what fuses around them) to YNNPACK, while podctl runs
//! the `xla_cpu_pjrt` plugin build with the compile options `pjrt` sets. So JAX runs on three
//! clients (`podctl_models.reference bench --client`): `jaxlib` (its defaults), `jaxlib-no-ynn`
//! (`XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`) and `plugin` (plain `jax.jit` on the
//! very plugin podctl loads, the like-with-like runtime comparison). Whatever `XLA_FLAGS` the
//! bench itself is started with reaches both sides (the plugin reads it too).

#[path = "../tests/integration/support.rs"]
mod support;

extern crate podctl_worker as worker;

use std::time::Instant;
use worker::{Slice, Trainer};

struct Args {
    mesh: String,
    micro_batch: u64,
    seq_len: u64,
    accum: u64,
    steps: u64,
    trials: u64,
    clients: Vec<String>,
}

fn parse_args() -> Args {
    let mut args = Args {
        mesh: "fsdp=2,tp=2".into(),
        micro_batch: 16,
        seq_len: 128,
        accum: 2,
        steps: 20,
        trials: 3,
        clients: ["jaxlib", "jaxlib-no-ynn", "plugin"].map(String::from).to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--mesh" => args.mesh = value(),
            "--micro-batch" => args.micro_batch = value().parse().expect("integer"),
            "--seq-len" => args.seq_len = value().parse().expect("integer"),
            "--accum" => args.accum = value().parse().expect("integer"),
            "--steps" => args.steps = value().parse().expect("integer"),
            "--trials" => args.trials = value().parse().expect("integer"),
            "--clients" => args.clients = value().split(',').map(String::from).collect(),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// Mean wall time of `steps` steps after two warm-up steps, in milliseconds.
fn rust_trial(trainer: &mut Trainer, args: &Args) -> f64 {
    let global = (args.micro_batch * args.accum) as usize;
    let mb = args.micro_batch as usize;
    let sl = args.seq_len as usize;
    let mut measured = Vec::new();
    for step in 0..args.steps + 2 {
        let started = Instant::now();
        let mut tokens = 0;
        for micro in 0..args.accum {
            let batch = support::batch(global, mb, sl, step, micro);
            tokens += batch.token_count();
            trainer.grad_step(&batch).expect("grad step");
        }
        trainer.apply(step + 1, 1e-3, 1.0 / tokens as f32).expect("apply");
        if step >= 2 {
            measured.push(started.elapsed().as_secs_f64());
        }
    }
    1000.0 * measured.iter().sum::<f64>() / measured.len() as f64
}

fn jax_trial(bundle: &std::path::Path, args: &Args, client: &str) -> f64 {
    let out = support::python_module(
        "podctl_models.reference",
        &[
            "bench",
            "--bundle",
            bundle.to_str().unwrap(),
            "--steps",
            &args.steps.to_string(),
            "--accum",
            &args.accum.to_string(),
            "--client",
            client,
        ],
    );
    let line = out.lines().last().expect("bench prints JSON");
    let value: serde_json::Value = serde_json::from_str(line).expect("bench JSON");
    value["step_ms"].as_f64().expect("step_ms")
}

fn main() {
    // The malloc settings `podctl launch` and `podctl worker` run with; the JAX children inherit
    // them, so both sides allocate alike.
    pjrt::restart_with_malloc_for_xla();
    let args = parse_args();
    let dir = support::root()
        .join("target/bench-bundles")
        .join(format!("tiny-{}-{}x{}", args.mesh, args.micro_batch, args.seq_len));
    let bundle = if dir.join("manifest.json").exists() {
        bundle::Bundle::load(&dir).expect("cached bundle loads")
    } else {
        support::export_tiny(&dir, &args.mesh, args.micro_batch, args.seq_len)
    };
    let slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).expect("client");
    let mut trainer = Trainer::new(slice, &bundle).expect("compile");
    trainer.init(0).expect("init");

    println!(
        "step time, tiny model, mesh {}, {} x {} micro-batches of {} tokens, {} steps per trial",
        args.mesh, args.accum, args.micro_batch, args.seq_len, args.steps
    );
    println!("XLA_FLAGS for both sides: {:?}", std::env::var("XLA_FLAGS").unwrap_or_default());
    println!("GLIBC_TUNABLES for both sides: {:?}", std::env::var("GLIBC_TUNABLES").unwrap_or_default());
    let mut rust_best = f64::INFINITY;
    let mut jax_best = vec![f64::INFINITY; args.clients.len()];
    for trial in 1..=args.trials {
        let rust = rust_trial(&mut trainer, &args);
        rust_best = rust_best.min(rust);
        let mut line = format!("trial {trial}: podctl worker {rust:8.2} ms/step");
        for (best, client) in jax_best.iter_mut().zip(&args.clients) {
            let jax = jax_trial(bundle.dir(), &args, client);
            *best = best.min(jax);
            line += &format!("   JAX on {client} {jax:8.2} ({:.3})", rust / jax);
        }
        println!("{line}");
    }
    println!("best:    podctl worker {rust_best:8.2} ms/step");
    for (best, client) in jax_best.iter().zip(&args.clients) {
        println!(
            "         JAX jit loop on {client:14} {best:8.2} ms/step   podctl / JAX {:.3}",
            rust_best / best
        );
    }
}
