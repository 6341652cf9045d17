//! What a failure means for whoever decides what to do next.
//!
//! Every podctl library error says, by its type, which [`Fault`] it is ([`Classify`]): the
//! command line turns it into an exit status and a hint, the client into a retry or not, the
//! worker into what it tells the coordinator. Nobody reads an error's message to decide; the
//! message is for people.
//!
//! It also holds the one [`fail_point!`]: crashes, pauses and injected errors at chosen points
//! (TiKV's `fail` crate), compiled only into a build that asks for them.
//!
//! **Architecture Invariant:** no dependencies, no podctl crate: every library can classify its
//! own errors (checked: the layering block's `fault:`); only the `failpoints` feature brings
//! `fail`, and only this crate names it (`only fail: fault`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

/// TiKV's `fail` crate, for the fail-point tests and binaries (`fault::fault::fail::cfg`,
/// `fault::fault::fail::FailScenario`); present with the `failpoints` feature.
#[cfg(feature = "failpoints")]
pub use fail;

/// `fail::fail_point!` with every form of it (`(name)`, `(name, |arg| ...)`,
/// `(name, cond, |arg| ...)`) and its semantics, compiled only where the *calling* crate's
/// `failpoints` feature is on (which turns on `podctl-fault/failpoints`); elsewhere a fail point
/// is no code at all, not a disabled check.
#[macro_export]
macro_rules! fail_point {
    ($($arg:tt)*) => {
        #[cfg(feature = "failpoints")]
        $crate::fail::fail_point!($($arg)*);
    };
}

use std::fmt;

/// What a failure means: whose it is, and so what can be done about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// What was given is wrong or does not fit: a flag, the job spec, a file, a bundle or a
    /// checkpoint it names. The same request fails again until it is changed.
    Input,
    /// Nobody answered in time: the coordinators, an object store, a peer. The same request may
    /// succeed later, unchanged.
    Unreachable,
    /// The credentials were refused: a token, a certificate.
    Denied,
    /// The work itself failed: a step, a device, a save, a job that ended failed, or a broken
    /// invariant of podctl's own.
    Failed,
    /// Stopped on purpose: Ctrl-C, SIGTERM, `podctl stop`, a newer generation of the job.
    Interrupted,
}

impl Fault {
    /// Whether the same request, repeated unchanged, may succeed.
    pub fn retryable(self) -> bool {
        self == Fault::Unreachable
    }

    /// A word for logs and machine-readable output: `input`, `unreachable`, `denied`, `failed`,
    /// `interrupted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Input => "input",
            Fault::Unreachable => "unreachable",
            Fault::Denied => "denied",
            Fault::Failed => "failed",
            Fault::Interrupted => "interrupted",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error that knows what it means.
pub trait Classify {
    /// What this failure means for whoever decides what to do next.
    fn fault(&self) -> Fault;
}

impl<T: Classify + ?Sized> Classify for &T {
    fn fault(&self) -> Fault {
        (**self).fault()
    }
}

impl<T: Classify + ?Sized> Classify for Box<T> {
    fn fault(&self) -> Fault {
        (**self).fault()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreachable_peer_is_worth_the_same_request_again() {
        let all = [Fault::Input, Fault::Unreachable, Fault::Denied, Fault::Failed, Fault::Interrupted];
        let retryable: Vec<Fault> = all.into_iter().filter(|f| f.retryable()).collect();
        assert_eq!(retryable, [Fault::Unreachable]);
        let words: Vec<String> = all.iter().map(Fault::to_string).collect();
        assert_eq!(words, ["input", "unreachable", "denied", "failed", "interrupted"]);
    }
}
