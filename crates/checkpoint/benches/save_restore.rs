//! Saves and restores a ~1 GiB training state on local disk and prints the numbers next to
//! Orbax (same arrays, CPU JAX, same machine, same run) and `dd conv=fdatasync` of the same
//! byte count. Also prints the training stall of an async save and the peak RSS growth of a
//! save, measured in a child process from /proc/self/status. Run: `benches/run.sh`.
//!
//! Flags: `--gib F` (state size, default 1.0), `--dir PATH` (scratch directory on the disk to
//! measure, default the system temp dir), `--skip-orbax`.

extern crate podctl_checkpoint as checkpoint;

use bytes::Bytes;
use checkpoint::{
    ArraySpec, AsyncSaver, Checkpoint, DataPosition, SaveOptions, SaveSpec, ShardBuffer, Storage,
    StoreCommitLog, Topology, committed_newest_first, finalize,
};
use futures::StreamExt;
use mesh::{DType, IciMesh, Region, Sharding};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: f64 = 1024.0 * 1024.0;

/// A Qwen-style decoder (vocab 32768, hidden 768, MLP 2048, GQA k/v 256) with Adam moments:
/// params, mu and nu for every weight, biases and norms included, plus a step counter. Ten
/// layers make 367 float32 arrays and ~0.98 GiB; `gib` scales the layer count and vocabulary.
fn model_arrays(gib: f64) -> Vec<ArraySpec> {
    let (hidden, mlp, kv) = (768u64, 2048u64, 256u64);
    let vocab = ((32768.0 * gib.min(1.0)) as u64).max(256);
    let layer_params =
        2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp + hidden + 2 * kv + 2 * hidden;
    let target_params = gib * (1u64 << 30) as f64 / 12.0;
    let layers = ((target_params - (vocab * hidden) as f64) / layer_params as f64).round().max(1.0) as u64;
    let mut weights: Vec<(String, Vec<u64>)> = vec![("embed".into(), vec![vocab, hidden])];
    for l in 0..layers {
        let p = |n: &str| format!("layers/{l:02}/{n}");
        weights.extend([
            (p("attn/wq"), vec![hidden, hidden]),
            (p("attn/wk"), vec![hidden, kv]),
            (p("attn/wv"), vec![hidden, kv]),
            (p("attn/wo"), vec![hidden, hidden]),
            (p("attn/bq"), vec![hidden]),
            (p("attn/bk"), vec![kv]),
            (p("attn/bv"), vec![kv]),
            (p("mlp/gate"), vec![hidden, mlp]),
            (p("mlp/up"), vec![hidden, mlp]),
            (p("mlp/down"), vec![mlp, hidden]),
            (p("norm_attn"), vec![hidden]),
            (p("norm_mlp"), vec![hidden]),
        ]);
    }
    weights.push(("final_norm".into(), vec![hidden]));
    let mut arrays = Vec::new();
    for group in ["params", "opt/mu", "opt/nu"] {
        for (name, shape) in &weights {
            let rank = shape.len();
            arrays.push(ArraySpec::new(
                format!("{group}/{name}"),
                shape.clone(),
                DType::Float32,
                Sharding::replicated(rank),
            ));
        }
    }
    arrays.push(ArraySpec::new("opt/count", vec![], DType::Float32, Sharding::replicated(0)));
    arrays
}

fn topology() -> Topology {
    Topology::single_host(IciMesh::new([("fsdp", 1)]).unwrap()).unwrap()
}

fn spec(arrays: Vec<ArraySpec>) -> SaveSpec {
    SaveSpec {
        step: 1000,
        save_id: "bench".into(),
        topology: topology(),
        arrays,
        bundle: "be0c4".into(),
        data_position: DataPosition { seed: 0, step: 1000 },
        rng_state: vec![0; 8],
        metadata: Default::default(),
    }
}

