//! How a command reaches a coordinator cluster: addresses or a kubeconfig context, a bearer
//! token, TLS.

use anyhow::{Context, Result, bail};
use clap::Args;
use client::{Client, ClientConfig, ClientTls};
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub struct ConnectArgs {
    /// Use this saved context (`podctl context list`) instead of the current one; flags and
    /// environment variables still win over what it holds.
    #[arg(long, env = "PODCTL_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
    /// Coordinator addresses (host:port), comma-separated: any node of the cluster.
    #[arg(long, env = "PODCTL_COORDINATOR", value_delimiter = ',', conflicts_with = "kube_context")]
    pub coordinator: Vec<String>,
    /// Reach the podctl install of this kubeconfig context instead (`kubectl config
    /// get-contexts`): port-forwards through the API server; the CA and the admin token come from
    /// the install's Secrets unless given here.
    #[arg(long)]
    pub kube_context: Option<String>,
    /// The namespace of the install (default: the context's namespace).
    #[arg(long, requires = "kube_context")]
    pub kube_namespace: Option<String>,
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
    /// A directory with `ca.pem` and, for mutual TLS, `client.pem` and `client.key` (the
    /// chart's TLS Secret, as worker pods mount it).
    #[arg(long, conflicts_with_all = ["ca", "cert", "key"])]
    pub tls_dir: Option<PathBuf>,
    /// Talk to the coordinator without TLS: local clusters on loopback only.
    #[arg(long, conflicts_with_all = ["ca", "tls_dir"])]
    pub insecure_plaintext: bool,
}

/// A way to the cluster: the client settings, and the port-forwards they go through (open as
/// long as this lives).
pub struct Connection {
    pub config: ClientConfig,
    _forwards: Option<controller::remote::Remote>,
}

impl Connection {
    /// A client of the cluster; it must not outlive this connection.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::new(self.config.clone())?)
    }
}

impl ConnectArgs {
    /// Whether a cluster was named (otherwise the command runs in local mode).
    pub fn is_remote(&self) -> bool {
        !self.coordinator.is_empty() || self.kube_context.is_some()
    }

    /// The token given on the command line, in the environment or in a file.
    fn given_token(&self) -> Result<Option<String>> {
        match (&self.token, &self.token_file) {
            (Some(token), _) => Ok(Some(token.clone())),
            (None, Some(file)) => Ok(Some(
                std::fs::read_to_string(file)
                    .with_context(|| format!("reading the token file {}", file.display()))?
                    .trim()
                    .to_string(),
            )),
            (None, None) => Ok(None),
        }
    }

    /// The TLS material given on the command line; `None` when none was.
    fn given_tls(&self) -> Result<Option<ClientTls>> {
        if let Some(dir) = &self.tls_dir {
            return Ok(Some(ClientTls::from_dir(dir).context("--tls-dir")?));
        }
        let Some(ca) = &self.ca else { return Ok(None) };
        let identity = self.cert.as_deref().zip(self.key.as_deref());
        Ok(Some(ClientTls::read(ca, identity).context("--ca, --cert, --key")?))
    }

    /// The client settings for `--coordinator` (workers and commands that take no kubeconfig).
    pub fn client_config(&self) -> Result<ClientConfig> {
        if self.kube_context.is_some() {
            bail!("--kube-context: this command runs inside the cluster; pass --coordinator HOST:PORT");
        }
        if self.coordinator.is_empty() {
            bail!(
                "no coordinator: pass --coordinator HOST:PORT (or set PODCTL_COORDINATOR), or --kube-context NAME, \
                 or save a context (`podctl context add`)"
            );
        }
        let tls = match self.given_tls()? {
            Some(tls) => Some(tls),
            None if self.insecure_plaintext => None,
            None => bail!(
                "no TLS material: pass --ca (and --cert/--key) or --tls-dir, or --insecure-plaintext on loopback"
            ),
        };
        let Some(token) = self.given_token()? else {
            bail!(
                "no token: set PODCTL_TOKEN or pass --token-file (or save one in a context: `podctl context add`)"
            )
        };
        Ok(ClientConfig::new(self.coordinator.clone(), token, tls))
    }

    /// Reaches the cluster: directly at `--coordinator`, or through the kubeconfig context's
    /// API server. Call inside the tokio runtime that will drive the client (the port-forwards
    /// are tasks on it).
    pub async fn connect(&self) -> Result<Connection> {
        let Some(context) = &self.kube_context else {
            return Ok(Connection { config: self.client_config()?, _forwards: None });
        };
        let (client, default_namespace) = controller::remote::client(Some(context)).await?;
        let namespace = self.kube_namespace.clone().unwrap_or(default_namespace);
        let remote = controller::remote::connect(client, &namespace)
            .await
            .with_context(|| format!("finding podctl in context {context}, namespace {namespace}"))?;
        let tls = match (self.given_tls()?, &remote.tls_secret) {
            (Some(tls), _) => Some(tls),
            // The install serves plaintext; the port-forward itself runs over the API server's TLS.
            (None, None) => None,
            (None, Some(secret)) => match &remote.ca_pem {
                Some(ca_pem) => Some(ClientTls { ca_pem: ca_pem.clone(), identity: None }),
                None => bail!(
                    "the kubeconfig's user may not read the CA in Secret {namespace}/{secret}; \
                     pass --ca with its ca.pem"
                ),
            },
        };
        let token = match (self.given_token()?, &remote.token) {
            (Some(token), _) => token,
            (None, Some(token)) => token.clone(),
            (None, None) => bail!(
                "the kubeconfig's user may not read podctl's admin token Secret in {namespace}; \
                 pass --token-file (or set PODCTL_TOKEN)"
            ),
        };
        let mut config = ClientConfig::new(remote.addresses.clone(), token, tls);
        config.routes = remote.routes.clone();
        Ok(Connection { config, _forwards: Some(remote) })
    }
}
