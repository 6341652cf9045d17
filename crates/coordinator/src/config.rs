//! A node's configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The certificate files of a node, as `coordinator::tls::create_dev_ca` writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA certificate (PEM): verifies servers and client certificates.
    pub ca: PathBuf,
    /// This node's server certificate chain (PEM).
    pub server_cert: PathBuf,
    /// Its private key (PEM).
    pub server_key: PathBuf,
    /// A worker's client certificate (PEM): what worker pods present; tests and tools use it as
    /// an ordinary client.
    pub client_cert: PathBuf,
    /// Its private key (PEM).
    pub client_key: PathBuf,
    /// The client certificate this node presents to its peers (PEM, common name
    /// [`crate::tls::PEER_COMMON_NAME`]): the only one the Raft service admits.
    pub peer_cert: PathBuf,
    /// Its private key (PEM).
    pub peer_key: PathBuf,
}

impl TlsFiles {
    /// The files in a directory made by `create_dev_ca`: `ca.pem`, `server.pem`, `server.key`,
    /// `client.pem`, `client.key`, `peer.pem`, `peer.key`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            ca: dir.join(crate::tls::CA_CERT),
            server_cert: dir.join(crate::tls::SERVER_CERT),
            server_key: dir.join(crate::tls::SERVER_KEY),
            client_cert: dir.join(crate::tls::CLIENT_CERT),
            client_key: dir.join(crate::tls::CLIENT_KEY),
            peer_cert: dir.join(crate::tls::PEER_CERT),
            peer_key: dir.join(crate::tls::PEER_KEY),
        }
    }
}

/// Every timeout a node uses. The defaults suit a cluster on one machine or a data centre.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// How often workers heartbeat.
    pub heartbeat: Duration,
    /// Silence longer than this loses a worker.
    pub lease: Duration,
    /// Silence longer than this loses a member the rest of its generation waits on
    /// (`decide::stalled_on`): they are heard from and none is past its step. Not above the
    /// lease; at or above it turns the rule off.
    pub suspect_after: Duration,
    /// How often the Raft leader heartbeats its followers.
    pub raft_heartbeat: Duration,
    /// A follower that hears no leader for a random time in `election_min..election_max`
    /// starts an election.
    pub election_min: Duration,
    /// See `election_min`.
    pub election_max: Duration,
    /// Deadline of one Raft RPC to a peer (snapshots get 10x).
    pub peer_rpc: Duration,
    /// A pending job starts with fewer workers than `mesh.dcn` after this wait.
    pub formation_wait: Duration,
    /// A job with no live worker for this long fails.
    pub abandon_after: Duration,
    /// After the last step, how long to wait for the final checkpoint before completing.
    pub final_checkpoint: Duration,
    /// How long `ReportStep` and `ReportCheckpoint` wait for the commit before answering anyway.
    pub report_wait: Duration,
    /// The longest `Kv.Get` wait.
    pub kv_wait_max: Duration,
    /// How often the leader loop looks at every job, at the least.
    pub tick: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            // Twice a second: survivors stuck on a cut member are heard from within
            // `suspect_after`, so the cut is named in ~0.75 s rather than 1.5 s (a heartbeat is a
            // few dozen bytes to the leader's memory, never the Raft log).
            heartbeat: Duration::from_millis(500),
            lease: Duration::from_secs(3),
            suspect_after: Duration::from_millis(750),
            raft_heartbeat: Duration::from_millis(120),
            election_min: Duration::from_millis(600),
            election_max: Duration::from_millis(1000),
            peer_rpc: Duration::from_secs(2),
            formation_wait: Duration::from_secs(60),
            abandon_after: Duration::from_secs(1800),
            final_checkpoint: Duration::from_secs(300),
            report_wait: Duration::from_secs(5),
            kv_wait_max: Duration::from_secs(60),
            tick: Duration::from_millis(100),
        }
    }
}

