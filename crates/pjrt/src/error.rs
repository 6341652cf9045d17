//! Typed errors: every `PJRT_Error` a plugin returns becomes [`Error::Pjrt`] with its code and
//! message; everything this crate refuses before calling the plugin has its own variant.

use std::path::PathBuf;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors from loading a plugin, validating a request, or the plugin itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin path does not exist or cannot be resolved.
    #[error(
        "PJRT plugin {path} cannot be opened: {source}; check the path (scripts/setup.sh installs the plugins)"
    )]
    PluginNotFound {
        /// The path as given.
        path: PathBuf,
        /// Why it could not be resolved.
        source: std::io::Error,
    },
    /// The dynamic loader refused the file.
    #[error("{path} cannot be loaded as a shared library: {message}; pass the path of a PJRT plugin (.so)")]
    PluginLoad {
        /// The canonical path.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The library loaded but is not a PJRT plugin.
    #[error("{path} is not a PJRT plugin: {reason}")]
    NotAPlugin {
        /// The canonical path.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The plugin speaks another major version of the C API.
    #[error(
        "{path} implements PJRT C API {plugin_major}.{plugin_minor}, but podctl-pjrt was built against \
         {major}.{minor}; use a plugin of major version {major}"
    )]
    ApiVersionMismatch {
        /// The canonical path.
        path: PathBuf,
        /// The plugin's major version.
        plugin_major: i32,
        /// The plugin's minor version.
        plugin_minor: i32,
        /// The header's major version.
        major: u32,
        /// The header's minor version.
        minor: u32,
    },
    /// The host could not give memory for a [`HostBuffer`](crate::HostBuffer).
    #[error("cannot map {bytes} bytes of host memory: {source}; the host needs more free memory")]
    HostMemory {
        /// The size asked for.
        bytes: usize,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// The plugin's function table is too old to contain a function this crate needs.
    #[error("the PJRT plugin (API {major}.{minor}) does not provide {function}; use a newer plugin")]
    MissingFunction {
        /// The C API function.
        function: &'static str,
        /// The plugin's major version.
        major: i32,
        /// The plugin's minor version.
        minor: i32,
    },
    /// A PJRT call returned an error.
    #[error("{function} failed with {code:?}: {message}")]
    Pjrt {
        /// The C API function that failed.
        function: &'static str,
        /// The error's status code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },
    /// A compile option is invalid; the plugin would abort the process on it, so it never sees it.
    #[error("invalid compile options: {field} {reason}")]
    InvalidCompileOptions {
        /// The offending field of [`crate::CompileOptions`].
        field: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A request is inconsistent (sizes, devices, argument lists) and was refused before the call.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// What was being checked.
        what: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The plugin reported an element type this crate does not model (sub-byte or future types).
    #[error("unsupported PJRT element type {0}; only byte-sized types are supported")]
    UnsupportedElementType(u32),
}

impl fault::Classify for Error {
    /// A plugin that does not load, or a request refused before the plugin saw it, is the
    /// input's; an error of the plugin (out of memory, a failed compile) is the run's.
    fn fault(&self) -> fault::Fault {
        match self {
            Error::PluginNotFound { .. }
            | Error::PluginLoad { .. }
            | Error::NotAPlugin { .. }
            | Error::ApiVersionMismatch { .. }
            | Error::MissingFunction { .. } => fault::Fault::Input,
            Error::HostMemory { .. }
            | Error::InvalidCompileOptions { .. }
            | Error::Pjrt { .. }
            | Error::InvalidArgument { .. }
            | Error::UnsupportedElementType(_) => fault::Fault::Failed,
        }
    }
}

/// PJRT status codes (absl's canonical codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The operation was cancelled.
    Cancelled,
    /// Unknown error.
    Unknown,
    /// The caller passed an invalid argument (bad MLIR, wrong shapes, ...).
    InvalidArgument,
    /// A deadline expired.
    DeadlineExceeded,
    /// Something was not found.
    NotFound,
    /// Something already exists.
    AlreadyExists,
    /// Permission denied.
    PermissionDenied,
    /// Out of memory or another resource.
    ResourceExhausted,
    /// The system is not in a state required for the operation.
    FailedPrecondition,
    /// The operation was aborted.
    Aborted,
    /// Out of range.
    OutOfRange,
    /// The plugin does not implement the operation.
    Unimplemented,
    /// An internal error in the plugin.
    Internal,
    /// The service is unavailable.
    Unavailable,
    /// Unrecoverable data loss.
    DataLoss,
    /// Not authenticated.
    Unauthenticated,
    /// A code this header does not know.
    Other(u32),
}

impl ErrorCode {
    pub(crate) fn from_raw(code: u32) -> Self {
        match code {
            1 => Self::Cancelled,
            2 => Self::Unknown,
            3 => Self::InvalidArgument,
            4 => Self::DeadlineExceeded,
            5 => Self::NotFound,
            6 => Self::AlreadyExists,
            7 => Self::PermissionDenied,
            8 => Self::ResourceExhausted,
            9 => Self::FailedPrecondition,
            10 => Self::Aborted,
            11 => Self::OutOfRange,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            15 => Self::DataLoss,
            16 => Self::Unauthenticated,
            other => Self::Other(other),
        }
    }
}

impl Error {
    /// The PJRT status code, if the plugin produced this error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Pjrt { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_header() {
        assert_eq!(
            ErrorCode::from_raw(crate::ffi::PJRT_Error_Code_INVALID_ARGUMENT),
            ErrorCode::InvalidArgument
        );
        assert_eq!(ErrorCode::from_raw(crate::ffi::PJRT_Error_Code_UNIMPLEMENTED), ErrorCode::Unimplemented);
        assert_eq!(
            ErrorCode::from_raw(crate::ffi::PJRT_Error_Code_UNAUTHENTICATED),
            ErrorCode::Unauthenticated
        );
        assert_eq!(ErrorCode::from_raw(99), ErrorCode::Other(99));
    }

    #[test]
    fn messages_name_the_function_and_code() {
        let error = Error::Pjrt {
            function: "PJRT_Client_Compile",
            code: ErrorCode::InvalidArgument,
            message: "bad module".into(),
        };
        assert_eq!(error.to_string(), "PJRT_Client_Compile failed with InvalidArgument: bad module");
        assert_eq!(error.code(), Some(ErrorCode::InvalidArgument));
    }
}
