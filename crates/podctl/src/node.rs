//! Local mode's embedded coordinator: the cli's [`cli::StartNode`] over
//! [`coordinator::Embedded`].

use cli::{BoxFuture, EmbeddedNode, NodeSettings, StartNode};
use std::net::SocketAddr;

/// Starts single-node coordinators in this process.
pub struct Embedded;

impl StartNode for Embedded {
    fn start(&self, settings: NodeSettings) -> BoxFuture<'_, anyhow::Result<Box<dyn EmbeddedNode>>> {
        Box::pin(async move {
            let NodeSettings { data_dir, admin_token, metrics_listen } = settings;
            let mut config = coordinator::Config::new(1, "127.0.0.1:0".parse()?, data_dir, admin_token);
            // Loopback only, and the launcher keeps the run record.
            config.insecure_plaintext = true;
            config.record_runs = true;
            config.metrics_listen = metrics_listen;
            let node = coordinator::Embedded::start(config).await?;
            Ok(Box::new(Node(node)) as Box<dyn EmbeddedNode>)
        })
    }
}

/// A running embedded node.
struct Node(coordinator::Embedded);

impl EmbeddedNode for Node {
    fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    fn metrics_addr(&self) -> Option<SocketAddr> {
        self.0.metrics_addr()
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move { Ok(self.0.stop().await?) })
    }
}