/// How one coordinator node runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's Raft id (non-zero, unique in the cluster).
    pub id: u64,
    /// Where to listen; port 0 picks a free port (tests).
    pub listen: SocketAddr,
    /// The address peers and clients reach this node at; the bound address when `None`.
    pub advertise: Option<String>,
    /// The initial cluster, id -> address, this node included. The lowest id initializes the
    /// cluster on first start. Empty: the node waits to be added with `Cluster.AddMember`.
    pub peers: BTreeMap<u64, String>,
    /// Where the Raft log and snapshots live.
    pub data_dir: PathBuf,
    /// Certificates; required unless `insecure_plaintext`.
    pub tls: Option<TlsFiles>,
    /// Serve and dial without TLS. Only for local mode on loopback, and only when asked for.
    pub insecure_plaintext: bool,
    /// The admin bearer token (cluster operations, submitting, every job).
    pub admin_token: String,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Take a snapshot (and purge the log before it) after this many entries.
    pub snapshot_every: u64,
    /// Write each job's run record into its `output_dir()` (local mode).
    pub record_runs: bool,
    /// Largest gRPC message accepted from clients and workers.
    pub max_message_bytes: usize,
    /// Largest Raft message accepted from peers (entries, snapshot chunks).
    pub max_peer_message_bytes: usize,
    /// Worker sessions served at once.
    pub max_sessions: usize,
    /// Log lines kept per job for `podctl logs`.
    pub log_lines_per_job: usize,
    /// How the leader reaches the jobs' checkpoint stores (to write manifests and markers).
    pub store_options: checkpoint::StoreOptions,
    /// Where to serve Prometheus metrics (`GET /metrics`, plain HTTP); `None`: not served.
    /// Port 0 picks a free port (`Node::metrics_addr`).
    pub metrics_listen: Option<SocketAddr>,
    /// The worker pods' template when the node runs the Kubernetes controller: a submission
    /// its slices cannot run is refused, saying what works (`WorkerTemplate::refusal`).
    pub kubernetes: Option<controller::WorkerTemplate>,
}

impl Config {
    /// A configuration with the defaults: one node, nothing listening yet chosen.
    pub fn new(
        id: u64,
        listen: SocketAddr,
        data_dir: impl Into<PathBuf>,
        admin_token: impl Into<String>,
    ) -> Self {
        Self {
            id,
            listen,
            advertise: None,
            peers: BTreeMap::new(),
            data_dir: data_dir.into(),
            tls: None,
            insecure_plaintext: false,
            admin_token: admin_token.into(),
            timeouts: Timeouts::default(),
            snapshot_every: 5000,
            record_runs: false,
            max_message_bytes: 4 << 20,
            max_peer_message_bytes: 64 << 20,
            max_sessions: 10_000,
            log_lines_per_job: 10_000,
            store_options: checkpoint::StoreOptions::default(),
            metrics_listen: None,
            kubernetes: None,
        }
    }

    /// Checks the fields fit together.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let invalid = |field: &'static str, reason: String| Err(crate::Error::Config { field, reason });
        if self.id == 0 {
            return invalid("id", "is 0; node ids start at 1".into());
        }
        if self.tls.is_none() && !self.insecure_plaintext {
            return invalid(
                "tls",
                "no certificates given; pass --tls-dir (make one with `podctl-coordinator dev-ca`) or, for local \
                 mode only, --insecure-plaintext"
                    .into(),
            );
        }
        if self.admin_token.len() < 16 {
            return invalid("admin_token", "is shorter than 16 characters; use a long random token".into());
        }
        if !self.peers.is_empty() && !self.peers.contains_key(&self.id) {
            return invalid("peers", format!("do not include this node's id {}; list every member", self.id));
        }
        let t = &self.timeouts;
        if t.election_min <= t.raft_heartbeat * 2 || t.election_max <= t.election_min {
            return invalid(
                "timeouts",
                format!(
                    "need raft_heartbeat x 2 < election_min < election_max, got {:?}, {:?}, {:?}",
                    t.raft_heartbeat, t.election_min, t.election_max
                ),
            );
        }
        if t.lease <= t.heartbeat {
            return invalid(
                "timeouts.lease",
                format!("{:?} must be longer than the heartbeat {:?}", t.lease, t.heartbeat),
            );
        }
        if self.snapshot_every == 0 {
            return invalid("snapshot_every", "is 0; use at least 1".into());
        }
        Ok(())
    }
}
