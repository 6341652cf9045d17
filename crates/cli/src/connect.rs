//! How a command reaches a coordinator cluster: addresses, a bearer token, TLS.

use anyhow::{Context, Result, bail};
use clap::Args;
use coordinator::client::ClientConfig;
use coordinator::tls::ClientTls;
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct ConnectArgs {
    /// Coordinator addresses (host:port), comma-separated: any node of the cluster.
    #[arg(long, env = "PODCTL_COORDINATOR", value_delimiter = ',')]
    pub coordinator: Vec<String>,
    /// The bearer token (prefer the environment or a file: arguments show in `ps`).
    #[arg(long, env = "PODCTL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the bearer token.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The CA that signed the coordinators' certificates (PEM).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM), for mutual TLS (workers need one).
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
    /// Talk to the coordinator without TLS: local clusters on loopback only.
    #[arg(long, conflicts_with = "ca")]
    pub insecure_plaintext: bool,
}

impl ConnectArgs {
    /// Whether a coordinator was named (otherwise the command runs in local mode).
    pub fn is_remote(&self) -> bool {
        !self.coordinator.is_empty()
    }

    pub fn token(&self) -> Result<String> {
        match (&self.token, &self.token_file) {
            (Some(token), _) => Ok(token.clone()),
            (None, Some(file)) => Ok(std::fs::read_to_string(file)
                .with_context(|| format!("reading the token file {}", file.display()))?
                .trim()
                .to_string()),
            (None, None) => bail!("no token: set PODCTL_TOKEN or pass --token-file"),
        }
    }

    pub fn client_config(&self) -> Result<ClientConfig> {
        if self.coordinator.is_empty() {
            bail!("no coordinator: pass --coordinator HOST:PORT (or set PODCTL_COORDINATOR)");
        }
        let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let tls = match (&self.ca, &self.cert, &self.key) {
            (Some(ca), cert, key) => {
                let identity = match (cert, key) {
                    (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
                    _ => None,
                };
                Some(ClientTls { ca_pem: read(ca)?, identity })
            }
            _ if self.insecure_plaintext => None,
            _ => bail!("no TLS material: pass --ca (and --cert/--key), or --insecure-plaintext on loopback"),
        };
        Ok(ClientConfig::new(self.coordinator.clone(), self.token()?, tls))
    }
}
