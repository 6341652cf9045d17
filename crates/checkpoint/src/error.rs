//! The crate's error type: every message names the value at fault and what to do about it.

use std::ops::Range;

/// Everything that can go wrong while saving, committing, restoring or collecting checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A caller-supplied value (topology, array spec, option, buffer) is unusable.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// The field or value at fault.
        what: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The object-store URL or its options cannot be turned into a store.
    #[error("object store {url}: {reason}")]
    InvalidStore {
        /// The URL as given.
        url: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The storage backend failed an operation.
    #[error("object store {operation} of {key} failed: {source}")]
    Store {
        /// What was attempted (`put`, `get`, `list`, ...).
        operation: &'static str,
        /// The object key or prefix.
        key: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },
    /// The host reports handed to finalize do not match the save's write plan.
    #[error("cannot finalize checkpoint {dir}: {reason}")]
    BadReport {
        /// The checkpoint directory.
        dir: String,
        /// What does not match.
        reason: String,
    },
    /// A manifest is malformed, inconsistent or claims more than storage holds; refused before
    /// any buffer is sized from it.
    #[error("manifest {key} refused: {reason}")]
    BadManifest {
        /// The manifest's object key.
        key: String,
        /// The first problem found.
        reason: String,
    },
    /// A stored chunk does not match its recorded CRC32C.
    #[error(
        "object {key} is corrupt: chunk {chunk} (bytes {}..{}) has crc32c {actual:#010x}, the manifest \
         recorded {expected:#010x}; restore an older checkpoint (see newest_verified)",
        bytes.start, bytes.end
    )]
    Corrupt {
        /// The object's full key.
        key: String,
        /// The chunk's index within the object.
        chunk: u64,
        /// The chunk's byte range within the object.
        bytes: Range<u64>,
        /// The CRC32C the manifest recorded.
        expected: u32,
        /// The CRC32C of the bytes read.
        actual: u32,
    },
    /// An object is shorter or longer than the manifest says, or a read returned the wrong length.
    #[error("object {key}: {reason}")]
    SizeMismatch {
        /// The object's full key.
        key: String,
        /// Expected versus found.
        reason: String,
    },
    /// A commit marker cannot be read or disagrees with the checkpoint it sits in.
    #[error("commit marker {key} is unusable: {reason}; remove the checkpoint or restore the marker")]
    BadMarker {
        /// The marker's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The commit log (Raft in the coordinator, markers offline) failed.
    #[error("commit log {operation} failed: {source}")]
    CommitLog {
        /// `record`, `list` or `remove`.
        operation: &'static str,
        /// The log's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The requested array or checkpoint does not exist.
    #[error("{what} not found: {hint}")]
    NotFound {
        /// What was looked for.
        what: String,
        /// Where to look instead.
        hint: String,
    },
    /// A background task (a save, a CRC check) died: panicked or was cancelled.
    #[error("{what} stopped unexpectedly: {reason}")]
    Task {
        /// The task, e.g. `background save of step 7`.
        what: String,
        /// The join error.
        reason: String,
    },
}

impl CheckpointError {
    pub(crate) fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidInput { what: what.into(), reason: reason.into() }
    }

    pub(crate) fn store(operation: &'static str, key: impl ToString, source: object_store::Error) -> Self {
        Self::Store { operation, key: key.to_string(), source }
    }

    pub(crate) fn manifest(key: impl ToString, reason: impl Into<String>) -> Self {
        Self::BadManifest { key: key.to_string(), reason: reason.into() }
    }
}

impl fault::Classify for CheckpointError {
    /// What a caller names (a value, a URL, a checkpoint that is not there) is the input's; a
    /// store that fails may answer later; bad bytes, reports and markers are a failed save.
    fn fault(&self) -> fault::Fault {
        use fault::Fault;
        match self {
            CheckpointError::InvalidInput { .. }
            | CheckpointError::InvalidStore { .. }
            | CheckpointError::NotFound { .. } => Fault::Input,
            CheckpointError::Store { source: object_store::Error::NotFound { .. }, .. } => Fault::Input,
            CheckpointError::Store {
                source:
                    object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. },
                ..
            } => Fault::Denied,
            CheckpointError::Store { .. } | CheckpointError::CommitLog { .. } => Fault::Unreachable,
            CheckpointError::BadReport { .. }
            | CheckpointError::BadManifest { .. }
            | CheckpointError::Corrupt { .. }
            | CheckpointError::SizeMismatch { .. }
            | CheckpointError::BadMarker { .. }
            | CheckpointError::Task { .. } => Fault::Failed,
        }
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;
