//! Why a call failed.

use std::path::PathBuf;
use std::time::Duration;
use tonic::Code;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator refused the call.
    #[error("{call}: {message} ({code:?})")]
    Refused {
        /// The RPC.
        call: &'static str,
        /// The gRPC code of the answer.
        code: Code,
        /// The coordinator's message (it says what to do).
        message: String,
    },
    /// No coordinator answered in time.
    #[error(
        "{call}: no coordinator leader answered within {waited:?} (tried {addresses}); last error: {last}"
    )]
    Unavailable {
        /// The RPC.
        call: &'static str,
        /// How long it tried.
        waited: Duration,
        /// The addresses it knew.
        addresses: String,
        /// The last error seen.
        last: String,
    },
    /// The configuration cannot be used.
    #[error("coordinator client: {0}")]
    Config(String),
    /// A certificate or key file could not be read.
    #[error(
        "cannot read {path}: {source}; certificates come from `podctl coordinator dev-ca` or the install's TLS Secret"
    )]
    Tls {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl ClientError {
    /// The gRPC code of the failure (`Unavailable` when nobody answered).
    pub fn code(&self) -> Code {
        match self {
            Self::Refused { code, .. } => *code,
            Self::Unavailable { .. } => Code::Unavailable,
            Self::Config(_) | Self::Tls { .. } => Code::InvalidArgument,
        }
    }

    pub(crate) fn refused(call: &'static str, status: &tonic::Status) -> Self {
        Self::Refused { call, code: status.code(), message: status.message().to_string() }
    }
}
