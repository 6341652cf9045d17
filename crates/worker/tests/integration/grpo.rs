//! GRPO's programs run through podctl's PJRT path equal JAX's own execution of the same exported
//! programs: one step's rollout (sampled, top-p), the reference's log-probs and the clipped,
//! KL-penalized grad step, sharded over (fsdp=2, tp=2) (the SFT parity test covers one device
//! too; every JAX run costs a Python start). The batch is laid out here from docs/BUNDLE.md,
//! independently of `worker::grpo`.

use crate::support;
use bundle::{Bundle, TensorSpec};
use std::path::Path;
use worker::{Arg, DeviceArray, Program, Slice};

const ROWS: usize = 4;
const PROMPT: usize = 8;
const NEW: usize = 8;
const SEQ: usize = PROMPT + NEW;
const PAD: i32 = 0;
const EOS: i32 = 2;

fn export_grpo(dir: &Path, mesh: &str) -> Bundle {
    let out = dir.to_str().expect("utf-8 path");
    let (rows, prompt, new) = (ROWS.to_string(), PROMPT.to_string(), NEW.to_string());
    support::python_module(
        "podctl_models.export",
        &[
            "--kind",
            "grpo",
            "--preset",
            "tiny",
            "--mesh",
            mesh,
            "--micro-batch",
            &rows,
            "--prompt-len",
            &prompt,
            "--max-new-tokens",
            &new,
            "--logprob-chunk",
            "4",
            "--out",
            out,
        ],
    );
    Bundle::load(dir).expect("exported bundle loads")
}

/// JAX's outputs of `program` for these host inputs (in the program's order).
fn jax_run(bundle: &Bundle, dir: &Path, program: &str, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let (input_dir, output_dir) = (dir.join(format!("{program}-in")), dir.join(format!("{program}-out")));
    std::fs::create_dir_all(&input_dir).unwrap();
    for (i, bytes) in inputs.iter().enumerate() {
        std::fs::write(input_dir.join(format!("{i}.bin")), bytes).unwrap();
    }
    support::python_module(
        "podctl_models.reference",
        &[
            "run",
            "--bundle",
            bundle.dir().to_str().unwrap(),
            "--program",
            program,
            "--inputs",
            input_dir.to_str().unwrap(),
            "--outputs",
            output_dir.to_str().unwrap(),
        ],
    );
    let outputs = bundle.program(program).unwrap().outputs.len();
    (0..outputs).map(|i| std::fs::read(output_dir.join(format!("{i}.bin"))).unwrap()).collect()
}

/// Runs `program` on the slice with `params` first and host `rest` after (donating nothing but
/// what the manifest donates, which only `grads` are); returns host outputs and the host inputs.
fn rust_run(
    slice: &Slice,
    program: &Program,
    arrays: Vec<Arg<'_>>,
    rest: &[Vec<u8>],
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let specs = &program.spec().inputs;
    let first = arrays.len();
    let mut host_inputs = Vec::new();
    for (spec, arg) in specs.iter().zip(&arrays) {
        let array = match arg {
            Arg::Borrow(a) => *a,
            Arg::Donate(a) => a,
        };
        host_inputs.push(slice.download(spec, array).unwrap());
    }
    let uploaded: Vec<DeviceArray> =
        rest.iter().enumerate().map(|(i, bytes)| slice.upload(&specs[first + i], bytes).unwrap()).collect();
    host_inputs.extend(rest.iter().cloned());
    let mut args = arrays;
    args.extend(uploaded.iter().map(Arg::Borrow));
    let outputs = program.run(args).unwrap();
    let host = program
        .spec()
        .outputs
        .iter()
        .zip(&outputs)
        .map(|(spec, a)| slice.download(spec, a).unwrap())
        .collect();
    (host, host_inputs)
}

/// `max |ours - jax|` over a float32 output relative to `max(1, max |jax|)` (see parity.rs).
fn relative_error(spec: &TensorSpec, ours: &[u8], jax: &[u8]) -> f64 {
    assert_eq!(ours.len(), jax.len(), "{} sizes differ", spec.name);
    let ours: Vec<f32> = bytemuck::pod_collect_to_vec(ours);
    let jax: Vec<f32> = bytemuck::pod_collect_to_vec(jax);
    let diff = ours
        .iter()
        .zip(&jax)
        .map(|(&a, &b)| if a == b { 0.0 } else { (a - b).abs() as f64 })
        .fold(0.0, f64::max);
    let scale = jax.iter().filter(|b| b.is_finite()).map(|&b| b.abs() as f64).fold(1.0, f64::max);
    diff / scale
}

fn compare(what: &str, specs: &[TensorSpec], ours: &[Vec<u8>], jax: &[Vec<u8>]) -> f64 {
    let mut worst = 0.0f64;
    for ((spec, a), b) in specs.iter().zip(ours).zip(jax) {
        let error = match spec.dtype {
            mesh::DType::Float32 => relative_error(spec, a, b),
            _ => {
                assert!(a == b, "{what}: {} differs from JAX", spec.name);
                0.0
            }
        };
        assert!(error <= 1e-5, "{what}: {} differs from JAX by {error:.3e}", spec.name);
        worst = worst.max(error);
    }
    worst
}

