//! The train state on device and the train step.
//!
//! Parameters, AdamW moments and the gradient accumulator live on device from `init` to the end
//! of the run. A step is `grad_step` once per micro-batch (each call adds its gradient into the
//! donated accumulator) and then `apply_step`, which consumes everything and hands back the new
//! state plus a zeroed accumulator in the same memory. Program signatures are the ones
//! docs/BUNDLE.md fixes and `bundle::Bundle::load` has checked, so positions are known here.
//!
//! A LoRA bundle's frozen base (`frozen/*`) is held beside the train state, not in it: `init`
//! produces it (or a restore places it), `grad_step` reads it, nothing ever writes it, and the
//! state that checkpoints and peers exchange is the adapters and their moments only.
//!
//! A GRPO bundle has `grpo_grad_step` in place of `grad_step`, plus `rollout` and `logprobs`;
//! the trainer compiles whichever set the bundle's kind has, and `crate::grpo` drives them. The
//! state, the accumulator, apply, checkpoints and state transfer are the same for both kinds.

use crate::error::{Part, WorkerError};
use crate::slice::{Arg, DeviceArray, Program, Slice};
use bundle::{Bundle, Manifest, TensorSpec};
use std::collections::HashMap;

/// What one optimizer step produced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AppliedStep {
    /// Summed loss over every micro-batch of the step (on this slice).
    pub loss_sum: f64,
    /// Target tokens that counted (on this slice).
    pub token_count: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
}

/// A slice's compiled programs and the train state they work on.
pub struct Trainer {
    slice: Slice,
    manifest: Manifest,
    bundle_id: String,
    init: Program,
    zero_grads: Program,
    /// `grad_step` (SFT) or `grpo_grad_step` (GRPO): parameters and the donated accumulator
    /// first, the accumulator plus scalar metrics out.
    pub(crate) grad_step: Program,
    apply_step: Program,
    /// Sampling (GRPO's rollouts, held-out evaluation of either kind), when the bundle has it.
    pub(crate) rollout: Option<Program>,
    /// GRPO's scoring program.
    pub(crate) grpo: Option<GrpoPrograms>,
    pub(crate) state: Option<State>,
    /// LoRA's frozen base, in the manifest's `frozen` order; empty for full fine-tuning (and
    /// before `init` or a restore of the base).
    frozen: Vec<DeviceArray>,
}

/// The program a GRPO bundle adds besides `rollout`.
pub(crate) struct GrpoPrograms {
    pub(crate) logprobs: Program,
}

pub(crate) struct State {
    pub(crate) params: Vec<DeviceArray>,
    mu: Vec<DeviceArray>,
    nu: Vec<DeviceArray>,
    pub(crate) grads: Vec<DeviceArray>,
    /// The scalar outputs of the grad steps since the last apply (`loss_sum`, `token_count`,
    /// and GRPO's metrics), read at apply time so the host never waits on the device between
    /// micro-batches.
    pub(crate) pending: Vec<Vec<DeviceArray>>,
}

