//! The command line of one coordinator node, shared by the `podctl-coordinator` binary (the
//! container image runs it) and `podctl coordinator`: flags, the Kubernetes controller's
//! settings, `dev-ca`, and running the node until SIGTERM or Ctrl-C.
//!
//! ```text
//! podctl coordinator --id 1 --listen 127.0.0.1:7001 --peers 1=127.0.0.1:7001,2=...,3=... \
//!     --data-dir /var/lib/podctl/1 --tls-dir certs/   (admin token in PODCTL_ADMIN_TOKEN)
//! podctl coordinator dev-ca --dir certs/ --host coordinator-0.example
//! ```
//!
//! With `--kubernetes` the node also runs the controller (`crates/controller`): on the Raft
//! leader only, it creates, watches and replaces the worker pods of every job (the chart in
//! `charts/podctl` passes every `--kube-*` flag; docs/KUBERNETES.md).

use crate::{Config, TlsFiles};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A node's log filter unless the operator gives one: its own lines at info (elections,
/// generations, recoveries), its libraries' at warn.
pub const DEFAULT_LOG: &str = "info,openraft=warn,h2=warn,tower=warn,hyper=warn";

/// A node's command line: run a node with [`NodeArgs`], or a subcommand.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodeCommand {
    #[command(subcommand)]
    command: Option<NodeSubcommand>,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Subcommand)]
enum NodeSubcommand {
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
    #[arg(long, conflicts_with = "id_from_hostname")]
    id: Option<u64>,
    /// Take the id from the StatefulSet ordinal that ends the host name: `podctl-0` is node 1.
    #[arg(long)]
    id_from_hostname: bool,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:7001")]
    listen: SocketAddr,
    /// The address others reach this node at (default: the listen address).
    #[arg(long)]
    advertise: Option<String>,
    /// The initial cluster: `id=host:port,...`, this node included. Omit on a node that will
    /// be added to a running cluster (`Cluster.AddMember`, docs/COORDINATOR.md).
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
    #[arg(long, default_value_t = 500)]
    heartbeat_ms: u64,
    /// A member silent this long while the rest of its generation waits on it is lost before
    /// its lease, milliseconds (default: 1.5 heartbeats; at or above the lease: off).
    #[arg(long)]
    suspect_ms: Option<u64>,
    /// Write each job's run record into its output directory.
    #[arg(long)]
    record_runs: bool,
    /// Serve Prometheus metrics (`GET /metrics`, plain HTTP) at this address.
    #[arg(long, env = "PODCTL_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    kube: KubeArgs,
}

