//! Compiles a StableHLO module for a device topology and prints the per-device memory the
//! compiler says it needs.
//!
//! ```text
//! cargo run -p podctl-pjrt --example memory_stats -- \
//!     --plugin .venv/lib/python3/site-packages/libtpu/libtpu.so \
//!     --topology v6e:2x4 --partitions 8 module.mlirbc
//! ```
//!
//! libtpu must see [`pjrt::LIBTPU_AOT_ENV`] when it loads; if the environment lacks it, the
//! example runs itself again with it set.

use pjrt::{CompileOptions, LIBTPU_AOT_ENV, Plugin};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

const USAGE: &str =
    "usage: memory_stats --plugin PATH --topology NAME [--partitions N] [--devices ID,ID,...] MODULE";

struct Args {
    plugin: PathBuf,
    topology: String,
    partitions: u32,
    /// Device ids of partitions 0, 1, ...; none lets the compiler choose.
    devices: Option<Vec<i64>>,
    module: PathBuf,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut plugin, mut topology, mut partitions, mut devices, mut module) = (None, None, 1, None, None);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value"));
        match arg.as_str() {
            "--plugin" => plugin = Some(PathBuf::from(value("--plugin")?)),
            "--topology" => topology = Some(value("--topology")?),
            "--partitions" => {
                let text = value("--partitions")?;
                partitions =
                    text.parse().map_err(|_| format!("--partitions {text} is not a positive integer"))?;
            }
            "--devices" => {
                let text = value("--devices")?;
                let ids = text.split(',').map(|id| id.trim().parse::<i64>());
                devices = Some(
                    ids.collect::<Result<_, _>>()
                        .map_err(|_| format!("--devices {text} is not a list of ids"))?,
                );
            }
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            path if module.is_none() => module = Some(PathBuf::from(path)),
            extra => return Err(format!("unexpected argument {extra}")),
        }
    }
    Ok(Args {
        plugin: plugin.ok_or("--plugin is required")?,
        topology: topology.ok_or("--topology is required")?,
        partitions,
        devices,
        module: module.ok_or("the module path is required")?,
    })
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let module = std::fs::read(&args.module).map_err(|e| format!("read {}: {e}", args.module.display()))?;
    let start = Instant::now();
    let plugin = Plugin::load(&args.plugin)?;
    let topology = plugin.topology(&args.topology, &[])?;
    let loaded = start.elapsed();
    let start = Instant::now();
    let options = CompileOptions {
        device_assignment: args.devices.clone().map(|ids| vec![ids]),
        ..CompileOptions::spmd(args.partitions)
    };
    let executable = topology.compile(&module, &options)?;
    let compiled = start.elapsed();
    let stats = executable.memory_stats()?;
    let (major, minor) = plugin.api_version();
    println!("plugin           {} (PJRT C API {major}.{minor})", plugin.path().display());
    println!(
        "topology         {} ({} devices, {})",
        args.topology,
        topology.num_devices()?,
        topology.platform_name()?
    );
    println!("partitions       {}", args.partitions);
    if let Some(devices) = &args.devices {
        println!("devices          {devices:?}");
    }
    println!("argument bytes   {}", stats.argument_bytes);
    println!("output bytes     {}", stats.output_bytes);
    println!("alias bytes      {}", stats.alias_bytes);
    println!("temp bytes       {}", stats.temp_bytes);
    println!("code bytes       {}", stats.generated_code_bytes);
    println!("peak bytes       {}", stats.peak_bytes);
    println!("load+topology    {:.3} s", loaded.as_secs_f64());
    println!("compile          {:.3} s", compiled.as_secs_f64());
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if !LIBTPU_AOT_ENV.iter().all(|(name, value)| std::env::var(name).as_deref() == Ok(*value)) {
        let status = std::env::current_exe()
            .and_then(|exe| Command::new(exe).args(std::env::args().skip(1)).envs(LIBTPU_AOT_ENV).status());
        return match status {
            Ok(status) if status.success() => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(error) => {
                eprintln!("cannot run itself again with libtpu's environment: {error}");
                ExitCode::FAILURE
            }
        };
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