fn bytes<T: bytemuck::Pod>(values: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

fn scalar_f32(value: f32) -> Vec<u8> {
    value.to_le_bytes().to_vec()
}

fn grpo_step_matches_jax(mesh: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = export_grpo(&tmp.path().join("bundle"), mesh);
    let slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    let [init, zero_grads, rollout, logprobs, grad_step] =
        ["init", "zero_grads", "rollout", "logprobs", "grpo_grad_step"]
            .map(|p| slice.compile(&bundle, p).unwrap());
    let n = bundle.manifest().params.len();
    let params_of = |seed: u32| -> Vec<DeviceArray> {
        let seed = slice.scalar(&init.spec().inputs[0], seed.to_le_bytes()).unwrap();
        init.run(vec![Arg::Borrow(&seed)]).unwrap().into_iter().take(n).collect()
    };
    let (policy, reference) = (params_of(42), params_of(7));

    // Rollout: left-padded prompts of 8, 5, 3 and 1 tokens, one seed per row, T = 1, top-p 0.9.
    let lengths: [i32; ROWS] = [8, 5, 3, 1];
    let mut prompts = vec![PAD; ROWS * PROMPT];
    for (row, &len) in lengths.iter().enumerate() {
        for c in PROMPT - len as usize..PROMPT {
            prompts[row * PROMPT + c] = 3 + ((row * 31 + c * 17) % 120) as i32;
        }
    }
    let sampling = [
        bytes(&prompts),
        bytes(&lengths),
        bytes(&[11u32, 12, 13, 14]),
        scalar_f32(1.0),
        scalar_f32(0.9),
        // `sample/stop_ids`: EOS in the first of the 8 slots, the others unused.
        bytes(&[EOS, -1, -1, -1, -1, -1, -1, -1]),
        PAD.to_le_bytes().to_vec(),
    ];
    let (ours, inputs) = rust_run(&slice, &rollout, policy.iter().map(Arg::Borrow).collect(), &sampling);
    let jax = jax_run(&bundle, tmp.path(), "rollout", &inputs);
    let mut worst = compare("rollout", &rollout.spec().outputs, &ours, &jax);
    let completion: Vec<i32> = bytemuck::pod_collect_to_vec(&ours[0]);
    let completion_lengths: Vec<i32> = bytemuck::pod_collect_to_vec(&ours[1]);
    let sample_logprobs: Vec<f32> = bytemuck::pod_collect_to_vec(&ours[2]);

    // Full rows, targets and the mask of the completion's targets (docs/BUNDLE.md, row layout).
    let mut tokens = vec![PAD; ROWS * SEQ];
    let mut targets = vec![PAD; ROWS * SEQ];
    let mut mask = vec![0f32; ROWS * SEQ];
    let mut old = vec![0f32; ROWS * SEQ];
    for row in 0..ROWS {
        tokens[row * SEQ..row * SEQ + PROMPT].copy_from_slice(&prompts[row * PROMPT..(row + 1) * PROMPT]);
        tokens[row * SEQ + PROMPT..(row + 1) * SEQ].copy_from_slice(&completion[row * NEW..(row + 1) * NEW]);
        for c in 0..SEQ - 1 {
            targets[row * SEQ + c] = tokens[row * SEQ + c + 1];
        }
        for t in 0..completion_lengths[row] as usize {
            mask[row * SEQ + PROMPT - 1 + t] = 1.0;
            // The sampler's log-probs, moved off-policy by up to +-0.4 so that some ratios clip.
            old[row * SEQ + PROMPT - 1 + t] = sample_logprobs[row * NEW + t] + 0.4 * ((t % 3) as f32 - 1.0);
        }
    }
    let rows = [bytes(&tokens), bytes(&targets), bytes(&lengths), scalar_f32(1.0)];
    let (ours, inputs) = rust_run(&slice, &logprobs, reference.iter().map(Arg::Borrow).collect(), &rows);
    let jax = jax_run(&bundle, tmp.path(), "logprobs", &inputs);
    worst = worst.max(compare("logprobs", &logprobs.spec().outputs, &ours, &jax));
    let reference_logprobs = ours[0].clone();

    let objective = [
        bytes(&tokens),
        bytes(&targets),
        bytes(&lengths),
        bytes(&mask),
        bytes(&[1.0f32, -1.0, 0.5, -0.5]),
        bytes(&old),
        reference_logprobs,
        scalar_f32(1.0),
        scalar_f32(0.2),
        scalar_f32(0.28),
        scalar_f32(0.1),
    ];
    let mut arrays: Vec<Arg<'_>> = policy.iter().map(Arg::Borrow).collect();
    arrays.extend(zero_grads.run(vec![]).unwrap().into_iter().map(Arg::Donate));
    let (ours, inputs) = rust_run(&slice, &grad_step, arrays, &objective);
    let jax = jax_run(&bundle, tmp.path(), "grpo_grad_step", &inputs);
    worst = worst.max(compare("grpo_grad_step", &grad_step.spec().outputs, &ours, &jax));

    let metric = |i: usize| f32::from_le_bytes(ours[n + i].clone().try_into().unwrap());
    let (loss_sum, token_count, kl_sum, clipped) = (metric(0), metric(1), metric(2), metric(3));
    println!(
        "mesh {mesh}: largest relative difference from JAX {worst:.2e}; loss_sum {loss_sum}, tokens {token_count}, \
         kl_sum {kl_sum}, clipped {clipped}"
    );
    assert_eq!(token_count, completion_lengths.iter().sum::<i32>() as f32);
    assert!(kl_sum > 0.0 && clipped > 0.0 && loss_sum.is_finite(), "the step exercises KL and clipping");
}

#[test]
fn grpo_step_matches_jax_sharded_over_fsdp2_tp2() {
    grpo_step_matches_jax("fsdp=2,tp=2");
}
