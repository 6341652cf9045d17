//! The crate's error type. Every variant names the peer, field or value involved and what to do.

use mesh::DType;
use std::net::SocketAddr;
use std::time::Duration;

/// Errors of forming a group and of running collectives on it.
///
/// Errors are `Clone` because a failed group hands the same first error to every caller that
/// waits on it afterwards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A [`Config`](crate::Config) field is out of range.
    #[error("invalid collective config: {field} = {value}; {fix}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What a valid value looks like.
        fix: &'static str,
    },
    /// A [`GroupSpec`](crate::GroupSpec) is inconsistent.
    #[error("invalid group spec: {reason}")]
    InvalidSpec {
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The listener could not be bound.
    #[error(
        "cannot bind the collective listener on {addr}: {detail}; pick a free port (0 lets the OS choose)"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        detail: String,
    },
    /// A buffer of an element type the ring does not sum.
    #[error("cannot all-reduce {dtype} buffers: the ring sums float32 and bfloat16 only")]
    UnsupportedDtype {
        /// The element type.
        dtype: DType,
    },
    /// A buffer or a submission that does not fit the round (wrong rank, bucket, size).
    #[error("invalid submission: {reason}")]
    InvalidSubmission {
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A peer refused the handshake for a reason other than its generation.
    #[error("member {member} at {addr} refused the handshake: {reason}")]
    Refused {
        /// The refusing member.
        member: usize,
        /// Its address.
        addr: SocketAddr,
        /// Why, as the peer put it.
        reason: String,
    },
    /// This member's generation is older than a peer's: the group it tries to form is gone.
    #[error(
        "generation {ours} is stale: member {member} at {addr} is at generation {current}; fetch the current group spec and form it again"
    )]
    StaleGeneration {
        /// The generation this member tried to form.
        ours: u64,
        /// The newer generation the peer is at.
        current: u64,
        /// The peer.
        member: usize,
        /// The peer's address.
        addr: SocketAddr,
    },
    /// A network wait outlasted its timeout.
    #[error("timed out after {after:?} waiting for {awaited} (rank {rank}, member {member} at {addr})")]
    Timeout {
        /// The logical rank waited on.
        rank: usize,
        /// The member hosting it.
        member: usize,
        /// The member's address.
        addr: SocketAddr,
        /// What was awaited.
        awaited: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// A peer's connection closed or reset: the peer died or dropped its group.
    #[error("lost rank {rank} (member {member} at {addr}): {detail}")]
    PeerLost {
        /// The logical rank lost.
        rank: usize,
        /// The member hosting it.
        member: usize,
        /// The member's address.
        addr: SocketAddr,
        /// How it was noticed, and by whom when relayed by another member.
        detail: String,
    },
    /// A peer aborted the group (it was aborted from outside or dropped its group).
    #[error("rank {rank} (member {member}) aborted the group: {detail}")]
    PeerAborted {
        /// The rank whose member aborted.
        rank: usize,
        /// The member.
        member: usize,
        /// The peer's reason.
        detail: String,
    },
    /// A peer failed for another reason (a timeout, a protocol error) and told the ring.
    #[error("rank {rank} (member {member}) failed: {detail}")]
    PeerFailed {
        /// The rank that reported the failure.
        rank: usize,
        /// The member hosting it.
        member: usize,
        /// The peer's error.
        detail: String,
    },
    /// A peer sent something the protocol does not allow here.
    #[error("protocol error from rank {rank} (member {member} at {addr}): {detail}")]
    Protocol {
        /// The sending rank.
        rank: usize,
        /// The member hosting it.
        member: usize,
        /// The member's address.
        addr: SocketAddr,
        /// What was expected and what came.
        detail: String,
    },
    /// The OS refused a thread for the ring.
    #[error("cannot start a ring thread: {detail}; the process is out of threads or memory")]
    Spawn {
        /// The OS error.
        detail: String,
    },
    /// The group was aborted through its [`AbortHandle`](crate::AbortHandle) (or dropped).
    #[error("the collective group was aborted")]
    Aborted,
}

impl fault::Classify for Error {
    /// A member that vanished or stayed silent may be back (or replaced) in the next
    /// generation; an abort or a newer generation is on purpose; a bad configuration is the
    /// input's; anything else failed the ring.
    fn fault(&self) -> fault::Fault {
        use fault::Fault;
        match self {
            Error::Timeout { .. } | Error::PeerLost { .. } => Fault::Unreachable,
            Error::Aborted | Error::StaleGeneration { .. } => Fault::Interrupted,
            Error::InvalidConfig { .. } | Error::Bind { .. } => Fault::Input,
            _ => Fault::Failed,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
