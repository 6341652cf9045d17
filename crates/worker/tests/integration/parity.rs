//! The grad step run through podctl's PJRT path equals JAX's own execution of the same exported
//! program, on one device and sharded over (fsdp=2, tp=2).

use crate::support;
use bundle::TensorSpec;
use std::path::Path;
use worker::{Arg, Slice};

fn write_inputs(dir: &Path, inputs: &[Vec<u8>]) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, bytes) in inputs.iter().enumerate() {
        std::fs::write(dir.join(format!("{i}.bin")), bytes).unwrap();
    }
}

/// `max |ours - jax|` over a float32 output, relative to the output's scale `max(1, max |jax|)`:
/// float32 sums in a different order differ by a few ulps of the largest terms, so that is the
/// yardstick, not each (possibly cancelled-out) element.
fn relative_error(spec: &TensorSpec, ours: &[u8], jax: &[u8]) -> f64 {
    assert_eq!(ours.len(), jax.len(), "{} sizes differ", spec.name);
    let ours: &[f32] = bytemuck::cast_slice(ours);
    let jax: &[f32] = bytemuck::cast_slice(jax);
    let diff = ours.iter().zip(jax).map(|(&a, &b)| (a - b).abs() as f64).fold(0.0, f64::max);
    let scale = jax.iter().map(|&b| b.abs() as f64).fold(1.0, f64::max);
    diff / scale
}

fn grad_step_matches_jax(mesh: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = support::export_tiny(&tmp.path().join("bundle"), mesh, 4, 128);
    let slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    let init = slice.compile(&bundle, "init").unwrap();
    let zero_grads = slice.compile(&bundle, "zero_grads").unwrap();
    let grad_step = slice.compile(&bundle, "grad_step").unwrap();
    let n = bundle.manifest().params.len();

    let seed = slice.scalar(&init.spec().inputs[0], 42u32.to_le_bytes()).unwrap();
    let params: Vec<_> = init.run(vec![Arg::Borrow(&seed)]).unwrap().into_iter().take(n).collect();
    let grads = zero_grads.run(vec![]).unwrap();
    let batch = support::batch(4, 4, 128, 0, 0);
    assert!(batch.token_count() > 0);

    // Host copies of every input, in the program's order, for JAX.
    let specs = &grad_step.spec().inputs;
    let mut host: Vec<Vec<u8>> = Vec::new();
    for (spec, array) in specs.iter().zip(params.iter().chain(&grads)) {
        host.push(slice.download(spec, array).unwrap());
    }
    host.push(bytemuck::cast_slice(&batch.tokens).to_vec());
    host.push(bytemuck::cast_slice(&batch.targets).to_vec());
    host.push(bytemuck::cast_slice(&batch.loss_mask).to_vec());
    let uploaded: Vec<_> = (2 * n..2 * n + 3).map(|i| slice.upload(&specs[i], &host[i]).unwrap()).collect();

    let mut args: Vec<Arg<'_>> = params.iter().map(Arg::Borrow).collect();
    args.extend(grads.into_iter().map(Arg::Donate));
    args.extend(uploaded.iter().map(Arg::Borrow));
    let outputs = grad_step.run(args).unwrap();

    write_inputs(&tmp.path().join("in"), &host);
    let bundle_dir = bundle.dir().to_str().unwrap();
    let (input_dir, output_dir) = (tmp.path().join("in"), tmp.path().join("out"));
    support::python_module(
        "podctl_models.reference",
        &[
            "run",
            "--bundle",
            bundle_dir,
            "--program",
            "grad_step",
            "--inputs",
            input_dir.to_str().unwrap(),
            "--outputs",
            output_dir.to_str().unwrap(),
        ],
    );

    let mut worst = (0.0f64, String::new());
    for (i, (spec, array)) in grad_step.spec().outputs.iter().zip(&outputs).enumerate() {
        let ours = slice.download(spec, array).unwrap();
        let jax = std::fs::read(output_dir.join(format!("{i}.bin"))).unwrap();
        let error = relative_error(spec, &ours, &jax);
        if error > worst.0 {
            worst = (error, spec.name.clone());
        }
    }
    println!("mesh {mesh}: largest relative difference from JAX {:.2e} ({})", worst.0, worst.1);
    assert!(worst.0 <= 1e-5, "mesh {mesh}: {} differs from JAX by {:.3e}", worst.1, worst.0);
    let loss_sum = f32::from_le_bytes(
        slice.download(&grad_step.spec().outputs[n], &outputs[n]).unwrap().try_into().unwrap(),
    );
    assert!(loss_sum > 0.0 && loss_sum.is_finite(), "loss_sum {loss_sum}");
}

#[test]
fn grad_step_matches_jax_on_one_device() {
    grad_step_matches_jax("fsdp=1,tp=1");
}

#[test]
fn grad_step_matches_jax_sharded_over_fsdp2_tp2() {
    grad_step_matches_jax("fsdp=2,tp=2");
}
