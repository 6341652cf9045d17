//! A TPU slice type and the worker pod template: names, labels, GKE selectors, tolerations, the
//! environment libtpu needs, the job object that owns a job's pods, and the Secret that carries
//! a job's worker token.
//!
//! **Ownership.** Every job has a job object, a ConfigMap `<job>-job` owned by the release's
//! workers Service (`<release>-workers`, which Helm makes and `helm uninstall` deletes); the
//! job's pods and token Secret are owned by the job object. Deleting the job object (or
//! uninstalling the release, which deletes the Service) makes Kubernetes' garbage collector
//! delete the pods and the Secret, whatever the coordinators are doing, so nothing is left
//! billing; the controller then stops the job (see [`crate::decide`]).
//!
//! **The pod.** Guaranteed QoS (requests equal limits for CPU, memory, ephemeral storage and
//! TPU chips: [`Resources`]), the runtime's default seccomp profile, every capability dropped,
//! a read-only root filesystem with the bundle cache and `/tmp` on `emptyDir` volumes, and no
//! privilege escalation. It runs as root: libtpu opens the TPU's device nodes, which GKE's TPU
//! device plugin hands the container with the host's (root) ownership; docs/KUBERNETES.md says
//! what libtpu needs and why nothing more is granted.
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
    Affinity, Capabilities, ConfigMap, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, KeyToPath,
    ObjectFieldSelector, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource, SecurityContext, Toleration, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
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
/// The crashes of a slice before this attempt, by exit code (JSON: `{"1": 2}`), on its pods:
/// the restart budget's memory, carried from attempt to attempt (see [`crate::decide`]).
pub const CRASHES_ANNOTATION: &str = "podctl.dev/crashes";
/// `app.kubernetes.io/component` of job objects.
pub const JOB_OBJECT_COMPONENT: &str = "job-object";
/// Kueue's label naming the LocalQueue a pod waits in (its plain-pod integration).
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Kueue's label making pods one group, admitted together.
pub const KUEUE_GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";
/// Kueue's annotation with the number of pods in the group.
pub const KUEUE_GROUP_COUNT_ANNOTATION: &str = "kueue.x-k8s.io/pod-group-total-count";

/// Where a worker pod finds its job token (the Secret's key `token`).
pub const TOKEN_DIR: &str = "/var/run/podctl/token";
/// Where a worker pod finds `ca.pem`, `client.pem` and `client.key`.
pub const TLS_DIR: &str = "/var/run/podctl/tls";
/// The worker's cache (`PODCTL_CACHE`: fetched bundles), an `emptyDir`: the root filesystem is
/// read-only.
pub const CACHE_DIR: &str = "/var/cache/podctl";
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

/// The slice-group label value of one attempt of one slice (see [`SLICE_GROUP_LABEL`]): the
/// job key for people, and a hash of the namespace, the release and the job id, because the
/// anti-affinity between slices spans every namespace (JobSet hashes a namespaced key too): the
/// same job id in two namespaces must not look like one slice to the scheduler.
pub fn slice_group(namespace: &str, instance: &str, job_id: &str, slice: u32, attempt: u32) -> String {
    format!("{}-s{slice}-a{attempt}-{}", job_key(job_id), scope_hash(namespace, instance, job_id))
}

/// The Kueue pod group of a job's pods (every slice, every attempt): unique in the namespace
/// across releases.
pub fn kueue_group(namespace: &str, instance: &str, job_id: &str) -> String {
    format!("{}-{}", job_key(job_id), scope_hash(namespace, instance, job_id))
}

fn scope_hash(namespace: &str, instance: &str, job_id: &str) -> String {
    hex::encode(&Sha256::digest(format!("{namespace}/{instance}/{job_id}").as_bytes())[..4])
}

/// The name of a job's token Secret.
pub fn token_secret_name(job_id: &str) -> String {
    format!("{}-token", job_key(job_id))
}

/// The name of a job's job object.
pub fn job_object_name(job_id: &str) -> String {
    format!("{}-job", job_key(job_id))
}

/// An object that owns others: its name and uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// Its name.
    pub name: String,
    /// Its uid (an owner reference names the one object, not whatever has the name later).
    pub uid: String,
}

