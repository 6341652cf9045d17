//! The Pod Security Standards' `baseline` and `restricted` levels, as the API server's Pod
//! Security admission checks a pod spec (Kubernetes 1.32, the `latest` version of each level:
//! <https://kubernetes.io/docs/concepts/security/pod-security-standards/>).
//!
//! [`violations`] reads a pod spec as JSON (a Pod's `spec`, or a pod template's) and names every
//! rule it breaks, in the words `kubectl` prints (`host namespaces (hostNetwork=true)`). The mock
//! enforces it on pod creation in namespaces labelled [`ENFORCE_LABEL`]; tests call it directly on
//! rendered manifests.

use serde_json::Value;

/// The namespace label whose level the API server enforces on pod creation.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// Capabilities `baseline` lets a container add (the container runtime's defaults).
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Volume types `restricted` allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Sysctls `baseline` allows.
const SAFE_SYSCTLS: [&str; 9] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
];

/// Every container of the spec: init, regular and ephemeral.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |field| spec[field].as_array().into_iter().flatten())
}

fn name(container: &Value) -> &str {
    container["name"].as_str().unwrap_or("?")
}

/// The rules of `level` (`privileged`, `baseline` or `restricted`) that `spec` breaks; empty
/// when it passes. An unknown level is a violation of its own.
pub fn violations(level: &str, spec: &Value) -> Vec<String> {
    match level {
        "privileged" => Vec::new(),
        "baseline" => baseline(spec),
        "restricted" => {
            let mut out = baseline(spec);
            out.extend(restricted(spec));
            out
        }
        other => vec![format!("unknown Pod Security level {other:?}")],
    }
}

fn baseline(spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let host: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .into_iter()
        .filter(|f| spec[*f] == true)
        .map(|f| format!("{f}=true"))
        .collect();
    if !host.is_empty() {
        out.push(format!("host namespaces ({})", host.join(", ")));
    }
    for c in containers(spec) {
        let sc = &c["securityContext"];
        if sc["privileged"] == true {
            out.push(format!(
                "privileged (container {:?} must not set securityContext.privileged=true)",
                name(c)
            ));
        }
        let added: Vec<&str> = sc["capabilities"]["add"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|cap| !BASELINE_CAPABILITIES.contains(cap))
            .collect();
        if !added.is_empty() {
            out.push(format!(
                "non-default capabilities (container {:?} must not include {added:?})",
                name(c)
            ));
        }
        let host_ports =
            c["ports"].as_array().into_iter().flatten().any(|p| p["hostPort"].as_i64().unwrap_or(0) != 0);
        if host_ports {
            out.push(format!("hostPort (container {:?} uses hostPort)", name(c)));
        }
        if sc["procMount"].as_str().is_some_and(|m| m != "Default") {
            out.push(format!("procMount (container {:?} must not set procMount)", name(c)));
        }
        if sc["seccompProfile"]["type"] == "Unconfined" {
            out.push(format!("seccompProfile (container {:?} must not set it to Unconfined)", name(c)));
        }
        if sc["appArmorProfile"]["type"] == "Unconfined" {
            out.push(format!("appArmorProfile (container {:?} must not set it to Unconfined)", name(c)));
        }
        out.extend(selinux(&sc["seLinuxOptions"], &format!("container {:?}", name(c))));
    }
    let pod_sc = &spec["securityContext"];
    if pod_sc["seccompProfile"]["type"] == "Unconfined" {
        out.push("seccompProfile (pod must not set it to Unconfined)".into());
    }
    if pod_sc["appArmorProfile"]["type"] == "Unconfined" {
        out.push("appArmorProfile (pod must not set it to Unconfined)".into());
    }
    out.extend(selinux(&pod_sc["seLinuxOptions"], "pod"));
    let unsafe_sysctls: Vec<&str> = pod_sc["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .filter(|s| !SAFE_SYSCTLS.contains(s))
        .collect();
    if !unsafe_sysctls.is_empty() {
        out.push(format!("forbidden sysctls ({})", unsafe_sysctls.join(", ")));
    }
    let host_paths: Vec<&str> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("hostPath").is_some())
        .filter_map(|v| v["name"].as_str())
        .collect();
    if !host_paths.is_empty() {
        out.push(format!("hostPath volumes ({})", host_paths.join(", ")));
    }
    out
}

