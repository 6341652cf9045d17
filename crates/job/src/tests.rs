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
    assert_eq!(spec.train, TrainOptions::default());
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
    let e = parse(&format!("{TINY}\ncheckpoint: {{ every: 0 }}")).unwrap_err();
    assert!(e.contains("`checkpoint.every`"), "{e}");
}
