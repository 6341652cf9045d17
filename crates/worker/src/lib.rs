//! The worker: one per host. It compiles a bundle's programs for the host's devices, keeps the
//! parameters and optimizer state resident on device, and trains.
//!
//! # Layout
//! - [`slice`]: a PJRT client over the slice's devices, programs compiled for them, and
//!   [`DeviceArray`]s, global arrays held as one buffer per device, moved to and from the host by
//!   their sharding.
//! - [`compile_cache`]: compiled programs on disk, loaded instead of compiled by a process that
//!   starts again (a replacement, a restart).
//! - [`trainer`]: the train state on device and its programs: gradient steps into a donated
//!   accumulator, apply.
//! - [`objective`]: what a step learns from; [`sft`] (the data's batches) and [`grpo`] (the
//!   policy's own rollouts, scored by verifiable rewards; [`grpo_stats`] its advantages and
//!   tallies).
//! - [`step`]: one global step of any objective over the data-parallel ranks this worker
//!   hosts: every rank's gradient, the reduction between workers, apply.
//! - [`phases`]: where a step's time went, by named phase, returned with every step.
//! - [`data_files`]: the job's data files on this host: local, or ranged reads from a bucket
//!   into a local cache.
//! - [`eval`]: held-out evaluation of either objective through the bundle's `rollout`.
//! - [`WorkerError`] (`error.rs`): why the worker stopped, as types, and what that means
//!   ([`fault::Fault`]).
//! - [`driver`]: the one training loop (steps, evaluation, reports, saves), whoever runs it.
//! - [`start`]: where a fresh run's state comes from, and an objective's frozen reference.
//! - [`ckpt`]: checkpoints of the train state: a host's share saved in the background, restore
//!   onto any mesh, the one save schedule.
//! - [`single`]: a job on one slice in this process, without a coordinator.
//! - [`agent`]: the worker process under a coordinator: session, assignments and resume,
//!   reports, decisions.
//! - [`peer`]: state transfer from a live peer to a replacement.
//! - [`metrics`]: the agent's Prometheus page.
//! - [`hf`]: a Hugging Face model's weights onto the devices, each device reading its regions.
//!
//! **Architecture Invariant:** the worker never interprets StableHLO; everything it knows about a
//! program comes from the bundle manifest. Buffers stay on device between steps; the host sees
//! only batches going in and metrics coming out (and, for syncs and saves, gradients and state).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod agent;
pub mod ckpt;
pub mod compile_cache;
pub mod data_files;
pub mod driver;
mod error;
pub mod eval;
pub mod grpo;
pub mod grpo_stats;
pub mod hf;
pub mod metrics;
pub mod objective;
pub mod peer;
pub mod phases;
pub mod sft;
pub mod single;
pub mod slice;
pub mod start;
pub mod step;
pub mod trainer;

pub use driver::{Control, Ended, OnInterrupt, Plan, Sink, Steps, Trained, TrainerSteps};
pub use error::{Part, WorkerError};
pub use objective::{EvalReport, Objective};
pub use phases::Phases;
pub use slice::{Arg, DeviceArray, Program, Slice};
pub use step::{Reduce, StepResult, run_step};
pub use trainer::Trainer;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// The modules `crate::` paths in `source` name (its tests excluded), by their first segment.
    fn imports(source: &str) -> BTreeSet<String> {
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        let mut names = BTreeSet::new();
        for line in code.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
            // Outside string literals only (a quote's odd-numbered pieces are inside one).
            for piece in line.split('"').step_by(2) {
                for (at, _) in piece.match_indices("crate::") {
                    let rest = &piece[at + "crate::".len()..];
                    // `crate::{a, b::c}` names several; `crate::a::{b, c}` names one.
                    let paths: Vec<&str> = match rest.strip_prefix('{') {
                        Some(group) => group.split('}').next().unwrap_or(group).split(',').collect(),
                        None => vec![rest],
                    };
                    for path in paths {
                        let name: String =
                            path.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        if !name.is_empty() {
                            names.insert(name);
                        }
                    }
                }
            }
        }
        names
    }

    /// The modules import one way: no cycle between them, and none imports through `lib.rs`
    /// (which only declares and re-exports), so the crate reads bottom-up (docs/ARCHITECTURE.md).
    #[test]
    fn modules_import_one_way() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let module = |name: &str| src.join(format!("{name}.rs")).is_file() || src.join(name).is_dir();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut through_lib = Vec::new();
        let mut files = vec![src.clone()];
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let relative = path.strip_prefix(&src).unwrap();
            let top = relative.iter().next().unwrap().to_string_lossy().trim_end_matches(".rs").to_string();
            if top == "lib" || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            for name in imports(&std::fs::read_to_string(&path).unwrap()) {
                match module(&name) {
                    true if name != top => {
                        graph.entry(top.clone()).or_default().insert(name);
                    }
                    true => {}
                    false => through_lib.push(format!("{} imports crate::{name}", relative.display())),
                }
            }
        }
        assert!(through_lib.is_empty(), "import from the module, not lib.rs's re-export: {through_lib:?}");
        // Depth-first: a module met again while on the path closes a cycle.
        fn visit<'a>(
            at: &'a str,
            graph: &'a BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
        ) {
            if let Some(start) = path.iter().position(|m| *m == at) {
                panic!("the modules import each other: {} -> {at}", path[start..].join(" -> "));
            }
            if !done.insert(at) {
                return;
            }
            path.push(at);
            for next in graph.get(at).into_iter().flatten() {
                visit(next, graph, path, done);
            }
            path.pop();
        }
        let mut done = BTreeSet::new();
        for module in graph.keys() {
            visit(module, &graph, &mut Vec::new(), &mut done);
        }
        assert!(graph.len() > 10 && graph["driver"].contains("ckpt"), "the scan sees the imports: {graph:?}");
    }
}
