//! A TPU slice type and the worker pod template: names, labels, GKE selectors, tolerations, the
//! environment libtpu needs, and the Secret that carries a job's worker token.
//!
//! A slice of `hosts()` hosts is the unit the controller creates and replaces: its pods are
//! `<job>-s<slice>-a<attempt>-h<host>`, and a pod lost from a slice replaces the whole slice
//! under the next attempt (the hosts of a multi-host slice run one SPMD program over ICI; it
//! cannot go on with a host missing, and `TPU_WORKER_HOSTNAMES` names the hosts of one attempt).
//!
//! The hosts of a multi-host slice must land in one GKE node pool (one pool is one physical
//! slice, its VMs joined by ICI), and no two slices in the same pool: the pods carry JobSet's
//! exclusive-topology rule on `cloud.google.com/gke-nodepool` (what XPK asks for with
//! `alpha.jobset.sigs.k8s.io/exclusive-topology`), a required pod affinity to their own slice
//! attempt and a required anti-affinity to every other. A single-host slice is one VM, so its
//! pod needs neither.

use crate::Error;
use crate::decide::DesiredJob;
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, EnvVarSource, KeyToPath, ObjectFieldSelector, Pod, PodAffinity,
    PodAffinityTerm, PodAntiAffinity, PodSpec, ResourceRequirements, Secret, SecretVolumeSource,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// GKE's node label for the TPU type of a node pool.
pub const TPU_ACCELERATOR_LABEL: &str = "cloud.google.com/gke-tpu-accelerator";
/// GKE's node label for the slice topology of a node pool.
pub const TPU_TOPOLOGY_LABEL: &str = "cloud.google.com/gke-tpu-topology";
/// GKE's node label (and taint) of Spot VMs.
pub const SPOT_LABEL: &str = "cloud.google.com/gke-spot";
/// The extended resource of TPU chips (and the taint GKE puts on TPU nodes).
pub const TPU_RESOURCE: &str = "google.com/tpu";
/// GKE's node label naming a node's node pool: the topology domain of a multi-host slice.
pub const NODE_POOL_LABEL: &str = "cloud.google.com/gke-nodepool";

/// Labels every object the controller makes carries.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// `worker` on pods, `job-token` on secrets.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// The Helm release: two installs in one namespace never touch each other's pods.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Who made the object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The job key (see [`job_key`]): a label value, so at most 63 characters.
pub const JOB_LABEL: &str = "podctl.dev/job";
/// The slice index.
pub const SLICE_LABEL: &str = "podctl.dev/slice";
/// The attempt: bumped each time the slice is replaced.
pub const ATTEMPT_LABEL: &str = "podctl.dev/attempt";
/// The host index inside the slice (`TPU_WORKER_ID`).
pub const HOST_LABEL: &str = "podctl.dev/host";
/// One attempt of one slice of one job (`<job key>-s<slice>-a<attempt>`), on the pods of
/// multi-host slices: what their node-pool affinity and anti-affinity select.
pub const SLICE_GROUP_LABEL: &str = "podctl.dev/slice-group";
/// The full job id (labels are too short for every id).
pub const JOB_ID_ANNOTATION: &str = "podctl.dev/job-id";

/// Where a worker pod finds its job token (the Secret's key `token`).
pub const TOKEN_DIR: &str = "/var/run/podctl/token";
/// Where a worker pod finds `ca.pem`, `client.pem` and `client.key`.
pub const TLS_DIR: &str = "/var/run/podctl/tls";
/// The only keys of the TLS Secret a worker pod mounts: never a server or CA key, whatever
/// else the Secret holds (whoever reads a worker's files must not be able to serve as a
/// coordinator or mint certificates).
pub const WORKER_TLS_FILES: [&str; 3] = ["ca.pem", "client.pem", "client.key"];
/// The key of the token in a job token Secret.
pub const TOKEN_KEY: &str = "token";

/// The longest job key: leaves room in a 63-character pod name for `-s<slice>-a<attempt>-h<host>`.
const MAX_JOB_KEY: usize = 36;

