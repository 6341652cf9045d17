//! The analytic planner end to end: the seeds' scenarios, multi-host layouts, bad input.

use mesh::DType;
use planner::{
    Accelerator, Candidate, GIB, Kind, Layout, PlanError, PlanOptions, Remat, Target, Workload, estimate,
    plan_analytic, render_plan,
};

fn grpo_seed_000() -> Workload {
    // 32 prompts x 8 generations, prompts up to 256 tokens, up to 2048 generated.
    Workload {
        model: bundle::preset("qwen3-1.7b").unwrap(),
        kind: Kind::Grpo { prompt_len: 256, max_new_tokens: 2048, generations: 8 },
        global_batch: 32 * 8,
        param_dtype: DType::Float32,
        compute_dtype: DType::Bfloat16,
        loss_chunk: 256,
        lora: None,
        attention_block: 512,
    }
}

#[test]
fn seed_000_lists_every_mesh_of_a_v6e_8_and_picks_one_that_fits() {
    let target = Target::new(Accelerator::v6e_8(), 1);
    let plan = plan_analytic(&grpo_seed_000(), &target, &PlanOptions::default()).unwrap();
    let pairs: Vec<(usize, usize)> = {
        let mut seen: Vec<(usize, usize)> = plan.rows.iter().map(|r| r.candidate.layout.pair()).collect();
        seen.dedup();
        seen
    };
    assert_eq!(pairs, [(8, 1), (4, 2), (2, 4), (1, 8)]);
    assert!(plan.skipped.is_empty(), "{:?}", plan.skipped);
    let chosen = plan.chosen().expect("something fits");
    assert!(chosen.fits(planner::V6E_HBM_LIMIT));
    // Every candidate of every mesh has all three programs estimated.
    for row in &plan.rows {
        let names: Vec<&str> = row.analytic.programs.iter().map(|p| p.program.as_str()).collect();
        assert_eq!(names, ["grpo_grad_step", "rollout", "apply_step"]);
    }
    let text = render_plan(&plan, false);
    for needle in ["(8,1)", "(4,2)", "(2,4)", "(1,8)", "choice: mesh", "reference model", "optimizer state"] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    assert!(text.contains("analytic breakdown of"), "{text}");
}

#[test]
fn unsharded_vocabulary_costs_what_the_seed_saw() {
    // Seed 000: with the vocabulary unsharded (tp = 1) the logits and the embedding gradient are
    // whole on every chip; tp = 2 halves them. With one row per chip the loss backward is the
    // peak phase.
    let w = grpo_seed_000();
    let acc = Accelerator::v6e_8();
    let term = |fsdp, tp, name: &str| {
        let c = Candidate::new(Layout { dcn: 1, fsdp, tp }, fsdp as u64, Remat::Full);
        let e = estimate(&w, &c, &acc);
        let program = e.program("grpo_grad_step").unwrap();
        program
            .terms
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.bytes)
            .unwrap_or_else(|| panic!("{name}: {program:?}"))
    };
    for name in ["embedding gradient", "logits"] {
        let (whole, halved) = (term(8, 1, name), term(4, 2, name));
        assert!(whole > halved * 19 / 10, "{name}: {whole} vs {halved}");
    }
}

#[test]
fn estimates_grow_with_rows_and_shrink_with_remat() {
    let w = grpo_seed_000();
    let acc = Accelerator::v6e_8();
    let peak = |micro_batch, remat| {
        let c = Candidate::new(Layout { dcn: 1, fsdp: 4, tp: 2 }, micro_batch, remat);
        estimate(&w, &c, &acc).peak()
    };
    assert!(peak(8, Remat::None) < peak(16, Remat::None));
    assert!(peak(16, Remat::Full) < peak(16, Remat::Dots));
    assert!(peak(16, Remat::Dots) < peak(16, Remat::None));
}