/// The controller's settings (`--kubernetes`).
#[derive(Args)]
struct KubeArgs {
    /// Run the Kubernetes controller: the Raft leader creates, watches and replaces the worker
    /// pods of every job, with the pod's service account.
    #[arg(long)]
    kubernetes: bool,
    /// The namespace of worker pods (the coordinator's own).
    #[arg(long, env = "POD_NAMESPACE")]
    kube_namespace: Option<String>,
    /// The Helm release: labels the pods, so two installs never touch each other's.
    #[arg(long, default_value = "podctl")]
    kube_instance: String,
    /// The worker image (it runs `podctl worker`).
    #[arg(long)]
    kube_worker_image: Option<String>,
    /// The address workers dial: the coordinator's client Service, `host:port`.
    #[arg(long)]
    kube_coordinator_address: Option<String>,
    /// The headless Service that names the hosts of a slice, and owns every job object: deleting
    /// it (`helm uninstall`) deletes every job's pods.
    #[arg(long, default_value = "podctl-workers")]
    kube_worker_subdomain: String,
    /// The service account of worker pods (Workload Identity).
    #[arg(long)]
    kube_worker_service_account: Option<String>,
    /// The Secret with ca.pem, client.pem and client.key that worker pods mount.
    #[arg(long)]
    kube_worker_tls_secret: Option<String>,
    /// The TPU type of the node pools (`cloud.google.com/gke-tpu-accelerator`).
    #[arg(long, default_value = "tpu-v6e-slice")]
    kube_tpu_accelerator: String,
    /// The slice topology (`cloud.google.com/gke-tpu-topology`).
    #[arg(long, default_value = "2x4")]
    kube_tpu_topology: String,
    /// Chips per host (default: from the accelerator and topology).
    #[arg(long)]
    kube_tpu_chips_per_host: Option<u32>,
    /// Run workers on Spot VMs.
    #[arg(long)]
    kube_spot: bool,
    /// Seconds a worker pod gets between SIGTERM and SIGKILL, and the deadline its preemption
    /// notice reports (GKE gives a Spot VM's pods 15 s unless the node pool grants more).
    #[arg(long, default_value_t = 15)]
    kube_grace_period_seconds: i64,
    /// The worker pods' network: `pod` (per-pod Workload Identity; the NetworkPolicy admits
    /// them by label) or `host` (the VM's interfaces; the node's service account for the
    /// bucket; no NetworkPolicy on GKE can tell them apart from the nodes).
    #[arg(long, value_enum, default_value_t = WorkerNetwork::Pod)]
    kube_worker_network: WorkerNetwork,
    /// CPU each worker pod requests and is limited to (default: from the slice type's host).
    #[arg(long)]
    kube_worker_cpu: Option<String>,
    /// Memory each worker pod requests and is limited to (default: from the host).
    #[arg(long)]
    kube_worker_memory: Option<String>,
    /// Ephemeral storage each worker pod requests and is limited to (default: 50Gi).
    #[arg(long)]
    kube_worker_ephemeral_storage: Option<String>,
    /// Crashes of one slice with the same exit code that fail its job.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    kube_crash_limit: u32,
    /// Seconds before a crashed slice is replaced the first time; doubled with every crash.
    #[arg(long, default_value_t = 10.0)]
    kube_crash_backoff_seconds: f64,
}

/// Where worker pods' traffic goes (docs/KUBERNETES.md weighs the two).
#[derive(Clone, Copy, clap::ValueEnum)]
enum WorkerNetwork {
    Host,
    Pod,
}

impl KubeArgs {
    fn config(&self) -> anyhow::Result<Option<controller::ControllerConfig>> {
        if !self.kubernetes {
            return Ok(None);
        }
        let need = |value: &Option<String>, flag: &str| {
            value.clone().with_context(|| format!("--kubernetes needs {flag}"))
        };
        let slice = controller::TpuSlice::new(
            &self.kube_tpu_accelerator,
            &self.kube_tpu_topology,
            self.kube_tpu_chips_per_host,
        )?;
        let host = controller::Resources::for_slice(&slice);
        let resource = |given: &Option<String>, default: Option<String>, flag: &str| {
            given.clone().or(default).with_context(|| {
                format!(
                    "--kube-tpu-accelerator {} with {} chips a host is not a host podctl knows the size of: give \
                     {flag} (the chart's workers.resources)",
                    slice.accelerator, slice.chips_per_host
                )
            })
        };
        let resources = controller::Resources {
            cpu: resource(&self.kube_worker_cpu, host.as_ref().map(|h| h.cpu.clone()), "--kube-worker-cpu")?,
            memory: resource(
                &self.kube_worker_memory,
                host.as_ref().map(|h| h.memory.clone()),
                "--kube-worker-memory",
            )?,
            ephemeral_storage: self.kube_worker_ephemeral_storage.clone().unwrap_or_else(|| "50Gi".into()),
        };
        if !(self.kube_crash_backoff_seconds.is_finite() && self.kube_crash_backoff_seconds > 0.0) {
            bail!("--kube-crash-backoff-seconds must be a positive number of seconds");
        }
        Ok(Some(controller::ControllerConfig {
            template: controller::WorkerTemplate {
                namespace: need(&self.kube_namespace, "--kube-namespace (or POD_NAMESPACE)")?,
                instance: self.kube_instance.clone(),
                image: need(&self.kube_worker_image, "--kube-worker-image")?,
                coordinator: need(&self.kube_coordinator_address, "--kube-coordinator-address")?,
                slice,
                spot: self.kube_spot,
                grace_period_seconds: self.kube_grace_period_seconds,
                host_network: matches!(self.kube_worker_network, WorkerNetwork::Host),
                service_account: self.kube_worker_service_account.clone(),
                subdomain: self.kube_worker_subdomain.clone(),
                tls_secret: self.kube_worker_tls_secret.clone(),
                resources,
            },
            resync: Duration::from_secs(1),
            policy: controller::Policy {
                crash_limit: self.kube_crash_limit,
                crash_backoff: Duration::from_secs_f64(self.kube_crash_backoff_seconds),
            },
        }))
    }
}

