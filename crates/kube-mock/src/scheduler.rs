//! kube-scheduler's filters that podctl's worker pods meet: node selectors, resources, and
//! required pod affinity and anti-affinity (both the incoming pod's terms and the anti-affinity
//! of pods already placed, which Kubernetes also honours).
//!
//! Pods are taken in the scheduler's queue order: creation timestamp (the mock gives every
//! object the same one), then name, then namespace, so the pods of two controllers that create
//! alike interleave as concurrent creations do; nodes by name. A pod that fits nowhere stays
//! pending with a `PodScheduled=False` condition saying why, as `kubectl describe` shows it.

use crate::{Key, Store};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Where a pod went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Bound to this node.
    Bound(String),
    /// Fits no node, and why.
    Unschedulable(String),
}

/// `4`, `500m`, `30Gi`, `1k`: the number, in units (cores, bytes, chips).
fn quantity(text: &str) -> f64 {
    let suffixes = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suffix, scale) in suffixes {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<f64>().unwrap_or(f64::NAN) * scale;
        }
    }
    text.parse().unwrap_or(f64::NAN)
}

/// What a pod's containers request (limits stand in for requests that are not given).
fn requests(pod: &Value) -> BTreeMap<String, f64> {
    let mut total = BTreeMap::new();
    for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
        let resources = &container["resources"];
        let mut asked: BTreeMap<String, f64> = BTreeMap::new();
        for field in ["limits", "requests"] {
            for (name, value) in resources[field].as_object().into_iter().flatten() {
                asked.insert(name.clone(), quantity(value.as_str().unwrap_or("0")));
            }
        }
        for (name, value) in asked {
            *total.entry(name).or_insert(0.0) += value;
        }
    }
    total
}

fn labels(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// Whether a `LabelSelector` selects these labels.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let exact = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let expressions = selector["matchExpressions"].as_array().into_iter().flatten().all(|e| {
        let value = e["key"].as_str().and_then(|k| labels.get(k));
        let values: Vec<&str> =
            e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        match e["operator"].as_str() {
            Some("In") => value.is_some_and(|v| values.contains(&v.as_str())),
            Some("NotIn") => !value.is_some_and(|v| values.contains(&v.as_str())),
            Some("Exists") => value.is_some(),
            Some("DoesNotExist") => value.is_none(),
            other => panic!("the mock scheduler does not know the operator {other:?}"),
        }
    });
    exact && expressions
}

/// Whether a term of a pod in `own_ns` looks at pods of namespace `ns`.
fn in_scope(term: &Value, own_ns: &str, ns: &str) -> bool {
    match (&term["namespaceSelector"], term["namespaces"].as_array()) {
        (Value::Object(selector), _) if selector.is_empty() => true,
        (Value::Object(_), _) => {
            panic!("the mock scheduler knows only the empty namespaceSelector (all namespaces)")
        }
        (_, Some(list)) if !list.is_empty() => list.iter().any(|n| n == ns),
        _ => own_ns == ns,
    }
}

fn terms<'a>(pod: &'a Value, kind: &str) -> impl Iterator<Item = &'a Value> {
    pod["spec"]["affinity"][kind]["requiredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
}

