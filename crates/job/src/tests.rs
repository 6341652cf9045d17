use super::*;

const TINY: &str = "
name: tiny-arith
model: tiny
mesh: { ici: { fsdp: 2, tp: 2 } }
batch: { global: 32, micro: 8 }
seq_len: 128
steps: 300
optimizer: { lr: 3.0e-3, warmup_steps: 20 }
data: { kind: arithmetic }
";

fn parse(yaml: &str) -> Result<JobSpec, String> {
    JobSpec::from_yaml(yaml, Path::new("job.yaml")).map_err(|e| e.to_string())
}

fn with(line: &str) -> String {
    let key = line.split(':').next().unwrap();
    let mut out: Vec<&str> = TINY.lines().filter(|l| !l.starts_with(&format!("{key}:"))).collect();
    out.push(line);
    out.join("\n")
}

#[test]
fn parses_the_tiny_example_with_defaults() {
    let spec = parse(TINY).unwrap();
    assert_eq!(spec.ici_mesh().to_string(), "(fsdp=2, tp=2)");
    assert_eq!(spec.mesh.dcn, 1);
    assert_eq!(spec.accum_steps(), 4);
    assert_eq!(spec.seed, 0);
    // `auto` remat is `none` with a fixed mesh.
    assert_eq!(
        spec.train,
        TrainOptions {
            remat: "none".into(),
            attention: "xla".into(),
            optimizer_offload: Some(false),
            ..TrainOptions::default()
        }
    );
    assert_eq!(spec.output_dir(), PathBuf::from("runs/tiny-arith"));
    assert_eq!(spec.optimizer.lr, 3e-3);
    assert_eq!(spec.optimizer.b2, 0.95);
}

#[test]
fn malformed_yaml_names_the_place() {
    let e = parse("name: [unclosed\nmodel: tiny").unwrap_err();
    assert!(e.starts_with("job spec job.yaml is not valid:"), "{e}");
    assert!(e.contains("line"), "{e}");
}

#[test]
fn unknown_and_missing_fields_are_refused() {
    let e = parse(&format!("{TINY}\nstep: 5")).unwrap_err();
    assert!(e.contains("unknown field") && e.contains("step"), "{e}");
    let e = parse(&TINY.replace("seq_len: 128\n", "")).unwrap_err();
    assert!(e.contains("seq_len"), "{e}");
}

#[test]
fn mesh_that_does_not_tile_the_host_is_refused() {
    let e = parse(&with("mesh: { ici: { fsdp: 3, tp: 3 } }\nruntime: { devices_per_host: 8 }")).unwrap_err();
    assert!(e.contains("`mesh.ici`") && e.contains("uses 9 devices per slice, but each host has 8"), "{e}");
    assert!(e.contains("(1,8), (2,4), (4,2), (8,1)"), "{e}");
    parse(&with("mesh: { ici: { fsdp: 4, tp: 2 } }\nruntime: { devices_per_host: 8 }")).unwrap();
}

#[test]
fn batch_arithmetic_is_checked() {
    let e = parse(&with("batch: { global: 30, micro: 8 }")).unwrap_err();
    assert!(
        e.contains("`batch.global`: 30 is not a multiple of batch.micro x mesh.dcn = 8 x 1 = 8; use e.g. 24"),
        "{e}"
    );
    let e = parse(&with("batch: { global: 36, micro: 9 }")).unwrap_err();
    assert!(e.contains("`batch.micro`: 9 does not split over mesh.ici.fsdp=2"), "{e}");
    let spec = parse(&with("mesh: { dcn: 2, ici: { fsdp: 2 } }")).unwrap();
    assert_eq!(spec.accum_steps(), 2);
    assert_eq!(spec.micro_batches_per_step(), 4);
}

