//! The TLS material a client presents and the gRPC endpoint to one coordinator.
//!
//! Coordinators serve TLS with certificates signed by the cluster CA. podctl authenticates with
//! a bearer token and needs only the CA; workers and the coordinators' own peers also present
//! a client certificate (mutual TLS). A directory as `podctl coordinator dev-ca` writes it, or
//! as worker pods mount the chart's TLS Secret, holds them under the names below.

use crate::ClientError;
use std::path::Path;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The CA certificate's file name.
pub const CA_CERT: &str = "ca.pem";
/// The client certificate's file name (workers and peers present it).
pub const CLIENT_CERT: &str = "client.pem";
/// The client key's file name.
pub const CLIENT_KEY: &str = "client.key";

/// The PEM material a client needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA that signed the servers' certificates.
    pub ca_pem: Vec<u8>,
    /// A client certificate and key (workers and peers), PEM.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

fn read(path: &Path) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|source| ClientError::Tls { path: path.into(), source })
}

impl ClientTls {
    /// The CA at `ca` and, when given, a client certificate and its key.
    pub fn read(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, ClientError> {
        let identity = match identity {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        Ok(Self { ca_pem: read(ca)?, identity })
    }

    /// A directory with `ca.pem` and, for mutual TLS, `client.pem` and `client.key` (used when
    /// both are there).
    pub fn from_dir(dir: &Path) -> Result<Self, ClientError> {
        let (cert, key) = (dir.join(CLIENT_CERT), dir.join(CLIENT_KEY));
        let identity = (cert.exists() && key.exists()).then_some((cert.as_path(), key.as_path()));
        Self::read(&dir.join(CA_CERT), identity)
    }

    /// tonic's settings for a server reached as `host`.
    pub fn config(&self, host: &str) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(host.to_string());
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }
}

/// An endpoint for `addr` (`host:port`), with TLS when given, a connect deadline, and HTTP/2
/// keep-alives so a dead peer is noticed. Calls set their own deadlines (streams have none).
pub fn endpoint(addr: &str, tls: Option<&ClientTls>, connect_timeout: Duration) -> Result<Endpoint, String> {
    endpoint_via(addr, addr, tls, connect_timeout)
}

/// An endpoint that connects to `connect` (`host:port`) and checks the server's certificate
/// against the host of `addr`: a port-forward to a coordinator keeps its name.
pub fn endpoint_via(
    addr: &str,
    connect: &str,
    tls: Option<&ClientTls>,
    connect_timeout: Duration,
) -> Result<Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{connect}"))
        .map_err(|e| format!("'{connect}' is not a host:port address: {e}"))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    if let Some(tls) = tls {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_matches(['[', ']']);
        endpoint = endpoint.tls_config(tls.config(host)).map_err(|e| format!("TLS for {addr}: {e}"))?;
    }
    Ok(endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_gives_the_ca_and_a_client_certificate_only_when_both_files_are_there() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CA_CERT), "ca").unwrap();
        std::fs::write(dir.path().join(CLIENT_CERT), "cert").unwrap();
        let tls = ClientTls::from_dir(dir.path()).unwrap();
        assert_eq!(tls, ClientTls { ca_pem: b"ca".to_vec(), identity: None });
        std::fs::write(dir.path().join(CLIENT_KEY), "key").unwrap();
        let tls = ClientTls::from_dir(dir.path()).unwrap();
        assert_eq!(tls.identity, Some((b"cert".to_vec(), b"key".to_vec())));
    }

    #[test]
    fn a_missing_file_names_itself_and_where_certificates_come_from() {
        let dir = tempfile::tempdir().unwrap();
        let e = ClientTls::from_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("ca.pem") && e.contains("dev-ca"), "{e}");
    }

    #[test]
    fn an_address_that_is_not_host_port_is_named() {
        let e = endpoint("not an address", None, Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("'not an address'"), "{e}");
    }
}
