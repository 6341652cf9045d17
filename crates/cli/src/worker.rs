//! `podctl worker`: one worker process, driven by a coordinator (local mode spawns these; on a
//! cluster each host runs one).

use crate::connect::ConnectArgs;
use anyhow::Result;
use clap::Args;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;
use worker::agent::{AgentConfig, AgentExit};

#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// The job to work for (its id or name).
    #[arg(long)]
    job: String,
    /// The PJRT plugin (a shared library; worker images set the environment variable).
    #[arg(long, env = "PODCTL_PJRT_PLUGIN")]
    plugin: PathBuf,
    /// The address the data plane (all-reduce, state transfer) listens on; peers must reach it
    /// (worker pods pass their host-network address).
    #[arg(long, env = "PODCTL_BIND", default_value = "127.0.0.1")]
    bind: IpAddr,
    /// The slice this worker was started for, when known (worker pods are told).
    #[arg(long, env = "PODCTL_SLICE")]
    slice: Option<u32>,
    /// Register under this instance id (worker pods use their pod name, which is how the
    /// Kubernetes controller tells whose pod was lost); default: host, pid and time.
    #[arg(long, env = "PODCTL_INSTANCE_ID")]
    instance_id: Option<String>,
    /// This host's name, as people see it.
    #[arg(long)]
    host: Option<String>,
    /// Serve Prometheus metrics at /metrics on this address (port 0 picks one).
    #[arg(long, env = "PODCTL_WORKER_METRICS")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Write the metrics address here once bound.
    #[arg(long, requires = "metrics_listen")]
    metrics_addr_file: Option<PathBuf>,
    /// Keep compiled programs in this directory and load them from it when the same worker
    /// starts again (a replacement, a restart) instead of compiling.
    #[arg(long, env = "PODCTL_COMPILE_CACHE")]
    compile_cache: Option<PathBuf>,
}

/// Exit code of a worker that left on SIGTERM (preempted), as opposed to one told to stop.
pub const PREEMPTED_EXIT: u8 = 3;

pub fn run(args: WorkerArgs) -> Result<u8> {
    let mut coordinator = args.connect.client_config()?;
    // A worker outlives elections and coordinator restarts: keep retrying for a while.
    coordinator.retry_for = Duration::from_secs(60);
    let host = args.host.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    });
    let config = AgentConfig {
        coordinator,
        job_id: args.job,
        plugin: args.plugin,
        host,
        instance_id: args.instance_id,
        bind: args.bind,
        slice: args.slice,
        metrics_listen: args.metrics_listen,
        metrics_addr_file: args.metrics_addr_file,
        compile_cache: args.compile_cache,
    };
    match worker::agent::run(config, sigterm())? {
        AgentExit::Stopped(reason) => {
            tracing::info!("stopped: {reason}");
            Ok(0)
        }
        AgentExit::Preempted => Ok(PREEMPTED_EXIT),
    }
}

/// Resolves on SIGTERM (a preemption notice, a pod's deletion); never when it cannot be watched.
async fn sigterm() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut sigterm) => {
            sigterm.recv().await;
        }
        Err(e) => {
            tracing::warn!("cannot watch for SIGTERM: {e}");
            std::future::pending::<()>().await;
        }
    }
}
