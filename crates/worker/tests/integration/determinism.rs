//! A rerun of the same job on the same mesh gives bitwise the same parameters, whether its
//! programs were compiled or loaded from the compile cache.

use crate::support;
use worker::compile_cache::CompileCache;
use worker::driver::{self, Ended, OnInterrupt, Plan, Uninterrupted};
use worker::sft::Sft;
use worker::{Sink, Slice, StepResult, Trainer, TrainerSteps};

fn train(bundle: &bundle::Bundle, steps: u64) -> Vec<(String, Vec<u8>)> {
    train_with(bundle, steps, None)
}

/// Each step's loss, as the driver reports it.
struct Losses(Vec<f64>);

impl Sink for Losses {
    fn on_step(&mut self, step: &StepResult) {
        self.0.push(step.loss());
    }
}

/// `steps` steps of SFT on the arithmetic task, through the loader, `run_step` and the driver,
/// as `podctl launch` runs them on one slice.
fn train_with(bundle: &bundle::Bundle, steps: u64, cache: Option<&CompileCache>) -> Vec<(String, Vec<u8>)> {
    let mut slice = Slice::open(support::plugin(), "cpu", bundle.mesh()).unwrap();
    if let Some(cache) = cache {
        slice = slice.with_compile_cache(cache.clone());
    }
    let mut trainer = Trainer::new(slice, bundle).unwrap();
    trainer.init(3).unwrap();
    let config: data::DataConfig = serde_json::from_str(r#"{"kind": "arithmetic"}"#).unwrap();
    let batch = data::BatchSpec::new(8, 4, 128).unwrap();
    let sft = Sft::from_loader(data::Loader::from_config(&config, batch, 7, &data::LocalFiles).unwrap());
    let optimizer = job::OptimizerSpec { lr: 1e-3, ..job::OptimizerSpec::default() };
    let plan = Plan {
        steps,
        optimizer: &optimizer,
        start: 0,
        evaluate_first: false,
        on_interrupt: OnInterrupt::Leave,
    };
    let mut run = TrainerSteps { trainer: &mut trainer, objective: &sft, ranks: &[0], accum: 2, group: None };
    let mut losses = Losses(Vec::new());
    let trained = driver::train(&mut run, &plan, None, &mut losses, &Uninterrupted).unwrap();
    assert!(matches!(trained.ended, Ended::Finished));
    assert_eq!(losses.0.len() as u64, steps);
    assert!(losses.0.iter().all(|l| l.is_finite()));
    trainer.download_state().unwrap()
}

#[test]
fn same_job_twice_gives_bitwise_identical_state() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = support::export_tiny(tmp.path(), "fsdp=2,tp=2", 4, 128);
    let first = train(&bundle, 4);
    let second = train(&bundle, 4);
    let initial = train(&bundle, 0);
    assert_eq!(first.len(), 3 * bundle.manifest().params.len());
    for ((name, a), (_, b)) in first.iter().zip(&second) {
        assert!(a == b, "{name} differs between two identical runs");
    }
    // Training moved the parameters, so equality above is not vacuous.
    let changed =
        first.iter().zip(&initial).filter(|((n, a), (_, b))| n.starts_with("params/") && a != b).count();
    assert_eq!(changed, bundle.manifest().params.len(), "every parameter trains");
}

/// Each cache entry's path and modification time.
fn entries(cache: &CompileCache) -> Vec<(std::path::PathBuf, std::time::SystemTime)> {
    let mut entries: Vec<_> = std::fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
            (path, modified)
        })
        .collect();
    entries.sort();
    entries
}

#[test]
fn programs_from_the_compile_cache_train_to_the_same_bits_and_a_damaged_entry_is_recompiled() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = support::export_tiny(&tmp.path().join("bundle"), "fsdp=2,tp=1", 4, 128);
    let cache = CompileCache::new(tmp.path().join("executables"));
    let compiled = train(&bundle, 3);
    assert_eq!(train_with(&bundle, 3, Some(&cache)), compiled, "compiled and kept");
    let kept = entries(&cache);
    assert_eq!(kept.len(), bundle::TRAIN_PROGRAMS.len(), "one entry per program: {kept:?}");
    // Loaded, not compiled: nothing is written again.
    assert_eq!(train_with(&bundle, 3, Some(&cache)), compiled, "loaded from the cache");
    assert_eq!(entries(&cache), kept);
    // A damaged entry is never handed to the plugin: the program is compiled and kept again.
    for (path, _) in &kept {
        let mut bytes = std::fs::read(path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(path, bytes).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(train_with(&bundle, 3, Some(&cache)), compiled, "recompiled");
    let rewritten = entries(&cache);
    assert_eq!(rewritten.len(), kept.len());
    assert!(rewritten.iter().zip(&kept).all(|(new, old)| new.1 > old.1), "every damaged entry was replaced");
}
