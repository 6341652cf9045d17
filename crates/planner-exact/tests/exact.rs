//! Exact mode against the real exporter (Python, as a process) and the real XLA:CPU plugin
//! (compiled in the crate's child process).

mod common;

const CHILD: &str = env!("CARGO_BIN_EXE_podctl-compile-stats");

use mesh::DType;
use planner::{
    Accelerator, Attention, Candidate, GIB, Kind, Layout, Oracle, PlanOptions, Platform, Remat, Target,
    Workload, estimate, peak_programs,
};
use planner_exact::{
    BundleRequest, CompileJob, CompileOutcome, Compiler, DiskCache, ExactOracle, resident_outside,
};

fn tiny_sft() -> Workload {
    Workload {
        model: bundle::preset("tiny").unwrap(),
        kind: Kind::Sft { seq_len: 128 },
        global_batch: 64,
        param_dtype: DType::Float32,
        compute_dtype: DType::Float32,
        loss_chunk: 64,
        lora: None,
        attention_block: 512,
    }
}

const LAYOUT: Layout = Layout { dcn: 1, fsdp: 2, tp: 2 };

fn candidate(micro_batch: u64) -> Candidate {
    Candidate::new(LAYOUT, micro_batch, Remat::None)
}

/// The step's peak measured by hand: export, compile each program in the child, add the
/// resident state from the manifest.
fn direct_peak(workload: &Workload, target: &Target, micro_batch: u64) -> u64 {
    let request =
        BundleRequest { workload: workload.clone(), candidate: candidate(micro_batch), platform: "cpu" };
    let bundle = bundle::Bundle::load(common::export(&request).unwrap()).unwrap();
    let compiler = common::compiler(CHILD, common::cpu_plugin());
    peak_programs(workload)
        .iter()
        .map(|&program| {
            let module = bundle.dir().join(&bundle.program(program).unwrap().file);
            let outcome = compiler.compile(&CompileJob { module, partitions: 4, topology: None }).unwrap();
            let (resident, inputs) = resident_outside(&bundle, program, workload, target).unwrap();
            outcome.bytes(Platform::Cpu, &inputs) + resident
        })
        .max()
        .unwrap()
}

#[test]
fn the_cliff_agrees_with_direct_compiles_and_a_second_plan_compiles_nothing() {
    let workload = tiny_sft();
    let roomy = Target::new(Accelerator::cpu(4, 64 * GIB), 1);
    let (peak16, peak32) = (direct_peak(&workload, &roomy, 16), direct_peak(&workload, &roomy, 32));
    assert!(peak16 < peak32, "{peak16} {peak32}");
    // A budget between the two puts the cliff between micro-batches 16 and 32.
    let limit = (peak16 + peak32) / 2;
    let target = Target::new(Accelerator::cpu(4, limit), 1);
    let options = PlanOptions {
        layouts: Some(vec![LAYOUT]),
        micro_batches: Some(vec![8, 16, 32]),
        remats: vec![Remat::None],
        attentions: vec![Attention::Xla],
        ..PlanOptions::default()
    };
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(cache_dir.path());
    let compiler = common::compiler(CHILD, common::cpu_plugin());
    let exporter = common::export;
    let oracle = ExactOracle::new(&workload, &target, &exporter, &compiler, 2).with_cache(cache.clone());
    let plan = planner::plan(&workload, &target, &options, Some(&oracle)).unwrap();

    let cliff = plan.cliff.expect("exact mode searches the cliff");
    let (fits, next) = (cliff.fits.unwrap(), cliff.next.unwrap());
    assert_eq!((fits.micro_batch, fits.peak, fits.margin), (16, peak16, limit as i64 - peak16 as i64));
    assert_eq!((next.micro_batch, next.peak, next.margin), (32, peak32, limit as i64 - peak32 as i64));
    assert!(fits.margin > 0 && next.margin < 0);
    assert_eq!(plan.chosen().unwrap().candidate, candidate(16));
    // grad_step of 16 and of 32 in one batch (the choice and the far side of its cliff), and
    // apply_step once: it does not depend on the micro-batch, so both candidates share it.
    let first = oracle.stats();
    assert_eq!((first.bundles, first.compiles, first.cached), (2, 3, 0), "{first:?}");

    let again = ExactOracle::new(&workload, &target, &exporter, &compiler, 2).with_cache(cache);
    let replan = planner::plan(&workload, &target, &options, Some(&again)).unwrap();
    assert_eq!(again.stats().compiles, 0, "{:?}", again.stats());
    assert_eq!(again.stats().cached, first.compiles + first.cached);
    assert_eq!(serde_json::to_string(&replan).unwrap(), serde_json::to_string(&plan).unwrap());
}

