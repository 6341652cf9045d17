//! Compiling in a child process. A plugin that aborts (libtpu does on some inputs) takes only
//! the child down, and each child loads libtpu with the environment it needs for ahead-of-time
//! compiles on a machine without TPUs, which cannot be set safely inside a running process.
//!
//! The child is any executable that calls [`child_main`] with its arguments: the crate's
//! `podctl-compile-stats` binary, or `podctl` itself through a hidden subcommand. It prints one
//! JSON line, a [`ChildReport`], on stdout.

use super::{CompileJob, CompileOutcome, Compiler, ProgramStats};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// What the child prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildReport {
    /// The program compiled (or the compiler refused it for lack of memory).
    Outcome(CompileOutcome),
    /// Anything else went wrong; the message says what.
    Error(String),
}

/// Compiles programs by running `program args... --plugin P --module FILE --partitions N
/// [--topology T]` and reading its [`ChildReport`].
#[derive(Debug, Clone)]
pub struct ProcessCompiler {
    /// The executable that runs [`child_main`].
    pub program: PathBuf,
    /// Arguments before the compile's own (e.g. a hidden subcommand name).
    pub args: Vec<String>,
    /// The PJRT plugin: libtpu for TPU topologies, the CPU plugin otherwise.
    pub plugin: PathBuf,
    /// How long one compile may take before the child is killed.
    pub timeout: Duration,
}

impl ProcessCompiler {
    /// A compiler running `program args...` with `plugin`, allowing 30 minutes per compile.
    pub fn new(program: impl Into<PathBuf>, args: Vec<String>, plugin: impl Into<PathBuf>) -> Self {
        Self { program: program.into(), args, plugin: plugin.into(), timeout: Duration::from_secs(30 * 60) }
    }
}

/// Keeps the last `limit` bytes of a stream (libtpu logs a lot on stderr).
fn drain_tail(mut stream: impl Read + Send + 'static, limit: usize) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buffer = [0u8; 8192];
        while let Ok(n) = stream.read(&mut buffer) {
            if n == 0 {
                break;
            }
            kept.extend_from_slice(&buffer[..n]);
            if kept.len() > 2 * limit {
                kept.drain(..kept.len() - limit);
            }
        }
        if kept.len() > limit {
            kept.drain(..kept.len() - limit);
        }
        kept
    })
}

impl Compiler for ProcessCompiler {
    fn identity(&self) -> String {
        // The plugin's path, size and modification time: a different plugin build is a
        // different compiler, without hashing hundreds of megabytes on every plan.
        let meta = std::fs::metadata(&self.plugin).ok();
        let size = meta.as_ref().map_or(0, |m| m.len());
        let modified = meta
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        format!("{} size={size} mtime={modified} assignment=identity", self.plugin.display())
    }

    fn compile(&self, job: &CompileJob) -> Result<CompileOutcome, String> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .arg("--plugin")
            .arg(&self.plugin)
            .arg("--module")
            .arg(&job.module)
            .args(["--partitions", &job.partitions.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(topology) = &job.topology {
            command.args(["--topology", topology]);
            command.envs(pjrt::LIBTPU_AOT_ENV);
            // Compiling needs no chip, so concurrent children may each load libtpu.
            command.env("ALLOW_MULTIPLE_LIBTPU_LOAD", "1");
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start the compiler {}: {e}", self.program.display()))?;
        let stdout = drain_tail(child.stdout.take().expect("stdout is piped"), 1 << 20);
        let stderr = drain_tail(child.stderr.take().expect("stderr is piped"), 4096);
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() > self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "compiling {} did not finish in {} s; the child was killed",
                        job.module.display(),
                        self.timeout.as_secs()
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(format!("waiting for the compiler: {e}")),
            }
        };
        let stdout = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        let report = String::from_utf8_lossy(&stdout)
            .lines()
            .rev()
            .find_map(|line| serde_json::from_str::<ChildReport>(line).ok());
        match report {
            Some(ChildReport::Outcome(outcome)) => Ok(outcome),
            Some(ChildReport::Error(message)) => Err(message),
            None => Err(format!(
                "the compiler exited with {status} without a report; its last words: {}",
                String::from_utf8_lossy(&stderr).trim()
            )),
        }
    }
}

/// What an XLA:TPU out-of-memory error says: `(used, limit, temporaries_only)`. libtpu words
/// it two ways: `Used 60.41G of 31.25G hbm` (everything the program needs) once it has placed
/// the buffers, or `the total memory required for HLO temporaries (43.93G) exceeds available
/// HBM (31.25G)` when the scratch alone is too large, before placing anything. Sizes are in
/// binary units with two decimals, so the bytes are good to about 10 MiB.
pub fn parse_out_of_memory(message: &str) -> Option<(u64, u64, bool)> {
    if let Some(at) = message.find("Used ") {
        let mut words = message[at + 5..].split_whitespace();
        let used = parse_size(words.next()?)?;
        if words.next()? != "of" {
            return None;
        }
        let limit = parse_size(words.next()?)?;
        return Some((used, limit, false));
    }
    let at = message.find("HLO temporaries (")?;
    let rest = &message[at + "HLO temporaries (".len()..];
    let used = parse_size(&rest[..rest.find(')')?])?;
    let rest = &rest[rest.find("available HBM (")? + "available HBM (".len()..];
    let limit = parse_size(&rest[..rest.find(')')?])?;
    Some((used, limit, true))
}

