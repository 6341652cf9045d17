//! The planner's exact mode: export each candidate's bundle, compile its programs for the
//! target, read the compiled memory statistics. The part of planning that touches files,
//! processes and PJRT, in a crate of its own so that only what compiles links PJRT (the CLI and
//! the worker; the coordinator reaches the pure `planner` through the job crate); the search
//! sees it through [`planner::Oracle`].
//!
//! Exporting goes through the caller's [`Exporter`] (podctl has a bundle cache; tests run the
//! exporter directly). Compiling goes through a [`Compiler`], normally a [`ProcessCompiler`]
//! that compiles in a child process. Compiles run on `parallelism` threads and land in a
//! [`DiskCache`] keyed by the program's content, the partition count, the topology and the
//! plugin, so that a second plan of the same job compiles nothing.
//!
//! A program's peak on one device comes from its compiled statistics (JAX's
//! `memory_analysis()` fields, [`ProgramStats::peak`]): on TPU libtpu's own peak, the count its
//! out-of-memory check uses; on CPU `argument + output - alias + temp + generated_code`. Then
//! the train state that stays resident beside it without being one of its arguments is added.
//! When libtpu refuses a program because it does not fit, its error gives the bytes it would
//! have used, and those stand in for the peak.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod cache;
mod child;

pub use cache::{CacheEntry, DiskCache, cache_key};
pub use child::{ChildReport, ProcessCompiler, child_main, parse_out_of_memory};

use bundle::Bundle;
use planner::{
    Attention, Candidate, Kind, Measured, Oracle, Platform, Target, Workload, laid_out_bytes, peak_programs,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

/// A program's compiled memory statistics on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramStats {
    /// Bytes of the arguments.
    pub argument: u64,
    /// Bytes of the outputs.
    pub output: u64,
    /// Bytes of outputs that reuse donated argument memory.
    pub alias: u64,
    /// Scratch bytes.
    pub temp: u64,
    /// Bytes of the compiled code.
    pub generated_code: u64,
    /// The plugin's own peak (`peak_memory_in_bytes`, 0 where it reports none).
    #[serde(default)]
    pub reported_peak: u64,
}

impl ProgramStats {
    /// `argument + output - alias + temp + generated_code`: the sum of the fields.
    pub fn sum(&self) -> u64 {
        (self.argument + self.output + self.temp + self.generated_code).saturating_sub(self.alias)
    }

    /// What the program occupies on a device of `platform`, given its `inputs`. libtpu's temp
    /// bytes count the fragmentation of its temporaries twice (8-54% of them, docs/PLANNER.md),
    /// so on TPU it is libtpu's own peak, the arguments plus its temporaries' allocation (what
    /// its out-of-memory check compares with the HBM), less the inputs it counts there although
    /// they live in host memory (offloaded optimizer state). XLA:CPU's peak counts only the
    /// arguments; there the sum of the fields is the allocation.
    pub fn peak(&self, platform: Platform, inputs: &Inputs) -> u64 {
        match platform {
            Platform::Tpu if self.reported_peak > 0 => self.reported_peak.saturating_sub(inputs.host),
            _ => self.sum(),
        }
    }
}

/// The result of one compile.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompileOutcome {
    /// It compiled; these are its statistics.
    Compiled(ProgramStats),
    /// The compiler refused it: it would use `used` bytes of the `limit` it has.
    OutOfMemory {
        /// Bytes the compiler says the program needs.
        used: u64,
        /// The compiler's limit.
        limit: u64,
        /// `used` counts the scratch memory only (libtpu's early check), not the arguments.
        temporaries_only: bool,
    },
}

impl CompileOutcome {
    /// Bytes the program occupies on one device of `platform`; its `inputs` complete an
    /// out-of-memory count that covers the scratch memory only.
    pub fn bytes(&self, platform: Platform, inputs: &Inputs) -> u64 {
        match *self {
            CompileOutcome::Compiled(stats) => stats.peak(platform, inputs),
            CompileOutcome::OutOfMemory { used, temporaries_only: false, .. } => used,
            CompileOutcome::OutOfMemory { used, temporaries_only: true, .. } => used + inputs.device,
        }
    }
}

