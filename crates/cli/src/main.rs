//! `podctl`: the command line. It parses arguments and hands them to the libraries; anything
//! more than glue belongs in a library crate.

mod ckpt;
mod connect;
mod export;
mod grpo;
mod launch;
mod local;
mod logs;
mod models;
mod plan;
mod progress;
mod status;
mod toolchain;
mod worker;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Train large models on pods of accelerators that come and go.
#[derive(Parser)]
#[command(name = "podctl", version, about)]
struct Cli {
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
    /// Run a training job. Without a cluster, everything runs on this machine.
    Launch {
        /// The job spec (YAML).
        job: PathBuf,
        /// Check the spec, resolve the bundle and the layout, then stop.
        #[arg(long)]
        dry_run: bool,
        /// The run directory (overrides the spec's `output`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Start from this checkpoint directory, or from the newest that restores under this
        /// root (default: the newest under the job's own checkpoint root, if any).
        #[arg(long)]
        resume: Option<String>,
        /// Print the job as a Kubernetes manifest instead of running it (for GitOps): export
        /// and upload the bundle, then print a ConfigMap that the coordinators of the install
        /// submit once applied, and whose deletion stops the job (docs/gke.md).
        #[arg(long, conflicts_with_all = ["dry_run", "resume", "coordinator", "kube_context"])]
        render: bool,
        /// With --render: the Helm release of the install the job is declared to.
        #[arg(long, default_value = "podctl", requires = "render")]
        release: String,
        /// Submit to this coordinator cluster instead of running one here (see `podctl worker`).
        #[command(flatten)]
        connect: connect::ConnectArgs,
    },
    /// Plan a job: the meshes, micro-batches and remat policies that fit, and the fastest.
    Plan(plan::PlanArgs),
    /// The compile child of `podctl plan --exact`: one compile, one JSON line on stdout.
    #[command(name = plan::COMPILE_CHILD, hide = true)]
    CompileStats {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run a worker process for a job under a coordinator (one per host).
    Worker(worker::WorkerArgs),
    /// Inspect and manage checkpoints: list, show, verify, digest, export, import, rm.
    Ckpt {
        #[command(subcommand)]
        command: ckpt::CkptCommand,
    },
    /// A job's status (or every job's) from the coordinators: progress, slices, checkpoint,
    /// recent events, leader; `--watch` keeps it on screen, `--json` for scripts.
    Status(status::StatusArgs),
    /// A job's worker logs, merged and labelled by slice; `-f` follows.
    Logs(logs::LogsArgs),
    /// Stop a job.
    Stop(status::StopArgs),
    /// Run a coordinator node (what the `podctl-coordinator` binary runs), or `dev-ca` to write
    /// development certificates.
    Coordinator(coordinator::command::NodeCommand),
}

fn main() -> ExitCode {
    quiet_xla_logs();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let log = match (&cli.command, matches.value_source("log")) {
        (Command::Coordinator(_), Some(ValueSource::DefaultValue)) => coordinator::command::DEFAULT_LOG,
        _ => &cli.log,
    };
    init_logging(log, cli.log_json);
    let result = match cli.command {
        Command::Launch { job, dry_run, out, resume, render, release, connect } => match render {
            true => launch::render(&job, &release),
            false => launch::run(&job, dry_run, out, resume, &connect),
        },
        Command::Ckpt { command } => ckpt::run(command),
        Command::Worker(args) => match worker::run(args) {
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Plan(args) => plan::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Logs(args) => logs::run(&args),
        Command::Stop(args) => status::stop(&args),
        // Every core, as the `podctl-coordinator` binary's runtime has.
        Command::Coordinator(node) => tokio::runtime::Runtime::new()
            .context("cannot start the async runtime")
            .and_then(|r| r.block_on(coordinator::command::run(node))),
        Command::CompileStats { args } => return planner::exact::child_main(args.into_iter()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            // Library errors often repeat their source in their own message; print what is new.
            let mut shown = error.to_string();
            for cause in error.chain().skip(1) {
                let cause = cause.to_string();
                if !shown.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                    shown = cause;
                }
            }
            ExitCode::from(2)
        }
    }
}

/// XLA inside the PJRT plugin logs INFO lines to stderr; keep warnings and errors unless the
/// user chose a level.
fn quiet_xla_logs() {
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        // SAFETY: called first thing in main, before any thread exists.
        unsafe { std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1") };
    }
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
