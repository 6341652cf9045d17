//! Refusals on the wire: a status code plus a google.rpc.ErrorInfo whose `reason` names a
//! `podctl.v1.Refusal`, so that clients decide by type, never by a message (docs/PROTOCOL.md).
//! The coordinator builds its refusals with [`status`]; the client reads them with [`of`].

use proto::v1;
use std::collections::HashMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Why the coordinator refused a call, beyond its status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Another node leads; nothing was done.
    NotLeader,
    /// The node was just elected and is catching up; nothing was done.
    CatchingUp,
    /// The cluster could not commit; the command may still be applied.
    NoCommit,
    /// A worker's message of an older generation.
    StaleGeneration,
    /// The request does not hold (a job spec, a report).
    Invalid,
    /// The checkpoint root holds another job's checkpoints.
    ForeignRoot,
    /// A limit of the cluster or the job.
    Limit,
    /// A checkpoint was not committed.
    NotCommitted,
    /// The command no longer fits the job's state.
    State,
}

impl Refusal {
    fn wire(self) -> v1::Refusal {
        match self {
            Refusal::NotLeader => v1::Refusal::NotLeader,
            Refusal::CatchingUp => v1::Refusal::CatchingUp,
            Refusal::NoCommit => v1::Refusal::NoCommit,
            Refusal::StaleGeneration => v1::Refusal::StaleGeneration,
            Refusal::Invalid => v1::Refusal::Invalid,
            Refusal::ForeignRoot => v1::Refusal::ForeignRoot,
            Refusal::Limit => v1::Refusal::Limit,
            Refusal::NotCommitted => v1::Refusal::NotCommitted,
            Refusal::State => v1::Refusal::State,
        }
    }

    fn from_wire(wire: v1::Refusal) -> Option<Self> {
        Some(match wire {
            v1::Refusal::Unspecified => return None,
            v1::Refusal::NotLeader => Refusal::NotLeader,
            v1::Refusal::CatchingUp => Refusal::CatchingUp,
            v1::Refusal::NoCommit => Refusal::NoCommit,
            v1::Refusal::StaleGeneration => Refusal::StaleGeneration,
            v1::Refusal::Invalid => Refusal::Invalid,
            v1::Refusal::ForeignRoot => Refusal::ForeignRoot,
            v1::Refusal::Limit => Refusal::Limit,
            v1::Refusal::NotCommitted => Refusal::NotCommitted,
            v1::Refusal::State => Refusal::State,
        })
    }

    /// Whether the refused call provably did nothing, so that even a call that is not
    /// idempotent (a submission) may be repeated.
    pub fn did_nothing(self) -> bool {
        matches!(self, Refusal::NotLeader | Refusal::CatchingUp)
    }
}

/// A refusal with `code`, `message` (for people) and `refusal` in its details, with `metadata`
/// (the values it names).
pub fn status(
    code: Code,
    message: impl Into<String>,
    refusal: Refusal,
    metadata: &[(&str, String)],
) -> Status {
    let metadata: HashMap<String, String> =
        metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let details = ErrorDetails::with_error_info(refusal.wire().as_str_name(), proto::ERROR_DOMAIN, metadata);
    Status::with_error_details(code, message, details)
}

/// The refusal a status carries, with its metadata; `None` for a status without one (a
/// transport error, a deadline, an older coordinator).
pub fn of(status: &Status) -> Option<(Refusal, HashMap<String, String>)> {
    let info = status.get_details_error_info()?;
    if info.domain != proto::ERROR_DOMAIN {
        return None;
    }
    let refusal = Refusal::from_wire(v1::Refusal::from_str_name(&info.reason)?)?;
    Some((refusal, info.metadata))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_survives_the_status_details() {
        let refused =
            status(Code::Unavailable, "not the leader", Refusal::NotLeader, &[("leader", "a:1".into())]);
        let (refusal, metadata) = of(&refused).unwrap();
        assert_eq!(refusal, Refusal::NotLeader);
        assert_eq!(metadata["leader"], "a:1");
        let info = refused.get_details_error_info().unwrap();
        assert_eq!((info.reason.as_str(), info.domain.as_str()), ("REFUSAL_NOT_LEADER", "podctl.v1"));
        assert_eq!(of(&Status::unavailable("not the leader")), None, "words alone are no refusal");
        let foreign = ErrorDetails::with_error_info("REFUSAL_NOT_LEADER", "example.com", HashMap::new());
        assert_eq!(of(&Status::with_error_details(Code::Unavailable, "x", foreign)), None, "another domain");
    }

    #[test]
    fn every_refusal_has_a_wire_name() {
        let all = [
            Refusal::NotLeader,
            Refusal::CatchingUp,
            Refusal::NoCommit,
            Refusal::StaleGeneration,
            Refusal::Invalid,
            Refusal::ForeignRoot,
            Refusal::Limit,
            Refusal::NotCommitted,
            Refusal::State,
        ];
        for refusal in all {
            assert_eq!(Refusal::from_wire(refusal.wire()), Some(refusal));
        }
        assert_eq!(all.iter().filter(|r| r.did_nothing()).count(), 2);
    }
}