impl ObjectRef {
    fn owner(&self, kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            // Deleting the owner needs no permission on its dependents' finalizers.
            block_owner_deletion: None,
            controller: Some(true),
        }
    }
}

/// What a worker pod requests, and is limited to: equal requests and limits make its QoS class
/// Guaranteed, the last the kubelet evicts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    /// CPU (`176`).
    pub cpu: String,
    /// Memory (`1152Gi`).
    pub memory: String,
    /// Ephemeral storage (`50Gi`): the bundle cache, `/tmp` (libtpu's logs) and the logs.
    pub ephemeral_storage: String,
}

impl Resources {
    /// The default for a slice type's host: the TPU VM's vCPUs less 8 and 80% of its memory
    /// (GKE keeps some for the kubelet and its system pods; axlearn requests 80% too), 50Gi of
    /// ephemeral storage (of the node's 100 GB boot disk). Known: v6e hosts, from GKE's table of
    /// machine types ([Plan TPUs in GKE](https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus)):
    /// ct6e-standard-1t 44 vCPUs and 176 GB, -4t 180 and 720 GB, -8t 180 and 1440 GB. None for
    /// others: name the resources (the chart's `workers.resources`).
    pub fn for_slice(slice: &TpuSlice) -> Option<Self> {
        let (vcpus, memory_gib) = match (slice.accelerator.as_str(), slice.chips_per_host) {
            ("tpu-v6e-slice", 1) => (44, 176),
            ("tpu-v6e-slice", 4) => (180, 720),
            ("tpu-v6e-slice", 8) => (180, 1440),
            _ => return None,
        };
        Some(Self {
            cpu: (vcpus - 8).to_string(),
            memory: format!("{}Gi", memory_gib * 4 / 5),
            ephemeral_storage: "50Gi".into(),
        })
    }
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
    /// What each worker pod requests and is limited to, besides its TPU chips.
    pub resources: Resources,
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

    /// The label selector of the job objects.
    pub fn job_object_selector(&self) -> String {
        selector(&self.base_labels(JOB_OBJECT_COMPONENT))
    }

    /// The name of the Service that owns every job object: the workers' headless Service.
    pub fn owner_service(&self) -> &str {
        &self.subdomain
    }

    /// Why a job whose slice uses `devices` devices cannot run on this cluster's slices, with
    /// what works instead; `None` when it can. The coordinator refuses such a submission.
    pub fn refusal(&self, devices: u32) -> Option<String> {
        let slice = &self.slice;
        if slice.hosts() > 1 {
            // The controller can place and replace multi-host slices (exclusive node pools), but
            // the hosts of one slice do not train as one SPMD program yet: each would be a
            // data-parallel member of its own. The chart refuses such slice types too.
            return Some(format!(
                "this install's slices ({} {}) span {} hosts of {} chips, and training one slice across \
                 several hosts is not built yet; what works is several single-host slices over DCN: install \
                 the chart with a single-host slice type (tpu.topology=2x4 on ct6e-standard-8t, v6e-8) and \
                 ask for more slices with mesh.dcn",
                slice.accelerator,
                slice.topology,
                slice.hosts(),
                slice.chips_per_host
            ));
        }
        self.device_refusal(devices)
    }

    /// Why a slice of `devices` devices does not fit this cluster's slices: a job submitted
    /// before the chart changed its slice type fails with this.
    pub(crate) fn device_refusal(&self, devices: u32) -> Option<String> {
        let slice = &self.slice;
        (devices != slice.chips()).then(|| {
            format!(
                "a slice of the job uses {devices} devices (mesh.ici) but this cluster's slices ({} {}) have {} \
                 chips; set mesh.ici to use {} devices, or install the chart with another tpu.topology",
                slice.accelerator,
                slice.topology,
                slice.chips(),
                slice.chips()
            )
        })
    }

