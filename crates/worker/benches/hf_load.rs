//! Loading a Hugging Face checkpoint onto a (fsdp 2, tp 2) CPU mesh with `worker::hf`, side by
//! side with transformers' `from_pretrained` of the same directory, in one run: wall time and
//! peak RSS of each, and the ratios the goals are stated in (podctl at least 2x faster; its peak
//! RSS at most 1.2x the bytes the host's devices hold).
//!
//! ```text
//! crates/worker/benches/hf_load/run.sh                  # makes the checkpoint once, then runs
//! cargo bench -p podctl-worker --bench hf_load -- --model DIR [--rounds 3] [--dtype bfloat16]
//! ```
//!
//! Every measurement is a fresh process (peak RSS only grows within one): this binary again
//! with `--child` for podctl (PJRT client over 4 CPU devices, then `HfModel::open` and every
//! parameter placed), `hf_load/transformers_load.py` in `.venv-hf/` for transformers
//! (`AutoModelForCausalLM.from_pretrained(dtype=...)`, imports not timed; then every weight read
//! once, timed apart, since a checkpoint already in the asked dtype is mapped rather than read
//! by `from_pretrained`). The files are
//! read once before the first round so both sides find them in the page cache, and rounds
//! alternate the two sides so background load hits both alike; the median of each is reported.

// The integration tests' helpers; this bench needs the project root and the plugin only.
#[allow(dead_code)]
#[path = "../tests/integration/support.rs"]
mod support;

extern crate podctl_worker as worker;

use bundle::TensorSpec;
use std::process::Command;
use std::time::Instant;

struct Args {
    model: String,
    rounds: usize,
    mesh: String,
    dtype: mesh::DType,
    child: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        model: String::new(),
        rounds: 3,
        mesh: "fsdp=2,tp=2".into(),
        dtype: mesh::DType::Bfloat16,
        child: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => args.model = value(),
            "--rounds" => args.rounds = value().parse().expect("integer"),
            "--mesh" => args.mesh = value(),
            "--dtype" => {
                args.dtype = match value().as_str() {
                    "float32" => mesh::DType::Float32,
                    "bfloat16" => mesh::DType::Bfloat16,
                    other => panic!("--dtype {other}: float32 or bfloat16"),
                }
            }
            "--child" => args.child = true,
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(
        !args.model.is_empty(),
        "--model DIR is required (crates/worker/benches/hf_load/run.sh makes one)"
    );
    args
}

/// A line of /proc/self/status, in bytes.
fn status_bytes(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn ici(text: &str) -> mesh::IciMesh {
    let axes: Vec<(String, usize)> = text
        .split(',')
        .map(|part| {
            let (name, size) = part.split_once('=').expect("name=size");
            (name.to_string(), size.parse().expect("integer"))
        })
        .collect();
    mesh::IciMesh::new(axes).unwrap()
}

/// One load in this process: prints a JSON line.
fn child(args: &Args) {
    let mesh = ici(&args.mesh);
    let slice = worker::Slice::open(support::plugin(), "cpu", &mesh).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let rss_before = status_bytes("VmRSS:");
    let start = Instant::now();
    let model = runtime.block_on(hf::HfModel::open(&args.model, &Default::default())).unwrap();
    let specs: Vec<TensorSpec> = model
        .model()
        .params()
        .into_iter()
        .map(|p| TensorSpec {
            name: format!("params/{}", p.path),
            shape: p.shape,
            dtype: args.dtype,
            sharding: p.sharding,
            donated: false,
            memory_kind: None,
        })
        .collect();
    let arrays = worker::hf::place_tensors(&slice, &specs, "params/", &model, runtime.handle()).unwrap();
    let seconds = start.elapsed().as_secs_f64();
    let device_bytes = worker::hf::device_bytes(&slice, &specs);
    let peak_rss = status_bytes("VmHWM:");
    drop(arrays);
    println!(
        "{}",
        serde_json::json!({"seconds": seconds, "peak_rss": peak_rss, "rss_before": rss_before,
                           "device_bytes": device_bytes, "file_bytes": model.data_bytes()})
    );
}

fn run(command: &mut Command) -> serde_json::Value {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rfind(|l| l.starts_with('{')).expect("a JSON line");
    serde_json::from_str(line).unwrap()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn gb(bytes: f64) -> String {
    format!("{:.2} GB", bytes / 1e9)
}

fn main() {
    let args = parse_args();
    if args.child {
        return child(&args);
    }
    let python = support::root().join(".venv-hf/bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup-hf-reference.sh", python.display());
    let script = support::root().join("crates/worker/benches/hf_load/transformers_load.py");
    // Both sides read from the page cache.
    for entry in std::fs::read_dir(&args.model).unwrap() {
        let path = entry.unwrap().path();
        std::io::copy(&mut std::fs::File::open(&path).unwrap(), &mut std::io::sink()).unwrap();
    }
    let exe = std::env::current_exe().unwrap();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let dtype = args.dtype.name();
        let podctl = run(Command::new(&exe).args([
            "--child",
            "--model",
            &args.model,
            "--mesh",
            &args.mesh,
            "--dtype",
            dtype,
        ]));
        let transformers = run(Command::new(&python).arg(&script).arg(&args.model).arg(dtype));
        println!(
            "round {}: podctl {:.2} s, peak RSS {}; transformers {:.2} s (+{:.2} s reading the weights), peak RSS {}",
            round + 1,
            podctl["seconds"].as_f64().unwrap(),
            gb(podctl["peak_rss"].as_f64().unwrap()),
            transformers["seconds"].as_f64().unwrap(),
            transformers["read_seconds"].as_f64().unwrap(),
            gb(transformers["peak_rss"].as_f64().unwrap())
        );
        ours.push(podctl);
        theirs.push(transformers);
    }
    let field = |runs: &[serde_json::Value], key: &str| {
        median(runs.iter().map(|r| r[key].as_f64().unwrap()).collect())
    };
    let (t_ours, t_theirs) = (field(&ours, "seconds"), field(&theirs, "seconds"));
    let t_read = field(&theirs, "read_seconds");
    let (rss_ours, rss_theirs) = (field(&ours, "peak_rss"), field(&theirs, "peak_rss"));
    let device = ours[0]["device_bytes"].as_f64().unwrap();
    println!();
    println!(
        "{} ({} of safetensors) onto mesh {} in {}, median of {} rounds:",
        args.model,
        gb(ours[0]["file_bytes"].as_f64().unwrap()),
        args.mesh,
        args.dtype,
        args.rounds
    );
    println!("  {:<34} {:>10} {:>14}", "", "wall time", "peak RSS");
    println!("  {:<34} {:>8.2} s {:>14}", "podctl (worker::hf, 4 CPU devices)", t_ours, gb(rss_ours));
    println!("  {:<34} {:>8.2} s {:>14}", "transformers from_pretrained", t_theirs, gb(rss_theirs));
    println!("  {:<34} {:>8.2} s", "  then every weight read once", t_read);
    println!(
        "  speed-up: {:.2}x against from_pretrained (goal >= 2x), {:.2}x against from_pretrained with its weights read",
        t_theirs / t_ours,
        (t_theirs + t_read) / t_ours
    );
    println!(
        "  podctl peak RSS / bytes its devices hold ({}): {:.3} (goal <= 1.2); the process held {} before the load",
        gb(device),
        rss_ours / device,
        gb(field(&ours, "rss_before"))
    );
}
