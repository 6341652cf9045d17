//! Runs one coordinator node (the container image and process tests use it; `podctl
//! coordinator` calls the same library function), or makes development certificates.
//!
//! ```text
//! podctl-coordinator --id 1 --listen 127.0.0.1:7001 --peers 1=127.0.0.1:7001,2=...,3=... \
//!     --data-dir /var/lib/podctl/1 --tls-dir certs/   (admin token in PODCTL_ADMIN_TOKEN)
//! podctl-coordinator dev-ca --dir certs/ --host coordinator-0.example
//! ```

// The workspace names this crate `coordinator` everywhere else.
extern crate podctl_coordinator as coordinator;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use coordinator::{Config, TlsFiles};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(version, about = "A podctl coordinator node", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Writes a development CA, a server certificate and a client certificate.
    DevCa {
        /// Where to write them.
        #[arg(long)]
        dir: PathBuf,
        /// Extra host names or IPs the server certificate is valid for (localhost and 127.0.0.1
        /// always are).
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
}

#[derive(Args)]
struct NodeArgs {
    /// This node's id (1, 2, 3, ...).
    #[arg(long)]
    id: Option<u64>,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:7001")]
    listen: SocketAddr,
    /// The address others reach this node at (default: the listen address).
    #[arg(long)]
    advertise: Option<String>,
    /// The initial cluster: `id=host:port,...`, this node included. Omit on a node that will
    /// be added with `podctl coordinator add`.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Where the Raft log and snapshots live.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A directory with ca.pem, server.pem/key and client.pem/key (see `dev-ca`).
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// Serve without TLS (local mode on loopback only).
    #[arg(long)]
    insecure_plaintext: bool,
    /// The admin bearer token.
    #[arg(long, env = "PODCTL_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Snapshot after this many log entries.
    #[arg(long, default_value_t = 5000)]
    snapshot_every: u64,
    /// Worker lease, milliseconds.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// Worker heartbeat interval, milliseconds.
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    /// Write each job's run record into its output directory.
    #[arg(long)]
    record_runs: bool,
}

fn parse_peers(peers: &[String]) -> anyhow::Result<BTreeMap<u64, String>> {
    peers
        .iter()
        .map(|p| {
            let (id, addr) = p.split_once('=').with_context(|| format!("peer '{p}' is not id=host:port"))?;
            Ok((id.parse().with_context(|| format!("peer id '{id}' is not a number"))?, addr.to_string()))
        })
        .collect()
}

fn config(args: NodeArgs) -> anyhow::Result<Config> {
    let Some(id) = args.id else { bail!("--id is required to run a node") };
    let Some(data_dir) = args.data_dir else { bail!("--data-dir is required to run a node") };
    let Some(token) = args.admin_token else {
        bail!("give the admin token with --admin-token or PODCTL_ADMIN_TOKEN")
    };
    let mut config = Config::new(id, args.listen, data_dir, token);
    config.advertise = args.advertise;
    config.peers = parse_peers(&args.peers)?;
    config.tls = args.tls_dir.as_deref().map(TlsFiles::in_dir);
    config.insecure_plaintext = args.insecure_plaintext;
    config.snapshot_every = args.snapshot_every;
    config.record_runs = args.record_runs;
    config.timeouts.lease = Duration::from_millis(args.lease_ms);
    config.timeouts.heartbeat = Duration::from_millis(args.heartbeat_ms);
    Ok(config)
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

async fn main_inner() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::DevCa { dir, hosts }) = cli.command {
        let files = coordinator::tls::create_dev_ca(&dir, &hosts)?;
        println!(
            "wrote {}, {}, {}",
            files.ca.display(),
            files.server_cert.display(),
            files.client_cert.display()
        );
        return Ok(());
    }
    let config = config(cli.node)?;
    let node = coordinator::Node::bind(config).await?;
    // Process tests and scripts read this line to learn the port.
    println!("listening on {}", node.local_addr());
    node.serve(shutdown_signal()).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn,h2=warn,tower=warn,hyper=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match main_inner().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podctl-coordinator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_bad_ones_are_named() {
        let peers = parse_peers(&["1=127.0.0.1:1".into(), "2=h:2".into()]).unwrap();
        assert_eq!(peers[&2], "h:2");
        assert!(parse_peers(&["x".into()]).unwrap_err().to_string().contains("'x'"));
    }
}