#[test]
fn two_hosts_list_8x2_and_4x4_with_dcn_bytes() {
    let target = Target::new(Accelerator::v6e_8(), 2);
    let plan = plan_analytic(&grpo_seed_000(), &target, &PlanOptions::default()).unwrap();
    let gradient = plan.workload.model.num_params() * 4;
    for pair in [(8, 2), (4, 4)] {
        let row = plan.rows.iter().find(|r| r.candidate.layout.pair() == pair).expect("layout listed");
        assert_eq!(row.candidate.layout.dcn, 2);
        // Ring all-reduce between the two slices: each host sends its whole gradient once.
        assert_eq!(row.time.dcn_bytes, gradient);
        assert!(row.time.dcn > 0.0);
    }
    let text = render_plan(&plan, false);
    assert!(text.contains("(8,2) = dcn 2 x ici(4,2)") && text.contains("(4,4) = dcn 2 x ici(2,4)"), "{text}");
    assert!(text.contains("DCN/step"), "{text}");
}

#[test]
fn a_mesh_that_does_not_divide_the_heads_names_the_ones_that_do() {
    let w = Workload {
        model: bundle::preset("tiny").unwrap(),
        kind: Kind::Sft { seq_len: 128 },
        global_batch: 64,
        param_dtype: DType::Float32,
        compute_dtype: DType::Float32,
        loss_chunk: 64,
        lora: None,
        attention_block: 512,
    };
    let target = Target::new(Accelerator::cpu(8, GIB), 1);
    let options =
        PlanOptions { layouts: Some(vec![Layout { dcn: 1, fsdp: 1, tp: 8 }]), ..PlanOptions::default() };
    let e = plan_analytic(&w, &target, &options).unwrap_err();
    assert!(matches!(e, PlanError::MeshDoesNotDivide { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("tp=8 does not divide the 4 query heads of tiny"), "{text}");
    assert!(text.contains("meshes that divide the model: (8,1), (4,2)"), "{text}");
    // Without a requested mesh the same layouts are skipped with the reason.
    let plan = plan_analytic(&w, &target, &PlanOptions::default()).unwrap();
    let skipped: Vec<String> = plan.skipped.iter().map(|(l, why)| format!("{l}: {why}")).collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(skipped[0].starts_with("(2,4): tp=4 does not divide the 2 key/value heads"), "{skipped:?}");
}

#[test]
fn a_model_larger_than_the_pod_says_what_would_fit() {
    let w = Workload {
        model: bundle::preset("qwen3-1.7b").unwrap(),
        kind: Kind::Sft { seq_len: 2048 },
        global_batch: 8,
        param_dtype: DType::Float32,
        compute_dtype: DType::Bfloat16,
        loss_chunk: 256,
        lora: None,
        attention_block: 512,
    };
    let target = Target::new(Accelerator::parse("v6e-1", 0).unwrap(), 1);
    let no_offload = PlanOptions { offloads: vec![false], ..PlanOptions::default() };
    let e = plan_analytic(&w, &target, &no_offload).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PlanError::DoesNotFit { .. }), "{text}");
    assert!(text.starts_with("qwen3-1.7b does not fit: the smallest configuration"), "{text}");
    assert!(text.contains("optimizer offload (AdamW state in host memory) would fit"), "{text}");
    assert!(text.contains("the largest preset that fits is qwen3-0.6b"), "{text}");
    assert!(text.contains("devices per slice"), "{text}");
    // With the lever allowed, the plan takes it: 16 bytes per f32 parameter do not fit one chip,
    // 8 do.
    let plan = plan_analytic(&w, &target, &PlanOptions::default()).unwrap();
    assert!(plan.chosen().unwrap().candidate.offload, "{}", render_plan(&plan, false));
}

#[test]
fn an_unknown_topology_lists_the_known_ones() {
    let e = Accelerator::parse("v7-8", 0).unwrap_err().to_string();
    assert_eq!(e, "unknown topology 'v7-8'; podctl plans for v6e-1, v6e-4, v6e-8, cpu-N");
}

#[test]
fn plans_are_deterministic() {
    let target = Target::new(Accelerator::v6e_8(), 2);
    let a = plan_analytic(&grpo_seed_000(), &target, &PlanOptions::default()).unwrap();
    let b = plan_analytic(&grpo_seed_000(), &target, &PlanOptions::default()).unwrap();
    assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
    assert_eq!(render_plan(&a, true), render_plan(&b, true));
}
