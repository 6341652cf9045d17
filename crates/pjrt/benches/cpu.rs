//! Latencies and copy throughput on the CPU plugin; prints numbers, asserts nothing.
//!
//! `cargo bench -p podctl-pjrt --bench cpu` (plugin from `PODCTL_PJRT_PLUGIN` or the venv).

use pjrt::{Buffer, CompileOptions, ElementType, ExecuteArg, NamedValue, Plugin};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn plugin_path() -> PathBuf {
    std::env::var_os("PODCTL_PJRT_PLUGIN").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../.venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
    })
}

/// Runs `f` `n` times and returns the median and the fastest run.
fn timed(n: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut runs: Vec<Duration> = (0..n)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    runs.sort();
    (runs[n / 2], runs[0])
}

fn report(what: &str, (median, fastest): (Duration, Duration)) {
    println!(
        "{what:<44} median {:>10.1} us   min {:>10.1} us",
        median.as_secs_f64() * 1e6,
        fastest.as_secs_f64() * 1e6
    );
}

fn main() {
    let start = Instant::now();
    let plugin = Plugin::load(plugin_path()).expect("load the CPU plugin (run scripts/setup.sh)");
    println!("plugin load + initialize                     {:>10.1} ms", start.elapsed().as_secs_f64() * 1e3);
    let start = Instant::now();
    let client = plugin.create_client(&[("cpu_device_count", NamedValue::Int64(4))]).unwrap();
    println!("client create (4 devices)                    {:>10.1} ms", start.elapsed().as_secs_f64() * 1e3);
    let devices = client.devices().unwrap();

    let start = Instant::now();
    let accumulate = client.compile(&fixture("accumulate.mlir"), &CompileOptions::default()).unwrap();
    println!("compile accumulate.mlir (1 device)           {:>10.1} ms", start.elapsed().as_secs_f64() * 1e3);
    let start = Instant::now();
    let sharded = client.compile(&fixture("sharded.mlirbc"), &CompileOptions::spmd(4)).unwrap();
    println!("compile sharded.mlirbc (4 partitions)        {:>10.1} ms", start.elapsed().as_secs_f64() * 1e3);

    let device = &accumulate.devices().unwrap()[0];
    let zeros = vec![0u8; 64];
    let x = client.buffer_from_host(&zeros, ElementType::F32, &[16], device).unwrap();
    let mut state = Some(client.buffer_from_host(&zeros, ElementType::F32, &[16], device).unwrap());
    report(
        "execute acc+2x, donated, 1 device",
        timed(2000, || {
            let mut outputs = accumulate
                .execute(vec![vec![ExecuteArg::Donate(state.take().unwrap()), ExecuteArg::Borrow(&x)]])
                .unwrap();
            state = Some(outputs.remove(0).remove(0));
        }),
    );

    let upload = |dims: &[i64], device| {
        let size = dims.iter().product::<i64>() as usize * 4;
        client.buffer_from_host(&vec![0u8; size], ElementType::F32, dims, device).unwrap()
    };
    let xs: Vec<Buffer> = devices.iter().map(|d| upload(&[4, 16], d)).collect();
    let ws: Vec<Buffer> = devices.iter().map(|d| upload(&[16, 4], d)).collect();
    report(
        "execute tanh(x@w), 4 devices",
        timed(2000, || {
            let args = (0..4).map(|d| vec![ExecuteArg::Borrow(&xs[d]), ExecuteArg::Borrow(&ws[d])]).collect();
            sharded.execute(args).unwrap();
        }),
    );

    for mib in [1usize, 64] {
        let bytes = vec![7u8; mib << 20];
        let dims = [(bytes.len() / 4) as i64];
        let (median, fastest) = timed(20, || {
            client.buffer_from_host(&bytes, ElementType::F32, &dims, &devices[0]).unwrap();
        });
        println!(
            "host -> device {mib:>3} MiB                          median {:>8.2} GB/s   best {:>8.2} GB/s",
            bytes.len() as f64 / median.as_secs_f64() / 1e9,
            bytes.len() as f64 / fastest.as_secs_f64() / 1e9
        );
        let buffer = client.buffer_from_host(&bytes, ElementType::F32, &dims, &devices[0]).unwrap();
        let mut host = vec![0u8; bytes.len()];
        let (median, fastest) = timed(20, || buffer.to_host_into(&mut host).unwrap());
        println!(
            "device -> host {mib:>3} MiB                          median {:>8.2} GB/s   best {:>8.2} GB/s",
            bytes.len() as f64 / median.as_secs_f64() / 1e9,
            bytes.len() as f64 / fastest.as_secs_f64() / 1e9
        );
    }
}