/// Bytes of a program's inputs on one device, by where they live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inputs {
    /// In device memory.
    pub device: u64,
    /// In host memory (offloaded optimizer state).
    pub host: u64,
}

/// One module to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileJob {
    /// The StableHLO file (`programs/<name>.mlirbc` of a bundle).
    pub module: PathBuf,
    /// SPMD partitions: the devices of one slice.
    pub partitions: u32,
    /// The topology to compile for without devices (`v6e:2x4`), or `None` for a client on
    /// this machine's CPU devices.
    pub topology: Option<String>,
}

/// Compiles a module and reports its memory statistics.
pub trait Compiler: Sync {
    /// What distinguishes this compiler's results from another's (plugin and version); part of
    /// the cache key.
    fn identity(&self) -> String;
    /// Compiles `job`.
    fn compile(&self, job: &CompileJob) -> Result<CompileOutcome, String>;
}

/// What to export for one candidate: the exporter's arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct BundleRequest {
    /// The workload.
    pub workload: Workload,
    /// The candidate.
    pub candidate: Candidate,
    /// `tpu` or `cpu`.
    pub platform: &'static str,
}

impl BundleRequest {
    /// Arguments for `python -m podctl_models.export` (everything but `--out`); the optimizer
    /// keeps the exporter's defaults, which do not change memory.
    pub fn exporter_args(&self) -> Vec<String> {
        let w = &self.workload;
        let c = &self.candidate;
        let [model_flag, model] = w.model.exporter_args();
        let mut args = vec![
            (model_flag.as_str(), model),
            ("--mesh", format!("fsdp={},tp={}", c.layout.fsdp, c.layout.tp)),
            ("--micro-batch", c.micro_batch.to_string()),
            ("--remat", c.remat.to_string()),
            ("--param-dtype", w.param_dtype.to_string()),
            ("--compute-dtype", w.compute_dtype.to_string()),
            ("--platform", self.platform.to_string()),
        ];
        // Levers only when set, so plain candidates keep the bundles (and caches) they had.
        if c.attention != Attention::Xla {
            args.push(("--attention", c.attention.to_string()));
            args.push(("--attention-block", w.attention_block.to_string()));
        }
        if let Some(lora) = &w.lora {
            args.push(("--lora-rank", lora.rank.to_string()));
            args.push(("--lora-targets", lora.targets.join(",")));
            args.push(("--lora-base-dtype", lora.base_dtype.to_string()));
        }
        match w.kind {
            Kind::Sft { seq_len } => {
                args.push(("--seq-len", seq_len.to_string()));
                args.push(("--loss-chunk", w.chunk().to_string()));
            }
            Kind::Grpo { prompt_len, max_new_tokens, .. } => {
                args.push(("--kind", "grpo".into()));
                args.push(("--prompt-len", prompt_len.to_string()));
                args.push(("--max-new-tokens", max_new_tokens.to_string()));
                args.push(("--logprob-chunk", w.loss_chunk.to_string()));
            }
        }
        let mut args: Vec<String> =
            args.into_iter().flat_map(|(flag, value)| [flag.to_string(), value]).collect();
        if c.offload {
            args.push("--offload-optimizer".into());
        }
        args
    }
}

/// Produces bundles: the caller's exporter (with its own cache).
pub trait Exporter: Sync {
    /// The directory of the bundle for `request`, exporting it if needed.
    fn export(&self, request: &BundleRequest) -> Result<PathBuf, String>;
}

impl<F: Fn(&BundleRequest) -> Result<PathBuf, String> + Sync> Exporter for F {
    fn export(&self, request: &BundleRequest) -> Result<PathBuf, String> {
        self(request)
    }
}

/// What exact mode is doing, for a progress display.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A bundle export started.
    Exporting(Candidate),
    /// A compile started (`cached` = read from the cache instead).
    Compiling {
        /// The candidate.
        candidate: Candidate,
        /// The program.
        program: String,
    },
    /// A compile finished after `seconds`.
    Compiled {
        /// The candidate.
        candidate: Candidate,
        /// The program.
        program: String,
        /// The compiler's count for the program alone: no resident state, host-memory inputs
        /// not yet taken off libtpu's peak, scratch only if the compiler ran out of memory early.
        bytes: u64,
        /// Wall time of the compile.
        seconds: f64,
    },
}