#[test]
fn every_field_gets_a_named_error() {
    for (line, field) in [
        ("name: Tiny_Arith", "`name`"),
        ("steps: 0", "`steps`"),
        ("seq_len: 1", "`seq_len`"),
        ("mesh: { dcn: 0, ici: { fsdp: 2 } }", "`mesh.dcn`"),
        ("optimizer: { lr: -1.0 }", "`optimizer.lr`"),
        ("optimizer: { warmup_steps: 300 }", "`optimizer.warmup_steps`"),
        ("train: { remat: some }", "`train.remat`"),
        (
            "seq_len: 96",
            "`train.loss_chunk`: 64 does not divide seq_len = 96; set it to a divisor of 96, e.g. 48",
        ),
        ("data: { kind: arithmetic, digits: [0, 3] }", "data.digits"),
        ("model: gpt-17", "`model`: 'gpt-17' is not a model preset"),
        ("mesh: { ici: { fsdp: 1, tp: 8 } }", "`mesh.ici.tp`: 8 does not divide the query heads"),
    ] {
        let e = parse(&with(line)).unwrap_err();
        assert!(e.contains(field), "{line}: {e}");
    }
}

#[test]
fn checkpoint_section_and_round_trip() {
    let spec = parse(&format!("{TINY}\ncheckpoint: {{ every: 50 }}")).unwrap();
    let uri = spec.checkpoint_uri().unwrap();
    assert!(uri.starts_with("file:///") && uri.ends_with("runs/tiny-arith/checkpoints"), "{uri}");
    assert_eq!(spec.checkpoint.as_ref().unwrap().keep, 3);
    let again = JobSpec::from_yaml(&spec.to_yaml(), Path::new("again.yaml")).unwrap();
    assert_eq!(again, spec);
    let e = parse(&format!("{TINY}\ncheckpoint: {{ every: 5, uri: /tmp/x }}")).unwrap_err();
    assert!(e.contains("`checkpoint.uri`"), "{e}");
    // Issue 10: a root that climbs out of its prefix was accepted (and file:// resolved it).
    for uri in
        ["s3://bucket/jobs/../other", "file:///runs/../etc", "gs://b/./x", "file:///a/..", "s3://b/a\\..\\c"]
    {
        let e = parse(&format!("{TINY}\ncheckpoint: {{ every: 5, uri: '{uri}' }}")).unwrap_err();
        assert!(e.contains("`checkpoint.uri`") && e.contains("'..' segment"), "{uri}: {e}");
    }
    parse(&format!("{TINY}\ncheckpoint: {{ every: 5, uri: 's3://bucket/jobs/a..b/c.d' }}")).unwrap();
    let e = parse(&format!("{TINY}\ncheckpoint: {{ every: 0 }}")).unwrap_err();
    assert!(e.contains("`checkpoint.every`"), "{e}");
}

#[test]
fn short_form_mesh_resolves_over_hosts_and_explains_itself() {
    let spec =
        parse(&with("mesh: { shape: \"(8,2)\", hosts: 2 }\nruntime: { devices_per_host: 8 }")).unwrap();
    assert_eq!(spec.mesh, MeshSpec::axes(2, 4, 2));
    assert_eq!(spec.mesh.request, MeshRequest::Shape { data: 8, tp: 2, hosts: 2 });
    assert_eq!(spec.accum_steps(), 2);
    assert!(spec.mesh.explain().starts_with("mesh (8,2) on 2 hosts = dcn 2 x ici(fsdp=4, tp=2)"));
    let one = parse(&with("mesh: \"(2,2)\"")).unwrap();
    assert_eq!(one.mesh, MeshSpec::axes(1, 2, 2));
    // A serialized spec carries the axes, and parses back to the same layout.
    let again = JobSpec::from_yaml(&spec.to_yaml(), Path::new("again.yaml")).unwrap();
    assert_eq!(again, spec);
    assert_eq!(again.mesh.request, MeshRequest::Axes);
}

