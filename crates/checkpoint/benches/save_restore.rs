//! Saves and restores a ~1 GiB training state on local disk and prints the numbers next to
//! Orbax (same arrays, CPU JAX, same machine, same run), `dd conv=fdatasync` of the same byte
//! count, and a cold `dd` read of the checkpoint's own files (evicted from the page cache first). Also prints the training stall of an async save and the peak RSS growth of a
//! save, measured in a child process from /proc/self/status. Run: `benches/run.sh`.
//!
//! Flags: `--gib F` (state size, default 1.0), `--dir PATH` (scratch directory on the disk to
//! measure, default the system temp dir), `--skip-orbax`.

extern crate podctl_checkpoint as checkpoint;

use bytes::Bytes;
use checkpoint::{
    ArraySpec, Checkpoint, DataPosition, HostUpload, SaveOptions, SaveSpec, ShardBuffer, Storage,
    StoreCommitLog, Topology, committed_newest_first, finalize,
};
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
    let (stall, uploaded, save) = runtime().block_on(async {
        let storage = Storage::open(dir.to_str().unwrap(), &Default::default()).unwrap();
        let start = Instant::now();
        let upload = HostUpload::new(&spec, 0, buffers).unwrap();
        let task = tokio::spawn({
            let storage = storage.clone();
            async move { upload.run(&storage, &SaveOptions::default()).await }
        });
        let stall = start.elapsed();
        let report = task.await.unwrap().unwrap();
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

/// Restores every array whole in one batch (as a worker restores its state), then checks them
/// bitwise (untimed).
async fn restore_once(storage: &Storage, commit: &checkpoint::CommitRecord, gib: f64) -> Duration {
    let start = Instant::now();
    let checkpoint = Checkpoint::open(storage, commit, &Default::default()).await.unwrap();
    let wanted: Vec<(&str, Region)> =
        checkpoint.manifest().arrays.iter().map(|a| (a.name.as_str(), Region::full(&a.shape))).collect();
    let restored = checkpoint.read_regions(&wanted).await.unwrap();
    let took = start.elapsed();
    let expected = model_arrays(gib);
    for (i, bytes) in restored.iter().enumerate() {
        assert_eq!(checkpoint.manifest().arrays[i].name, expected[i].name);
        assert!(*bytes == contents(i, bytes.len()), "array {} restored wrong", expected[i].name);
    }
    took
}

/// Drops `dir`'s files from the page cache: `sync`, then `posix_fadvise(POSIX_FADV_DONTNEED)` on
/// every file (orbax_bench.py does the same to its directory). Returns the bytes still resident
/// afterwards, as `fincore` counts them (None when fincore is missing).
fn evict(dir: &Path) -> Option<u64> {
    use std::os::fd::AsRawFd;
    unsafe extern "C" {
        fn posix_fadvise(fd: i32, offset: i64, len: i64, advice: i32) -> i32;
    }
    const POSIX_FADV_DONTNEED: i32 = 4;
    let _ = Command::new("sync").status();
    let files = files_under(dir);
    for path in &files {
        let file = std::fs::File::open(path).unwrap();
        // SAFETY: a plain syscall on a descriptor this function owns.
        let rc = unsafe { posix_fadvise(file.as_raw_fd(), 0, 0, POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise of {}", path.display());
    }
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .args(&files)
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|v| v.parse::<u64>().ok()).sum())
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { out.extend(files_under(&path)) } else { out.push(path) }
    }
    out
}

/// The disk's cold sequential read of the checkpoint's own bytes: every file of `dir` evicted
/// from the page cache, then read by `dd bs=16M` into /dev/null, one file after the other.
fn dd_read(dir: &Path) -> Duration {
    evict(dir);
    let start = Instant::now();
    for path in files_under(dir) {
        let status = Command::new("dd")
            .args([&format!("if={}", path.display()), "of=/dev/null", "bs=16M", "status=none"])
            .status()
            .expect("run dd");
        assert!(status.success(), "dd of {} failed", path.display());
    }
    start.elapsed()
}

/// A process's one runtime (the parent's and the saving child's), of two threads as a worker's
/// uploads get beside training.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A cold `dd` read of the checkpoint, then a restore with its files evicted from the page
/// cache the same way, then one warm.
fn restore(
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    gib: f64,
) -> (Duration, Duration, Option<u64>, Duration) {
    runtime.block_on(async {
        let storage = Storage::open(dir.to_str().unwrap(), &Default::default()).unwrap();
        let log = StoreCommitLog::new(storage.clone());
        let commit = committed_newest_first(&log).await.unwrap().remove(0);
        let dd = dd_read(dir);
        let resident = evict(dir);
        let first = restore_once(&storage, &commit, gib).await;
        let warm = restore_once(&storage, &commit, gib).await;
        (dd, first, resident, warm)
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn gib_per_s(bytes: u64, took: f64) -> f64 {
    bytes as f64 / MIB / 1024.0 / took
}

/// One round's numbers, seconds.
#[derive(Default)]
struct Round {
    dd: f64,
    dd_read: f64,
    save: f64,
    stream: f64,
    restore: f64,
    warm: f64,
    stall: f64,
    growth: f64,
    save_overhead_mib: f64,
    resident: Option<u64>,
    orbax: Option<(f64, f64, f64, f64, Option<u64>)>,
}

fn podctl_round(runtime: &tokio::runtime::Runtime, scratch: &Path, gib: f64, round: &mut Round) {
    let ours_dir = scratch.join("podctl");
    let _ = std::fs::remove_dir_all(&ours_dir);
    let child = run_json(Command::new(std::env::current_exe().unwrap()).args([
        "--child-save",
        ours_dir.to_str().unwrap(),
        "--gib",
        &gib.to_string(),
    ]));
    round.save = child["save_s"].as_f64().unwrap();
    round.stream = child["upload_s"].as_f64().unwrap();
    round.stall = child["stall_s"].as_f64().unwrap();
    let kib = |k: &str| child[k].as_u64().unwrap() * 1024;
    let handed = child["bytes"].as_u64().unwrap();
    round.growth = kib("hwm_kib").saturating_sub(kib("rss_before_kib")) as f64 / handed as f64;
    round.save_overhead_mib = kib("hwm_kib").saturating_sub(kib("rss_loaded_kib")) as f64 / MIB;
    let (dd_read, restore_time, resident, warm_time) = restore(runtime, &ours_dir, gib);
    (round.dd_read, round.restore, round.resident, round.warm) =
        (dd_read.as_secs_f64(), restore_time.as_secs_f64(), resident, warm_time.as_secs_f64());
    std::fs::remove_dir_all(&ours_dir).unwrap();
}

fn orbax_round(scratch: &Path, list_path: &Path, round: &mut Round) -> String {
    let venv = std::env::var_os("PODCTL_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"));
    let python = venv.join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/orbax_bench.py");
    let orbax = run_json(Command::new(python).arg(script).args([
        "--arrays",
        list_path.to_str().unwrap(),
        "--dir",
        scratch.to_str().unwrap(),
    ]));
    let f = |k: &str| orbax[k].as_f64().unwrap();
    round.orbax = Some((
        f("save_s"),
        f("restore_s"),
        f("restore_warm_s"),
        f("save_stall_s"),
        orbax["resident_bytes"].as_u64(),
    ));
    format!(
        "orbax-checkpoint {}, jax {}",
        orbax["orbax"].as_str().unwrap_or("?"),
        orbax["jax"].as_str().unwrap_or("?")
    )
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "?".into(), |l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let gib: f64 = flag("--gib").map_or(1.0, |v| v.parse().expect("--gib takes a number"));
    if let Some(dir) = flag("--child-save") {
        child_save(Path::new(&dir), gib);
        return;
    }
    let rounds: usize = flag("--rounds").map_or(3, |v| v.parse().expect("--rounds takes a count"));
    let skip_orbax = args.iter().any(|a| a == "--skip-orbax");
    let base = flag("--dir").map_or_else(std::env::temp_dir, PathBuf::from);
    let scratch = tempfile::Builder::new().prefix("podctl-ckpt-bench").tempdir_in(&base).unwrap();
    let arrays = model_arrays(gib);
    let bytes: u64 = arrays.iter().map(|a| a.num_bytes().unwrap()).sum();
    println!(
        "state: {} float32 arrays, {:.1} MiB, scratch {}, {rounds} rounds, load average {}",
        arrays.len(),
        bytes as f64 / MIB,
        scratch.path().display(),
        uptime()
    );
    let list: Vec<serde_json::Value> =
        arrays.iter().map(|a| serde_json::json!({"name": a.name, "shape": a.shape})).collect();
    let list_path = scratch.path().join("arrays.json");
    std::fs::write(&list_path, serde_json::to_vec(&list).unwrap()).unwrap();

    let gibs = |t: f64| gib_per_s(bytes, t);
    let runtime = runtime();
    let mut all = Vec::new();
    let mut versions = String::new();
    for r in 0..rounds {
        let mut round = Round { dd: dd(scratch.path(), bytes).as_secs_f64(), ..Round::default() };
        // Alternate who goes first, so neither always runs right after dd or on a warmer disk.
        if skip_orbax {
            podctl_round(&runtime, scratch.path(), gib, &mut round);
        } else if r % 2 == 0 {
            podctl_round(&runtime, scratch.path(), gib, &mut round);
            versions = orbax_round(scratch.path(), &list_path, &mut round);
        } else {
            versions = orbax_round(scratch.path(), &list_path, &mut round);
            podctl_round(&runtime, scratch.path(), gib, &mut round);
        }
        let resident = |r: Option<u64>| {
            r.map_or("fincore missing".into(), |b| format!("{:.1} MiB resident", b as f64 / MIB))
        };
        println!(
            "round {}: load {}  dd {:.3} s  podctl save {:.3} s (stream {:.3}, commit {:.3})  dd read cold {:.3} s  restore cold {:.3} s ({}, {:.0}% of dd)  warm {:.3} s",
            r + 1,
            uptime(),
            round.dd,
            round.save,
            round.stream,
            round.save - round.stream,
            round.dd_read,
            round.restore,
            resident(round.resident),
            100.0 * round.dd_read / round.restore,
            round.warm
        );
        if let Some((save, restore, warm, _, res)) = round.orbax {
            println!(
                "         orbax save {save:.3} s  restore cold {restore:.3} s ({})  warm {warm:.3} s  => save {:.2}x, cold {:.2}x, warm {:.2}x",
                resident(res),
                save / round.save,
                restore / round.restore,
                warm / round.warm
            );
        }
        all.push(round);
    }

    let m = |f: &dyn Fn(&Round) -> f64| median(all.iter().map(f).collect());
    let (dd_s, save_s, stream_s, restore_s, warm_s) =
        (m(&|r| r.dd), m(&|r| r.save), m(&|r| r.stream), m(&|r| r.restore), m(&|r| r.warm));
    let dd_read_s = m(&|r| r.dd_read);
    println!("medians over {rounds} rounds (load average now {}):", uptime());
    println!("dd conv=fdatasync          {:>6.3} s  {:>6.2} GiB/s", dd_s, gibs(dd_s));
    println!(
        "dd read, cold (bs=16M)     {:>6.3} s  {:>6.2} GiB/s  (the checkpoint's files, evicted)",
        dd_read_s,
        gibs(dd_read_s)
    );
    println!(
        "podctl save (async, fsync) {:>6.3} s  {:>6.2} GiB/s  ({:.0}% of dd, per round median {:.0}%; stream {:.3} s, commit {:.3} s)",
        save_s,
        gibs(save_s),
        100.0 * dd_s / save_s,
        100.0 * m(&|r| r.dd / r.save),
        stream_s,
        save_s - stream_s
    );
    println!(
        "podctl restore, cold       {:>6.3} s  {:>6.2} GiB/s  (files evicted with POSIX_FADV_DONTNEED, every chunk CRC-checked, bitwise equal; {:.0}% of the cold dd read, per round median {:.0}%, goal >= 90%)",
        restore_s,
        gibs(restore_s),
        100.0 * dd_read_s / restore_s,
        100.0 * m(&|r| r.dd_read / r.restore)
    );
    println!(
        "podctl restore, warm       {:>6.3} s  {:>6.2} GiB/s  (files in page cache)",
        warm_s,
        gibs(warm_s)
    );
    println!("podctl training stall      {:>9.3} ms (the background upload spawned)", m(&|r| r.stall) * 1e3);
    println!(
        "podctl peak RSS growth     {:.3}x the {:.1} MiB handed over (save itself: +{:.1} MiB)",
        m(&|r| r.growth),
        bytes as f64 / MIB,
        m(&|r| r.save_overhead_mib)
    );
    if skip_orbax {
        return;
    }
    let o = |i: usize| {
        median(
            all.iter()
                .map(|r| {
                    let o = r.orbax.unwrap();
                    [o.0, o.1, o.2, o.3][i]
                })
                .collect(),
        )
    };
    let (o_save, o_restore, o_warm, o_stall) = (o(0), o(1), o(2), o(3));
    println!("{versions}");
    println!(
        "orbax save                 {:>6.3} s  {:>6.2} GiB/s  (stall {:.3} s)",
        o_save,
        gibs(o_save),
        o_stall
    );
    println!("orbax restore, cold        {:>6.3} s  {:>6.2} GiB/s", o_restore, gibs(o_restore));
    println!("orbax restore, warm        {:>6.3} s  {:>6.2} GiB/s", o_warm, gibs(o_warm));
    let ratio = |f: &dyn Fn(&Round) -> f64| {
        let v: Vec<f64> = all.iter().map(f).collect();
        let (lo, hi) = v.iter().fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        format!("{:.2}x (rounds {lo:.2}-{hi:.2})", median(v))
    };
    println!(
        "podctl vs orbax, per-round ratios' medians: save {} faster, cold restore {}, warm restore {} (goals >= 2x); save at {:.0}% of dd (goal >= 70%); RSS growth {:.3}x (goal <= 1.25x + fixed)",
        ratio(&|r| r.orbax.unwrap().0 / r.save),
        ratio(&|r| r.orbax.unwrap().1 / r.restore),
        ratio(&|r| r.orbax.unwrap().2 / r.warm),
        100.0 * m(&|r| r.dd / r.save),
        m(&|r| r.growth)
    );
}