/// A short, DNS-label-safe name for a job: its id when short enough, else a prefix and a hash.
pub fn job_key(job_id: &str) -> String {
    if job_id.len() <= MAX_JOB_KEY {
        return job_id.to_string();
    }
    let hash = hex::encode(&Sha256::digest(job_id.as_bytes())[..4]);
    format!("{}-{hash}", job_id[..MAX_JOB_KEY - 9].trim_end_matches('-'))
}

/// The name (and hostname) of a worker pod.
pub fn pod_name(job_id: &str, slice: u32, attempt: u32, host: u32) -> String {
    format!("{}-s{slice}-a{attempt}-h{host}", job_key(job_id))
}

/// `(slice, attempt, host)` of a pod name of this job, if it is one.
pub fn parse_pod_name(job_id: &str, name: &str) -> Option<(u32, u32, u32)> {
    let rest = name.strip_prefix(&job_key(job_id))?.strip_prefix("-s")?;
    let (slice, rest) = rest.split_once("-a")?;
    let (attempt, host) = rest.split_once("-h")?;
    Some((slice.parse().ok()?, attempt.parse().ok()?, host.parse().ok()?))
}

/// The slice-group label value of one attempt of one slice (see [`SLICE_GROUP_LABEL`]).
pub fn slice_group(job_id: &str, slice: u32, attempt: u32) -> String {
    format!("{}-s{slice}-a{attempt}", job_key(job_id))
}

/// The name of a job's token Secret.
pub fn token_secret_name(job_id: &str) -> String {
    format!("{}-token", job_key(job_id))
}

/// A TPU slice type: what a GKE node pool offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpuSlice {
    /// `cloud.google.com/gke-tpu-accelerator`, e.g. `tpu-v6e-slice`.
    pub accelerator: String,
    /// `cloud.google.com/gke-tpu-topology`, e.g. `2x4`.
    pub topology: String,
    /// Chips each host (VM) of the slice has.
    pub chips_per_host: u32,
}

impl TpuSlice {
    /// A slice type; `chips_per_host` defaults to what GKE's machine types have: v5e and v6e
    /// slices of up to 8 chips are one host, larger ones (and every other TPU) 4 chips a host.
    pub fn new(accelerator: &str, topology: &str, chips_per_host: Option<u32>) -> Result<Self, Error> {
        let invalid = |reason: String| Err(Error::Slice { field: "topology", reason });
        let dims: Vec<u32> = match topology.split('x').map(str::parse).collect() {
            Ok(dims) => dims,
            Err(_) => return invalid(format!("'{topology}' is not like 2x4 or 2x2x1")),
        };
        if dims.len() < 2 || dims.contains(&0) {
            return invalid(format!("'{topology}' is not like 2x4 or 2x2x1"));
        }
        let chips: u32 = dims.iter().product();
        let single_host = matches!(accelerator, "tpu-v6e-slice" | "tpu-v5-lite-podslice") && chips <= 8;
        let per_host = chips_per_host.unwrap_or(if single_host { chips } else { chips.min(4) });
        if per_host == 0 || !chips.is_multiple_of(per_host) {
            return Err(Error::Slice {
                field: "chips_per_host",
                reason: format!("{per_host} does not divide the {chips} chips of a {topology} slice"),
            });
        }
        Ok(Self { accelerator: accelerator.into(), topology: topology.into(), chips_per_host: per_host })
    }

    /// Chips of one slice.
    pub fn chips(&self) -> u32 {
        self.topology.split('x').filter_map(|d| d.parse::<u32>().ok()).product()
    }

    /// Hosts (pods) of one slice.
    pub fn hosts(&self) -> u32 {
        self.chips() / self.chips_per_host
    }
}