/// Deterministic contents of array `index`, so the restore can be checked bitwise.
fn contents(index: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut x = 0x243F_6A88_85A3_08D3u64 ^ index as u64;
    for word in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
    }
    out
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// The child process: allocate the state as a trainer would after copying it off the devices,
/// hand it to an async save, and report stall, duration and memory.
fn child_save(dir: &Path, gib: f64) {
    let rss_before = status_kib("VmRSS:");
    let spec = spec(model_arrays(gib));
    let buffers: Vec<ShardBuffer> = spec
        .arrays
        .iter()
        .enumerate()
        .map(|(i, a)| ShardBuffer {
            array: a.name.clone(),
            device: 0,
            data: Bytes::from(contents(i, a.num_bytes().unwrap() as usize)),
        })
        .collect();
    let handed: u64 = buffers.iter().map(|b| b.data.len() as u64).sum();
    let rss_loaded = status_kib("VmRSS:");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (stall, uploaded, save) = runtime.block_on(async {
        let storage = Storage::open(dir.to_str().unwrap(), &Default::default()).unwrap();
        let saver = AsyncSaver::new(storage.clone(), SaveOptions::default()).unwrap();
        let start = Instant::now();
        let handle = saver.start(&spec, 0, buffers).unwrap();
        let stall = start.elapsed();
        let report = handle.finish().await.unwrap();
        let uploaded = start.elapsed();
        finalize(&storage, &spec, &[report], &StoreCommitLog::new(storage.clone())).await.unwrap();
        (stall, uploaded, start.elapsed())
    });
    let hwm = status_kib("VmHWM:");
    println!(
        "{}",
        serde_json::json!({
            "bytes": handed, "stall_s": stall.as_secs_f64(), "save_s": save.as_secs_f64(),
            "upload_s": uploaded.as_secs_f64(),
            "rss_before_kib": rss_before, "rss_loaded_kib": rss_loaded, "hwm_kib": hwm,
        })
    );
}

fn run_json(command: &mut Command) -> serde_json::Value {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{command:?} failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON from {command:?}: {stdout}"));
    serde_json::from_str(line).unwrap()
}

fn dd(dir: &Path, bytes: u64) -> Duration {
    let path = dir.join("dd.bin");
    let count = bytes.div_ceil(16 << 20);
    let start = Instant::now();
    let status = Command::new("dd")
        .args([
            "if=/dev/zero",
            &format!("of={}", path.display()),
            "bs=16M",
            &format!("count={count}"),
            "conv=fdatasync",
            "status=none",
        ])
        .status()
        .expect("run dd");
    let took = start.elapsed();
    assert!(status.success(), "dd failed");
    std::fs::remove_file(path).unwrap();
    took.mul_f64(bytes as f64 / (count * (16 << 20)) as f64)
}

/// Restores every array whole, 4 at a time, and checks them bitwise (untimed).
async fn restore_once(storage: &Storage, commit: &checkpoint::CommitRecord, gib: f64) -> Duration {
    let start = Instant::now();
    let checkpoint = Checkpoint::open(storage, commit, &Default::default()).await.unwrap();
    let names: Vec<(usize, String, Vec<u64>)> = checkpoint
        .manifest()
        .arrays
        .iter()
        .enumerate()
        .map(|(i, a)| (i, a.name.clone(), a.shape.clone()))
        .collect();
    let restored: Vec<(usize, Vec<u8>)> = futures::stream::iter(&names)
        .map(|(i, name, shape)| {
            let checkpoint = &checkpoint;
            async move { (*i, checkpoint.read_region(name, &Region::full(shape)).await.unwrap()) }
        })
        .buffer_unordered(4)
        .collect()
        .await;
    let took = start.elapsed();
    let expected = model_arrays(gib);
    for (i, bytes) in &restored {
        assert_eq!(checkpoint.manifest().arrays[*i].name, expected[*i].name);
        assert!(*bytes == contents(*i, bytes.len()), "array {} restored wrong", expected[*i].name);
    }
    took
}

/// Restores with the page cache dropped (when the kernel allows it), then again warm.
fn restore(dir: &Path, gib: f64) -> (Duration, bool, Duration) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let storage = Storage::open(dir.to_str().unwrap(), &Default::default()).unwrap();
        let log = StoreCommitLog::new(storage.clone());
        let commit = committed_newest_first(&log).await.unwrap().remove(0);
        let cold = drop_caches();
        let first = restore_once(&storage, &commit, gib).await;
        let warm = restore_once(&storage, &commit, gib).await;
        (first, cold, warm)
    })
}

