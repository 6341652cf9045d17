//! Compiles one StableHLO module with a PJRT plugin and prints its memory statistics as one
//! JSON line: the child process of the planner's exact mode (`planner_exact::ProcessCompiler`).
//!
//! ```text
//! podctl-compile-stats --plugin libtpu.so --module grad_step.mlirbc --partitions 8 --topology v6e:2x4
//! ```
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    planner_exact::child_main(std::env::args().skip(1))
}
