//! `podctl`: the command line of podctl's commands (`crates/cli`) plus `podctl coordinator`, a
//! node of the coordinator cluster (`crates/coordinator`, the same command the
//! `podctl-coordinator` binary runs). This binary is only the glue between the two: it parses the
//! command line, sets up logging, and hands the cli a way to start local mode's embedded node
//! ([`node::Embedded`]), so that the cli does not depend on the coordinator (ripgrep's layout:
//! a thin binary on top, docs/ARCHITECTURE.md).
#![forbid(unsafe_code)]

mod node;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// Train large models on pods of accelerators that come and go.
#[derive(Parser)]
#[command(name = "podctl", version, about, after_help = cli::exit::HELP)]
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
    /// Print a completion script for a shell, e.g. `podctl completions bash >
    /// ~/.local/share/bash-completion/completions/podctl` (zsh: into a directory of `$fpath` as
    /// `_podctl`; fish: `~/.config/fish/completions/podctl.fish`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
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
    coordinator::logging::init(log, podctl.log_json);
    // The process's one async runtime (every core, as the `podctl-coordinator` binary's), made
    // after the re-exec above and handed down: commands are synchronous and block on it where
    // they do I/O, a worker's uploads and session run on it beside the thread that owns PJRT.
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("podctl").build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return cli::report(&anyhow::Error::new(error).context("cannot start the async runtime"));
        }
    };
    let result = match podctl.command {
        Command::Cli(command) => cli::run(command, &node::Embedded, runtime.handle()),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Podctl::command(), "podctl", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Coordinator(node) => {
            runtime.block_on(coordinator::command::run(node)).map(|()| ExitCode::SUCCESS)
        }
    };
    // Tasks still running (a metrics server, a forwarder past its last words) end with the process.
    runtime.shutdown_timeout(SHUTDOWN_WAIT);
    result.unwrap_or_else(|error| cli::report(&error))
}

/// How long the runtime's tasks get to end when the command is done.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