fn gib_per_s(bytes: u64, took: f64) -> f64 {
    bytes as f64 / MIB / 1024.0 / took
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let gib: f64 = flag("--gib").map_or(1.0, |v| v.parse().expect("--gib takes a number"));
    if let Some(dir) = flag("--child-save") {
        child_save(Path::new(&dir), gib);
        return;
    }
    let base = flag("--dir").map_or_else(std::env::temp_dir, PathBuf::from);
    let scratch = tempfile::Builder::new().prefix("podctl-ckpt-bench").tempdir_in(&base).unwrap();
    let arrays = model_arrays(gib);
    let bytes: u64 = arrays.iter().map(|a| a.num_bytes().unwrap()).sum();
    println!(
        "state: {} float32 arrays, {:.1} MiB, scratch {}",
        arrays.len(),
        bytes as f64 / MIB,
        scratch.path().display()
    );

    let dd_time = dd(scratch.path(), bytes).as_secs_f64();
    println!("dd conv=fdatasync         {:>7.3} s  {:>6.2} GiB/s", dd_time, gib_per_s(bytes, dd_time));

    let ours_dir = scratch.path().join("podctl");
    let child = run_json(Command::new(std::env::current_exe().unwrap()).args([
        "--child-save",
        ours_dir.to_str().unwrap(),
        "--gib",
        &gib.to_string(),
    ]));
    let save_s = child["save_s"].as_f64().unwrap();
    let stall_s = child["stall_s"].as_f64().unwrap();
    let (restore_time, cold, warm_time) = restore(&ours_dir, gib);
    let (restore_s, warm_s) = (restore_time.as_secs_f64(), warm_time.as_secs_f64());
    let cache = if cold { "page cache dropped" } else { "drop_caches refused: cache warm" };
    println!(
        "podctl save (async, fsync) {:>6.3} s  {:>6.2} GiB/s  ({:.0}% of dd; stream {:.3} s, commit {:.3} s)",
        save_s,
        gib_per_s(bytes, save_s),
        100.0 * dd_time / save_s,
        child["upload_s"].as_f64().unwrap(),
        save_s - child["upload_s"].as_f64().unwrap()
    );
    println!(
        "podctl restore             {:>6.3} s  {:>6.2} GiB/s  ({cache}, every chunk CRC-checked, bitwise equal)",
        restore_s,
        gib_per_s(bytes, restore_s)
    );
    println!(
        "podctl restore, warm       {:>6.3} s  {:>6.2} GiB/s  (files in page cache)",
        warm_s,
        gib_per_s(bytes, warm_s)
    );
    println!("podctl training stall      {:>9.3} ms (AsyncSaver::start returning)", stall_s * 1e3);
    let kib = |k: &str| child[k].as_u64().unwrap() * 1024;
    let handed = child["bytes"].as_u64().unwrap();
    let growth = kib("hwm_kib").saturating_sub(kib("rss_before_kib"));
    let save_overhead = kib("hwm_kib").saturating_sub(kib("rss_loaded_kib"));
    println!(
        "podctl peak RSS growth     {:>7.1} MiB = {:.3}x the {:.1} MiB handed over (save itself: +{:.1} MiB)",
        growth as f64 / MIB,
        growth as f64 / handed as f64,
        handed as f64 / MIB,
        save_overhead as f64 / MIB
    );

    if args.iter().any(|a| a == "--skip-orbax") {
        return;
    }
    let venv = std::env::var_os("PODCTL_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"));
    let python = venv.join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    let list: Vec<serde_json::Value> =
        arrays.iter().map(|a| serde_json::json!({"name": a.name, "shape": a.shape})).collect();
    let list_path = scratch.path().join("arrays.json");
    std::fs::write(&list_path, serde_json::to_vec(&list).unwrap()).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/orbax_bench.py");
    let orbax = run_json(Command::new(python).arg(script).args([
        "--arrays",
        list_path.to_str().unwrap(),
        "--dir",
        scratch.path().to_str().unwrap(),
    ]));
    let (o_save, o_restore) = (orbax["save_s"].as_f64().unwrap(), orbax["restore_s"].as_f64().unwrap());
    let o_warm = orbax["restore_warm_s"].as_f64().unwrap();
    println!(
        "orbax {} save            {:>6.3} s  {:>6.2} GiB/s  (stall {:.3} s)",
        orbax["orbax"].as_str().unwrap_or("?"),
        o_save,
        gib_per_s(bytes, o_save),
        orbax["save_stall_s"].as_f64().unwrap()
    );
    println!("orbax restore              {:>6.3} s  {:>6.2} GiB/s", o_restore, gib_per_s(bytes, o_restore));
    println!("orbax restore, warm        {:>6.3} s  {:>6.2} GiB/s", o_warm, gib_per_s(bytes, o_warm));
    println!(
        "podctl vs orbax: save {:.2}x faster, restore {:.2}x faster ({:.2}x warm) (goals >= 2x); save at {:.0}% of dd (goal >= 70%); RSS growth {:.3}x (goal <= 1.25x + fixed)",
        o_save / save_s,
        o_restore / restore_s,
        o_warm / warm_s,
        100.0 * dd_time / save_s,
        growth as f64 / handed as f64
    );
}
