//! The errors of starting and running a node (service errors are `tonic::Status`, built in
//! `grpc::status`).

use std::path::PathBuf;

/// Why a node could not start or went down.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration field does not work.
    #[error("coordinator config `{field}`: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The data directory cannot be used.
    #[error("cannot use data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The Raft database failed.
    #[error("raft storage {path}: {reason}")]
    Storage {
        /// The database file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The listener could not be bound.
    #[error("cannot listen on {addr}: {source}; is the port in use?")]
    Bind {
        /// The address.
        addr: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Certificates could not be read or made.
    #[error("TLS: {0}")]
    Tls(String),
    /// Raft refused to start or stopped.
    #[error("raft: {0}")]
    Raft(String),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Server(String),
}
