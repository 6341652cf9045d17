//! A Hugging Face model's weights on a trainer's devices: each device gets its region of every
//! parameter, read from the model's safetensors and converted to the bundle's dtype by the `hf`
//! crate, then the train state starts from them with AdamW's moments and the gradients zero (a
//! run from pretrained weights starts its optimizer afresh, as one from another run's checkpoint
//! does after `Trainer::reset_optimizer`).
//!
//! From a local directory the devices whose shards read the same rows of the source tensors
//! (those differing only along the axis that splits the tensors' columns) are read together and
//! uploaded before the next group, so each mapped page is read once and the host holds a few
//! shards of one parameter beyond what the devices hold; from an object store a parameter's
//! shards for all devices are read together, so each byte is fetched once.
//!
//! A LoRA bundle's model weights are its frozen base; its adapters start from `init(seed)` (the
//! B matrices are zero, so training starts at the pretrained model).

use crate::error::{Part, PjrtContext, WorkerError};
use crate::slice::{Arg, DeviceArray, Program, Slice};
use crate::trainer::Trainer;
use ::hf::HfModel;
use bundle::{Manifest, ModelConfig, TensorSpec};
use mesh::Region;
use pjrt::HostBuffer;
use std::time::Instant;

/// What [`load`] placed.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// Parameters (or frozen base tensors) placed.
    pub tensors: usize,
    /// Bytes the slice's devices hold of them, replicas counted.
    pub device_bytes: u64,
    /// Wall time of the load.
    pub seconds: f64,
}

/// Places `model`'s weights on `trainer`'s devices and starts the train state from them:
/// AdamW's moments and the gradients zero (a LoRA bundle: the weights become the frozen base
/// and the adapters are `init(seed)`'s). The bundle must have been exported for the model's
/// dimensions. `runtime` runs the object-store reads.
pub fn load(
    trainer: &mut Trainer,
    model: &HfModel,
    seed: u32,
    runtime: &tokio::runtime::Handle,
) -> Result<Loaded, WorkerError> {
    let start = Instant::now();
    let arrays = place_weights(trainer.slice(), trainer.manifest(), model, runtime)?;
    let specs = weight_specs(trainer.manifest());
    let device_bytes = device_bytes(trainer.slice(), specs);
    let tensors = specs.len();
    if trainer.frozen_specs().is_empty() {
        trainer.start_from_params(arrays)?;
    } else {
        trainer.init(seed)?;
        trainer.set_frozen(arrays)?;
    }
    Ok(Loaded { tensors, device_bytes, seconds: start.elapsed().as_secs_f64() })
}

/// `model`'s weights on `slice`'s devices as the bundle of `manifest` lays them out: its
/// `params` (full fine-tuning) or its `frozen` base (LoRA), in the manifest's order, apart from
/// any train state (e.g. GRPO's frozen reference, or a forward pass alone).
pub fn place_weights(
    slice: &Slice,
    manifest: &Manifest,
    model: &HfModel,
    runtime: &tokio::runtime::Handle,
) -> Result<Vec<DeviceArray>, WorkerError> {
    check_model(manifest.model.clone(), model)?;
    let prefix = if manifest.frozen.is_empty() { "params/" } else { "frozen/" };
    place_tensors(slice, weight_specs(manifest), prefix, model, runtime)
}

