//! `podctl worker`: one worker process, driven by a coordinator (local mode spawns these; on a
//! cluster each host runs one).

use crate::connect::ConnectArgs;
use anyhow::Result;
use clap::Args;
use client::ClientConfig;
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
    /// Seconds from SIGTERM to SIGKILL for this process: the deadline its preemption notice
    /// reports (worker pods are given their terminationGracePeriodSeconds).
    #[arg(long, env = "PODCTL_GRACE_PERIOD_SECONDS", default_value_t = 30)]
    grace_period_seconds: u64,
}

/// Exit status of a worker that left on SIGTERM (preempted), as opposed to one told to stop:
/// 128 + 15, what a shell reports for a process SIGTERM ended.
pub const PREEMPTED_EXIT: u8 = 143;

pub fn run(args: WorkerArgs, runtime: &tokio::runtime::Handle) -> Result<u8> {
    let mut coordinator = args.connect.client_config()?;
    // A worker outlives elections and coordinator restarts: keep retrying for a while.
    coordinator.retry_for = Duration::from_secs(60);
    match worker::agent::run(agent_config(args, coordinator), sigterm(), runtime)? {
        AgentExit::Stopped(reason) => {
            tracing::info!("stopped: {reason}");
            Ok(0)
        }
        AgentExit::Preempted => Ok(PREEMPTED_EXIT),
    }
}

fn agent_config(args: WorkerArgs, coordinator: ClientConfig) -> AgentConfig {
    let host = args.host.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    });
    AgentConfig {
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
        preemption_deadline: Duration::from_secs(args.grace_period_seconds),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use controller::{DesiredJob, ObjectRef, Resources, TpuSlice, WorkerTemplate};

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Worker(WorkerArgs),
    }

    #[test]
    fn a_worker_pod_s_deadline_is_its_grace_period() {
        for grace in [15, 120] {
            let slice = TpuSlice::new("tpu-v6e-slice", "2x4", None).unwrap();
            let template = WorkerTemplate {
                namespace: "train".into(),
                instance: "podctl".into(),
                image: "podctl-worker:test".into(),
                coordinator: "podctl.train.svc:7001".into(),
                resources: Resources::for_slice(&slice).unwrap(),
                slice,
                spot: true,
                grace_period_seconds: grace,
                host_network: true,
                service_account: None,
                subdomain: "podctl-workers".into(),
                tls_secret: Some("podctl-worker-tls".into()),
            };
            let job = DesiredJob {
                id: "llm-1".into(),
                running: true,
                slices: 1,
                devices_per_slice: 8,
                worker_token: "t".into(),
                registrations: vec![],
                object_uid: Some("u".into()),
                queue: None,
                priority_class: None,
            };
            let owner = ObjectRef { name: "llm-1-job".into(), uid: "u".into() };
            let pod = template.pod(&job, &owner, 0, 0, 0, &Default::default());
            let spec = pod.spec.unwrap();
            let container = &spec.containers[0];
            // The pod's own command line, as the kubelet runs it, and the plugin the worker
            // image's environment names.
            let argv = container.command.iter().flatten().chain(container.args.iter().flatten());
            let argv = argv.map(String::as_str).chain(["--plugin", "/opt/libtpu/libtpu.so"]);
            let Command::Worker(args) = Cli::try_parse_from(argv).unwrap().command;
            let config =
                agent_config(args, ClientConfig::new(vec!["podctl.train.svc:7001".into()], "t", None));
            let grace_period = spec.termination_grace_period_seconds.unwrap();
            assert_eq!(grace_period, grace);
            assert_eq!(config.preemption_deadline, Duration::from_secs(grace_period as u64));
        }
    }
}
