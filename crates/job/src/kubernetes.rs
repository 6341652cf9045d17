//! The `kubernetes:` section: how a job's pods queue on a cluster (ignored by local runs).
//!
//! XPK users queue their workloads with Kueue and give them a priority; podctl's controller puts
//! the same on the worker pods it creates: `queue` is Kueue's `kueue.x-k8s.io/queue-name` label
//! (a LocalQueue of the namespace; the pods are admitted as one Kueue pod group), and
//! `priority_class` the pods' `priorityClassName` (a PriorityClass, which Kueue also reads as the
//! workload's priority).

use crate::JobError;
use serde::{Deserialize, Serialize};

/// Queueing on Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesSpec {
    /// The Kueue LocalQueue the job's pods wait in (Kueue's plain-pod integration).
    pub queue: Option<String>,
    /// The PriorityClass of the job's pods.
    pub priority_class: Option<String>,
}

/// Whether `name` is a DNS-1123 subdomain of at most `max` characters (what Kubernetes accepts
/// for object names; label values also allow at most 63).
fn dns_name(name: &str, max: usize) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !name.is_empty() && name.len() <= max && name.split('.').all(label_ok)
}

impl KubernetesSpec {
    pub(crate) fn validate(&self) -> Result<(), JobError> {
        // The queue's name is a label value on every pod: 63 characters at most.
        if let Some(queue) = &self.queue
            && !dns_name(queue, 63)
        {
            return Err(JobError::Invalid {
                field: "kubernetes.queue",
                reason: format!(
                    "'{queue}' is not a LocalQueue name: use up to 63 lowercase letters, digits, '-' and '.' \
                     (`kubectl get localqueues` lists the namespace's)"
                ),
            });
        }
        if let Some(class) = &self.priority_class
            && !dns_name(class, 253)
        {
            return Err(JobError::Invalid {
                field: "kubernetes.priority_class",
                reason: format!(
                    "'{class}' is not a PriorityClass name: use lowercase letters, digits, '-' and '.' \
                     (`kubectl get priorityclasses` lists them)"
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_kubernetes_checks_them() {
        let spec = |queue: &str, class: &str| KubernetesSpec {
            queue: Some(queue.into()),
            priority_class: Some(class.into()),
        };
        assert!(spec("team-a", "high-priority").validate().is_ok());
        assert!(spec("lq.team-a", "system.high").validate().is_ok());
        let e = spec("Team_A", "high").validate().unwrap_err().to_string();
        assert!(e.contains("`kubernetes.queue`") && e.contains("'Team_A'"), "{e}");
        let e = spec(&"q".repeat(64), "high").validate().unwrap_err().to_string();
        assert!(e.contains("63"), "{e}");
        let e = spec("team-a", "-high").validate().unwrap_err().to_string();
        assert!(e.contains("`kubernetes.priority_class`"), "{e}");
        assert!(KubernetesSpec::default().validate().is_ok());
    }
}