fn selinux(options: &Value, whose: &str) -> Option<String> {
    let allowed = ["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"];
    let bad_type = options["type"].as_str().is_some_and(|t| !allowed.contains(&t));
    let custom = options["user"].is_string() || options["role"].is_string();
    (bad_type || custom).then(|| format!("seLinuxOptions ({whose} sets a forbidden type, user or role)"))
}

fn restricted(spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let pod_sc = &spec["securityContext"];
    let bad_volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| {
            v.as_object().is_some_and(|fields| {
                fields.keys().filter(|k| *k != "name").any(|k| !RESTRICTED_VOLUMES.contains(&k.as_str()))
            })
        })
        .filter_map(|v| v["name"].as_str())
        .collect();
    if !bad_volumes.is_empty() {
        out.push(format!("restricted volume types ({})", bad_volumes.join(", ")));
    }
    if pod_sc["runAsUser"] == 0 {
        out.push("runAsUser=0 (pod must not set runAsUser=0)".into());
    }
    for c in containers(spec) {
        let sc = &c["securityContext"];
        let n = name(c);
        if sc["allowPrivilegeEscalation"] != false {
            out.push(format!("allowPrivilegeEscalation != false (container {n:?} must set it to false)"));
        }
        let non_root = match sc["runAsNonRoot"].as_bool() {
            Some(v) => v,
            None => pod_sc["runAsNonRoot"] == true,
        };
        if !non_root {
            out.push(format!("runAsNonRoot != true (pod or container {n:?} must set runAsNonRoot=true)"));
        }
        if sc["runAsUser"] == 0 {
            out.push(format!("runAsUser=0 (container {n:?} must not set runAsUser=0)"));
        }
        let seccomp = sc["seccompProfile"]["type"].as_str().or(pod_sc["seccompProfile"]["type"].as_str());
        if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
            out.push(format!(
                "seccompProfile (pod or container {n:?} must set securityContext.seccompProfile.type to RuntimeDefault or Localhost)"
            ));
        }
        let caps = &sc["capabilities"];
        let drops_all = caps["drop"].as_array().into_iter().flatten().any(|d| d == "ALL");
        if !drops_all {
            out.push(format!("unrestricted capabilities (container {n:?} must set securityContext.capabilities.drop=[\"ALL\"])"));
        }
        let added: Vec<&str> = caps["add"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|cap| *cap != "NET_BIND_SERVICE")
            .collect();
        if !added.is_empty() {
            out.push(format!("unrestricted capabilities (container {n:?} must not add {added:?})"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_level_names_what_it_refuses() {
        let host = json!({ "hostNetwork": true, "containers": [{ "name": "w" }] });
        assert_eq!(violations("baseline", &host), ["host namespaces (hostNetwork=true)"]);
        assert!(violations("privileged", &host).is_empty());

        let root = json!({
            "containers": [{ "name": "w", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] },
                "seccompProfile": { "type": "RuntimeDefault" }
            } }],
            "volumes": [{ "name": "cache", "emptyDir": {} }]
        });
        assert!(violations("baseline", &root).is_empty());
        let restricted = violations("restricted", &root);
        assert_eq!(restricted.len(), 1, "{restricted:?}");
        assert!(restricted[0].starts_with("runAsNonRoot != true"), "{restricted:?}");

        let mut non_root = root.clone();
        non_root["securityContext"] = json!({ "runAsNonRoot": true, "runAsUser": 1000 });
        assert!(violations("restricted", &non_root).is_empty());

        let loose = json!({
            "containers": [{ "name": "w", "securityContext": { "capabilities": { "add": ["IPC_LOCK", "CHOWN"] } } }],
            "volumes": [{ "name": "dev", "hostPath": { "path": "/dev" } }]
        });
        let found = violations("baseline", &loose);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("\"IPC_LOCK\"") && !found[0].contains("CHOWN"), "{found:?}");
        assert_eq!(found[1], "hostPath volumes (dev)");
        assert_eq!(violations("strict", &loose), ["unknown Pod Security level \"strict\""]);
    }
}