fn parse_size(text: &str) -> Option<u64> {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic())?);
    let scale = match unit {
        "B" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    Some((value * scale as f64).round() as u64)
}

struct ChildArgs {
    plugin: PathBuf,
    module: PathBuf,
    partitions: u32,
    topology: Option<String>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<ChildArgs, String> {
    let (mut plugin, mut module, mut partitions, mut topology) = (None, None, None, None);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--plugin" => plugin = Some(PathBuf::from(value()?)),
            "--module" => module = Some(PathBuf::from(value()?)),
            "--partitions" => {
                let text = value()?;
                partitions = Some(text.parse().map_err(|_| format!("--partitions {text} is not a count"))?);
            }
            "--topology" => topology = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(ChildArgs {
        plugin: plugin.ok_or("--plugin is required")?,
        module: module.ok_or("--module is required")?,
        partitions: partitions.ok_or("--partitions is required")?,
        topology,
    })
}

fn stats(memory: pjrt::MemoryStats) -> ProgramStats {
    let bytes = |v: i64| v.max(0) as u64;
    ProgramStats {
        argument: bytes(memory.argument_bytes),
        output: bytes(memory.output_bytes),
        alias: bytes(memory.alias_bytes),
        temp: bytes(memory.temp_bytes),
        generated_code: bytes(memory.generated_code_bytes),
        reported_peak: bytes(memory.peak_bytes),
    }
}

fn compile_in_child(args: &ChildArgs) -> Result<CompileOutcome, String> {
    let module =
        std::fs::read(&args.module).map_err(|e| format!("cannot read {}: {e}", args.module.display()))?;
    let plugin = pjrt::Plugin::load(&args.plugin).map_err(|e| e.to_string())?;
    // Partition p on device p, as the worker compiles a slice's programs (its devices in mesh
    // order): XLA schedules and places buffers differently without a device assignment.
    let options = pjrt::CompileOptions {
        device_assignment: Some(vec![(0..i64::from(args.partitions)).collect()]),
        ..pjrt::CompileOptions::spmd(args.partitions)
    };
    let result = match &args.topology {
        Some(name) => {
            let topology = plugin.topology(name, &[]).map_err(|e| format!("topology {name}: {e}"))?;
            topology.compile(&module, &options).and_then(|executable| executable.memory_stats())
        }
        None => {
            let client = plugin
                .create_client(&[("cpu_device_count", pjrt::NamedValue::Int64(i64::from(args.partitions)))])
                .map_err(|e| e.to_string())?;
            client.compile(&module, &options).and_then(|executable| executable.memory_stats())
        }
    };
    match result {
        Ok(memory) => Ok(CompileOutcome::Compiled(stats(memory))),
        Err(error) => {
            let message = error.to_string();
            match parse_out_of_memory(&message) {
                Some((used, limit, temporaries_only)) => {
                    Ok(CompileOutcome::OutOfMemory { used, limit, temporaries_only })
                }
                None => Err(message),
            }
        }
    }
}

/// The child side: compiles one module as the arguments say and prints a [`ChildReport`] line.
/// Exits 0 when it printed a report, 2 on bad arguments.
pub fn child_main(args: impl Iterator<Item = String>) -> ExitCode {
    let args = match parse_args(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}\nusage: --plugin PATH --module FILE --partitions N [--topology NAME]");
            return ExitCode::from(2);
        }
    };
    let report = match compile_in_child(&args) {
        Ok(outcome) => ChildReport::Outcome(outcome),
        Err(message) => ChildReport::Error(message),
    };
    println!("{}", serde_json::to_string(&report).expect("reports serialize"));
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_messages_parse_in_binary_units() {
        let message = "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space \
                       hbm. Used 60.41G of 31.25G hbm. Exceeded hbm capacity by 29.16G.";
        let (used, limit, temporaries_only) = parse_out_of_memory(message).unwrap();
        assert_eq!(limit, planner::V6E_HBM_LIMIT);
        assert_eq!(used, (60.41 * (1u64 << 30) as f64).round() as u64);
        assert!(!temporaries_only);
        let early = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO \
                     temporaries (43.93G) exceeds available HBM (31.25G).";
        let (used, limit, temporaries_only) = parse_out_of_memory(early).unwrap();
        assert_eq!((used, limit), ((43.93 * (1u64 << 30) as f64).round() as u64, planner::V6E_HBM_LIMIT));
        assert!(temporaries_only);
        assert_eq!(parse_size("18.80M"), Some((18.80 * (1u64 << 20) as f64).round() as u64));
        assert_eq!(parse_out_of_memory("Used nothing"), None);
        assert_eq!(parse_out_of_memory("no memory words here"), None);
    }

    #[test]
    fn bad_arguments_are_refused_by_name() {
        let args = |list: &[&str]| parse_args(list.iter().map(|s| s.to_string())).err().unwrap();
        assert!(args(&["--plugin", "p", "--module", "m"]).contains("--partitions is required"));
        assert!(args(&["--partitions", "x"]).contains("--partitions x is not a count"));
        assert!(args(&["--bogus"]).contains("unknown argument --bogus"));
    }
}
