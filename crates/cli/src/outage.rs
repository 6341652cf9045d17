//! Following a job through a coordinator outage.
//!
//! A leader election, or a cluster that lost its quorum for a while (two of three nodes killed or
//! hung at once), leaves the coordinators without a leader for longer than one call's retries
//! (the client's `retry_for`). The job runs on meanwhile: workers train through a leaderless
//! stretch and the new leader takes them in. So a command that follows a job (`podctl launch`,
//! `podctl status --watch`, `podctl logs -f`) keeps asking through an outage, says so once
//! ([`began`]), and gives up only after
//! [`PATIENCE`] without an answer. The soak found this: a 1,134-failure run's `podctl launch`
//! exited with an error 22 s into such a stretch while its job went on to finish.

use client::ClientError;
use std::time::{Duration, Instant};

/// How long a follower keeps asking without an answer before it gives up.
pub const PATIENCE: Duration = Duration::from_secs(300);

/// What a follower does after a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Ask again; `first` the first failure of this outage (say so).
    Retry {
        /// Whether the outage just began.
        first: bool,
    },
    /// Not an outage (the coordinator refused), or one longer than the patience: fail.
    GiveUp,
}

/// An outage as a follower sees it: since when no call was answered.
#[derive(Debug)]
pub struct Outage {
    patience: Duration,
    since: Option<Instant>,
}

impl Outage {
    /// No outage yet; give up after `patience` of one.
    pub fn new(patience: Duration) -> Self {
        Outage { patience, since: None }
    }

    /// A call failed at `now` with `error`.
    pub fn failed(&mut self, error: &ClientError, now: Instant) -> Next {
        if !crate::exit::unreachable(error) {
            return Next::GiveUp;
        }
        let first = self.since.is_none();
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) >= self.patience { Next::GiveUp } else { Next::Retry { first } }
    }

    /// A call was answered at `now`: how long the outage it ends lasted, if one did.
    pub fn answered(&mut self, now: Instant) -> Option<Duration> {
        self.since.take().map(|since| now.duration_since(since))
    }

    /// How long the outage has lasted at `now` (zero when none is on).
    pub fn lasted(&self, now: Instant) -> Duration {
        self.since.map_or(Duration::ZERO, |since| now.duration_since(since))
    }
}

/// What a follower says when an outage begins with `error`.
pub fn began(error: &ClientError) -> String {
    format!(
        "no coordinator answers ({error}); the job runs on meanwhile: still asking, for up to {}s",
        PATIENCE.as_secs()
    )
}

/// Calls `call` until it is answered, through an outage of up to the patience of `outage`;
/// `begins` is told when an outage begins. A refusal is returned at once.
pub async fn patiently<T, Fut>(
    outage: &mut Outage,
    mut call: impl FnMut() -> Fut,
    mut begins: impl FnMut(&ClientError),
) -> Result<T, ClientError>
where
    Fut: Future<Output = Result<T, ClientError>>,
{
    loop {
        match call().await {
            Ok(answer) => {
                outage.answered(Instant::now());
                return Ok(answer);
            }
            Err(e) => match outage.failed(&e, Instant::now()) {
                Next::Retry { first } => {
                    if first {
                        begins(&e);
                    }
                    // Each call already tried for the client's `retry_for`.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Next::GiveUp => return Err(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nobody() -> ClientError {
        ClientError::Unavailable {
            call: "Jobs.Get",
            waited: Duration::from_secs(20),
            addresses: "a:1, b:2, c:3".into(),
            last: "not the leader; the leader is c:3".into(),
        }
    }

    /// A refusal with gRPC `code` (14 Unavailable, 4 DeadlineExceeded, 5 NotFound, 7
    /// PermissionDenied, 16 Unauthenticated).
    fn refused(code: i32) -> ClientError {
        ClientError::Refused { call: "Jobs.Get", code: code.into(), refusal: None, message: "m".into() }
    }

    #[test]
    fn an_outage_is_waited_out_up_to_the_patience_and_said_once() {
        let t0 = Instant::now();
        let mut outage = Outage::new(Duration::from_secs(300));
        assert_eq!(outage.failed(&nobody(), t0), Next::Retry { first: true });
        // Twenty seconds of retries each: the one that cut a soak's launch short was the first.
        assert_eq!(outage.failed(&nobody(), t0 + Duration::from_secs(22)), Next::Retry { first: false });
        assert_eq!(outage.lasted(t0 + Duration::from_secs(30)), Duration::from_secs(30));
        assert_eq!(outage.answered(t0 + Duration::from_secs(44)), Some(Duration::from_secs(44)));
        assert_eq!(outage.answered(t0 + Duration::from_secs(45)), None, "said once");
        // A new outage starts its own clock.
        let t1 = t0 + Duration::from_secs(400);
        assert_eq!(outage.failed(&refused(14), t1), Next::Retry { first: true });
        assert_eq!(outage.failed(&nobody(), t1 + Duration::from_secs(299)), Next::Retry { first: false });
        assert_eq!(outage.failed(&nobody(), t1 + Duration::from_secs(300)), Next::GiveUp);
    }

    #[test]
    fn a_refusal_is_not_waited_out() {
        let mut outage = Outage::new(PATIENCE);
        for code in [5, 7, 16] {
            assert_eq!(outage.failed(&refused(code), Instant::now()), Next::GiveUp, "{code}");
        }
        assert_eq!(outage.failed(&refused(4), Instant::now()), Next::Retry { first: true });
    }
}