/// The node id of a StatefulSet pod: its ordinal + 1.
fn id_from_hostname(hostname: &str) -> anyhow::Result<u64> {
    let ordinal = hostname.rsplit_once('-').and_then(|(_, n)| n.parse::<u64>().ok());
    ordinal.map(|n| n + 1).with_context(|| format!("host name '{hostname}' does not end in -<ordinal>"))
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
    let id = if args.id_from_hostname {
        let hostname = match std::env::var("HOSTNAME") {
            Ok(name) => name,
            Err(_) => {
                std::fs::read_to_string("/proc/sys/kernel/hostname").context("reading the host name")?
            }
        };
        Some(id_from_hostname(hostname.trim())?)
    } else {
        args.id
    };
    let Some(id) = id else { bail!("--id (or --id-from-hostname) is required to run a node") };
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
    config.metrics_listen = args.metrics_listen;
    config.timeouts.lease = Duration::from_millis(args.lease_ms);
    config.timeouts.heartbeat = Duration::from_millis(args.heartbeat_ms);
    config.timeouts.suspect_after =
        Duration::from_millis(args.suspect_ms.unwrap_or(args.heartbeat_ms.saturating_mul(3) / 2));
    Ok(config)
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

/// Runs the node (until SIGTERM or Ctrl-C), or the subcommand.
pub async fn run(cli: NodeCommand) -> anyhow::Result<()> {
    if let Some(NodeSubcommand::DevCa { dir, hosts }) = cli.command {
        let files = crate::tls::create_dev_ca(&dir, &hosts)?;
        println!(
            "wrote {}, {}, {} (workers), {} (coordinator peers)",
            files.ca.display(),
            files.server_cert.display(),
            files.client_cert.display(),
            files.peer_cert.display()
        );
        return Ok(());
    }
    let kube = cli.node.kube.config()?;
    let mut config = config(cli.node)?;
    config.kubernetes = kube.as_ref().map(|k| k.template.clone());
    let node = crate::Node::bind(config).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let controller = match kube {
        Some(kube) => {
            let client = controller::reconcile::in_cluster().await?;
            let plane = Arc::new(crate::kubernetes::Plane(node.ctx()));
            let controller = controller::Controller::new(client, kube, plane);
            Some(tokio::spawn(controller.run(wait(stopped.clone()))))
        }
        None => None,
    };
    // Process tests and scripts read this line to learn the port.
    println!("listening on {}", node.local_addr());
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    node.serve(wait(stopped)).await?;
    if let Some(controller) = controller {
        let _ = controller.await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeCommand,
    }

    #[test]
    fn dev_ca_is_a_subcommand_and_node_flags_do_not_mix_with_it() {
        let cli = Cli::try_parse_from(["podctl-coordinator", "dev-ca", "--dir", "certs"]).unwrap();
        assert!(
            matches!(cli.node.command, Some(NodeSubcommand::DevCa { ref dir, .. }) if dir == Path::new("certs"))
        );
        let cli = Cli::try_parse_from(["podctl-coordinator", "--id", "2"]).unwrap();
        assert!(cli.node.command.is_none() && cli.node.node.id == Some(2));
        assert!(Cli::try_parse_from(["podctl-coordinator", "--id", "2", "dev-ca", "--dir", "c"]).is_err());
    }

    #[test]
    fn peers_parse_and_bad_ones_are_named() {
        let peers = parse_peers(&["1=127.0.0.1:1".into(), "2=h:2".into()]).unwrap();
        assert_eq!(peers[&2], "h:2");
        assert!(parse_peers(&["x".into()]).unwrap_err().to_string().contains("'x'"));
    }

    #[test]
    fn stateful_set_pods_number_their_nodes_from_one() {
        assert_eq!(id_from_hostname("podctl-0").unwrap(), 1);
        assert_eq!(id_from_hostname("my-release-podctl-2").unwrap(), 3);
        assert!(id_from_hostname("laptop").unwrap_err().to_string().contains("'laptop'"));
    }

    #[test]
    fn the_chart_s_flags_make_a_controller_config() {
        let cli = Cli::try_parse_from([
            "podctl-coordinator",
            "--id-from-hostname",
            "--kubernetes",
            "--kube-namespace=train",
            "--kube-worker-image=w:1",
            "--kube-coordinator-address=podctl.train.svc:7001",
            "--kube-tpu-topology=4x4",
            "--kube-spot",
        ])
        .unwrap();
        let config = cli.node.node.kube.config().unwrap().unwrap();
        assert_eq!(config.template.slice.hosts(), 4);
        assert!(config.template.spot);
        // The defaults: the pod network, GKE's 15 s for a Spot VM's pods, a ct6e-standard-4t
        // host's resources, three crashes of one kind.
        assert!(!config.template.host_network);
        assert_eq!(config.template.grace_period_seconds, 15);
        assert_eq!(config.template.resources.memory, "576Gi");
        assert_eq!(config.policy, controller::Policy::default());
        let cli = Cli::try_parse_from([
            "podctl-coordinator",
            "--kubernetes",
            "--kube-namespace=train",
            "--kube-worker-image=w:1",
            "--kube-coordinator-address=podctl.train.svc:7001",
            "--kube-worker-network=host",
            "--kube-grace-period-seconds=120",
            "--kube-crash-limit=5",
            "--kube-crash-backoff-seconds=0.5",
        ])
        .unwrap();
        let config = cli.node.node.kube.config().unwrap().unwrap();
        assert!(config.template.host_network);
        assert_eq!(config.template.grace_period_seconds, 120);
        assert_eq!(config.policy.crash_limit, 5);
        assert_eq!(config.policy.crash_backoff, Duration::from_millis(500));
        // A host podctl does not know the size of needs its resources named.
        let cli = Cli::try_parse_from([
            "podctl-coordinator",
            "--kubernetes",
            "--kube-namespace=train",
            "--kube-worker-image=w:1",
            "--kube-coordinator-address=podctl.train.svc:7001",
            "--kube-tpu-accelerator=tpu-v5p-slice",
            "--kube-tpu-topology=2x2x1",
        ])
        .unwrap();
        let e = cli.node.node.kube.config().unwrap_err().to_string();
        assert!(e.contains("--kube-worker-cpu") && e.contains("workers.resources"), "{e}");
        let e = Cli::try_parse_from(["podctl-coordinator", "--kube-worker-network=bridge"]).err().unwrap();
        assert!(e.to_string().contains("'bridge'") && e.to_string().contains("host, pod"), "{e}");
        let e = Cli::try_parse_from(["podctl-coordinator", "--kubernetes", "--kube-namespace=t"]).unwrap();
        assert!(e.node.node.kube.config().unwrap_err().to_string().contains("--kube-worker-image"));
    }
}
