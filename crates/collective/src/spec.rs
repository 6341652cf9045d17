//! What a group is ([`GroupSpec`]) and how it behaves ([`Config`]).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

/// Most logical ranks a group may have; it bounds the handshake and every per-rank table.
pub const MAX_RANKS: usize = 4096;

/// Longest job name, in bytes; it bounds the handshake.
pub const MAX_JOB_LEN: usize = 1024;

/// One generation of one all-reduce group, as the coordinator hands it to every member.
///
/// The group has `placement.len()` logical ranks (the data-parallel size D) hosted by
/// `members.len()` processes; `placement[rank]` is the index in `members` of the process that
/// hosts `rank`. The ring runs over logical ranks, so the sums are the same bits whatever the
/// placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// The job, so two jobs on one host never join each other's ring.
    pub job: String,
    /// The coordinator's membership generation; a peer from another generation is refused.
    pub generation: u64,
    /// Every member's listener address, the same list on every member.
    pub members: Vec<SocketAddr>,
    /// Logical rank -> index in `members`.
    pub placement: Vec<usize>,
    /// This process's index in `members`.
    pub me: usize,
}

impl GroupSpec {
    /// Checks that the spec describes a group this process can form.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Err(Error::InvalidSpec { reason });
        if self.job.is_empty() || self.job.len() > MAX_JOB_LEN {
            return invalid(format!(
                "job name of {} bytes; it must be 1 to {MAX_JOB_LEN} bytes",
                self.job.len()
            ));
        }
        if self.members.is_empty() {
            return invalid("no members; list every process's listener address".into());
        }
        let mut seen = HashSet::new();
        if let Some(dup) = self.members.iter().find(|a| !seen.insert(**a)) {
            return invalid(format!(
                "member address {dup} is listed twice; each process has its own listener"
            ));
        }
        if self.me >= self.members.len() {
            return invalid(format!("me = {} but there are {} members", self.me, self.members.len()));
        }
        if self.placement.is_empty() || self.placement.len() > MAX_RANKS {
            return invalid(format!("{} logical ranks; a group has 1 to {MAX_RANKS}", self.placement.len()));
        }
        if let Some((rank, member)) =
            self.placement.iter().enumerate().find(|(_, m)| **m >= self.members.len())
        {
            return invalid(format!(
                "placement puts rank {rank} on member {member} but there are {} members",
                self.members.len()
            ));
        }
        if let Some(idle) = (0..self.members.len()).find(|m| !self.placement.contains(m)) {
            return invalid(format!(
                "member {idle} ({}) hosts no logical rank; drop it from members",
                self.members[idle]
            ));
        }
        Ok(())
    }

    /// The data-parallel size D: the number of logical ranks.
    pub fn ranks(&self) -> usize {
        self.placement.len()
    }

    /// The logical ranks this process hosts, ascending.
    pub fn local_ranks(&self) -> Vec<usize> {
        (0..self.placement.len()).filter(|r| self.placement[*r] == self.me).collect()
    }
}

/// Timeouts and the pipelining unit. Every member of a group must use the same `chunk_bytes`
/// (the handshake checks it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Bound on forming a group: connecting to every peer and hearing from every peer.
    pub connect_timeout: Duration,
    /// Bound on each network wait while a bucket is in flight: a peer that sends nothing (or
    /// accepts nothing) for this long fails the group. Set it above the worst skew between
    /// members' submissions of the same bucket.
    pub io_timeout: Duration,
    /// Largest chunk sent as one frame. Smaller chunks pipeline the ring sooner, larger ones cost
    /// fewer frames; `benches/allreduce.rs` measures the trade-off.
    pub chunk_bytes: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            connect_timeout: Duration::from_secs(30),
            io_timeout: Duration::from_secs(60),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }
}

/// The default pipelining unit (see `benches/README.md` for the measurement behind it).
pub const DEFAULT_CHUNK_BYTES: usize = 512 * 1024;

const MIN_CHUNK_BYTES: usize = 4 * 1024;
const MAX_CHUNK_BYTES: usize = 64 * 1024 * 1024;

impl Config {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        if self.connect_timeout.is_zero() {
            return Err(Error::InvalidConfig {
                field: "connect_timeout",
                value: format!("{:?}", self.connect_timeout),
                fix: "use a positive duration, e.g. 30s",
            });
        }
        if self.io_timeout.is_zero() {
            return Err(Error::InvalidConfig {
                field: "io_timeout",
                value: format!("{:?}", self.io_timeout),
                fix: "use a positive duration, e.g. 60s",
            });
        }
        if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&self.chunk_bytes)
            || !self.chunk_bytes.is_multiple_of(4)
        {
            return Err(Error::InvalidConfig {
                field: "chunk_bytes",
                value: self.chunk_bytes.to_string(),
                fix: "use a multiple of 4 between 4 KiB and 64 MiB",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> GroupSpec {
        GroupSpec {
            job: "job".into(),
            generation: 3,
            members: vec!["127.0.0.1:1000".parse().unwrap(), "127.0.0.1:1001".parse().unwrap()],
            placement: vec![0, 1, 0, 1],
            me: 1,
        }
    }

    #[test]
    fn valid_spec_and_local_ranks() {
        let s = spec();
        s.validate().unwrap();
        assert_eq!(s.ranks(), 4);
        assert_eq!(s.local_ranks(), vec![1, 3]);
    }

    #[test]
    fn rejects_inconsistent_specs() {
        type Breakage = (fn(&mut GroupSpec), &'static str);
        let cases: Vec<Breakage> = vec![
            (|s| s.job.clear(), "job name"),
            (|s| s.members.clear(), "no members"),
            (|s| s.members[1] = s.members[0], "listed twice"),
            (|s| s.me = 2, "me = 2"),
            (|s| s.placement.clear(), "0 logical ranks"),
            (|s| s.placement[2] = 5, "rank 2 on member 5"),
            (|s| s.placement = vec![0, 0], "member 1 (127.0.0.1:1001) hosts no logical rank"),
        ];
        for (break_it, needle) in cases {
            let mut s = spec();
            break_it(&mut s);
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }

    #[test]
    fn config_ranges() {
        Config::default().validate().unwrap();
        let bad = Config { chunk_bytes: 1000, ..Config::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("chunk_bytes = 1000"));
        let bad = Config { io_timeout: Duration::ZERO, ..Config::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("io_timeout"));
        let bad = Config { connect_timeout: Duration::ZERO, ..Config::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("connect_timeout"));
    }
}