impl Trainer {
    /// Compiles the bundle's training programs for the slice (in parallel: compiles dominate
    /// start-up): SFT's four (and `rollout` when it evaluates), or GRPO's six.
    pub fn new(slice: Slice, bundle: &Bundle) -> Result<Self, WorkerError> {
        let mut names: Vec<&str> = if bundle.manifest().train.kind == "grpo" {
            bundle::GRPO_PROGRAMS.to_vec()
        } else {
            bundle::TRAIN_PROGRAMS.to_vec()
        };
        if bundle.manifest().programs.contains_key("rollout") && !names.contains(&"rollout") {
            names.push("rollout");
        }
        let compiled: Vec<Result<Program, WorkerError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = names
                .iter()
                .map(|&name| {
                    let slice = &slice;
                    scope.spawn(move || slice.compile(bundle, name))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("compile thread panicked")).collect()
        });
        let mut programs: HashMap<&str, Program> = HashMap::new();
        for (name, program) in names.iter().zip(compiled) {
            programs.insert(name, program?);
        }
        let is_grpo = programs.contains_key("grpo_grad_step");
        let rollout = programs.remove("rollout");
        let mut take = |name: &str| programs.remove(name).expect("compiled above");
        let (grad_step, grpo) = match is_grpo {
            true => (take("grpo_grad_step"), Some(GrpoPrograms { logprobs: take("logprobs") })),
            false => (take("grad_step"), None),
        };
        Ok(Self {
            manifest: bundle.manifest().clone(),
            bundle_id: bundle.id().to_string(),
            init: take("init"),
            zero_grads: take("zero_grads"),
            apply_step: take("apply_step"),
            grad_step,
            rollout,
            grpo,
            slice,
            state: None,
            frozen: Vec::new(),
        })
    }

    /// The slice the trainer runs on.
    pub fn slice(&self) -> &Slice {
        &self.slice
    }

    /// The bundle's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The bundle's identity (hex), as checkpoints record it.
    pub fn bundle_id(&self) -> &str {
        &self.bundle_id
    }

    /// Exact per-device memory of the grad step (SFT's or GRPO's), the largest program.
    pub fn grad_step_memory(&self) -> Result<pjrt::MemoryStats, WorkerError> {
        self.grad_step.memory_stats()
    }

    /// Initializes parameters from `seed` and zeroes the optimizer state and gradients.
    pub fn init(&mut self, seed: u32) -> Result<(), WorkerError> {
        let seed = self.slice.scalar(&self.init.spec().inputs[0], seed.to_le_bytes())?;
        let mut out = self.init.run(vec![Arg::Borrow(&seed)])?.into_iter();
        let n = self.manifest.params.len();
        self.frozen = out.by_ref().take(self.manifest.frozen.len()).collect();
        let params = out.by_ref().take(n).collect();
        let mu = out.by_ref().take(n).collect();
        let nu = out.by_ref().take(n).collect();
        let grads = self.zero_grads.run(vec![])?;
        self.state = Some(State { params, mu, nu, grads, pending: Vec::new() });
        Ok(())
    }

    /// Adds one micro-batch's gradient to the accumulator.
    pub fn grad_step(&mut self, batch: &data::Batch) -> Result<(), WorkerError> {
        let train = &self.manifest.train;
        if self.grpo.is_some() {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                "this is a GRPO bundle: it learns from its own rollouts (crate::grpo), not from SFT batches; \
                 export an SFT bundle for supervised training",
            ));
        }
        if batch.rows as u64 != train.micro_batch || batch.seq_len as u64 != train.seq_len {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                format!(
                    "a batch of {}x{} does not fit the bundle's grad_step, lowered for micro_batch {} x seq_len {}",
                    batch.rows, batch.seq_len, train.micro_batch, train.seq_len
                ),
            ));
        }
        let state = self.state.as_mut().ok_or_else(not_initialized)?;
        let f = self.manifest.frozen.len();
        if self.frozen.len() != f {
            return Err(WorkerError::broken(
                "the LoRA bundle's frozen base is not on the devices; init or restore it first",
            ));
        }
        let n = self.manifest.params.len();
        let inputs = &self.grad_step.spec().inputs[f..];
        let tokens = self.slice.upload(&inputs[2 * n], bytemuck::cast_slice(&batch.tokens))?;
        let targets = self.slice.upload(&inputs[2 * n + 1], bytemuck::cast_slice(&batch.targets))?;
        let mask = self.slice.upload(&inputs[2 * n + 2], bytemuck::cast_slice(&batch.loss_mask))?;

        let mut args: Vec<Arg<'_>> = self.frozen.iter().map(Arg::Borrow).collect();
        args.extend(state.params.iter().map(Arg::Borrow));
        args.extend(std::mem::take(&mut state.grads).into_iter().map(Arg::Donate));
        args.extend([Arg::Borrow(&tokens), Arg::Borrow(&targets), Arg::Borrow(&mask)]);
        let mut out = self.grad_step.run(args)?;
        let metrics = out.split_off(n);
        state.grads = out;
        state.pending.push(metrics);
        Ok(())
    }

    /// Applies the accumulated gradient: AdamW step `step` (1-based) at `learning_rate`, with the
    /// summed gradient scaled by `grad_scale` (1 / the global batch's target tokens).
    pub fn apply(
        &mut self,
        step: u64,
        learning_rate: f32,
        grad_scale: f32,
    ) -> Result<AppliedStep, WorkerError> {
        let (loss_sum, token_count) = self.pending_metrics()?;
        let state = self.state.take().ok_or_else(not_initialized)?;
        let n = self.manifest.params.len();
        let inputs = &self.apply_step.spec().inputs;
        let step_index = i32::try_from(step).map_err(|_| {
            WorkerError::incompatible(Part::Job, format!("step {step} does not fit the program's int32 step"))
        })?;
        let step_arg = self.slice.scalar(&inputs[4 * n], step_index.to_le_bytes())?;
        let lr = self.slice.scalar(&inputs[4 * n + 1], learning_rate.to_le_bytes())?;
        let scale = self.slice.scalar(&inputs[4 * n + 2], grad_scale.to_le_bytes())?;

        let args: Vec<Arg<'_>> = [state.params, state.mu, state.nu, state.grads]
            .into_iter()
            .flatten()
            .map(Arg::Donate)
            .chain([Arg::Borrow(&step_arg), Arg::Borrow(&lr), Arg::Borrow(&scale)])
            .collect();
        let mut out = self.apply_step.run(args)?;
        let grad_norm = self.slice.read_f32(&out.pop().expect("signature checked"))?;
        let mut out = out.into_iter();
        let params = out.by_ref().take(n).collect();
        let mu = out.by_ref().take(n).collect();
        let nu = out.by_ref().take(n).collect();
        let grads = out.collect();
        self.state = Some(State { params, mu, nu, grads, pending: Vec::new() });
        Ok(AppliedStep { loss_sum, token_count, grad_norm })
    }

    /// The train state's arrays as [`Trainer::download_state`] gives them: name and byte length.
    pub fn state_layout(&self) -> Vec<(String, usize)> {
        self.state_specs().iter().map(|spec| (spec.name.clone(), spec.num_bytes() as usize)).collect()
    }

    /// The parameters and optimizer state on the devices, in the order of
    /// [`Trainer::state_specs`]: what a peer sends from.
    pub fn state_arrays(&self) -> Result<Vec<&DeviceArray>, WorkerError> {
        let state = self.state.as_ref().ok_or_else(not_initialized)?;
        Ok(state.params.iter().chain(&state.mu).chain(&state.nu).collect())
    }

    /// Copies the parameters and optimizer state to the host, named as in the bundle
    /// (`params/...`, `opt/mu/...`, `opt/nu/...`), each a whole row-major array.
    pub fn download_state(&self) -> Result<Vec<(String, Vec<u8>)>, WorkerError> {
        let state = self.state.as_ref().ok_or_else(not_initialized)?;
        let arrays = state.params.iter().chain(&state.mu).chain(&state.nu);
        self.state_specs()
            .iter()
            .zip(arrays)
            .map(|(spec, a)| Ok((spec.name.clone(), self.slice.download(spec, a)?)))
            .collect()
    }

    /// Replaces the parameters and optimizer state with host arrays named and laid out as
    /// [`Trainer::download_state`] gives them (a restore or a peer's state), and zeroes the
    /// gradients.
    pub fn upload_state(&mut self, arrays: &[(String, Vec<u8>)]) -> Result<(), WorkerError> {
        let specs = self.state_specs();
        if arrays.len() != specs.len() {
            return Err(WorkerError::broken(format!(
                "a state of {} arrays does not fit the bundle's {}",
                arrays.len(),
                specs.len()
            )));
        }
        let mut uploaded = Vec::with_capacity(specs.len());
        for (spec, (name, bytes)) in specs.iter().zip(arrays) {
            if *name != spec.name {
                return Err(WorkerError::broken(format!(
                    "state array '{name}' is where '{}' belongs",
                    spec.name
                )));
            }
            uploaded.push(self.slice.upload(spec, bytes)?);
        }
        self.set_state(uploaded)
    }

    /// The state's tensors (`params/...`, `opt/mu/...`, `opt/nu/...`) in the order of
    /// [`Trainer::download_state`], with their shapes, dtypes and shardings.
    pub fn state_specs(&self) -> &[TensorSpec] {
        &self.init.spec().outputs[self.manifest.frozen.len()..]
    }

    /// LoRA's frozen base (`frozen/...`), in the manifest's order; empty for full fine-tuning.
    pub fn frozen_specs(&self) -> &[TensorSpec] {
        &self.init.spec().outputs[..self.manifest.frozen.len()]
    }

    /// Whether the frozen base is on the devices (always, for full fine-tuning).
    pub fn has_frozen(&self) -> bool {
        self.frozen.len() == self.manifest.frozen.len()
    }

    /// Copies device `device`'s shard of frozen tensor `index` to the host.
    pub fn download_frozen_shard(&self, index: usize, device: usize) -> Result<Vec<u8>, WorkerError> {
        let (spec, array) = self.frozen_specs().get(index).zip(self.frozen.get(index)).ok_or_else(|| {
            WorkerError::broken(format!(
                "frozen tensor {index} is not on the devices; init or restore it first"
            ))
        })?;
        self.slice.download_shard(spec, array, device)
    }

    /// Copies frozen tensor `index` (whole, row-major) to the host.
    pub fn download_frozen(&self, index: usize) -> Result<Vec<u8>, WorkerError> {
        let (spec, array) = self.frozen_specs().get(index).zip(self.frozen.get(index)).ok_or_else(|| {
            WorkerError::broken(format!(
                "frozen tensor {index} is not on the devices; init or restore it first"
            ))
        })?;
        self.slice.download(spec, array)
    }

    /// Replaces the frozen base with arrays already on the slice, in the order of
    /// [`Trainer::frozen_specs`].
    pub fn set_frozen(&mut self, arrays: Vec<DeviceArray>) -> Result<(), WorkerError> {
        if arrays.len() != self.manifest.frozen.len() {
            return Err(WorkerError::broken(format!(
                "a frozen base of {} arrays does not fit the bundle's {}",
                arrays.len(),
                self.manifest.frozen.len()
            )));
        }
        self.frozen = arrays;
        Ok(())
    }

    /// Copies device `device`'s shard of state tensor `index` to the host.
    pub fn download_state_shard(&self, index: usize, device: usize) -> Result<Vec<u8>, WorkerError> {
        let state = self.state.as_ref().ok_or_else(not_initialized)?;
        let n = self.manifest.params.len();
        let spec = self.state_specs().get(index).ok_or_else(|| {
            WorkerError::broken(format!("state tensor {index} of {} does not exist", 3 * n))
        })?;
        let array = match index / n {
            0 => &state.params[index],
            1 => &state.mu[index - n],
            _ => &state.nu[index - 2 * n],
        };
        self.slice.download_shard(spec, array, device)
    }

    /// Replaces the parameters and optimizer state with arrays already on the slice, in the
    /// order of [`Trainer::state_specs`], and zeroes the gradients.
    pub fn set_state(&mut self, arrays: Vec<DeviceArray>) -> Result<(), WorkerError> {
        if self.manifest.train.optimizer_offload {
            // Uploads land in device memory; apply_step takes the moments in host memory.
            return Err(WorkerError::incompatible(
                Part::Bundle,
                "this bundle keeps AdamW state in host memory (train.optimizer_offload), and placing a \
                 restored state there is not supported yet; resume without optimizer offload",
            ));
        }
        let n = self.manifest.params.len();
        if arrays.len() != 3 * n {
            return Err(WorkerError::broken(format!(
                "a state of {} arrays does not fit the bundle's {}",
                arrays.len(),
                3 * n
            )));
        }
        let mut it = arrays.into_iter();
        let params = it.by_ref().take(n).collect();
        let mu = it.by_ref().take(n).collect();
        let nu = it.collect();
        let grads = self.zero_grads.run(vec![])?;
        self.state = Some(State { params, mu, nu, grads, pending: Vec::new() });
        Ok(())
    }

    /// The parameters on the devices, in the manifest's `params` order (to run a program of the
    /// bundle with them, e.g. the optional `logits`).
    pub fn params(&self) -> Result<&[DeviceArray], WorkerError> {
        Ok(&self.state.as_ref().ok_or_else(not_initialized)?.params)
    }

    /// LoRA's frozen base on the devices (empty for full fine-tuning).
    pub fn frozen(&self) -> &[DeviceArray] {
        &self.frozen
    }

    /// Starts the train state from parameters already on the slice (in the order of
    /// [`Trainer::state_specs`]' parameters: a Hugging Face model's, `crate::hf`), with AdamW's
    /// moments and the gradients zero: what `init` leaves, without its draw.
    pub fn start_from_params(&mut self, params: Vec<DeviceArray>) -> Result<(), WorkerError> {
        if self.manifest.train.optimizer_offload {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                "this bundle keeps AdamW state in host memory (train.optimizer_offload), and placing \
                 parameters loaded from files there is not supported yet; load without optimizer offload",
            ));
        }
        let n = self.manifest.params.len();
        if params.len() != n {
            return Err(WorkerError::broken(format!(
                "{} parameters do not fit the bundle's {n}",
                params.len()
            )));
        }
        // The moments and the accumulator have the parameters' shapes, dtypes and shardings.
        let mu = self.zero_grads.run(vec![])?;
        let nu = self.zero_grads.run(vec![])?;
        let grads = self.zero_grads.run(vec![])?;
        self.state = Some(State { params, mu, nu, grads, pending: Vec::new() });
        Ok(())
    }

    /// The parameters `init(seed)` makes, on the devices, apart from the train state.
    pub fn init_params(&self, seed: u32) -> Result<Vec<DeviceArray>, WorkerError> {
        let seed = self.slice.scalar(&self.init.spec().inputs[0], seed.to_le_bytes())?;
        let (f, n) = (self.manifest.frozen.len(), self.manifest.params.len());
        Ok(self.init.run(vec![Arg::Borrow(&seed)])?.into_iter().skip(f).take(n).collect())
    }

    /// Replaces AdamW's moments with zeros (`init`'s), keeping the parameters: a run that starts
    /// from another run's parameters (GRPO from an SFT checkpoint) starts its optimizer afresh,
    /// as its step count does.
    pub fn reset_optimizer(&mut self) -> Result<(), WorkerError> {
        let (f, n) = (self.manifest.frozen.len(), self.manifest.params.len());
        let seed = self.slice.scalar(&self.init.spec().inputs[0], 0u32.to_le_bytes())?;
        let mut fresh = self.init.run(vec![Arg::Borrow(&seed)])?.into_iter().skip(f + n);
        let state = self.state.as_mut().ok_or_else(not_initialized)?;
        state.mu = fresh.by_ref().take(n).collect();
        state.nu = fresh.collect();
        Ok(())
    }

    /// The gradient accumulator's tensors, in parameter order.
    pub fn grad_specs(&self) -> &[TensorSpec] {
        let n = self.manifest.params.len();
        &self.grad_step.spec().outputs[..n]
    }

    /// Copies gradient tensor `index` (whole, row-major) to the host.
    pub fn download_grad(&self, index: usize) -> Result<Vec<u8>, WorkerError> {
        let state = self.state.as_ref().ok_or_else(not_initialized)?;
        self.slice.download(&self.grad_specs()[index], &state.grads[index])
    }

    /// Starts a fresh accumulator (the previous one is dropped).
    pub fn zero_grads(&mut self) -> Result<(), WorkerError> {
        let grads = self.zero_grads.run(vec![])?;
        self.state.as_mut().ok_or_else(not_initialized)?.grads = grads;
        Ok(())
    }

    /// Forgets a step in flight: its accumulated gradient and metrics. The state stays at the
    /// last applied step.
    pub fn discard_step(&mut self) -> Result<(), WorkerError> {
        self.zero_grads()?;
        self.state.as_mut().ok_or_else(not_initialized)?.pending.clear();
        Ok(())
    }

    /// Replaces the accumulator with host tensors (the sums of an all-reduce).
    pub fn upload_grads(&mut self, grads: &[Vec<u8>]) -> Result<(), WorkerError> {
        let uploaded: Vec<DeviceArray> = self
            .grad_specs()
            .iter()
            .zip(grads)
            .map(|(spec, bytes)| self.slice.upload(spec, bytes))
            .collect::<Result<_, _>>()?;
        self.state.as_mut().ok_or_else(not_initialized)?.grads = uploaded;
        Ok(())
    }

    /// Micro-batch metrics accumulated since the last apply: `(loss_sum, token_count)`.
    pub fn pending_metrics(&self) -> Result<(f64, f64), WorkerError> {
        let (mut loss_sum, mut token_count) = (0.0f64, 0.0f64);
        for outputs in self.pending_outputs()? {
            loss_sum += outputs[0] as f64;
            token_count += outputs[1] as f64;
        }
        Ok((loss_sum, token_count))
    }

    /// The scalar outputs of each grad step since the last apply, in call order.
    pub(crate) fn pending_outputs(&self) -> Result<Vec<Vec<f32>>, WorkerError> {
        let state = self.state.as_ref().ok_or_else(not_initialized)?;
        state.pending.iter().map(|outputs| outputs.iter().map(|a| self.slice.read_f32(a)).collect()).collect()
    }
}

pub(crate) fn not_initialized() -> WorkerError {
    WorkerError::broken("the train state is not initialized; call init first")
}
