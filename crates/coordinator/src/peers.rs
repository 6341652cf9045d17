//! Whether this node's peers answer its Raft calls. A peer that stops answering is logged once,
//! as a warning, when it goes and once when it answers again, instead of at every retry
//! (openraft retries a lost follower several times a second, and its own messages about it are
//! rate-limited by [`crate::logging`]); `podctl status` shows the state meanwhile
//! ([`PeerHealth::view`], through `Cluster.Info`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A peer not called for this long is shown as unknown: this node stopped leading, and what it
/// saw then says nothing now.
pub const STALE: Duration = Duration::from_secs(30);

/// Whether a peer answered this node's last call to it.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerState {
    /// It answered (with a result or a Raft error of its own).
    Answering,
    /// It has not answered since `since`: the first failure's time and message.
    Unreachable {
        /// When it stopped answering.
        since: Instant,
        /// Why the first call failed.
        error: String,
    },
}

/// What this node knows of its peers' reachability, from its own calls to them. A leader calls
/// every peer (heartbeats), a follower none but in elections: a peer it never called is absent.
#[derive(Debug, Default)]
pub struct PeerHealth {
    /// By peer id: its address, state and when it was last called.
    peers: Mutex<BTreeMap<u64, (String, PeerState, Instant)>>,
}

impl PeerHealth {
    /// Records a call to `target` at `addr`; logs a change of state.
    pub fn record(&self, target: u64, addr: &str, outcome: Result<(), String>) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let previous = peers.get(&target).map(|(_, state, _)| state.clone());
        let next = match (outcome, previous) {
            (Ok(()), Some(PeerState::Unreachable { since, .. })) => {
                tracing::warn!(
                    peer = target,
                    "coordinator node {target} at {addr} answers again after {:.1}s unreachable",
                    since.elapsed().as_secs_f64()
                );
                PeerState::Answering
            }
            (Ok(()), _) => PeerState::Answering,
            (Err(_), Some(down @ PeerState::Unreachable { .. })) => down,
            (Err(error), _) => {
                tracing::warn!(
                    peer = target,
                    "coordinator node {target} at {addr} is unreachable: {error} (logged again when it \
                     answers; `podctl status` shows it meanwhile)"
                );
                PeerState::Unreachable { since: Instant::now(), error }
            }
        };
        peers.insert(target, (addr.to_string(), next, Instant::now()));
    }

    /// The peers this node called within [`STALE`]: their address and state.
    pub fn view(&self) -> BTreeMap<u64, (String, PeerState)> {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers
            .iter()
            .filter(|(_, (_, _, called))| called.elapsed() < STALE)
            .map(|(id, (addr, state, _))| (*id, (addr.clone(), state.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::tests::warnings;

    #[test]
    fn a_peer_going_and_coming_back_is_logged_once_each_way() {
        let health = PeerHealth::default();
        let logged = warnings(|| {
            health.record(2, "10.0.0.2:7001", Ok(()));
            for _ in 0..50 {
                health.record(2, "10.0.0.2:7001", Err("connection refused".into()));
            }
            let view = health.view();
            let (addr, state) = &view[&2];
            assert_eq!(addr, "10.0.0.2:7001");
            assert!(matches!(state, PeerState::Unreachable { error, .. } if error == "connection refused"));
            for _ in 0..50 {
                health.record(2, "10.0.0.2:7001", Ok(()));
            }
            assert_eq!(health.view()[&2].1, PeerState::Answering);
        });
        assert_eq!(logged.len(), 2, "{logged:?}");
        assert!(
            logged[0].starts_with("coordinator node 2 at 10.0.0.2:7001 is unreachable: connection refused")
        );
        assert!(logged[1].starts_with("coordinator node 2 at 10.0.0.2:7001 answers again after "));
    }
}