#[test]
fn short_form_errors_name_the_field_and_the_fix() {
    let e = parse(&with("mesh: { shape: \"(6,2)\", hosts: 4 }")).unwrap_err();
    assert!(
        e.contains("`mesh.hosts`: (6,2) over 4 hosts: the data axis of 6 devices does not split into 4 equal hosts; use hosts 1, 2, 3, 6"),
        "{e}"
    );
    let e = parse(&with("mesh: \"(8,2\"")).unwrap_err();
    assert!(e.contains("'(8,2' is not a mesh; write the mesh as"), "{e}");
    let e =
        parse(&with("mesh: { shape: \"(8,2)\", hosts: 2 }\nruntime: { devices_per_host: 4 }")).unwrap_err();
    assert!(e.contains("`mesh.ici`: (fsdp=4, tp=2) uses 8 devices per slice, but each host has 4"), "{e}");
    let e = parse(&with("mesh: { shape: \"(4,3)\", hosts: 1 }")).unwrap_err();
    assert!(e.contains("`mesh.ici.tp`: 3 does not divide"), "{e}");
}

#[test]
fn auto_mesh_is_the_planners_choice_within_the_device_budget() {
    let auto = "mesh: auto\nruntime: { devices_per_host: 4, device_memory: 1GiB }";
    let spec =
        parse(&with(auto).replace("batch: { global: 32, micro: 8 }", "batch: { global: 32 }")).unwrap();
    let MeshRequest::Auto { hosts: 1, choice: Some(choice) } = &spec.mesh.request else {
        panic!("{:?}", spec.mesh.request)
    };
    assert!(choice.starts_with("the planner chose micro-batch"), "{choice}");
    assert_eq!(spec.mesh.devices_per_slice(), 4);
    assert!(spec.batch.micro > 0 && ["none", "dots", "full"].contains(&spec.train.remat.as_str()));
    // The same plan, made directly, chooses the same candidate.
    let workload = spec.workload().unwrap();
    let target = planner::Target::new(spec.accelerator().unwrap(), 1);
    let plan = planner::plan_analytic(&workload, &target, &planner::PlanOptions::default()).unwrap();
    assert_eq!(plan.chosen().unwrap().candidate, spec.candidate().unwrap());
    assert!(spec.describe_layout().unwrap().starts_with("auto: the planner chose"));

    // batch.micro and train.remat, when written, pin the choice.
    let pinned = parse(&format!("{}\ntrain: {{ remat: full }}", with(auto))).unwrap();
    assert_eq!((pinned.batch.micro, pinned.train.remat.as_str()), (8, "full"));

    // Without the devices of a host there is nothing to plan for.
    let e = parse(&with("mesh: auto")).unwrap_err();
    assert!(
        e.contains("`runtime.devices_per_host`: is missing: mesh: auto needs the devices of a host"),
        "{e}"
    );
    // Nothing fits in 1 MiB per device: the planner says what would.
    let e = parse(&with("mesh: auto\nruntime: { devices_per_host: 4, device_memory: 1MiB }")).unwrap_err();
    assert!(e.contains("`mesh`: auto: tiny does not fit"), "{e}");
}

#[test]
fn auto_mesh_over_two_v6e_hosts() {
    let spec = parse(
        &with("mesh: { shape: auto, hosts: 2 }\nruntime: { accelerator: v6e-8 }")
            .replace("model: tiny", "model: qwen3-1.7b")
            .replace("batch: { global: 32, micro: 8 }", "batch: { global: 64 }"),
    )
    .unwrap();
    assert_eq!((spec.mesh.dcn, spec.mesh.devices_per_slice()), (2, 8));
}