/// Counters of one plan's exact work.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExactStats {
    /// Bundles exported or found.
    pub bundles: usize,
    /// Compiles run.
    pub compiles: usize,
    /// Compiles answered from the cache.
    pub cached: usize,
    /// Seconds spent compiling (summed over threads).
    pub compile_seconds: f64,
}

/// The [`Oracle`] of exact mode.
pub struct ExactOracle<'a> {
    workload: Workload,
    target: Target,
    exporter: &'a dyn Exporter,
    compiler: &'a dyn Compiler,
    cache: Option<DiskCache>,
    parallelism: usize,
    /// A program other than the training program and `apply_step` is compiled only if its
    /// analytic peak is at least this share of the training program's (see `needs_compile`).
    skip_below: f64,
    progress: Option<&'a (dyn Fn(&Progress) + Sync)>,
    stats: Mutex<ExactStats>,
}

impl<'a> ExactOracle<'a> {
    /// Measures candidates of `workload` on `target` with these tools, `parallelism` exports or
    /// compiles at a time.
    pub fn new(
        workload: &Workload,
        target: &Target,
        exporter: &'a dyn Exporter,
        compiler: &'a dyn Compiler,
        parallelism: usize,
    ) -> Self {
        Self {
            workload: workload.clone(),
            target: target.clone(),
            exporter,
            compiler,
            cache: None,
            parallelism: parallelism.max(1),
            skip_below: 0.75,
            progress: None,
            stats: Mutex::new(ExactStats::default()),
        }
    }

    /// Compiles every program of the step, even those the analytic model puts far below the
    /// training program.
    pub fn compile_every_program(mut self) -> Self {
        self.skip_below = 0.0;
        self
    }

    /// Whether `program` of `candidate` needs a compile: the training program sets the peak of
    /// nearly every step and `apply_step` is cheap to compile, so both always do; another
    /// program (GRPO's rollout) only when the analytic model puts it within reach of the
    /// training program (its error is about 10%, the margin here 25%). Otherwise its analytic
    /// bytes are reported as not compiled.
    fn needs_compile(&self, candidate: &Candidate, program: &str) -> Result<(), u64> {
        if program == "apply_step" || program == "grad_step" || program == "grpo_grad_step" {
            return Ok(());
        }
        let estimate = planner::estimate(&self.workload, candidate, &self.target.accelerator);
        let train = if self.workload.is_grpo() { "grpo_grad_step" } else { "grad_step" };
        let bytes = |name| estimate.program(name).map_or(0, |p| p.bytes());
        let (this, training) = (bytes(program), bytes(train));
        if this as f64 >= self.skip_below * training as f64 { Ok(()) } else { Err(this) }
    }