/// What every worker pod of this coordinator has in common.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerTemplate {
    /// The namespace pods and secrets live in (the coordinator's own).
    pub namespace: String,
    /// The Helm release (`app.kubernetes.io/instance`): scopes what the controller watches.
    pub instance: String,
    /// The worker image (runs `podctl worker`).
    pub image: String,
    /// The address workers dial (the coordinator's client Service, `host:port`).
    pub coordinator: String,
    /// The slice type every job runs on.
    pub slice: TpuSlice,
    /// Run on Spot VMs (select them and tolerate their taint).
    pub spot: bool,
    /// Seconds between SIGTERM and SIGKILL: the pod's `terminationGracePeriodSeconds`, and the
    /// deadline the worker reports in its preemption notice (`--grace-period-seconds`). On a
    /// Spot VM's preemption GKE gives user pods at most 15 s unless the node pool's system
    /// configuration grants more (up to 120 s), whatever the pod asks for.
    pub grace_period_seconds: i64,
    /// Run on the host network (the VM's own interfaces for the gradient ring and libtpu; the
    /// node's service account for the bucket) rather than the pod network (per-pod Workload
    /// Identity; the CNI on every packet). docs/KUBERNETES.md weighs the two.
    pub host_network: bool,
    /// The Kubernetes service account of worker pods (Workload Identity on the pod network).
    pub service_account: Option<String>,
    /// The headless Service whose DNS names the hosts of a slice (`<pod>.<subdomain>`).
    pub subdomain: String,
    /// The Secret with `ca.pem`, `client.pem` and `client.key` for mutual TLS; none: plaintext.
    pub tls_secret: Option<String>,
}

