//! podctl's commands: `launch`, `plan`, `worker`, `ckpt`, `status`, `logs`, `stop`, `doctor`. Each parses
//! its flags and hands them to the libraries; anything more than glue belongs in a library crate.
//!
//! The `podctl` binary (`crates/podctl`) parses the command line into a [`Command`] and calls
//! [`run`]. This crate knows a coordinator only through its client (`podctl-client`): local
//! mode's embedded node comes from the binary as a [`StartNode`], so the cli builds without
//! openraft, redb or the gRPC server, and no protobuf type reaches it.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod ckpt;
mod connect;
mod context;
mod doctor;
mod embedded;
pub mod exit;
mod export;
mod init_from;
mod interrupt;
mod launch;
mod local;
mod logs;
mod models;
mod outage;
mod plan;
mod progress;
mod single;
mod status;
mod summary;
mod toolchain;
mod worker;

pub use embedded::{BoxFuture, EmbeddedNode, NodeSettings, StartNode};

use ::worker::single::Resume;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

/// podctl's commands (the binary adds `podctl coordinator`).
#[derive(Subcommand)]
pub enum Command {
    /// Run a training job. Without a cluster, everything runs on this machine (Ctrl-C stops it
    /// after saving a checkpoint); against one, the launch follows the job and Ctrl-C detaches.
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
        /// Start afresh instead of resuming, beside what the job's checkpoint root holds: the
        /// run begins a new line of checkpoints there; nothing already there is deleted or
        /// rewritten.
        #[arg(long, conflicts_with = "resume")]
        start_over: bool,
        /// Print the job as a Kubernetes manifest instead of running it (for GitOps): export
        /// and upload the bundle, then print a ConfigMap that the coordinators of the install
        /// submit once applied, and whose deletion stops the job (docs/gke.md).
        #[arg(long, conflicts_with_all = ["dry_run", "resume", "start_over", "coordinator", "kube_context"])]
        render: bool,
        /// With --render: the Helm release of the install the job is declared to.
        #[arg(long, default_value = "podctl", requires = "render")]
        release: String,
        /// Override a spec field, checked as the file is (repeatable): `--set steps=500 --set
        /// optimizer.lr=1e-3`; values are YAML (`--set data.digits=[2,3]`).
        #[arg(long = "set", value_name = "FIELD=VALUE")]
        set: Vec<String>,
        /// Run on this machine even when a saved context names a cluster.
        #[arg(long, conflicts_with_all = ["coordinator", "kube_context", "context", "render"])]
        local: bool,
        /// Against a cluster: return once the job is accepted, printing how to follow and stop
        /// it (without it the launch follows the job, and Ctrl-C detaches: the job runs on).
        #[arg(long, short, conflicts_with_all = ["dry_run", "render", "local"])]
        detach: bool,
        /// Submit to this coordinator cluster instead of running one here (see `podctl worker`).
        #[command(flatten)]
        connect: connect::ConnectArgs,
    },
    /// Plan a job: the meshes, micro-batches and remat policies that fit, and the fastest.
    Plan(plan::PlanArgs),
    /// The compile child of `podctl plan --exact`: one compile, one JSON line on stdout.
    #[command(name = plan::COMPILE_CHILD, hide = true)]
    CompileStats {
        /// The compile's arguments, as `podctl plan --exact` passes them.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run a worker process for a job under a coordinator (one per host).
    Worker(worker::WorkerArgs),
    /// Inspect and manage checkpoints: list, show, verify, digest, export, import, rm.
    Ckpt {
        /// What to do with them.
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
    /// Save, pick and list the clusters commands talk to (so that `--coordinator`, `--ca`,
    /// `--token-file` or `--kube-context` need not be repeated).
    Context {
        /// What to do.
        #[command(subcommand)]
        command: context::ContextCommand,
    },
    /// Check this machine: podctl's Python, JAX and plugin, the cache, and with --job or
    /// --coordinator/--kube-context what that job or cluster needs; one line per check.
    Doctor(doctor::DoctorArgs),
}

/// Runs `command`; `node` starts local mode's embedded coordinator when a launch needs one.
/// `runtime` is the process's one async runtime (built by `main`): the commands are synchronous
/// and block on it where they do I/O.
pub fn run(
    command: Command,
    node: &dyn StartNode,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<ExitCode> {
    match command {
        Command::Launch {
            job,
            dry_run,
            out,
            resume,
            start_over,
            render,
            release,
            set,
            local,
            detach,
            connect,
        } => {
            let resume = match (resume, start_over) {
                (Some(from), _) => Resume::From(from),
                (None, true) => Resume::StartOver,
                (None, false) => Resume::Newest,
            };
            let overrides = overrides(&set)?;
            let connect = match local {
                true => connect,
                false => connect.with_saved(&context::Config::load()?)?,
            };
            match render {
                true => launch::render(&job, &overrides, &release, runtime)?,
                false => {
                    launch::run(&job, &overrides, dry_run, detach, out, resume, &connect, node, runtime)?
                }
            }
        }
        Command::Ckpt { command } => ckpt::run(command, runtime)?,
        Command::Worker(args) => return Ok(ExitCode::from(worker::run(args, runtime)?)),
        Command::Plan(args) => plan::run(&args, runtime)?,
        Command::Status(mut args) => {
            args.connect = args.connect.with_saved(&context::Config::load()?)?;
            status::run(&args, runtime)?
        }
        Command::Logs(mut args) => {
            args.connect = args.connect.with_saved(&context::Config::load()?)?;
            logs::run(&args, runtime)?
        }
        Command::Stop(mut args) => {
            args.connect = args.connect.with_saved(&context::Config::load()?)?;
            status::stop(&args, runtime)?
        }
        Command::Context { command } => context::run(command)?,
        Command::Doctor(mut args) => {
            args.connect = args.connect.with_saved(&context::Config::load()?)?;
            return doctor::run(&args, runtime);
        }
        Command::CompileStats { args } => return Ok(planner_exact::child_main(args.into_iter())),
    }
    Ok(ExitCode::SUCCESS)
}

/// The `--set FIELD=VALUE` overrides, parsed.
fn overrides(set: &[String]) -> anyhow::Result<Vec<job::Override>> {
    Ok(set.iter().map(|s| job::Override::parse(s)).collect::<Result<_, _>>()?)
}

/// Prints a command's error with the causes it does not already say, and gives its exit status
/// ([`exit::classify`]).
pub fn report(error: &anyhow::Error) -> ExitCode {
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
    ExitCode::from(exit::classify(error).code())
}
