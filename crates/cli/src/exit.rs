//! What a command's outcome means to a script: its exit status.
//!
//! | status | meaning |
//! | --- | --- |
//! | 0 | done (a cluster launch that detached: the job was accepted and runs on) |
//! | 1 | the job failed, or what the command checked did (`ckpt verify`) |
//! | 2 | bad usage or spec: a flag, a field, a file (the message names it and the fix) |
//! | 3 | cannot reach or authenticate to the coordinators |
//! | 130 | interrupted: Ctrl-C stopped a local run (after saving a checkpoint, where it has them) |
//!
//! [`classify`] decides from the error's types, never its text: a coordinator's answer by its
//! gRPC code ([`client::ClientError::code`]), what the commands know about their own failures
//! by the [`Classified`] they wrap them in; anything else is bad input, which is what an error
//! before any work started is.

use client::ClientError;

/// gRPC status codes (grpc/doc/statuscodes.md; fixed by the protocol), which the client's
/// refusals carry: the cli names no gRPC type.
mod code {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const ALREADY_EXISTS: i32 = 6;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// What an outcome means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The job failed (or what a command checked did).
    Failed,
    /// Bad usage or spec.
    Usage,
    /// The coordinators cannot be reached, or refused the credentials.
    Unreachable,
    /// Ctrl-C stopped a local run.
    Interrupted,
}

impl Exit {
    /// The exit status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::Unreachable => 3,
            Exit::Interrupted => 130,
        }
    }
}

/// The exit statuses as `podctl --help` lists them.
pub const HELP: &str = "Exit status: 0 done (a cluster launch that detached: the job runs on), 1 the job failed \
(or what the command checked: `ckpt verify`), 2 bad usage or spec, 3 cannot reach or authenticate \
to the coordinators, 130 interrupted (Ctrl-C stopped a local run, after a checkpoint where the job has them).";

/// An error whose meaning a command knows: a job that ended failed, a run stopped by Ctrl-C. It
/// shows as the error it wraps; a typed error inside it (a coordinator out of reach while the
/// job was followed) still decides.
#[derive(Debug)]
pub struct Classified {
    /// What it means, unless a typed error inside says otherwise.
    pub exit: Exit,
    /// The error.
    pub error: anyhow::Error,
}

impl std::fmt::Display for Classified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for Classified {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl Classified {
    /// `error` as a failure of the job (status 1).
    pub fn failed(error: impl Into<anyhow::Error>) -> anyhow::Error {
        Classified { exit: Exit::Failed, error: error.into() }.into()
    }

    /// `error` as an interruption (status 130).
    pub fn interrupted(error: impl Into<anyhow::Error>) -> anyhow::Error {
        Classified { exit: Exit::Interrupted, error: error.into() }.into()
    }
}

/// A coordinator's answer, by its gRPC code.
fn of_client(error: &ClientError) -> Exit {
    if unreachable(error) {
        return Exit::Unreachable;
    }
    match error.code() as i32 {
        code::UNAUTHENTICATED | code::PERMISSION_DENIED => Exit::Unreachable,
        code::INVALID_ARGUMENT
        | code::NOT_FOUND
        | code::ALREADY_EXISTS
        | code::FAILED_PRECONDITION
        | code::OUT_OF_RANGE => Exit::Usage,
        _ => Exit::Failed,
    }
}

/// Whether no coordinator answered `error`'s call, so that asking again later may succeed (an
/// election, a cluster without its quorum for a while), as opposed to a refusal.
pub fn unreachable(error: &ClientError) -> bool {
    // `ClientError::Unavailable`, nobody answering, has the code `UNAVAILABLE`.
    matches!(error.code() as i32, code::UNAVAILABLE | code::DEADLINE_EXCEEDED)
}

/// What a typed error in `error`'s chain says, if any does.
fn typed(error: &(dyn std::error::Error + 'static)) -> Option<Exit> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(classified) = e.downcast_ref::<Classified>() {
            return Some(typed(classified.error.as_ref()).unwrap_or(classified.exit));
        }
        if let Some(client) = e.downcast_ref::<ClientError>() {
            return Some(of_client(client));
        }
        cause = e.source();
    }
    None
}

/// What `error` means to a script.
pub fn classify(error: &anyhow::Error) -> Exit {
    typed(error.as_ref()).unwrap_or(Exit::Usage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn refused(code: i32) -> ClientError {
        ClientError::Refused { call: "Jobs.Get", code: code.into(), message: "m".into(), refusal: None }
    }

    #[test]
    fn a_coordinator_s_answer_decides_by_its_code() {
        let unreachable = ClientError::Unavailable {
            call: "Jobs.Get",
            waited: Duration::from_secs(15),
            addresses: "127.0.0.1:1".into(),
            last: "connection refused".into(),
        };
        assert_eq!(classify(&unreachable.into()), Exit::Unreachable);
        assert_eq!(classify(&refused(code::UNAUTHENTICATED).into()), Exit::Unreachable);
        assert_eq!(classify(&refused(code::NOT_FOUND).into()), Exit::Usage);
        assert_eq!(classify(&refused(13).into()), Exit::Failed);
        // Wrapped in context, it still decides.
        let wrapped = anyhow::Error::from(refused(code::PERMISSION_DENIED)).context("stopping j-1");
        assert_eq!(classify(&wrapped), Exit::Unreachable);
    }

    #[test]
    fn a_command_s_own_meaning_holds_unless_a_typed_error_inside_says_otherwise() {
        assert_eq!(classify(&anyhow::anyhow!("no such file")), Exit::Usage);
        let failed = Classified::failed(anyhow::anyhow!("the job ended failed: step 3 diverged"));
        assert_eq!(classify(&failed), Exit::Failed);
        assert_eq!(failed.to_string(), "the job ended failed: step 3 diverged");
        assert_eq!(classify(&Classified::interrupted(anyhow::anyhow!("Ctrl-C"))), Exit::Interrupted);
        // The job was being followed when the coordinators went away: that is what to report.
        let lost =
            Classified::failed(anyhow::Error::from(refused(code::UNAVAILABLE)).context("following j-1"));
        assert_eq!(classify(&lost), Exit::Unreachable);
        assert_eq!(
            [Exit::Failed, Exit::Usage, Exit::Unreachable, Exit::Interrupted].map(Exit::code),
            [1, 2, 3, 130]
        );
    }
}
