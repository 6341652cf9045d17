//! Whether a node is ready: it has joined the Raft cluster, not merely opened its port.
//!
//! `GET /readyz` on the node's HTTP listener (`Config::metrics_listen`, beside `/metrics` and
//! `/healthz`) answers 200 when this node is a voter of the cluster's membership and knows a
//! leader of its current term, else 503 with the reason. The chart's readiness probe uses it:
//! the client Service and `podctl --kube-context` reach only members that can answer, and a
//! rolling update (one replica at a time, `maxUnavailable: 1` in the PodDisruptionBudget) waits
//! for each restarted replica to be back in the cluster before it takes the next. Liveness is
//! `/healthz` (the process answers): a replica cut off from its peers is not ready, but
//! restarting it would not help.

use crate::typ;
use std::time::Duration;

/// Ready (what it knows of the cluster), or why not. A leader must have heard from a quorum
/// within `quorum_ack_within` (the longest election timeout: past it, its followers may have
/// elected another leader).
pub fn readiness(id: u64, metrics: &typ::Metrics, quorum_ack_within: Duration) -> Result<String, String> {
    let membership = metrics.membership_config.membership();
    if membership.voter_ids().next().is_none() {
        return Err(format!(
            "node {id} has no cluster yet: the lowest id of --peers initializes it once every peer answers"
        ));
    }
    if !membership.voter_ids().any(|voter| voter == id) {
        return Err(format!(
            "node {id} is not a voter of the cluster ({:?})",
            membership.voter_ids().collect::<Vec<_>>()
        ));
    }
    let term = metrics.current_term;
    match metrics.current_leader {
        Some(leader) if leader == id => match metrics.millis_since_quorum_ack {
            Some(ms) if u128::from(ms) <= quorum_ack_within.as_millis() => {
                Ok(format!("node {id} leads term {term}"))
            }
            _ => Err(format!(
                "node {id} leads term {term} but no quorum has answered it within {quorum_ack_within:?}"
            )),
        },
        Some(leader) => Ok(format!("node {id} is a voter of term {term}, led by node {leader}")),
        None => Err(format!(
            "node {id} knows no leader in term {term} (an election is on, or its peers are unreachable)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{BasicNode, Membership, StoredMembership};
    use std::collections::{BTreeMap, BTreeSet};

    fn metrics(voters: &[u64], leader: Option<u64>) -> typ::Metrics {
        let nodes: BTreeMap<u64, BasicNode> =
            voters.iter().map(|&id| (id, BasicNode::new(format!("n{id}:7001")))).collect();
        let membership = Membership::new(vec![voters.iter().copied().collect::<BTreeSet<_>>()], nodes);
        let mut metrics = typ::Metrics::new_initial(1);
        metrics.membership_config = std::sync::Arc::new(StoredMembership::new(None, membership));
        metrics.current_leader = leader;
        metrics.current_term = 3;
        metrics
    }

    #[test]
    fn a_node_is_ready_once_it_is_a_voter_that_knows_its_leader() {
        let within = Duration::from_secs(1);
        let e = readiness(1, &typ::Metrics::new_initial(1), within).unwrap_err();
        assert!(e.contains("no cluster yet"), "{e}");
        let e = readiness(1, &metrics(&[2, 3, 4], Some(2)), within).unwrap_err();
        assert!(e.contains("not a voter"), "{e}");
        let e = readiness(1, &metrics(&[1, 2, 3], None), within).unwrap_err();
        assert!(e.contains("knows no leader in term 3"), "{e}");
        let ready = readiness(1, &metrics(&[1, 2, 3], Some(2)), within).unwrap();
        assert_eq!(ready, "node 1 is a voter of term 3, led by node 2");
    }

    #[test]
    fn a_leader_is_ready_only_while_a_quorum_answers_it() {
        let within = Duration::from_secs(1);
        let mut leading = metrics(&[1, 2, 3], Some(2));
        leading.millis_since_quorum_ack = Some(120);
        assert_eq!(readiness(2, &leading, within).unwrap(), "node 2 leads term 3");
        leading.millis_since_quorum_ack = Some(5_000);
        let e = readiness(2, &leading, within).unwrap_err();
        assert!(e.contains("no quorum has answered it within 1s"), "{e}");
        leading.millis_since_quorum_ack = None;
        assert!(readiness(2, &leading, within).is_err());
    }
}
