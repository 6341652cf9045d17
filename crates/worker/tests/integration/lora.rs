//! LoRA end to end on the CPU plugin: a job with `train.lora` trains through `worker::single::run`,
//! only the adapters change, the checkpoints hold the adapters and their moments while the
//! frozen base is saved once apart from them, a resume places both again, and the exported
//! weights (adapters merged into the base) are the same model.

use crate::support;
use checkpoint::{Checkpoint, Limits, Storage, StoreCommitLog, StoreOptions, committed_newest_first};
use job::JobSpec;
use mesh::Region;
use std::path::Path;
use worker::ckpt::BASE_DIR;
use worker::single::Resume;
use worker::{Sink, Slice, StepResult, Trainer};

const SEQ_LEN: u64 = 128;

fn job(root: &Path, steps: u64) -> JobSpec {
    let yaml = format!(
        "name: lora\nmodel: tiny\nmesh: {{ ici: {{ fsdp: 2, tp: 2 }} }}\nbatch: {{ global: 8, micro: 4 }}\n\
         seq_len: {SEQ_LEN}\nsteps: {steps}\nseed: 5\noptimizer: {{ lr: 2.0e-2, warmup_steps: 2 }}\n\
         data: {{ kind: arithmetic }}\n\
         train: {{ loss_chunk: 16, lora: {{ rank: 4, alpha: 8, targets: [q_proj, v_proj, down_proj] }} }}\n\
         checkpoint: {{ every: 5, uri: 'file://{}' }}\n",
        root.display()
    );
    JobSpec::from_yaml(&yaml, Path::new("lora.yaml")).unwrap()
}

fn export(dir: &Path) -> bundle::Bundle {
    let out = dir.to_str().unwrap();
    support::python_module(
        "podctl_models.export",
        &[
            "--preset",
            "tiny",
            "--mesh",
            "fsdp=2,tp=2",
            "--micro-batch",
            "4",
            "--seq-len",
            "128",
            "--loss-chunk",
            "16",
            "--lora-rank",
            "4",
            "--lora-alpha",
            "8",
            "--lora-targets",
            "q_proj,v_proj,down_proj",
            "--out",
            out,
        ],
    );
    bundle::Bundle::load(dir).unwrap()
}

struct Losses(Vec<f64>);

impl Sink for Losses {
    fn on_step(&mut self, step: &StepResult) {
        self.0.push(step.loss());
    }
}

fn frozen(trainer: &Trainer) -> Vec<Vec<u8>> {
    (0..trainer.frozen_specs().len()).map(|i| trainer.download_frozen(i).unwrap()).collect()
}

fn loader(job: &JobSpec) -> data::Loader {
    let spec =
        data::BatchSpec::new(job.batch.global as usize, job.batch.micro as usize, job.seq_len as usize)
            .unwrap();
    data::Loader::from_config(&job.data, spec, job.seed, &data::LocalFiles).unwrap()
}