    /// Caches compiled statistics in `cache`.
    pub fn with_cache(mut self, cache: DiskCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Reports what it does to `progress`.
    pub fn with_progress(mut self, progress: &'a (dyn Fn(&Progress) + Sync)) -> Self {
        self.progress = Some(progress);
        self
    }

    /// What it has done so far.
    pub fn stats(&self) -> ExactStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn report(&self, event: Progress) {
        if let Some(progress) = self.progress {
            progress(&event);
        }
    }

    fn request(&self, candidate: &Candidate) -> BundleRequest {
        BundleRequest {
            workload: self.workload.clone(),
            candidate: *candidate,
            platform: self.target.accelerator.platform.name(),
        }
    }

    /// The compile of one program of one bundle: its module file and cache key.
    fn job(
        &self,
        candidate: &Candidate,
        bundle: &Bundle,
        program: &str,
    ) -> Result<(CompileJob, String), String> {
        let module = bundle.dir().join(&bundle.program(program).map_err(|e| e.to_string())?.file);
        let bytes = std::fs::read(&module).map_err(|e| format!("cannot read {}: {e}", module.display()))?;
        let partitions = candidate.layout.devices_per_slice() as u32;
        let topology = self.target.accelerator.topology.clone();
        let key =
            cache_key(&bytes, partitions, topology.as_deref().unwrap_or("cpu"), &self.compiler.identity());
        Ok((CompileJob { module, partitions, topology }, key))
    }

    /// Compiles `job` (or reads it from the cache).
    fn compile(
        &self,
        candidate: &Candidate,
        program: &str,
        job: &CompileJob,
        key: &str,
    ) -> Result<CompileOutcome, String> {
        if let Some(entry) = self.cache.as_ref().and_then(|c| c.get(key)) {
            self.stats.lock().unwrap_or_else(|e| e.into_inner()).cached += 1;
            return Ok(entry.outcome);
        }
        self.report(Progress::Compiling { candidate: *candidate, program: program.to_string() });
        let started = Instant::now();
        let outcome = self.compiler.compile(job)?;
        let seconds = started.elapsed().as_secs_f64();
        self.report(Progress::Compiled {
            candidate: *candidate,
            program: program.to_string(),
            bytes: outcome.bytes(self.target.accelerator.platform, &Inputs::default()),
            seconds,
        });
        {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.compiles += 1;
            stats.compile_seconds += seconds;
        }
        if let Some(cache) = &self.cache {
            let entry = CacheEntry { outcome, compile_seconds: seconds, program: program.to_string() };
            cache
                .put(key, &entry)
                .map_err(|e| format!("cannot write the compile cache {}: {e}", cache.dir().display()))?;
        }
        Ok(outcome)
    }
}

/// Runs `tasks` on up to `threads` threads, results in task order.
fn run_parallel<T: Sync, R: Send>(tasks: &[T], threads: usize, work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..tasks.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(tasks.len()).max(1) {
            scope.spawn(|| {
                loop {
                    let i = {
                        let mut next = next.lock().unwrap_or_else(|e| e.into_inner());
                        let i = *next;
                        *next += 1;
                        i
                    };
                    let Some(task) = tasks.get(i) else { break };
                    let result = work(task);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every task ran"))
        .collect()
}

/// `(resident, inputs)` on one device during `program`: bytes of train state resident that it
/// does not take as arguments (the parameters, both AdamW moments unless offloaded to host
/// memory, the gradient accumulator, LoRA's frozen base and, for GRPO, the reference model,
/// minus what its inputs hold), and the bytes of its inputs.
pub fn resident_outside(
    bundle: &Bundle,
    program: &str,
    workload: &Workload,
    target: &Target,
) -> Result<(u64, Inputs), String> {
    let manifest = bundle.manifest();
    let platform = target.accelerator.platform;
    let mesh = &manifest.mesh;
    let spec = bundle.program(program).map_err(|e| e.to_string())?;
    let laid_out =
        |t: &bundle::TensorSpec| laid_out_bytes(&t.sharding.shard_shape(&t.shape, mesh), t.dtype, platform);
    // Inputs in host memory (offloaded AdamW state) take no device memory.
    let on_host =
        |host: bool| spec.inputs.iter().filter(|t| t.memory_kind.is_some() == host).map(laid_out).sum();
    let inputs = Inputs { device: on_host(false), host: on_host(true) };
    let per_param = |prefix: &str| -> u64 {
        manifest
            .params
            .iter()
            .filter(|p| {
                let name = format!("{prefix}{}", &p.name["params/".len()..]);
                !spec.inputs.iter().any(|t| t.name == name)
            })
            .map(laid_out)
            .sum()
    };
    let mut bytes = per_param("params/") + per_param("grads/");
    if !manifest.train.optimizer_offload {
        bytes += per_param("opt/mu/") + per_param("opt/nu/");
    }
    // LoRA's frozen base, where the program does not take it.
    bytes += manifest
        .frozen
        .iter()
        .filter(|f| !spec.inputs.iter().any(|t| t.name == f.name))
        .map(laid_out)
        .sum::<u64>();
    if workload.is_grpo() {
        // The reference model is never an argument under its own name: `logprobs` takes it in
        // place of the parameters.
        bytes += manifest.params.iter().map(laid_out).sum::<u64>();
    }
    Ok((bytes, inputs))
}

impl Oracle for ExactOracle<'_> {
    fn measure(&self, candidates: &[Candidate]) -> Vec<Result<Measured, String>> {
        // Export every bundle first (in parallel), then compile the distinct programs.
        let bundles: Vec<Result<Bundle, String>> = run_parallel(candidates, self.parallelism, |candidate| {
            self.report(Progress::Exporting(*candidate));
            let dir = self.exporter.export(&self.request(candidate))?;
            let bundle = Bundle::load(&dir).map_err(|e| e.to_string())?;
            bundle.check_mesh(&candidate.layout.ici_mesh()).map_err(|e| e.to_string())?;
            Ok(bundle)
        });
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).bundles +=
            bundles.iter().filter(|b| b.is_ok()).count();
        // Each (candidate, program) needs an outcome; the same module bytes compile to the same
        // statistics (apply_step does not depend on the micro-batch or the remat policy), so
        // each distinct cache key is compiled once.
        let programs = peak_programs(&self.workload);
        let mut needs: Vec<(usize, &str, Result<String, String>)> = Vec::new();
        let mut unique: BTreeMap<String, (usize, &str, CompileJob)> = BTreeMap::new();
        let mut not_compiled: Vec<Vec<(String, u64)>> = vec![Vec::new(); candidates.len()];
        for (i, bundle) in bundles.iter().enumerate() {
            let Ok(bundle) = bundle else { continue };
            for &program in programs {
                if let Err(bytes) = self.needs_compile(&candidates[i], program) {
                    not_compiled[i].push((program.to_string(), bytes));
                    continue;
                }
                match self.job(&candidates[i], bundle, program) {
                    Ok((job, key)) => {
                        unique.entry(key.clone()).or_insert((i, program, job));
                        needs.push((i, program, Ok(key)));
                    }
                    Err(message) => needs.push((i, program, Err(message))),
                }
            }
        }
        let mut unique: Vec<(String, (usize, &str, CompileJob))> = unique.into_iter().collect();
        // The training programs take the longest to compile: start them first so the short ones
        // fill in behind them. Cached results cost nothing wherever they sit.
        unique.sort_by_key(|(key, (i, program, _))| {
            (*program == "apply_step", *program == "rollout", *i, key.clone())
        });
        let compiled = run_parallel(&unique, self.parallelism, |(key, (i, program, job))| {
            self.compile(&candidates[*i], program, job, key)
        });
        let outcomes: BTreeMap<&str, Result<CompileOutcome, String>> =
            unique.iter().map(|(key, _)| key.as_str()).zip(compiled).collect();

        let mut results: Vec<Result<Measured, String>> = Vec::with_capacity(candidates.len());
        for (i, bundle) in bundles.into_iter().enumerate() {
            let bundle = match bundle {
                Ok(bundle) => bundle,
                Err(message) => {
                    results.push(Err(format!("export failed: {message}")));
                    continue;
                }
            };
            let mut measured = Measured {
                programs: Vec::new(),
                compiler_out_of_memory: false,
                not_compiled: std::mem::take(&mut not_compiled[i]),
            };
            let mut failure = None;
            for (owner, program, key) in &needs {
                if *owner != i {
                    continue;
                }
                let outcome =
                    key.as_ref().map_err(Clone::clone).and_then(|key| outcomes[key.as_str()].clone());
                let outcome = match outcome {
                    Ok(outcome) => outcome,
                    Err(message) => {
                        failure = Some(format!("compiling {program}: {message}"));
                        break;
                    }
                };
                measured.compiler_out_of_memory |= matches!(outcome, CompileOutcome::OutOfMemory { .. });
                match resident_outside(&bundle, program, &self.workload, &self.target) {
                    Ok((resident, inputs)) => {
                        let bytes = outcome.bytes(self.target.accelerator.platform, &inputs);
                        measured.programs.push((program.to_string(), bytes + resident));
                    }
                    Err(message) => {
                        failure = Some(message);
                        break;
                    }
                }
            }
            results.push(match failure {
                Some(message) => Err(message),
                None => Ok(measured),
            });
        }
        results
    }
}

/// How many compiles to run at once: one per core, and no more than the memory available
/// allows at `bytes_per_compile` each (read from `/proc/meminfo` where it exists).
pub fn default_parallelism(bytes_per_compile: u64) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        text.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    });
    let by_memory = available.map_or(cores, |bytes| (bytes / bytes_per_compile.max(1)) as usize);
    cores.min(by_memory).max(1)
}
