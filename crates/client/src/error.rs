//! Why a call failed.

use crate::refusal::{self, Refusal};
use fault::{Classify, Fault};
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
        /// Why, when the coordinator said so in the status's details.
        refusal: Option<Refusal>,
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
    /// A setting of the client cannot be used.
    #[error("coordinator client {setting}: {reason}")]
    Config {
        /// The setting: `addresses`, `token`, `address`.
        setting: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
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
            Self::Config { .. } | Self::Tls { .. } => Code::InvalidArgument,
        }
    }

    /// Why the coordinator refused, when it said.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Refused { refusal, .. } => *refusal,
            _ => None,
        }
    }

    pub(crate) fn refused(call: &'static str, status: &tonic::Status) -> Self {
        Self::Refused {
            call,
            code: status.code(),
            refusal: refusal::of(status).map(|(r, _)| r),
            message: status.message().to_string(),
        }
    }
}

impl Classify for ClientError {
    fn fault(&self) -> Fault {
        match self.code() {
            Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange => Fault::Input,
            Code::Unauthenticated | Code::PermissionDenied => Fault::Denied,
            Code::Unavailable | Code::DeadlineExceeded => Fault::Unreachable,
            Code::Cancelled => Fault::Interrupted,
            Code::Ok
            | Code::Unknown
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Unimplemented
            | Code::Internal
            | Code::DataLoss => Fault::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_s_code_says_whose_fault_it_is() {
        let refused =
            |code, refusal| ClientError::Refused { call: "Jobs.Submit", code, refusal, message: "m".into() };
        assert_eq!(refused(Code::InvalidArgument, Some(Refusal::Invalid)).fault(), Fault::Input);
        assert_eq!(refused(Code::FailedPrecondition, Some(Refusal::ForeignRoot)).fault(), Fault::Input);
        assert_eq!(refused(Code::Unauthenticated, None).fault(), Fault::Denied);
        assert_eq!(refused(Code::PermissionDenied, None).fault(), Fault::Denied);
        assert_eq!(refused(Code::Internal, None).fault(), Fault::Failed);
        let nobody = ClientError::Unavailable {
            call: "Jobs.Get",
            waited: Duration::from_secs(20),
            addresses: "a:1".into(),
            last: "connection refused".into(),
        };
        assert_eq!(nobody.fault(), Fault::Unreachable);
        assert!(nobody.fault().retryable());
        let config = ClientError::Config { setting: "token", reason: "not ASCII".into() };
        assert_eq!(config.fault(), Fault::Input);
        assert_eq!(refused(Code::ResourceExhausted, Some(Refusal::Limit)).refusal(), Some(Refusal::Limit));
    }
}