/// `specs` (each `<prefix><podctl path>`, e.g. `params/layers/q_proj`, in the dtype and
/// sharding it names) filled from `model` on `slice`'s devices: the work of
/// [`place_weights`] without a bundle (the loading benchmark places a model this way).
pub fn place_tensors(
    slice: &Slice,
    specs: &[TensorSpec],
    prefix: &str,
    model: &HfModel,
    runtime: &tokio::runtime::Handle,
) -> Result<Vec<DeviceArray>, WorkerError> {
    let mesh = slice.mesh();
    let mut arrays = Vec::with_capacity(specs.len());
    for spec in specs {
        let path = spec.name.strip_prefix(prefix).ok_or_else(|| {
            WorkerError::broken(format!("'{}' is not a {prefix}* tensor of the bundle", spec.name))
        })?;
        let mut regions: Vec<Region> = Vec::new();
        for d in 0..mesh.num_devices() {
            let region = spec.sharding.shard_region(&spec.shape, mesh, d);
            if !regions.contains(&region) {
                regions.push(region);
            }
        }
        // Local: the regions that read the same source rows together (each page mapped once,
        // a few shards held at a time). Object store: every region at once (each byte fetched
        // once, the tensor's shards held until uploaded).
        let groups = match model.location().is_local() {
            true => model.shared_reads(path, &regions),
            false => vec![(0..regions.len()).collect()],
        };
        let mut read: Vec<Option<HostBuffer>> = (0..regions.len()).map(|_| None).collect();
        let array = slice.upload_each(spec, |_, region| {
            let i = regions.iter().position(|r| r == region).expect("every device's region is listed");
            if read[i].is_none() {
                let group = groups.iter().find(|g| g.contains(&i)).expect("groups cover the regions");
                let wanted: Vec<Region> = group.iter().map(|&j| regions[j].clone()).collect();
                // The devices' own memory: the CPU plugin takes these buffers over as they are.
                let mut bufs = wanted
                    .iter()
                    .map(|r| HostBuffer::zeroed(r.num_elements() as usize * spec.dtype.size()))
                    .collect::<Result<Vec<_>, _>>()
                    .context(|| format!("placing '{}'", spec.name))?;
                runtime.block_on(model.read_regions_into(
                    path,
                    &spec.shape,
                    spec.dtype,
                    &wanted,
                    &mut bufs,
                ))?;
                for (&j, b) in group.iter().zip(bufs) {
                    read[j] = Some(b);
                }
            }
            Ok(read[i].take().expect("just read"))
        })?;
        arrays.push(array);
    }
    Ok(arrays)
}

/// The tensors a model's weights fill: the parameters, or a LoRA bundle's frozen base.
fn weight_specs(manifest: &Manifest) -> &[TensorSpec] {
    if manifest.frozen.is_empty() { &manifest.params } else { &manifest.frozen }
}

/// Refuses a bundle lowered for other dimensions than the model's.
fn check_model(bundle: ModelConfig, model: &HfModel) -> Result<(), WorkerError> {
    let ours = ModelConfig { preset: model.model().preset.clone(), ..bundle };
    if ours != *model.model() {
        return Err(WorkerError::incompatible(
            Part::Model,
            format!(
                "the bundle was exported for model {ours:?}, but {} describes {:?}; export the bundle for this model",
                model.location().describe(::hf::config::CONFIG_FILE),
                model.model()
            ),
        ));
    }
    Ok(())
}

/// Bytes the slice's devices hold of `specs`, replicas counted.
pub fn device_bytes(slice: &Slice, specs: &[TensorSpec]) -> u64 {
    let mesh = slice.mesh();
    specs
        .iter()
        .map(|s| {
            let shard: u64 = s.sharding.shard_shape(&s.shape, mesh).iter().product();
            shard * s.dtype.size() as u64 * mesh.num_devices() as u64
        })
        .sum()
}

/// Full float32 logits `[rows, seq, vocab]` of `tokens` (`[rows, seq]` row-major, the bundle's
/// micro-batch and sequence length) through the bundle's optional `logits` program (`program`,
/// compiled from a bundle exported with it), under `weights`: the frozen base (LoRA) then the
/// parameters, as the program takes them.
pub fn logits(
    slice: &Slice,
    program: &Program,
    weights: &[&DeviceArray],
    tokens: &[i32],
) -> Result<Vec<f32>, WorkerError> {
    let inputs = &program.spec().inputs;
    let tokens =
        slice.upload(inputs.last().expect("logits takes the tokens last"), bytemuck::cast_slice(tokens))?;
    let mut args: Vec<Arg<'_>> = weights.iter().map(|w| Arg::Borrow(w)).collect();
    args.push(Arg::Borrow(&tokens));
    let out = program.run(args)?;
    let bytes = slice.download(&program.spec().outputs[0], &out[0])?;
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}
