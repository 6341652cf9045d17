//! Wiring a node: storage -> Raft -> services -> listener, and shutting it down.
//!
//! [`Node::bind`] opens the data directory, starts Raft and binds the listener (port 0 works:
//! tests and local mode read [`Node::local_addr`]); [`Node::serve`] serves until the shutdown
//! future resolves, then stops the server, the leader loop and Raft. [`run`] is both in one;
//! [`Embedded`] is a single-node cluster in the calling process, for `podctl launch`.

use crate::config::Config;
use crate::ctx::Ctx;
use crate::grpc;
use crate::logs::LogBuffers;
use crate::memory::LeaderMemory;
use crate::network::{Network, PeerDialer};
use crate::peers::PeerHealth;
use crate::store::{self, LogStore, StateMachineStore};
use crate::{Error, typ};
use openraft::{BasicNode, ServerState, SnapshotPolicy};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A bound, running node.
pub struct Node {
    ctx: Arc<Ctx>,
    listener: TcpListener,
    addr: SocketAddr,
    metrics: Option<(TcpListener, SocketAddr)>,
}

impl Node {
    /// Opens the data directory, starts Raft and binds the listener.
    pub async fn bind(config: Config) -> Result<Node, Error> {
        config.validate()?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind { addr: config.listen.to_string(), source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Bind { addr: config.listen.to_string(), source })?;
        let advertise = config.advertise.clone().unwrap_or_else(|| addr.to_string());
        let metrics = match config.metrics_listen {
            Some(at) => {
                let bind_err = |source| Error::Bind { addr: at.to_string(), source };
                let listener = TcpListener::bind(at).await.map_err(bind_err)?;
                let bound = listener.local_addr().map_err(bind_err)?;
                Some((listener, bound))
            }
            None => None,
        };

        let db = store::open_database(&config.data_dir)?;
        let log_store = LogStore::new(db.clone());
        let state_machine = StateMachineStore::open(db)?;
        let shared = state_machine.shared();

        let t = &config.timeouts;
        let raft_config = openraft::Config {
            cluster_name: "podctl".into(),
            heartbeat_interval: t.raft_heartbeat.as_millis() as u64,
            election_timeout_min: t.election_min.as_millis() as u64,
            election_timeout_max: t.election_max.as_millis() as u64,
            install_snapshot_timeout: (t.peer_rpc * 10).as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.snapshot_every.min(1000),
            snapshot_max_chunk_size: (config.max_peer_message_bytes / 4) as u64,
            ..Default::default()
        }
        .validate()
        .map_err(|e| Error::Config { field: "timeouts", reason: e.to_string() })?;

        let tls = match &config.tls {
            Some(files) => Some(crate::tls::peer_tls(files)?),
            None => None,
        };
        let dialer =
            PeerDialer { tls, rpc_timeout: t.peer_rpc, max_message_bytes: config.max_peer_message_bytes };
        let peers = Arc::new(PeerHealth::default());
        let network = Network::new(dialer, peers.clone());
        let raft = typ::Raft::new(config.id, Arc::new(raft_config), network, log_store, state_machine)
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;

        let admin_sha = Sha256::digest(config.admin_token.as_bytes()).into();
        let ctx = Arc::new(Ctx {
            id: config.id,
            raft,
            shared,
            leader: LeaderMemory::default(),
            logs: LogBuffers::new(config.log_lines_per_job),
            peers,
            advertise,
            admin_sha,
            config,
        });
        Ok(Node { ctx, listener, addr, metrics })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address `/metrics` is served at, when `Config::metrics_listen` asked for it.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(_, addr)| *addr)
    }

    /// The shared context (tests inspect the Raft node through it).
    pub fn ctx(&self) -> Arc<Ctx> {
        self.ctx.clone()
    }

    /// Serves until `shutdown` resolves, then stops everything.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), Error> {
        let Node { ctx, listener, metrics, .. } = self;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut tasks = tokio::task::JoinSet::new();
        if let Some((metrics_listener, _)) = metrics {
            let counters = Arc::new(crate::metrics::Counters::default());
            tasks.spawn(crate::metrics::count(ctx.clone(), counters.clone(), stop_rx.clone()));
            tasks.spawn(crate::metrics::serve(ctx.clone(), counters, metrics_listener, stop_rx.clone()));
        }
        tasks.spawn(crate::leader::run(ctx.clone(), stop_rx.clone()));
        let recorder =
            ctx.config.record_runs.then(|| tokio::spawn(crate::recorder::run(ctx.clone(), stop_rx.clone())));
        tasks.spawn(initialize_when_first(ctx.clone()));

        let mut builder = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .max_concurrent_streams(4096);
        if let Some(files) = &ctx.config.tls {
            builder = builder
                .tls_config(crate::tls::server_config(files)?)
                .map_err(|e| Error::Tls(e.to_string()))?;
        }
        let router = grpc::routes(&mut builder, ctx.clone());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let mut stop_for_server = stop_rx.clone();
        let server = router.serve_with_incoming_shutdown(incoming, async move {
            let _ = stop_for_server.changed().await;
        });
        let server = tokio::spawn(server);
        shutdown.await;
        tracing::info!(id = ctx.id, "shutting down");
        let _ = stop_tx.send(true);
        // Streams (sessions, watches) would hold the graceful shutdown open: give them a moment.
        let served = tokio::time::timeout(Duration::from_secs(5), server).await;
        // The recorder finishes on its own: it writes what was applied before the stop.
        if let Some(recorder) = recorder {
            let _ = recorder.await;
        }
        tasks.shutdown().await;
        let _ = ctx.raft.shutdown().await;
        match served {
            Ok(Ok(Err(e))) => Err(Error::Server(e.to_string())),
            _ => Ok(()),
        }
    }
}