/// Why `pod` cannot go on `node`, given the pods already bound (with their nodes).
fn misfit(pod: &Value, ns: &str, node: &Value, bound: &[(&str, &Value, &Value)]) -> Option<String> {
    let node_labels = labels(node);
    let node_name = node["metadata"]["name"].as_str().unwrap_or_default();
    for (key, value) in pod["spec"]["nodeSelector"].as_object().into_iter().flatten() {
        if node_labels.get(key).map(String::as_str) != value.as_str() {
            return Some(format!("node selector {key}={value}"));
        }
    }
    let allocatable = &node["status"]["allocatable"];
    for (resource, wanted) in requests(pod) {
        let used: f64 = bound
            .iter()
            .filter(|(_, _, n)| n["metadata"]["name"] == node_name)
            .map(|(_, p, _)| requests(p).get(&resource).copied().unwrap_or(0.0))
            .sum();
        let capacity = allocatable[&resource].as_str().map(quantity).unwrap_or(0.0);
        if used + wanted > capacity {
            return Some(format!("Insufficient {resource}"));
        }
    }
    let domain = |n: &Value, key: &str| labels(n).get(key).cloned();
    let pod_labels = labels(pod);
    for term in terms(pod, "podAffinity") {
        let key = term["topologyKey"].as_str().unwrap_or_default();
        let matching: Vec<_> = bound
            .iter()
            .filter(|(other_ns, p, _)| {
                in_scope(term, ns, other_ns) && selects(&term["labelSelector"], &labels(p))
            })
            .collect();
        let here = domain(node, key);
        let satisfied = if matching.is_empty() {
            // The first pod of a group may go anywhere, if it matches its own term.
            selects(&term["labelSelector"], &pod_labels)
        } else {
            here.is_some() && matching.iter().any(|(_, _, n)| domain(n, key) == here)
        };
        if !satisfied {
            return Some("pod affinity".into());
        }
    }
    for term in terms(pod, "podAntiAffinity") {
        let key = term["topologyKey"].as_str().unwrap_or_default();
        let here = domain(node, key);
        let clash = bound.iter().any(|(other_ns, p, n)| {
            in_scope(term, ns, other_ns)
                && selects(&term["labelSelector"], &labels(p))
                && here.is_some()
                && domain(n, key) == here
        });
        if clash {
            return Some("pod anti-affinity".into());
        }
    }
    // Pods already placed keep others off their domains by their own anti-affinity.
    for (other_ns, p, n) in bound {
        for term in terms(p, "podAntiAffinity") {
            let key = term["topologyKey"].as_str().unwrap_or_default();
            if in_scope(term, other_ns, ns)
                && selects(&term["labelSelector"], &pod_labels)
                && domain(n, key).is_some()
                && domain(n, key) == domain(node, key)
            {
                return Some(format!(
                    "the anti-affinity of pod {}",
                    p["metadata"]["name"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    None
}

pub(crate) fn schedule(s: &mut Store) -> BTreeMap<String, Placement> {
    let nodes: Vec<Value> =
        s.objects.iter().filter(|((p, _, _), _)| p == "nodes").map(|(_, n)| n.clone()).collect();
    let mut queue: Vec<Key> = s
        .objects
        .iter()
        .filter(|((p, _, _), pod)| {
            p == "pods"
                && pod["spec"]["nodeName"].is_null()
                && pod["metadata"]["deletionTimestamp"].is_null()
                && pod["status"]["phase"] == "Pending"
        })
        .map(|(key, _)| key.clone())
        .collect();
    queue.sort_by(|a, b| {
        let created =
            |k: &Key| s.objects[k]["metadata"]["creationTimestamp"].as_str().unwrap_or_default().to_string();
        (created(a), &a.2, &a.1).cmp(&(created(b), &b.2, &b.1))
    });
    let mut placements = BTreeMap::new();
    for key in queue {
        let pod = s.objects[&key].clone();
        let placement = {
            let bound: Vec<(&str, &Value, &Value)> = s
                .objects
                .iter()
                .filter(|((p, _, _), other)| {
                    p == "pods" && !matches!(other["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
                })
                .filter_map(|((_, ns, _), other)| {
                    let node = nodes.iter().find(|n| n["metadata"]["name"] == other["spec"]["nodeName"])?;
                    Some((ns.as_str(), other, node))
                })
                .collect();
            let mut reasons = Vec::new();
            let mut chosen = None;
            for node in &nodes {
                match misfit(&pod, &key.1, node, &bound) {
                    None => {
                        chosen = node["metadata"]["name"].as_str().map(str::to_string);
                        break;
                    }
                    Some(reason) => reasons
                        .push(format!("{}: {reason}", node["metadata"]["name"].as_str().unwrap_or("?"))),
                }
            }
            match chosen {
                Some(node) => Placement::Bound(node),
                None => Placement::Unschedulable(format!(
                    "0/{} nodes are available: {}",
                    nodes.len(),
                    reasons.join("; ")
                )),
            }
        };
        let mut updated = pod;
        match &placement {
            Placement::Bound(node) => {
                updated["spec"]["nodeName"] = json!(node);
                updated["status"]["conditions"] = json!([{ "type": "PodScheduled", "status": "True" }]);
            }
            Placement::Unschedulable(why) => {
                updated["status"]["conditions"] = json!([{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why }]);
            }
        }
        let updated = s.record("pods", &key.1, "MODIFIED", updated);
        s.objects.insert(key.clone(), updated);
        placements.insert(format!("{}/{}", key.1, key.2), placement);
    }
    placements
}

#[cfg(test)]
mod tests {
    use super::quantity;

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(quantity("4"), 4.0);
        assert_eq!(quantity("500m"), 0.5);
        assert_eq!(quantity("30Gi"), 30.0 * 1024f64.powi(3));
        assert_eq!(quantity("2k"), 2000.0);
        assert!(quantity("lots").is_nan());
    }
}