impl WorkerTemplate {
    /// The labels every worker pod and token Secret of this coordinator carries.
    fn base_labels(&self, component: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (NAME_LABEL.into(), "podctl".into()),
            (COMPONENT_LABEL.into(), component.into()),
            (INSTANCE_LABEL.into(), self.instance.clone()),
            (MANAGED_BY_LABEL.into(), "podctl-coordinator".into()),
        ])
    }

    /// The label selector of the worker pods.
    pub fn pod_selector(&self) -> String {
        selector(&self.base_labels("worker"))
    }

    /// The label selector of the job token Secrets.
    pub fn secret_selector(&self) -> String {
        selector(&self.base_labels("job-token"))
    }

    fn metadata(&self, name: String, component: &str, job_id: &str) -> ObjectMeta {
        let mut labels = self.base_labels(component);
        labels.insert(JOB_LABEL.into(), job_key(job_id));
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(JOB_ID_ANNOTATION.into(), job_id.to_string())])),
            ..Default::default()
        }
    }

    /// The Secret that holds a job's worker token (mounted by its pods as `--token-file`).
    pub fn token_secret(&self, job: &DesiredJob) -> Secret {
        Secret {
            metadata: self.metadata(token_secret_name(&job.id), "job-token", &job.id),
            string_data: Some(BTreeMap::from([(TOKEN_KEY.into(), job.worker_token.clone())])),
            type_: Some("Opaque".into()),
            ..Default::default()
        }
    }

    /// The pod of host `host` of slice `slice`, attempt `attempt`, of `job`.
    pub fn pod(&self, job: &DesiredJob, slice: u32, attempt: u32, host: u32) -> Pod {
        let name = pod_name(&job.id, slice, attempt, host);
        let mut metadata = self.metadata(name.clone(), "worker", &job.id);
        let labels = metadata.labels.get_or_insert_default();
        labels.insert(SLICE_LABEL.into(), slice.to_string());
        labels.insert(ATTEMPT_LABEL.into(), attempt.to_string());
        labels.insert(HOST_LABEL.into(), host.to_string());
        let multi_host = self.slice.hosts() > 1;
        if multi_host {
            labels.insert(SLICE_GROUP_LABEL.into(), slice_group(&job.id, slice, attempt));
        }

        let hostnames = (0..self.slice.hosts())
            .map(|h| format!("{}.{}", pod_name(&job.id, slice, attempt, h), self.subdomain))
            .collect::<Vec<_>>()
            .join(",");
        let value =
            |name: &str, value: String| EnvVar { name: name.into(), value: Some(value), value_from: None };
        let field = |name: &str, path: &str| EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector { field_path: path.into(), api_version: None }),
                ..Default::default()
            }),
        };
        let env = vec![
            field("POD_NAME", "metadata.name"),
            field("POD_NAMESPACE", "metadata.namespace"),
            // The data plane (gradient ring, peer catch-up) listens on the host's address, which
            // is the pod's under the host network.
            field("PODCTL_BIND", "status.podIP"),
            // The worker registers with these: the controller recognizes its registration by
            // the instance id (the pod name) and the coordinator places it by slice.
            value("PODCTL_INSTANCE_ID", name.clone()),
            value("PODCTL_SLICE", slice.to_string()),
            // libtpu's multi-host slice rendezvous: this host's index and every host's name.
            value("TPU_WORKER_ID", host.to_string()),
            value("TPU_WORKER_HOSTNAMES", hostnames),
        ];

        let mut args: Vec<String> = vec![
            "worker".into(),
            "--coordinator".into(),
            self.coordinator.clone(),
            "--job".into(),
            job.id.clone(),
            "--token-file".into(),
            format!("{TOKEN_DIR}/{TOKEN_KEY}"),
            // The deadline its preemption notice reports: this pod's grace period.
            "--grace-period-seconds".into(),
            self.grace_period_seconds.to_string(),
        ];
        let mut mounts = vec![VolumeMount {
            name: "token".into(),
            mount_path: TOKEN_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }];
        let mut volumes = vec![Volume {
            name: "token".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(token_secret_name(&job.id)),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        }];
        if let Some(tls) = &self.tls_secret {
            args.extend(["--tls-dir".into(), TLS_DIR.into()]);
            mounts.push(VolumeMount {
                name: "tls".into(),
                mount_path: TLS_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            });
            volumes.push(Volume {
                name: "tls".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(tls.clone()),
                    default_mode: Some(0o400),
                    items: Some(
                        WORKER_TLS_FILES
                            .iter()
                            .map(|file| KeyToPath {
                                key: file.to_string(),
                                path: file.to_string(),
                                mode: None,
                            })
                            .collect(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }

        let chips = Quantity(self.slice.chips_per_host.to_string());
        let tpu = BTreeMap::from([(TPU_RESOURCE.to_string(), chips)]);
        let mut node_selector = BTreeMap::from([
            (TPU_ACCELERATOR_LABEL.to_string(), self.slice.accelerator.clone()),
            (TPU_TOPOLOGY_LABEL.to_string(), self.slice.topology.clone()),
        ]);
        let mut tolerations = vec![Toleration {
            key: Some(TPU_RESOURCE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }];
        if self.spot {
            node_selector.insert(SPOT_LABEL.into(), "true".into());
            tolerations.push(Toleration {
                key: Some(SPOT_LABEL.into()),
                operator: Some("Equal".into()),
                value: Some("true".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            });
        }

        let affinity = multi_host.then(|| exclusive_node_pool(&slice_group(&job.id, slice, attempt)));

        Pod {
            metadata,
            spec: Some(PodSpec {
                // The controller replaces a lost slice under a new name; a restarted container
                // would come back with no state and an old registration.
                restart_policy: Some("Never".into()),
                hostname: Some(name),
                subdomain: Some(self.subdomain.clone()),
                // On the host network, DCN traffic (the gradient ring, peer catch-up) goes over
                // the VM's own interfaces.
                host_network: self.host_network.then_some(true),
                dns_policy: self.host_network.then(|| "ClusterFirstWithHostNet".into()),
                service_account_name: self.service_account.clone(),
                affinity,
                termination_grace_period_seconds: Some(self.grace_period_seconds),
                node_selector: Some(node_selector),
                tolerations: Some(tolerations),
                containers: vec![Container {
                    name: "worker".into(),
                    image: Some(self.image.clone()),
                    command: Some(vec!["podctl".into()]),
                    args: Some(args),
                    env: Some(env),
                    resources: Some(ResourceRequirements {
                        limits: Some(tpu.clone()),
                        requests: Some(tpu),
                        ..Default::default()
                    }),
                    volume_mounts: Some(mounts),
                    // Root, for libtpu's device nodes (docs/KUBERNETES.md), but never more.
                    security_context: Some(SecurityContext {
                        allow_privilege_escalation: Some(false),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                volumes: Some(volumes),
                ..Default::default()
            }),
            status: None,
        }
    }
}

impl WorkerTemplate {
    /// A job's token Secret and the pods of the first attempt of every slice, as YAML documents
    /// (each one JSON, which YAML reads): what the controller would create, for review (the
    /// chart's tests validate it against the Kubernetes schemas). GitOps declares the job
    /// instead ([`crate::declare`]): the pods are the controller's.
    pub fn render(&self, job: &DesiredJob) -> String {
        let mut docs =
            vec![serde_json::to_string_pretty(&self.token_secret(job)).expect("a Secret serializes")];
        for slice in 0..job.slices {
            for host in 0..self.slice.hosts() {
                let pod = self.pod(job, slice, 0, host);
                docs.push(serde_json::to_string_pretty(&pod).expect("a Pod serializes"));
            }
        }
        docs.iter().map(|d| format!("---\n{d}\n")).collect()
    }
}

/// JobSet's exclusive placement on node pools, for the pods of slice attempt `group`: all in the
/// pool of the first one scheduled (a pod matching its own required affinity may go where none
/// matches yet), and none in a pool holding another slice's pods, of any podctl install or
/// namespace. Attempts differ, so a replacement keeps off the pool its predecessor is leaving.
fn exclusive_node_pool(group: &str) -> Affinity {
    let requirement = |operator: &str, values: Option<Vec<String>>| LabelSelectorRequirement {
        key: SLICE_GROUP_LABEL.into(),
        operator: operator.into(),
        values,
    };
    let term = |expressions: Vec<LabelSelectorRequirement>, namespace_selector: Option<LabelSelector>| {
        PodAffinityTerm {
            label_selector: Some(LabelSelector { match_expressions: Some(expressions), match_labels: None }),
            namespace_selector,
            topology_key: NODE_POOL_LABEL.into(),
            ..Default::default()
        }
    };
    Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![term(
                vec![requirement("In", Some(vec![group.into()]))],
                None,
            )]),
            ..Default::default()
        }),
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![term(
                vec![requirement("Exists", None), requirement("NotIn", Some(vec![group.into()]))],
                // `{}`: every namespace.
                Some(LabelSelector::default()),
            )]),
            ..Default::default()
        }),
        node_affinity: None,
    }
}

fn selector(labels: &BTreeMap<String, String>) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_types_know_their_hosts() {
        let v6e8 = TpuSlice::new("tpu-v6e-slice", "2x4", None).unwrap();
        assert_eq!((v6e8.chips(), v6e8.chips_per_host, v6e8.hosts()), (8, 8, 1));
        let v6e16 = TpuSlice::new("tpu-v6e-slice", "4x4", None).unwrap();
        assert_eq!((v6e16.chips(), v6e16.chips_per_host, v6e16.hosts()), (16, 4, 4));
        let v5p = TpuSlice::new("tpu-v5p-slice", "2x2x2", None).unwrap();
        assert_eq!(v5p.hosts(), 2);
        let e = TpuSlice::new("tpu-v6e-slice", "2by4", None).unwrap_err().to_string();
        assert!(e.contains("2by4") && e.contains("2x4"), "{e}");
        let e = TpuSlice::new("tpu-v6e-slice", "4x4", Some(3)).unwrap_err().to_string();
        assert!(e.contains("3 does not divide the 16 chips"), "{e}");
    }

    #[test]
    fn names_fit_dns_labels_and_parse_back() {
        let short = "tiny-arith-12";
        assert_eq!(pod_name(short, 1, 3, 0), "tiny-arith-12-s1-a3-h0");
        assert_eq!(parse_pod_name(short, "tiny-arith-12-s1-a3-h0"), Some((1, 3, 0)));
        assert_eq!(parse_pod_name(short, "tiny-arith-123-s1-a3-h0"), None);
        assert_eq!(parse_pod_name(short, "random-instance-id"), None);
        let long = format!("{}-7", "a".repeat(63));
        let name = pod_name(&long, 4095, 999_999, 255);
        assert!(name.len() <= 63, "{name} is {} characters", name.len());
        assert_eq!(parse_pod_name(&long, &name), Some((4095, 999_999, 255)));
        // Two long ids that share a prefix still get different keys.
        assert_ne!(job_key(&long), job_key(&format!("{}-8", "a".repeat(63))));
        assert!(token_secret_name(&long).len() <= 63);
    }
}