/// On first start, the lowest id of the configured peers initializes the cluster.
async fn initialize_when_first(ctx: Arc<Ctx>) {
    let peers = &ctx.config.peers;
    if peers.keys().next() != Some(&ctx.id) {
        return;
    }
    match ctx.raft.is_initialized().await {
        Ok(false) => {}
        _ => return,
    }
    let members: BTreeMap<u64, BasicNode> =
        peers.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
    match ctx.raft.initialize(members).await {
        Ok(()) => tracing::info!(id = ctx.id, "initialized the cluster with {:?}", peers),
        Err(e) => tracing::warn!(id = ctx.id, "cannot initialize the cluster: {e}"),
    }
}

/// Runs a node until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), Error> {
    Node::bind(config).await?.serve(shutdown).await
}

/// A single-node coordinator in the calling process (local mode): initialized at once, leading
/// by the time [`Embedded::start`] returns.
pub struct Embedded {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    ctx: Arc<Ctx>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Embedded {
    /// Starts a node from `config` as a cluster of one (its `peers` are replaced by itself;
    /// listen on `127.0.0.1:0` to get a free port) and waits until it leads.
    pub async fn start(mut config: Config) -> Result<Self, Error> {
        config.peers.clear();
        let node = Node::bind(config).await?;
        let addr = node.local_addr();
        let metrics_addr = node.metrics_addr();
        let advertise = node.ctx.advertise.clone();
        let ctx = node.ctx.clone();
        // The peers map drives `initialize_when_first`; the Config inside ctx is shared, so
        // initialize here directly instead.
        if !ctx.raft.is_initialized().await.map_err(|e| Error::Raft(e.to_string()))? {
            let members = BTreeMap::from([(ctx.id, BasicNode::new(&advertise))]);
            ctx.raft.initialize(members).await.map_err(|e| Error::Raft(e.to_string()))?;
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(node.serve(async move {
            let _ = stopped.await;
        }));
        let wait = ctx.raft.wait(Some(Duration::from_secs(10)));
        wait.state(ServerState::Leader, "embedded coordinator leads")
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ctx.require_leader().is_err() {
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Raft("the embedded coordinator did not become ready in 10 s".into()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self { addr, metrics_addr, ctx, stop: Some(stop), task })
    }

    /// The address clients and workers dial.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address `/metrics` is served at, when `Config::metrics_listen` asked for it.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The node's shared context (a controller runs over it).
    pub fn ctx(&self) -> Arc<Ctx> {
        self.ctx.clone()
    }

    /// Stops the node and waits for it.
    pub async fn stop(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.map_err(|e| Error::Server(e.to_string()))?
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
