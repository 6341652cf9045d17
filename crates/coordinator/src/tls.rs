//! Certificates: a development CA, the servers' TLS settings, and the client certificates: the
//! workers' and the one a node presents to its peers (read by `client::ClientTls`, as every
//! client of the cluster does).
//!
//! Every listener serves TLS (rustls) with the node's server certificate. Client certificates
//! are optional at the handshake, but when one is presented it must be signed by the cluster
//! CA; the worker services then require one, and the Raft service the peers' one: common name
//! [`PEER_COMMON_NAME`] (etcd's `--peer-cert-allowed-cn`), so a worker's key cannot speak Raft.
//! podctl may come with only a bearer token.

use crate::Error;
use crate::config::TlsFiles;
use client::ClientTls;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::path::Path;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

pub use client::tls::{CA_CERT, CLIENT_CERT, CLIENT_KEY};

/// The CA key's file name (keep it off the nodes in production).
pub const CA_KEY: &str = "ca.key";
/// The server certificate's file name.
pub const SERVER_CERT: &str = "server.pem";
/// The server key's file name.
pub const SERVER_KEY: &str = "server.key";
/// The peer certificate's file name: what a node presents to the other nodes' Raft service.
pub const PEER_CERT: &str = "peer.pem";
/// The peer key's file name.
pub const PEER_KEY: &str = "peer.key";
/// The common name of the peer certificate, the one the Raft service admits. Issue the
/// coordinators' peer certificate with it (and no other client certificate).
pub const PEER_COMMON_NAME: &str = "podctl-peer";
/// The common name `dev-ca` gives the workers' client certificate.
pub const WORKER_COMMON_NAME: &str = "podctl-worker";

fn tls_err(what: &str) -> impl Fn(rcgen::Error) -> Error + '_ {
    move |e| Error::Tls(format!("cannot make the {what}: {e}"))
}

/// Writes a development CA, a server certificate valid for `hosts` (names or IP addresses;
/// `localhost` and `127.0.0.1` are always included), the workers' client certificate and the
/// coordinators' peer certificate into `dir`. Returns the files. Not for production: the CA key
/// sits beside the certificates.
pub fn create_dev_ca(dir: &Path, hosts: &[String]) -> Result<TlsFiles, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Tls(format!("cannot create {}: {e}", dir.display())))?;
    let ca_key = KeyPair::generate().map_err(tls_err("CA key"))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err("CA"))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "podctl development CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(tls_err("CA"))?;

    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into()];
    for host in hosts {
        if !names.contains(host) {
            names.push(host.clone());
        }
    }
    let server_key = KeyPair::generate().map_err(tls_err("server key"))?;
    let mut server = CertificateParams::new(names).map_err(tls_err("server certificate"))?;
    server.distinguished_name.push(DnType::CommonName, "podctl coordinator");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server.signed_by(&server_key, &ca).map_err(tls_err("server certificate"))?;

    let client_pair = |name: &str, what: &'static str| -> Result<(String, KeyPair), Error> {
        let key = KeyPair::generate().map_err(tls_err(what))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err(what))?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        Ok((params.signed_by(&key, &ca).map_err(tls_err(what))?.pem(), key))
    };
    let (client_cert, client_key) = client_pair(WORKER_COMMON_NAME, "client certificate")?;
    let (peer_cert, peer_key) = client_pair(PEER_COMMON_NAME, "peer certificate")?;

    let files = TlsFiles::in_dir(dir);
    let write = |path: &Path, text: String, secret: bool| -> Result<(), Error> {
        std::fs::write(path, text)
            .map_err(|e| Error::Tls(format!("cannot write {}: {e}", path.display())))?;
        if secret {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| Error::Tls(format!("cannot restrict {}: {e}", path.display())))?;
        }
        Ok(())
    };
    write(&files.ca, ca.pem(), false)?;
    write(&dir.join(CA_KEY), ca.key().serialize_pem(), true)?;
    write(&files.server_cert, server_cert.pem(), false)?;
    write(&files.server_key, server_key.serialize_pem(), true)?;
    write(&files.client_cert, client_cert, false)?;
    write(&files.client_key, client_key.serialize_pem(), true)?;
    write(&files.peer_cert, peer_cert, false)?;
    write(&files.peer_key, peer_key.serialize_pem(), true)?;
    Ok(files)
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| {
        Error::Tls(format!(
            "cannot read {}: {e}; make certificates with `podctl-coordinator dev-ca`",
            path.display()
        ))
    })
}

/// The server side: the node's certificate, and client certificates verified against the CA
/// when presented.
pub fn server_config(files: &TlsFiles) -> Result<ServerTlsConfig, Error> {
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(read(&files.server_cert)?, read(&files.server_key)?))
        .client_ca_root(Certificate::from_pem(read(&files.ca)?))
        .client_auth_optional(true))
}

/// The CA and the workers' client certificate: a worker's (or a test's) mutual TLS.
pub fn client_tls(files: &TlsFiles) -> Result<ClientTls, Error> {
    ClientTls::read(&files.ca, Some((&files.client_cert, &files.client_key)))
        .map_err(|e| Error::Tls(e.to_string()))
}

/// The CA and this node's peer certificate, which it presents to its peers' Raft service.
pub fn peer_tls(files: &TlsFiles) -> Result<ClientTls, Error> {
    ClientTls::read(&files.ca, Some((&files.peer_cert, &files.peer_key))).map_err(|e| {
        Error::Tls(format!(
            "{e}; the coordinators need a peer certificate ({PEER_CERT}, {PEER_KEY}) with common name \
             {PEER_COMMON_NAME}: `podctl-coordinator dev-ca` writes one"
        ))
    })
}

/// The common name of a certificate (DER), if it has one.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let name = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_ca_writes_every_file_with_secret_keys() {
        let dir = tempfile::tempdir().unwrap();
        let files = create_dev_ca(dir.path(), &["node-1.example".into()]).unwrap();
        for path in [&files.ca, &files.server_cert, &files.client_cert, &files.peer_cert] {
            assert!(std::fs::read_to_string(path).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        }
        use std::os::unix::fs::PermissionsExt;
        for path in [&files.server_key, &files.client_key, &files.peer_key, &dir.path().join(CA_KEY)] {
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{path:?} is readable by others");
        }
        assert!(server_config(&files).is_ok());
        assert!(client_tls(&files).unwrap().identity.is_some());
        // The two client certificates tell who holds them apart.
        let der = |path: &std::path::Path| {
            let pem = std::fs::read(path).unwrap();
            x509_parser::pem::parse_x509_pem(&pem).unwrap().1.contents
        };
        assert_eq!(common_name(&der(&files.peer_cert)).as_deref(), Some(PEER_COMMON_NAME));
        assert_eq!(common_name(&der(&files.client_cert)).as_deref(), Some(WORKER_COMMON_NAME));
        assert_eq!(common_name(b"not a certificate"), None);
    }

    #[test]
    fn a_missing_file_names_itself_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let e = server_config(&TlsFiles::in_dir(dir.path())).unwrap_err().to_string();
        assert!(e.contains("server.pem") && e.contains("dev-ca"), "{e}");
    }
}