#[test]
fn auto_mesh_chooses_the_levers_unless_the_spec_pins_them() {
    let v6e = |train: &str| {
        parse(
            &with(&format!(
                "mesh: auto
runtime: {{ accelerator: v6e-1 }}{train}"
            ))
            .replace("model: tiny", "model: qwen3-1.7b")
            .replace("seq_len: 128", "seq_len: 2048")
            .replace("batch: { global: 32, micro: 8 }", "batch: { global: 8 }"),
        )
    };
    // Qwen3-1.7B with f32 AdamW state does not fit one v6e chip; offloading the state does.
    let spec = v6e("").unwrap();
    assert!(spec.train.offload(), "{:?}", spec.train);
    assert!(["xla", "blockwise", "pallas"].contains(&spec.train.attention.as_str()));
    let MeshRequest::Auto { choice: Some(choice), .. } = &spec.mesh.request else { panic!() };
    assert!(choice.contains("optimizer offload"), "{choice}");
    // Pinned, the planner keeps them: offload off does not fit, and says what would.
    let e = v6e("
train: { optimizer_offload: false }")
    .unwrap_err();
    assert!(e.contains("optimizer offload (AdamW state in host memory) would fit"), "{e}");
    let pinned = v6e("
train: { attention: blockwise }")
    .unwrap();
    assert_eq!(pinned.train.attention, "blockwise");
    // A fixed mesh means plain attention and no offload unless the spec says otherwise.
    let fixed = parse(TINY).unwrap();
    assert_eq!((fixed.train.attention.as_str(), fixed.train.optimizer_offload), ("xla", Some(false)));
}

#[test]
fn grpo_jobs_parse_with_defaults_and_check_their_groups() {
    let grpo =
        TINY.replace("seq_len: 128\n", "grpo: { prompt_len: 32, max_new_tokens: 96, generations: 8 }\n");
    let spec = parse(&grpo).unwrap();
    assert_eq!(spec.seq_len, 128);
    assert_eq!(spec.workload().unwrap().kind_name(), "grpo");
    let g = spec.grpo.as_ref().unwrap();
    assert_eq!((g.temperature, g.top_p, g.clip_low, g.clip_high, g.kl_beta), (1.0, 1.0, 0.2, 0.2, 0.0));
    assert!(g.scale_rewards && g.init_from.is_none());
    // Arithmetic data has a held-out split: a GRPO job evaluates on it unless told otherwise.
    assert_eq!(spec.eval, Some(EvalSpec { problems: 256, every: 0, prompt_len: None, max_new_tokens: None }));
    // The spec goes to workers as JSON: it must come back the same.
    assert_eq!(parse(&spec.to_yaml()).unwrap(), spec);

    let e = parse(&grpo.replace("global: 32", "global: 36").replace("micro: 8", "micro: 4")).unwrap_err();
    assert!(e.contains("`batch.global`: 36 rows are not whole groups of grpo.generations = 8"), "{e}");
    let e = parse(&format!("{grpo}seq_len: 100\n")).unwrap_err();
    assert!(
        e.contains("`seq_len`: 100 but a GRPO row is grpo.prompt_len + grpo.max_new_tokens = 128"),
        "{e}"
    );
    // 32 rows over 4 slices is 8 per slice: one group each. Over 8 slices a group would split.
    let two = grpo
        .replace("mesh: { ici: { fsdp: 2, tp: 2 } }", "mesh: { dcn: 4, ici: { fsdp: 2, tp: 2 } }")
        .replace("micro: 8", "micro: 4");
    parse(&two).unwrap();
    let e = parse(&two.replace("global: 32", "global: 48").replace("generations: 8", "generations: 16"))
        .unwrap_err();
    assert!(e.contains("12 per slice, not whole groups of grpo.generations = 16"), "{e}");
    for (field, needle) in [
        ("temperature: 0", "`grpo.temperature`: 0 must be a positive number"),
        ("top_p: 1.5", "`grpo.top_p`: 1.5 must lie in (0, 1]"),
        ("clip_low: 1.0", "`grpo.clip_low`: 1 would allow a ratio of 0"),
        ("kl_beta: -0.1", "`grpo.kl_beta`: -0.1 must be a non-negative number"),
        ("generations: 1", "`grpo.generations`: is 1"),
        ("init_from: ''", "`grpo.init_from`: is empty"),
        ("reward: { exact_match: .nan }", "reward.exact_match"),
        ("temprature: 1.0", "unknown field"),
    ] {
        let spec = grpo.replace("generations: 8 }", &format!("generations: 8, {field} }}"));
        let spec = if field.starts_with("generations") { spec.replace("generations: 8, ", "") } else { spec };
        let e = parse(&spec).unwrap_err();
        assert!(e.contains(needle), "{field}: {e}");
    }
}

#[test]
fn grpo_rewards_parse_in_every_form_and_round_trip() {
    let rewards = "
grpo:
  prompt_len: 32
  max_new_tokens: 96
  generations: 8
  reward_workers: 3
  rewards:
    - numeric_answer
    - { format: '#### -?[0-9]+$', weight: 0.5 }
    - { length: { max: 96, soft: 32, unit: chars }, weight: 0.25, name: overlong }
    - my_rewards.py:brevity
    - { python: s3://bucket/rewards/check.py:unit_tests, weight: 2 }
    - { numeric_answer: {}, weight: 0.1, name: numeric_again }
";
    let spec = parse(&TINY.replace("seq_len: 128\n", rewards)).unwrap();
    let g = spec.grpo.as_ref().unwrap();
    let summary: Vec<(&str, f32)> = g.rewards.iter().map(|r| (r.name.as_str(), r.weight)).collect();
    assert_eq!(
        summary,
        [
            ("numeric_answer", 1.0),
            ("format", 0.5),
            ("overlong", 0.25),
            ("brevity", 1.0),
            ("unit_tests", 2.0),
            ("numeric_again", 0.1)
        ]
    );
    assert_eq!(g.rewards[3].python_function(), Some(("my_rewards.py", "brevity")));
    assert_eq!(g.rewards[4].python_function(), Some(("s3://bucket/rewards/check.py", "unit_tests")));
    assert_eq!(
        g.rewards[2].kind,
        RewardKind::Length(data::LengthReward { max: 96, soft: 32, unit: data::LengthUnit::Chars })
    );
    assert_eq!((g.reward_workers, g.reward_timeout_seconds), (3, 60.0));
    assert_eq!(parse(&spec.to_yaml()).unwrap(), spec, "the spec goes to workers and back unchanged");
    // None named: the numeric answer alone.
    let plain = parse(
        &TINY.replace("seq_len: 128\n", "grpo: { prompt_len: 32, max_new_tokens: 96, generations: 8 }\n"),
    )
    .unwrap();
    assert_eq!(plain.grpo.unwrap().reward_functions(), [RewardFunction::numeric_answer()]);
}

#[test]
fn bad_rewards_name_the_entry_and_the_fix() {
    let with_rewards = |list: &str| {
        TINY.replace(
            "seq_len: 128\n",
            &format!("grpo: {{ prompt_len: 32, max_new_tokens: 96, generations: 8, {list} }}\n"),
        )
    };
    for (list, needle) in [
        ("rewards: [accuracy]", "\"accuracy\" is not a reward function: use numeric_answer"),
        ("rewards: [rewards.py]", "is not a reward function"),
        ("rewards: ['rewards.py:2fast']", "\"2fast\" in \"rewards.py:2fast\" is not a Python function name"),
        ("rewards: [format]", "`format` needs its setting: write { format: <regex> }"),
        ("rewards: [{ format: '(' }]", "`grpo.rewards`: entry 1 (format): \"(\" is not a regular expression"),
        ("rewards: [{ length: { max: 0 } }]", "entry 1 (length): max is 0"),
        ("rewards: [{ length: { max: 8, soft: 9 } }]", "soft 9 is longer than max 8"),
        (
            "rewards: [numeric_answer, { numeric_answer: {}, weight: 2 }]",
            "entry 2 (numeric_answer): entry 1 has the same name",
        ),
        ("rewards: [{ numeric_answer: {}, weight: .nan }]", "weight NaN is not a finite number"),
        ("rewards: [{ format: a, length: { max: 3 } }]", "names more than one reward function"),
        ("rewards: [{ weight: 2 }]", "names no reward function"),
        ("rewards: [{ python: 'a.py:f', name: 'a b' }]", "the name \"a b\" must be letters, digits and _"),
        ("rewards: [{ format: a, weigth: 2 }]", "unknown field `weigth`"),
        ("reward_workers: 0", "`grpo.reward_workers`: 0 is out of range"),
        ("reward_timeout_seconds: 0", "`grpo.reward_timeout_seconds`: 0 must be a positive number"),
    ] {
        let e = parse(&with_rewards(list)).unwrap_err();
        assert!(e.contains(needle), "{list}: {e}");
    }
}

#[test]
fn runtime_accelerator_is_checked_against_the_host() {
    for (runtime, needle) in [
        ("{ accelerator: v5e-8 }", "`runtime.accelerator`: unknown topology 'v5e-8'"),
        (
            "{ accelerator: v6e-16 }",
            "`runtime.accelerator`: v6e-16 is one slice of 16 chips across several hosts, and training one \
             slice across hosts is not built yet; what works is several single-host slices over DCN: \
             runtime.accelerator: v6e-8 and mesh.dcn: 2",
        ),
        (
            "{ accelerator: v6e-8, device_memory: 8GiB }",
            "`runtime.device_memory`: a v6e-8 device may use 31.25 GiB",
        ),
        (
            "{ accelerator: v6e-8, devices_per_host: 4 }",
            "`runtime.devices_per_host`: 4, but a v6e-8 host has 8",
        ),
        (
            "{ accelerator: v6e-8 }",
            "`mesh.ici`: (fsdp=2, tp=2) uses 4 devices per slice, but a v6e-8 host has 8",
        ),
        ("{ device_memory: 4GB }", "'4GB' is not a memory size"),
    ] {
        let e = parse(&format!("{TINY}runtime: {runtime}")).unwrap_err();
        assert!(e.contains(needle), "{runtime}: {e}");
    }
}

#[test]
fn missing_micro_batch_or_seq_len_say_what_to_write() {
    let e = parse(&with("batch: { global: 32 }")).unwrap_err();
    assert!(e.contains("`batch.micro`: is missing (or 0)") && e.contains("mesh: auto"), "{e}");
    let e = parse(&TINY.replace("seq_len: 128\n", "")).unwrap_err();
    assert!(e.contains("`seq_len`: is missing"), "{e}");
}

#[test]
fn memory_levers_parse_with_defaults_and_named_errors() {
    let spec =
        parse(&with("train: { attention: blockwise, attention_block: 64, lora: { rank: 8 } }")).unwrap();
    assert_eq!((spec.train.attention.as_str(), spec.train.attention_block), ("blockwise", 64));
    let lora = spec.train.lora.unwrap();
    assert_eq!((lora.rank, lora.alpha, lora.base_dtype), (8, 16.0, mesh::DType::Bfloat16));
    assert_eq!(lora.targets, LORA_TARGETS.map(String::from));
    let spec = parse(&with(
        "train: { lora: { rank: 4, alpha: 8, targets: [q_proj, v_proj], base_dtype: float32 } }",
    ))
    .unwrap();
    assert_eq!(spec.train.lora.unwrap().targets, ["q_proj", "v_proj"]);

    for (line, expected) in [
        (
            "train: { attention: flash }",
            "`train.attention`: 'flash' is not one of auto, xla, blockwise, pallas",
        ),
        ("train: { attention_block: 0 }", "`train.attention_block`: is 0"),
        ("train: { lora: { rank: 0 } }", "`train.lora.rank`: is 0"),
        ("train: { lora: { rank: 4, alpha: -1 } }", "`train.lora.alpha`: -1 must be positive"),
        ("train: { lora: { rank: 4, targets: [] } }", "`train.lora.targets`: is empty"),
        ("train: { lora: { rank: 4, targets: [wq] } }", "`train.lora.targets`: 'wq' is not a projection"),
        (
            "train: { lora: { rank: 4, targets: [q_proj, q_proj] } }",
            "'q_proj' is not a projection or appears twice",
        ),
        (
            "train: { lora: { rank: 4, base_dtype: int32 } }",
            "`train.lora.base_dtype`: int32 is not supported",
        ),
        ("train: { lora: { rank: 4, dropout: 0.1 } }", "unknown field"),
        (
            "mesh: { dcn: 2, ici: { fsdp: 2 } }\ntrain: { lora: { rank: 4 } }",
            "`train.lora`: LoRA runs on one slice for now",
        ),
        (
            "train: { optimizer_offload: true }",
            "`train.optimizer_offload`: keeps AdamW state in TPU host memory (pinned_host), which the CPU plugin does not have",
        ),
    ] {
        let e = parse(&with(line)).unwrap_err();
        assert!(e.contains(expected), "{line}: {e}");
    }
    // On a TPU host, offload is a setting like any other.
    let tpu = "mesh: { ici: { fsdp: 4, tp: 2 } }\ntrain: { optimizer_offload: true }\nruntime: { accelerator: v6e-8 }";
    assert!(parse(&with(tpu)).unwrap().train.offload());
}

#[test]
fn eval_is_for_any_job_whose_data_has_held_out_problems() {
    let grpo =
        TINY.replace("seq_len: 128\n", "grpo: { prompt_len: 32, max_new_tokens: 96, generations: 8 }\n");
    let gsm8k = |extra: &str| {
        format!(
            "data: {{ kind: gsm8k, path: train.jsonl{extra}, tokenizer: {{ kind: hf, path: Qwen3-1.7B }}, chat: {{}} }}"
        )
    };
    // GRPO on a file without a test file: no evaluation unless asked for; asked for, an error.
    let spec = parse(&with_line(&grpo, &gsm8k(""))).unwrap();
    assert_eq!((spec.eval.as_ref(), spec.evaluation()), (None, None));
    let e = parse(&format!("{}\neval: {{ problems: 64 }}", with_line(&grpo, &gsm8k("")))).unwrap_err();
    assert!(
        e.contains("`eval.problems`: 64, but data of kind gsm8k has no held-out problems; set data.test"),
        "{e}"
    );
    // With a test file, GRPO evaluates by default and takes its decode shapes from grpo:.
    let spec = parse(&with_line(&grpo, &gsm8k(", test: test.jsonl"))).unwrap();
    assert_eq!(spec.evaluation().map(|e| e.problems), Some(256));
    let e = parse(&format!(
        "{}\neval: {{ every: 5, max_new_tokens: 64 }}",
        with_line(&grpo, &gsm8k(", test: test.jsonl"))
    ))
    .unwrap_err();
    assert!(e.contains("`eval.max_new_tokens`: a GRPO job evaluates with its rollout program"), "{e}");
    // An SFT job evaluates only when asked, and needs its decode buffers.
    let sft = with(&gsm8k(", test: test.jsonl"));
    assert_eq!(parse(&sft).unwrap().eval, None);
    let spec =
        parse(&format!("{sft}\neval: {{ problems: 100, every: 50, prompt_len: 256, max_new_tokens: 512 }}"))
            .unwrap();
    assert_eq!(
        spec.evaluation(),
        Some(&EvalSpec { problems: 100, every: 50, prompt_len: Some(256), max_new_tokens: Some(512) })
    );
    assert_eq!(parse(&spec.to_yaml()).unwrap(), spec);
    for (eval, needle) in [
        ("{ problems: 100 }", "`eval.prompt_len`: is missing; an SFT job decodes"),
        ("{ prompt_len: 256 }", "`eval.max_new_tokens`: is missing"),
        ("{ prompt_len: 0, max_new_tokens: 8 }", "`eval.prompt_len`: is 0"),
        ("{ problems: 10, steps: 3 }", "unknown field"),
    ] {
        let e = parse(&format!("{sft}\neval: {eval}")).unwrap_err();
        assert!(e.contains(needle), "{eval}: {e}");
    }
    // Off is always fine; token files have nothing to evaluate.
    parse(&format!("{sft}\neval: {{ problems: 0 }}")).unwrap();
    let tokens = with("data: { kind: tokens, path: c.bin, dtype: u16 }");
    let e = parse(&format!("{tokens}\neval: {{ prompt_len: 8, max_new_tokens: 8 }}")).unwrap_err();
    assert!(e.contains("token files have no prompts"), "{e}");
    let e = parse(&with_line(&grpo, "data: { kind: tokens, path: c.bin, dtype: u16 }")).unwrap_err();
    assert!(e.contains("`data.kind`: tokens files have no prompts to answer"), "{e}");
}

/// `spec` with its `data:` line replaced by `line`.
fn with_line(spec: &str, line: &str) -> String {
    let key = line.split(':').next().unwrap();
    spec.lines()
        .map(|l| if l.starts_with(&format!("{key}:")) { line } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A reader that knows one directory: Qwen3-1.7B's dimensions under another name.
struct Reader;

impl ModelReader for Reader {
    fn read_config(&self, uri: &str) -> Result<bundle::ModelConfig, String> {
        match uri {
            "gs://models/Qwen3-1.7B" => Ok(bundle::ModelConfig {
                preset: "hf:Qwen3-1.7B".into(),
                ..bundle::preset("qwen3-1.7b").unwrap()
            }),
            other => Err(format!("{other}/config.json: missing")),
        }
    }
}

fn parse_with(yaml: &str) -> Result<JobSpec, String> {
    JobSpec::from_yaml_with(yaml, Path::new("job.yaml"), &Reader).map_err(|e| e.to_string())
}

#[test]
fn a_hugging_face_model_takes_its_shape_from_the_reader_and_carries_it() {
    let spec = parse_with(&with("model: { hf: gs://models/Qwen3-1.7B }")).unwrap();
    assert_eq!(spec.model.name(), "hf:gs://models/Qwen3-1.7B");
    assert_eq!(spec.model.hf_dir(), Some("gs://models/Qwen3-1.7B"));
    assert_eq!(spec.model_config().unwrap().num_params(), 1_720_574_976);
    assert_eq!(spec.workload().unwrap().model.preset, "hf:Qwen3-1.7B");
    // Passed on, the spec needs no reader: it carries the dimensions.
    let again = JobSpec::from_yaml(&spec.to_yaml(), Path::new("again.yaml")).unwrap();
    assert_eq!(again, spec);
    assert_eq!(parse(TINY).unwrap().model, ModelSpec::from("tiny"));
}

#[test]
fn a_hugging_face_model_that_cannot_be_read_names_the_field() {
    let hf = "model: { hf: gs://models/Qwen3-1.7B }";
    let e = parse(&with(hf)).unwrap_err();
    let want = "`model.hf`: 'gs://models/Qwen3-1.7B' is a Hugging Face model whose config.json this command does not read";
    assert!(e.contains(want), "{e}");
    let wide = with(hf).replace("mesh: { ici: { fsdp: 2, tp: 2 } }", "mesh: { ici: { fsdp: 1, tp: 16 } }");
    for (yaml, want) in [
        (with("model: { hf: gs://models/none }"), "`model.hf`: gs://models/none/config.json: missing"),
        (with("model: { hf: 'ftp://host/m' }"), "`model.hf`: 'ftp://host/m' is not a model directory"),
        (with("model: { hf: '' }"), "`model.hf`: is empty"),
        (with("model: { hf: x, revision: main }"), "unknown field `revision`"),
        (
            with("model: [tiny]"),
            "a preset name (tiny, small, qwen3-0.6b, qwen3-1.7b) or { hf: <model directory> }",
        ),
        (wide, "`mesh.ici.tp`: 16 does not divide the key/value heads of hf:gs://models/Qwen3-1.7B"),
    ] {
        let e = parse_with(&yaml).unwrap_err();
        assert!(e.contains(want), "{yaml}: {e}");
    }
}