#[test]
fn the_child_reports_what_pjrt_reports_in_process() {
    let workload = tiny_sft();
    let request = BundleRequest { workload, candidate: candidate(8), platform: "cpu" };
    let bundle = bundle::Bundle::load(common::export(&request).unwrap()).unwrap();
    let module = bundle.dir().join(&bundle.program("grad_step").unwrap().file);
    let outcome = common::compiler(CHILD, common::cpu_plugin())
        .compile(&CompileJob { module: module.clone(), partitions: 4, topology: None })
        .unwrap();
    let plugin = pjrt::Plugin::load(common::cpu_plugin()).unwrap();
    let client = plugin.create_client(&[("cpu_device_count", pjrt::NamedValue::Int64(4))]).unwrap();
    let stats = client
        .compile(&std::fs::read(&module).unwrap(), &pjrt::CompileOptions::spmd(4))
        .unwrap()
        .memory_stats()
        .unwrap();
    let CompileOutcome::Compiled(child) = outcome else { panic!("{outcome:?}") };
    assert_eq!(
        (child.argument, child.output, child.alias, child.temp, child.generated_code),
        (
            stats.argument_bytes as u64,
            stats.output_bytes as u64,
            stats.alias_bytes as u64,
            stats.temp_bytes as u64,
            stats.generated_code_bytes as u64
        )
    );
    // Arguments are params + grads + batch; grads alias the outputs.
    assert!(child.alias > 0 && child.temp > 0, "{child:?}");
}

#[test]
fn a_child_that_cannot_compile_is_an_error_not_a_crash() {
    let request = BundleRequest { workload: tiny_sft(), candidate: candidate(8), platform: "cpu" };
    let bundle = bundle::Bundle::load(common::export(&request).unwrap()).unwrap();
    let module = bundle.dir().join("manifest.json");
    // A plugin path that is not a plugin, then a module that is not StableHLO.
    let not_a_plugin = common::compiler(CHILD, module.clone());
    let e = not_a_plugin
        .compile(&CompileJob { module: module.clone(), partitions: 4, topology: None })
        .unwrap_err();
    assert!(e.contains("manifest.json"), "{e}");
    let e = common::compiler(CHILD, common::cpu_plugin())
        .compile(&CompileJob { module, partitions: 4, topology: None })
        .unwrap_err();
    assert!(!e.is_empty());
}

#[test]
fn analytic_and_exact_agree_on_cpu() {
    // The short variant of benches/analytic_vs_exact.rs: SFT and GRPO on `small`, where the
    // activations the model describes dominate (on `tiny` fixed overheads of a few MiB do).
    let cpu = Accelerator::cpu(4, 64 * GIB);
    let target = Target::new(cpu.clone(), 1);
    let sft =
        Workload { model: bundle::preset("small").unwrap(), kind: Kind::Sft { seq_len: 512 }, ..tiny_sft() };
    let grpo = Workload {
        model: bundle::preset("small").unwrap(),
        kind: Kind::Grpo { prompt_len: 64, max_new_tokens: 192, generations: 8 },
        ..tiny_sft()
    };
    let compiler = common::compiler(CHILD, common::cpu_plugin());
    let exporter = common::export;
    for (workload, c) in [
        (&sft, Candidate::new(LAYOUT, 16, Remat::None)),
        (&sft, Candidate::new(Layout { dcn: 1, fsdp: 1, tp: 4 }, 8, Remat::Full)),
        (&grpo, Candidate::new(LAYOUT, 8, Remat::Dots)),
    ] {
        let oracle = ExactOracle::new(workload, &target, &exporter, &compiler, 2);
        let exact = oracle.measure(&[c]).remove(0).unwrap().peak();
        let analytic = estimate(workload, &c, &cpu).peak();
        let error = analytic as f64 / exact as f64 - 1.0;
        assert!(error.abs() < 0.15, "{c}: analytic {analytic} vs exact {exact} ({:+.1}%)", 100.0 * error);
    }
}