#[test]
fn lora_trains_only_its_adapters_and_saves_the_base_once_apart() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let bundle = export(&tmp.path().join("bundle"));
    let manifest = bundle.manifest();
    assert_eq!(manifest.params.len(), 6, "two adapters on each of three projections");
    assert_eq!(manifest.frozen.len(), 13, "the whole model, frozen");
    let root = tmp.path().join("ckpt");
    let job = job(&root, 12);

    let slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    let mut trainer = Trainer::new(slice, &bundle).unwrap();
    trainer.init(worker::start::init_seed(job.seed)).unwrap();
    let base_before = frozen(&trainer);
    let adapters_before = trainer.download_state().unwrap();

    let mut losses = Losses(Vec::new());
    let summary = worker::single::run(
        &mut trainer,
        &job,
        &mut losses,
        &Resume::Newest,
        &worker::driver::Uninterrupted,
        runtime.handle(),
    )
    .unwrap();
    assert_eq!(summary.trained.steps(), 12);
    let (first, last) = (losses.0[0], losses.0[losses.0.len() - 1]);
    assert!(last < 0.9 * first, "LoRA trains: {:?}", losses.0);

    // The base is bitwise what init drew; every adapter moved (B starts at zero).
    assert!(frozen(&trainer) == base_before, "the frozen base changed during training");
    let adapters_after = trainer.download_state().unwrap();
    for ((name, before), (_, after)) in adapters_before.iter().zip(&adapters_after) {
        if name.starts_with("params/") {
            assert!(before != after, "{name} did not train");
        }
        if name.ends_with(".lora_b") && name.starts_with("params/") {
            assert!(before.iter().all(|&b| b == 0), "{name} starts at zero");
        }
    }

    // Checkpoints: the adapters and their moments; the base once, under <root>/base.
    let storage = Storage::open(&format!("file://{}", root.display()), &StoreOptions::default()).unwrap();
    let commits = runtime.block_on(committed_newest_first(&StoreCommitLog::new(storage.clone()))).unwrap();
    assert_eq!(commits.iter().map(|c| c.step).collect::<Vec<_>>(), [12, 10, 5]);
    let newest = runtime.block_on(Checkpoint::open(&storage, &commits[0], &Limits::default())).unwrap();
    let names: Vec<&str> = newest.manifest().arrays.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names.len(), 3 * 6);
    assert!(names.iter().all(|n| n.contains(".lora_")), "{names:?}");
    let lora = &newest.manifest().metadata["lora"];
    assert_eq!((lora["rank"].as_u64(), lora["alpha"].as_f64()), (Some(4), Some(8.0)));
    let base_dir = lora["base"].as_str().unwrap();
    assert!(base_dir.starts_with(&format!("{BASE_DIR}/000000000000-base-")), "{base_dir}");
    let base_storage =
        Storage::open(&format!("file://{}/{BASE_DIR}", root.display()), &StoreOptions::default()).unwrap();
    let base_commits =
        runtime.block_on(committed_newest_first(&StoreCommitLog::new(base_storage.clone()))).unwrap();
    assert_eq!(base_commits.len(), 1, "one base for the whole run");
    let base =
        runtime.block_on(Checkpoint::open(&base_storage, &base_commits[0], &Limits::default())).unwrap();
    for (spec, before) in trainer.frozen_specs().iter().zip(&base_before) {
        let whole = Region::new(spec.shape.iter().map(|&d| 0..d).collect());
        let saved = runtime.block_on(base.read_region(&spec.name, &whole)).unwrap();
        assert!(saved == *before, "{} differs in the base checkpoint", spec.name);
    }

    // Resume to step 16 with the base clobbered on the devices: the restore brings it back.
    let zeros: Vec<_> = trainer
        .frozen_specs()
        .iter()
        .map(|spec| trainer.slice().upload(spec, &vec![0u8; spec.num_bytes() as usize]).unwrap())
        .collect();
    trainer.set_frozen(zeros).unwrap();
    let longer = self::job(&root, 16);
    let resumed = worker::single::run(
        &mut trainer,
        &longer,
        &mut losses,
        &Resume::Newest,
        &worker::driver::Uninterrupted,
        runtime.handle(),
    )
    .unwrap();
    assert_eq!((resumed.trained.start, resumed.trained.steps()), (12, 4));
    assert!(frozen(&trainer) == base_before, "the resumed run trains on the saved base");
    let base_commits = runtime.block_on(committed_newest_first(&StoreCommitLog::new(base_storage))).unwrap();
    assert_eq!(base_commits.len(), 1, "a resumed run reuses the base it finds");

    // The exported weights, adapters merged, are the same model: a full fine-tuning bundle
    // holding them computes the LoRA model's loss.
    let batch = loader(&longer).micro_batch(3, 1).unwrap();
    trainer.grad_step(&batch).unwrap();
    let (lora_loss, tokens) = trainer.pending_metrics().unwrap();
    drop(trainer);
    let commits = runtime.block_on(committed_newest_first(&StoreCommitLog::new(storage.clone()))).unwrap();
    let newest = runtime.block_on(Checkpoint::open(&storage, &commits[0], &Limits::default())).unwrap();
    let file = tmp.path().join("merged.safetensors");
    let report = runtime
        .block_on(checkpoint::export::export_weights(&newest, storage.url(), &file, mesh::DType::Float32))
        .unwrap();
    assert_eq!(report.merged, ["layers/q_proj", "layers/v_proj", "layers/down_proj"]);
    let weights = checkpoint::export::read_safetensors(&file).unwrap();
    assert_eq!(weights.len(), 13);

    let full = support::export_tiny(&tmp.path().join("full"), "fsdp=2,tp=2", 4, SEQ_LEN);
    let slice = Slice::open(support::plugin(), "cpu", full.mesh()).unwrap();
    let mut trainer = Trainer::new(slice, &full).unwrap();
    trainer.init(0).unwrap();
    let state: Vec<(String, Vec<u8>)> = trainer
        .state_specs()
        .iter()
        .map(|spec| {
            let path = spec.name.split_once('/').map(|(_, p)| p).unwrap();
            let bytes = match spec.name.starts_with("params/") {
                true => {
                    let (_, _, values) = weights.iter().find(|(name, _, _)| name == path).unwrap();
                    values.iter().flat_map(|v| v.to_le_bytes()).collect()
                }
                false => vec![0u8; spec.num_bytes() as usize],
            };
            (spec.name.clone(), bytes)
        })
        .collect();
    trainer.upload_state(&state).unwrap();
    trainer.grad_step(&batch).unwrap();
    let (merged_loss, merged_tokens) = trainer.pending_metrics().unwrap();
    assert_eq!(merged_tokens, tokens);
    let relative = (merged_loss - lora_loss).abs() / lora_loss.abs();
    assert!(relative < 1e-5, "merged model loss {merged_loss} vs LoRA {lora_loss} ({relative:e})");
}
