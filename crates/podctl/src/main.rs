//! `podctl`: the command line of podctl's commands (`crates/cli`) plus `podctl coordinator`, a
//! node of the coordinator cluster (`crates/coordinator`, the same command the
//! `podctl-coordinator` binary runs). This binary is only the glue between the two: it parses the
//! command line, sets up logging, and hands the cli a way to start local mode's embedded node
//! ([`node::Embedded`]), so that the cli does not depend on the coordinator (ripgrep's layout:
//! a thin binary on top, docs/ARCHITECTURE.md).
#![forbid(unsafe_code)]

mod node;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// Train large models on pods of accelerators that come and go.
#[derive(Parser)]
#[command(name = "podctl", version, about)]
struct Podctl {
    /// Log filter (e.g. `info`, `podctl=debug`); also read from RUST_LOG.
    #[arg(long, global = true, env = "PODCTL_LOG", default_value = "warn")]
    log: String,
    /// Logs as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Cli(cli::Command),
    /// Run a coordinator node (what the `podctl-coordinator` binary runs), or `dev-ca` to write
    /// development certificates.
    Coordinator(coordinator::command::NodeCommand),
}

fn main() -> ExitCode {
    // XLA inside the PJRT plugin logs INFO lines to stderr: keep warnings and errors unless the
    // user chose a level. First thing, while this process has one thread.
    pjrt::quiet_plugin_logs();
    let matches = Podctl::command().get_matches();
    // The commands that run programs (glibc reads its tunables at start); before any thread starts.
    if matches!(matches.subcommand_name(), Some("launch" | "worker")) {
        pjrt::restart_with_malloc_for_xla();
    }
    let podctl = Podctl::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let log = match (&podctl.command, matches.value_source("log")) {
        (Command::Coordinator(_), Some(ValueSource::DefaultValue)) => coordinator::command::DEFAULT_LOG,
        _ => &podctl.log,
    };
    init_logging(log, podctl.log_json);
    let result = match podctl.command {
        Command::Cli(command) => cli::run(command, &node::Embedded),
        // Every core, as the `podctl-coordinator` binary's runtime has.
        Command::Coordinator(node) => tokio::runtime::Runtime::new()
            .context("cannot start the async runtime")
            .and_then(|r| r.block_on(coordinator::command::run(node)))
            .map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|error| cli::report(&error))
}

fn init_logging(filter: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