    fn metadata(
        &self,
        name: String,
        component: &str,
        job_id: &str,
        owner: Option<OwnerReference>,
    ) -> ObjectMeta {
        let mut labels = self.base_labels(component);
        labels.insert(JOB_LABEL.into(), job_key(job_id));
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(JOB_ID_ANNOTATION.into(), job_id.to_string())])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        }
    }

    /// A job's job object, owned by the release's workers Service `owner` (see the module).
    pub fn job_object(&self, job: &DesiredJob, owner: &ObjectRef) -> ConfigMap {
        ConfigMap {
            metadata: self.metadata(
                job_object_name(&job.id),
                JOB_OBJECT_COMPONENT,
                &job.id,
                Some(owner.owner("Service")),
            ),
            data: Some(BTreeMap::from([
                ("job-id".into(), job.id.clone()),
                (
                    "about".into(),
                    "podctl's handle on this job: it owns the job's worker pods and token Secret. \
                     Deleting it stops the job and deletes them; `podctl stop` does the same."
                        .into(),
                ),
            ])),
            ..Default::default()
        }
    }

    /// The Secret that holds a job's worker token (mounted by its pods as `--token-file`),
    /// owned by the job object.
    pub fn token_secret(&self, job: &DesiredJob, owner: &ObjectRef) -> Secret {
        Secret {
            metadata: self.metadata(
                token_secret_name(&job.id),
                "job-token",
                &job.id,
                Some(owner.owner("ConfigMap")),
            ),
            string_data: Some(BTreeMap::from([(TOKEN_KEY.into(), job.worker_token.clone())])),
            type_: Some("Opaque".into()),
            ..Default::default()
        }
    }

    /// The pod of host `host` of slice `slice`, attempt `attempt`, of `job`, owned by the job
    /// object `owner`; `crashes` is the slice's crash history before this attempt.
    pub fn pod(
        &self,
        job: &DesiredJob,
        owner: &ObjectRef,
        slice: u32,
        attempt: u32,
        host: u32,
        crashes: &BTreeMap<i32, u32>,
    ) -> Pod {
        let name = pod_name(&job.id, slice, attempt, host);
        let mut metadata = self.metadata(name.clone(), "worker", &job.id, Some(owner.owner("ConfigMap")));
        let labels = metadata.labels.get_or_insert_default();
        labels.insert(SLICE_LABEL.into(), slice.to_string());
        labels.insert(ATTEMPT_LABEL.into(), attempt.to_string());
        labels.insert(HOST_LABEL.into(), host.to_string());
        let multi_host = self.slice.hosts() > 1;
        let group = slice_group(&self.namespace, &self.instance, &job.id, slice, attempt);
        if multi_host {
            labels.insert(SLICE_GROUP_LABEL.into(), group.clone());
        }
        let annotations = metadata.annotations.get_or_insert_default();
        if !crashes.is_empty() {
            let history: BTreeMap<String, u32> =
                crashes.iter().map(|(code, n)| (code.to_string(), *n)).collect();
            annotations.insert(CRASHES_ANNOTATION.into(), serde_json::to_string(&history).expect("a map"));
        }
        if let Some(queue) = &job.queue {
            // Kueue's plain-pod integration: the job's pods wait in `queue` and are admitted as
            // one group (all slices at once), which Kueue names after the label.
            labels.insert(KUEUE_QUEUE_LABEL.into(), queue.clone());
            labels.insert(KUEUE_GROUP_LABEL.into(), kueue_group(&self.namespace, &self.instance, &job.id));
            annotations
                .insert(KUEUE_GROUP_COUNT_ANNOTATION.into(), (job.slices * self.slice.hosts()).to_string());
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
            // The root filesystem is read-only: fetched bundles go to the cache volume.
            value("PODCTL_CACHE", CACHE_DIR.to_string()),
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
        let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: read_only.then_some(true),
            ..Default::default()
        };
        let scratch = |name: &str| Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        };
        // libtpu writes its logs and lock file under /tmp.
        let mut mounts = vec![
            mount("token", TOKEN_DIR, true),
            mount("cache", CACHE_DIR, false),
            mount("tmp", "/tmp", false),
        ];
        let mut volumes = vec![
            Volume {
                name: "token".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(token_secret_name(&job.id)),
                    default_mode: Some(0o400),
                    ..Default::default()
                }),
                ..Default::default()
            },
            scratch("cache"),
            scratch("tmp"),
        ];
        if let Some(tls) = &self.tls_secret {
            args.extend(["--tls-dir".into(), TLS_DIR.into()]);
            mounts.push(mount("tls", TLS_DIR, true));
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

        let resources = BTreeMap::from([
            (TPU_RESOURCE.to_string(), Quantity(self.slice.chips_per_host.to_string())),
            ("cpu".to_string(), Quantity(self.resources.cpu.clone())),
            ("memory".to_string(), Quantity(self.resources.memory.clone())),
            ("ephemeral-storage".to_string(), Quantity(self.resources.ephemeral_storage.clone())),
        ]);
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

        let affinity = multi_host.then(|| exclusive_node_pool(&group));

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
                priority_class_name: job.priority_class.clone(),
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
                        limits: Some(resources.clone()),
                        requests: Some(resources),
                        ..Default::default()
                    }),
                    volume_mounts: Some(mounts),
                    // Root, for libtpu's device nodes, with no capability at all: the device
                    // plugin gives the container its TPU's device nodes, and GKE's TPU nodes the
                    // locked-memory limit libtpu pins its DMA buffers against
                    // (docs/KUBERNETES.md).
                    security_context: Some(SecurityContext {
                        allow_privilege_escalation: Some(false),
                        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
                        read_only_root_filesystem: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                volumes: Some(volumes),
                security_context: Some(PodSecurityContext {
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        localhost_profile: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }
}

impl WorkerTemplate {
    /// A job's job object (owned by `owner`, the workers Service), token Secret and the pods of
    /// the first attempt of every slice, as YAML documents (each one JSON, which YAML reads):
    /// what the controller would create, for review (the chart's tests validate it against the
    /// Kubernetes schemas). The job object's uid is the API server's to give: `object_uid`
    /// stands in for it. GitOps declares the job instead ([`crate::declare`]): the pods are the
    /// controller's.
    pub fn render(&self, job: &DesiredJob, owner: &ObjectRef, object_uid: &str) -> String {
        let object = ObjectRef { name: job_object_name(&job.id), uid: object_uid.into() };
        let mut docs = vec![
            serde_json::to_string_pretty(&self.job_object(job, owner)).expect("a ConfigMap serializes"),
            serde_json::to_string_pretty(&self.token_secret(job, &object)).expect("a Secret serializes"),
        ];
        for slice in 0..job.slices {
            for host in 0..self.slice.hosts() {
                let pod = self.pod(job, &object, slice, 0, host, &BTreeMap::new());
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
        assert!(token_secret_name(&long).len() <= 63 && job_object_name(&long).len() <= 63);
        let group = slice_group("a-namespace", "podctl", &long, 4095, 999_999);
        assert!(group.len() <= 63, "{group} is {} characters", group.len());
    }

    #[test]
    fn slice_groups_differ_across_namespaces_and_releases() {
        let a = slice_group("team-a", "podctl", "llm-1", 0, 0);
        assert!(a.starts_with("llm-1-s0-a0-"), "{a}");
        assert_ne!(a, slice_group("team-b", "podctl", "llm-1", 0, 0));
        assert_ne!(a, slice_group("team-a", "other", "llm-1", 0, 0));
        assert_ne!(a, slice_group("team-a", "podctl", "llm-1", 0, 1));
        assert_eq!(a, slice_group("team-a", "podctl", "llm-1", 0, 0), "deterministic: a new leader agrees");
    }

    #[test]
    fn v6e_hosts_get_guaranteed_resources_that_fit_them() {
        let resources = |topology: &str, per_host| {
            Resources::for_slice(&TpuSlice::new("tpu-v6e-slice", topology, per_host).unwrap())
        };
        let v6e8 = resources("2x4", None).unwrap();
        assert_eq!((v6e8.cpu.as_str(), v6e8.memory.as_str()), ("172", "1152Gi"));
        assert_eq!(resources("2x2", None).unwrap().memory, "576Gi");
        assert_eq!(resources("1x1", None).unwrap().cpu, "36");
        assert_eq!(Resources::for_slice(&TpuSlice::new("tpu-v5p-slice", "2x2x1", None).unwrap()), None);
    }
}
