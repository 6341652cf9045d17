//! `podctl worker`: one worker process, driven by a coordinator (local mode spawns these; on a
//! cluster each host runs one).

use anyhow::{Context, Result, bail};
use clap::Args;
use coordinator::client::ClientConfig;
use coordinator::tls::ClientTls;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;
use worker::agent::{AgentConfig, AgentExit};

#[derive(Args)]
pub struct WorkerArgs {
    /// Coordinator addresses (host:port), comma-separated: any node of the cluster.
    #[arg(long, env = "PODCTL_COORDINATOR", value_delimiter = ',', required = true)]
    coordinator: Vec<String>,
    /// The job to work for (its id or name).
    #[arg(long)]
    job: String,
    /// The PJRT plugin (a shared library).
    #[arg(long)]
    plugin: PathBuf,
    /// The job's token (prefer the environment or a file: arguments show in `ps`).
    #[arg(long, env = "PODCTL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the job's token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The address the data plane (all-reduce, state transfer) listens on; peers must reach it.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// The slice this worker was started for, when known.
    #[arg(long)]
    slice: Option<u32>,
    /// This host's name, as people see it.
    #[arg(long)]
    host: Option<String>,
    /// The CA that signed the coordinators' certificates (PEM).
    #[arg(long, requires_all = ["cert", "key"])]
    ca: Option<PathBuf>,
    /// This worker's client certificate (PEM), for mutual TLS.
    #[arg(long)]
    cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Talk to the coordinator without TLS: local mode on loopback only.
    #[arg(long, conflicts_with = "ca")]
    insecure_plaintext: bool,
}

/// Exit code of a worker that left on SIGTERM (preempted), as opposed to one told to stop.
pub const PREEMPTED_EXIT: u8 = 3;

pub fn run(args: WorkerArgs) -> Result<u8> {
    let token = match (&args.token, &args.token_file) {
        (Some(token), _) => token.clone(),
        (None, Some(file)) => std::fs::read_to_string(file)
            .with_context(|| format!("reading the token file {}", file.display()))?
            .trim()
            .to_string(),
        (None, None) => bail!("no job token: set PODCTL_TOKEN or pass --token-file"),
    };
    let tls = match (&args.ca, &args.cert, &args.key) {
        (Some(ca), Some(cert), Some(key)) => {
            let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
            Some(ClientTls { ca_pem: read(ca)?, identity: Some((read(cert)?, read(key)?)) })
        }
        _ if args.insecure_plaintext => None,
        _ => bail!("no TLS material: pass --ca, --cert and --key, or --insecure-plaintext for local mode"),
    };
    let mut coordinator = ClientConfig::new(args.coordinator, token, tls);
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
        bind: args.bind,
        slice: args.slice,
    };
    match worker::agent::run(config)? {
        AgentExit::Stopped(reason) => {
            tracing::info!("stopped: {reason}");
            Ok(0)
        }
        AgentExit::Preempted => Ok(PREEMPTED_EXIT),
    }
}
