//! The coordinator node local mode runs in this process, as the cli sees it.
//!
//! The cli reaches coordinators only through the client crate; it does not depend on the
//! coordinator crate, whose Raft, storage and gRPC server the `podctl` binary brings in. The
//! binary implements [`StartNode`] over `coordinator::Embedded` and passes it to
//! [`crate::run`], as ripgrep's binary hands its libraries what they need from above.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;

/// A boxed future that may move between threads.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What local mode asks of its node: a cluster of one, plaintext on loopback (a free port),
/// writing each job's run record into the job's output directory.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// Where its Raft log and snapshots go.
    pub data_dir: PathBuf,
    /// The admin token; it never leaves this process and its workers.
    pub admin_token: String,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
}

/// Starts local mode's coordinator node in this process.
pub trait StartNode {
    /// Starts a node; it leads by the time the future resolves.
    fn start(&self, settings: NodeSettings) -> BoxFuture<'_, anyhow::Result<Box<dyn EmbeddedNode>>>;
}

/// A node running in this process.
pub trait EmbeddedNode: Send {
    /// The address clients and workers dial.
    fn addr(&self) -> SocketAddr;
    /// Where `/metrics` is served, when asked for.
    fn metrics_addr(&self) -> Option<SocketAddr>;
    /// Stops the node and waits for it (its run records are complete when this resolves).
    fn stop(self: Box<Self>) -> BoxFuture<'static, anyhow::Result<()>>;
}
