//! The controller's decision: a pure function of (desired jobs, observed pods and secrets).
//!
//! [`decide`] reads no clock and calls nothing: the reconcile loop lists the API server, asks
//! the coordinator what it wants, calls this and carries out the [`Action`]s. The same inputs
//! give the same actions on any node, which is what makes a failover safe: names are
//! deterministic, so a new leader that decides again creates nothing twice (a create the old
//! leader already made answers `AlreadyExists`), and a loss is reported again until the
//! coordinator has removed the worker (reporting is idempotent there).
//!
//! The rules, per slice `s` of a job that runs:
//! - Its **attempt** is the highest attempt among its pods and the registrations whose instance
//!   id is one of its pod names (registrations outlive pods, so an attempt is never reused).
//! - A host of that attempt is **lost** when its pod is being deleted, has ended (evicted,
//!   failed, succeeded, unknown), or is gone while the coordinator has a registration from it.
//! - With a lost host, the slice is replaced: every host of attempt `a + 1` is created and every
//!   remaining pod of older attempts deleted. Otherwise missing hosts of the attempt are created
//!   (a creation a failed-over leader had not finished).
//! - Every registration of the job that is still active while its pod is not live (or is being
//!   deleted now) is reported lost, with the pod's reason: that is the coordinator's
//!   preemption notice.
//!
//! Jobs that ended, and pods or secrets of jobs the coordinator does not know, are deleted. A job
//! whose slice has another number of devices than the cluster's slice type fails with the fix.

use crate::slice::{self, WorkerTemplate, parse_pod_name, token_secret_name};
use k8s_openapi::api::core::v1::{Pod, Secret};
use std::collections::{BTreeMap, BTreeSet};

/// A worker registration the coordinator holds for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The coordinator's worker id.
    pub worker_id: String,
    /// The id the worker registered with; pods started by the controller use their pod name.
    pub instance_id: String,
    /// Removed from the job (the coordinator already knows it is gone).
    pub removed: bool,
}

/// A job as the coordinator wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredJob {
    /// The job id.
    pub id: String,
    /// Pending, running or recovering: its pods should exist. False once it ended.
    pub running: bool,
    /// Slices (`mesh.dcn`).
    pub slices: u32,
    /// Devices one slice uses (`mesh.ici` sizes multiplied).
    pub devices_per_slice: u32,
    /// The token its workers authenticate with (written to the job's Secret).
    pub worker_token: String,
    /// Every registration of the job, removed ones included.
    pub registrations: Vec<Registration>,
}

/// Where an observed pod is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Waiting for a node, pulling, starting.
    Pending,
    /// Running.
    Running,
    /// Deletion requested (preemption, eviction, a user): the worker has its grace period.
    Deleting,
    /// Ended or unreachable: evicted, failed, succeeded, or its node lost (`Unknown`).
    Ended {
        /// The phase.
        phase: String,
        /// Kubernetes' reason and message, when it gave them.
        reason: String,
    },
}

impl PodState {
    /// Still doing its work.
    pub fn is_live(&self) -> bool {
        matches!(self, Self::Pending | Self::Running)
    }
}

/// A worker pod as listed from the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedPod {
    /// Its name.
    pub name: String,
    /// The job (annotation), when the pod carries it.
    pub job_id: Option<String>,
    /// `(slice, attempt, host)` from its labels, when it carries them.
    pub position: Option<(u32, u32, u32)>,
    /// Where it is.
    pub state: PodState,
}

impl ObservedPod {
    /// Reads what the decision needs from a pod.
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let name = pod.metadata.name.clone()?;
        let job_id = pod.metadata.annotations.as_ref().and_then(|a| a.get(slice::JOB_ID_ANNOTATION)).cloned();
        let label = |key: &str| -> Option<u32> { pod.metadata.labels.as_ref()?.get(key)?.parse().ok() };
        let position =
            match (label(slice::SLICE_LABEL), label(slice::ATTEMPT_LABEL), label(slice::HOST_LABEL)) {
                (Some(s), Some(a), Some(h)) => Some((s, a, h)),
                _ => None,
            };
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into());
        let state = if pod.metadata.deletion_timestamp.is_some() {
            PodState::Deleting
        } else {
            match phase.as_str() {
                "Pending" => PodState::Pending,
                "Running" => PodState::Running,
                _ => {
                    let reason =
                        [status.and_then(|s| s.reason.clone()), status.and_then(|s| s.message.clone())]
                            .into_iter()
                            .flatten()
                            .collect::<Vec<_>>()
                            .join(": ");
                    PodState::Ended { phase, reason }
                }
            }
        };
        Some(Self { name, job_id, position, state })
    }

    fn describe(&self) -> String {
        match &self.state {
            PodState::Pending | PodState::Running => format!("pod {} is replaced with its slice", self.name),
            PodState::Deleting => {
                format!("pod {} is being deleted (preemption, eviction or a user)", self.name)
            }
            PodState::Ended { phase, reason } if reason.is_empty() => format!("pod {} is {phase}", self.name),
            PodState::Ended { phase, reason } => format!("pod {} is {phase} ({reason})", self.name),
        }
    }
}

/// A job token Secret as listed from the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedSecret {
    /// Its name.
    pub name: String,
    /// The job (annotation), when it carries it.
    pub job_id: Option<String>,
}

impl ObservedSecret {
    /// Reads what the decision needs from a Secret.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        Some(Self {
            name: secret.metadata.name.clone()?,
            job_id: secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(slice::JOB_ID_ANNOTATION))
                .cloned(),
        })
    }
}

/// What the controller should do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create a job's token Secret.
    CreateSecret(Box<Secret>),
    /// Delete a Secret.
    DeleteSecret {
        /// Its name.
        name: String,
    },
    /// Create a worker pod.
    CreatePod(Box<Pod>),
    /// Delete a pod.
    DeletePod {
        /// Its name.
        name: String,
        /// Why, for the log.
        reason: String,
    },
    /// Tell the coordinator these workers of a slice are gone (its preemption notice).
    ReportLost {
        /// The job.
        job_id: String,
        /// The slice.
        slice: u32,
        /// The coordinator's worker ids.
        worker_ids: Vec<String>,
        /// Why, naming the pod.
        reason: String,
    },
    /// The job can never run on this cluster's slices.
    FailJob {
        /// The job.
        job_id: String,
        /// Why, with the fix.
        reason: String,
    },
    /// Submit a declared job ([`crate::declare`]).
    SubmitJob {
        /// The declaration it comes from.
        source: String,
        /// What it declares.
        declaration: crate::declare::Declaration,
    },
    /// Stop a job (its declaration was deleted).
    StopJob {
        /// The job.
        job_id: String,
        /// Why.
        reason: String,
    },
    /// A declaration that declares nothing (told once in the log).
    RefuseDeclaration {
        /// The declaration.
        source: String,
        /// What is wrong, with the fix.
        reason: String,
    },
}

/// The actions that bring the observed pods and secrets to what `desired` asks for.
///
/// Order: secrets before the pods that mount them, deletions of replaced pods before their
/// replacements, reports last (so the report names the replacement's attempt in the log).
pub fn decide(
    template: &WorkerTemplate,
    desired: &[DesiredJob],
    pods: &[ObservedPod],
    secrets: &[ObservedSecret],
) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut reports = Vec::new();
    let running: BTreeMap<&str, &DesiredJob> =
        desired.iter().filter(|j| j.running).map(|j| (j.id.as_str(), j)).collect();

    for secret in secrets {
        if !secret.job_id.as_deref().is_some_and(|j| running.contains_key(j)) {
            actions.push(Action::DeleteSecret { name: secret.name.clone() });
        }
    }
    for pod in pods {
        let ours = pod.job_id.as_deref().is_some_and(|j| running.contains_key(j)) && pod.position.is_some();
        if !ours && pod.state != PodState::Deleting {
            let reason = match &pod.job_id {
                Some(job) => format!("job {job} is over or unknown to the coordinator"),
                None => "it names no job".into(),
            };
            actions.push(Action::DeletePod { name: pod.name.clone(), reason });
        }
    }

    for job in running.values() {
        if job.devices_per_slice != template.slice.chips() {
            actions.push(Action::FailJob {
                job_id: job.id.clone(),
                reason: format!(
                    "a slice of the job uses {} devices (mesh.ici) but this cluster's slices ({} {}) have {} \
                     chips; set mesh.ici to use {} devices, or install the chart with another tpu.topology",
                    job.devices_per_slice,
                    template.slice.accelerator,
                    template.slice.topology,
                    template.slice.chips(),
                    template.slice.chips()
                ),
            });
            continue;
        }
        let secret = token_secret_name(&job.id);
        if !secrets.iter().any(|s| s.name == secret) {
            actions.push(Action::CreateSecret(Box::new(template.token_secret(job))));
        }
        let job_pods: Vec<&ObservedPod> = pods
            .iter()
            .filter(|p| p.job_id.as_deref() == Some(job.id.as_str()) && p.position.is_some())
            .collect();
        for slice in 0..job.slices {
            decide_slice(template, job, slice, &job_pods, &mut actions, &mut reports);
        }
    }
    actions.extend(reports);
    actions
}

fn decide_slice(
    template: &WorkerTemplate,
    job: &DesiredJob,
    slice: u32,
    job_pods: &[&ObservedPod],
    actions: &mut Vec<Action>,
    reports: &mut Vec<Action>,
) {
    let hosts = template.slice.hosts();
    let pods: BTreeMap<(u32, u32), &ObservedPod> = job_pods
        .iter()
        .filter_map(|p| {
            let (s, a, h) = p.position?;
            (s == slice).then_some(((a, h), *p))
        })
        .collect();
    let registered: BTreeMap<(u32, u32), Vec<&Registration>> =
        job.registrations.iter().fold(BTreeMap::new(), |mut by, r| {
            if let Some((s, a, h)) = parse_pod_name(&job.id, &r.instance_id)
                && s == slice
            {
                by.entry((a, h)).or_insert_with(Vec::new).push(r);
            }
            by
        });
    let attempt = pods.keys().chain(registered.keys()).map(|&(a, _)| a).max();

    let mut lost_reason = None;
    if let Some(a) = attempt {
        for h in 0..hosts {
            let gone = match pods.get(&(a, h)) {
                Some(pod) if !pod.state.is_live() => Some(pod.describe()),
                Some(_) => None,
                None if registered.contains_key(&(a, h)) => {
                    Some(format!("pod {} is gone", slice::pod_name(&job.id, slice, a, h)))
                }
                None => None,
            };
            if let Some(reason) = gone {
                lost_reason.get_or_insert(reason);
            }
        }
    }
    let current = match (attempt, &lost_reason) {
        (None, _) => 0,
        (Some(a), Some(_)) => a + 1,
        (Some(a), None) => a,
    };

    // Pods of older attempts go: the slice is replaced as a whole.
    let mut not_live: BTreeSet<String> = BTreeSet::new();
    for (&(a, _), pod) in &pods {
        if !pod.state.is_live() || a < current {
            not_live.insert(pod.name.clone());
        }
        if a < current && pod.state != PodState::Deleting {
            let reason = match &lost_reason {
                Some(lost) => format!("slice {slice} is replaced by attempt {current}: {lost}"),
                None => format!("attempt {current} of slice {slice} replaced it"),
            };
            actions.push(Action::DeletePod { name: pod.name.clone(), reason });
        }
    }
    for h in 0..hosts {
        if !pods.contains_key(&(current, h)) {
            actions.push(Action::CreatePod(Box::new(template.pod(job, slice, current, h))));
        }
    }

    // Active registrations whose pod is not live: the coordinator's preemption notice.
    let mut lost = Vec::new();
    let mut reason = lost_reason;
    for (&(a, h), registrations) in &registered {
        let name = slice::pod_name(&job.id, slice, a, h);
        let live = pods.get(&(a, h)).is_some_and(|p| p.state.is_live()) && !not_live.contains(&name);
        for r in registrations.iter().filter(|r| !r.removed && !live) {
            lost.push(r.worker_id.clone());
            reason.get_or_insert_with(|| match pods.get(&(a, h)) {
                Some(pod) => pod.describe(),
                None => format!("pod {name} is gone"),
            });
        }
    }
    if !lost.is_empty() {
        reports.push(Action::ReportLost {
            job_id: job.id.clone(),
            slice,
            worker_ids: lost,
            reason: reason.unwrap_or_default(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slice::{TpuSlice, pod_name};
    use k8s_openapi::api::core::v1::PodAffinityTerm;

    fn template(topology: &str) -> WorkerTemplate {
        WorkerTemplate {
            namespace: "train".into(),
            instance: "podctl".into(),
            image: "example.com/podctl:1".into(),
            coordinator: "podctl.train.svc:7001".into(),
            slice: TpuSlice::new("tpu-v6e-slice", topology, None).unwrap(),
            spot: true,
            grace_period_seconds: 30,
            host_network: true,
            service_account: Some("podctl-worker".into()),
            subdomain: "podctl-workers".into(),
            tls_secret: Some("podctl-worker-tls".into()),
        }
    }

    fn job(id: &str, slices: u32, devices: u32) -> DesiredJob {
        DesiredJob {
            id: id.into(),
            running: true,
            slices,
            devices_per_slice: devices,
            worker_token: "wt".into(),
            registrations: vec![],
        }
    }

    fn observed(name: &str, job_id: &str, position: (u32, u32, u32), state: PodState) -> ObservedPod {
        ObservedPod { name: name.into(), job_id: Some(job_id.into()), position: Some(position), state }
    }

    /// The pods and secrets the actions create, as the API server would then list them.
    fn apply(actions: &[Action], pods: &mut Vec<ObservedPod>, secrets: &mut Vec<ObservedSecret>) {
        for action in actions {
            match action {
                Action::CreatePod(pod) => pods.push(ObservedPod::from_pod(pod).unwrap()),
                Action::DeletePod { name, .. } => {
                    pods.iter_mut().filter(|p| &p.name == name).for_each(|p| p.state = PodState::Deleting)
                }
                Action::CreateSecret(s) => secrets.push(ObservedSecret::from_secret(s).unwrap()),
                Action::DeleteSecret { name } => secrets.retain(|s| &s.name != name),
                Action::ReportLost { .. }
                | Action::FailJob { .. }
                | Action::SubmitJob { .. }
                | Action::StopJob { .. }
                | Action::RefuseDeclaration { .. } => {}
            }
        }
    }

    fn created(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::CreatePod(p) => p.metadata.name.clone(),
                _ => None,
            })
            .collect()
    }

    fn registration(worker_id: &str, instance_id: &str) -> Registration {
        Registration { worker_id: worker_id.into(), instance_id: instance_id.into(), removed: false }
    }

    #[test]
    fn a_two_slice_v6e_8_spot_job_gets_exactly_its_pods() {
        let t = template("2x4");
        let actions = decide(&t, &[job("llm-1", 2, 8)], &[], &[]);
        assert_eq!(actions.len(), 3, "{actions:#?}");
        let Action::CreateSecret(secret) = &actions[0] else { panic!("{actions:#?}") };
        assert_eq!(secret.metadata.name.as_deref(), Some("llm-1-token"));
        assert_eq!(secret.string_data.as_ref().unwrap()["token"], "wt");
        assert_eq!(created(&actions), ["llm-1-s0-a0-h0", "llm-1-s1-a0-h0"]);

        let Action::CreatePod(pod) = &actions[2] else { panic!() };
        let json = serde_json::to_value(pod).unwrap();
        let expected = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "llm-1-s1-a0-h0",
                "namespace": "train",
                "labels": {
                    "app.kubernetes.io/component": "worker",
                    "app.kubernetes.io/instance": "podctl",
                    "app.kubernetes.io/managed-by": "podctl-coordinator",
                    "app.kubernetes.io/name": "podctl",
                    "podctl.dev/attempt": "0",
                    "podctl.dev/host": "0",
                    "podctl.dev/job": "llm-1",
                    "podctl.dev/slice": "1"
                },
                "annotations": { "podctl.dev/job-id": "llm-1" }
            },
            "spec": {
                "restartPolicy": "Never",
                "hostname": "llm-1-s1-a0-h0",
                "subdomain": "podctl-workers",
                "hostNetwork": true,
                "dnsPolicy": "ClusterFirstWithHostNet",
                "serviceAccountName": "podctl-worker",
                "terminationGracePeriodSeconds": 30,
                "nodeSelector": {
                    "cloud.google.com/gke-spot": "true",
                    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                    "cloud.google.com/gke-tpu-topology": "2x4"
                },
                "tolerations": [
                    { "key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule" },
                    { "key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule" }
                ],
                "containers": [{
                    "name": "worker",
                    "image": "example.com/podctl:1",
                    "command": ["podctl"],
                    "args": [
                        "worker", "--coordinator", "podctl.train.svc:7001", "--job", "llm-1",
                        "--token-file", "/var/run/podctl/token/token", "--grace-period-seconds", "30",
                        "--tls-dir", "/var/run/podctl/tls"
                    ],
                    "env": [
                        { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                        { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                        { "name": "PODCTL_BIND", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "PODCTL_INSTANCE_ID", "value": "llm-1-s1-a0-h0" },
                        { "name": "PODCTL_SLICE", "value": "1" },
                        { "name": "TPU_WORKER_ID", "value": "0" },
                        { "name": "TPU_WORKER_HOSTNAMES", "value": "llm-1-s1-a0-h0.podctl-workers" }
                    ],
                    "resources": {
                        "limits": { "google.com/tpu": "8" },
                        "requests": { "google.com/tpu": "8" }
                    },
                    "volumeMounts": [
                        { "name": "token", "mountPath": "/var/run/podctl/token", "readOnly": true },
                        { "name": "tls", "mountPath": "/var/run/podctl/tls", "readOnly": true }
                    ],
                    "securityContext": { "allowPrivilegeEscalation": false }
                }],
                "volumes": [
                    { "name": "token", "secret": { "secretName": "llm-1-token", "defaultMode": 256 } },
                    { "name": "tls", "secret": {
                        "secretName": "podctl-worker-tls",
                        "defaultMode": 256,
                        "items": [
                            { "key": "ca.pem", "path": "ca.pem" },
                            { "key": "client.pem", "path": "client.pem" },
                            { "key": "client.key", "path": "client.key" }
                        ]
                    } }
                ]
            }
        });
        // A single-host slice is one VM: no node-pool affinity, no slice-group label (the
        // scheduler places a v6e-8 pod on any free ct6e-standard-8t node, as before).
        assert_eq!(json, expected, "{}", serde_json::to_string_pretty(&json).unwrap());
    }

    #[test]
    fn multi_host_slices_name_every_host_of_their_attempt() {
        let t = template("4x4");
        let actions = decide(&t, &[job("big-2", 1, 16)], &[], &[]);
        assert_eq!(
            created(&actions),
            ["big-2-s0-a0-h0", "big-2-s0-a0-h1", "big-2-s0-a0-h2", "big-2-s0-a0-h3"]
        );
        let Action::CreatePod(pod) = &actions[3] else { panic!() };
        let container = &pod.spec.as_ref().unwrap().containers[0];
        let env: BTreeMap<_, _> =
            container.env.as_ref().unwrap().iter().map(|e| (e.name.as_str(), e.value.clone())).collect();
        assert_eq!(env["TPU_WORKER_ID"].as_deref(), Some("2"));
        assert_eq!(
            env["TPU_WORKER_HOSTNAMES"].as_deref(),
            Some(
                "big-2-s0-a0-h0.podctl-workers,big-2-s0-a0-h1.podctl-workers,\
                 big-2-s0-a0-h2.podctl-workers,big-2-s0-a0-h3.podctl-workers"
            )
        );
        assert_eq!(container.resources.as_ref().unwrap().limits.as_ref().unwrap()["google.com/tpu"].0, "4");
    }

    /// Whether a label selector of an affinity term selects a pod with these labels (the
    /// operators the controller uses).
    fn selects(term: &PodAffinityTerm, labels: &BTreeMap<String, String>) -> bool {
        let selector = term.label_selector.as_ref().unwrap();
        selector.match_expressions.as_ref().unwrap().iter().all(|r| {
            let value = labels.get(&r.key);
            let values = r.values.clone().unwrap_or_default();
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => !value.is_some_and(|v| values.contains(v)),
                "Exists" => value.is_some(),
                other => panic!("operator {other}"),
            }
        })
    }

    /// The required pod affinity and anti-affinity terms of a pod.
    fn placement(pod: &Pod) -> (PodAffinityTerm, PodAffinityTerm) {
        let affinity = pod.spec.as_ref().unwrap().affinity.clone().expect("a multi-host pod has an affinity");
        assert!(affinity.node_affinity.is_none());
        let together =
            affinity.pod_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap();
        let apart =
            affinity.pod_anti_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap();
        assert_eq!((together.len(), apart.len()), (1, 1), "one term each");
        (together[0].clone(), apart[0].clone())
    }

    fn created_pods(actions: &[Action]) -> Vec<Pod> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::CreatePod(p) => Some((**p).clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_two_slice_4x4_spot_job_keeps_each_slice_in_one_node_pool_and_the_slices_apart() {
        let t = template("4x4");
        let actions = decide(&t, &[job("big-2", 2, 16)], &[], &[]);
        let pods = created_pods(&actions);
        assert_eq!(pods.len(), 8, "two slices of four hosts: {actions:#?}");
        let labels = |p: &Pod| p.metadata.labels.clone().unwrap();
        for pod in &pods {
            let spec = pod.spec.as_ref().unwrap();
            // Spot, as the template says, and the multi-host slice type.
            let selector = spec.node_selector.as_ref().unwrap();
            assert_eq!(selector["cloud.google.com/gke-spot"], "true");
            assert_eq!(selector["cloud.google.com/gke-tpu-topology"], "4x4");
            let (together, apart) = placement(pod);
            assert_eq!(together.topology_key, "cloud.google.com/gke-nodepool");
            assert_eq!(apart.topology_key, "cloud.google.com/gke-nodepool");
            // Together: its own slice's hosts, in its own namespace; apart: everyone else's,
            // in every namespace.
            assert!(together.namespace_selector.is_none() && together.namespaces.is_none());
            assert_eq!(apart.namespace_selector, Some(Default::default()));
            for other in &pods {
                let same_slice = labels(other)["podctl.dev/slice"] == labels(pod)["podctl.dev/slice"];
                assert_eq!(selects(&together, &labels(other)), same_slice);
                assert_eq!(selects(&apart, &labels(other)), !same_slice);
            }
            // Pods that are not a slice's (no slice-group label) are neither pulled nor pushed.
            let unrelated = BTreeMap::from([("app".to_string(), "web".to_string())]);
            assert!(!selects(&together, &unrelated) && !selects(&apart, &unrelated));
        }
        assert_eq!(labels(&pods[5])["podctl.dev/slice-group"], "big-2-s1-a0");

        // Host 2 of slice 1 is preempted: the replacement attempt keeps off the pool its
        // predecessor is leaving (whose pods are still there, terminating) and off slice 0's.
        let secrets = vec![ObservedSecret { name: "big-2-token".into(), job_id: Some("big-2".into()) }];
        let mut observed_pods: Vec<ObservedPod> =
            pods.iter().map(|p| ObservedPod::from_pod(p).unwrap()).collect();
        observed_pods.iter_mut().for_each(|p| p.state = PodState::Running);
        observed_pods[6].state = PodState::Deleting;
        let actions = decide(&t, &[job("big-2", 2, 16)], &observed_pods, &secrets);
        let replacements = created_pods(&actions);
        assert_eq!(replacements.len(), 4, "{actions:#?}");
        for pod in &replacements {
            assert_eq!(labels(pod)["podctl.dev/slice-group"], "big-2-s1-a1");
            let (together, apart) = placement(pod);
            for old in &pods {
                assert!(!selects(&together, &labels(old)) && selects(&apart, &labels(old)));
            }
            for new in &replacements {
                assert!(selects(&together, &labels(new)) && !selects(&apart, &labels(new)));
            }
        }
    }

    #[test]
    fn deciding_again_over_what_was_created_changes_nothing() {
        // This is the failover case: a new leader decides over what the old one created.
        let t = template("2x4");
        let jobs = [job("llm-1", 2, 8)];
        let (mut pods, mut secrets) = (vec![], vec![]);
        let first = decide(&t, &jobs, &pods, &secrets);
        // The old leader died after its first pod.
        apply(&first[..2], &mut pods, &mut secrets);
        let second = decide(&t, &jobs, &pods, &secrets);
        assert_eq!(created(&second), ["llm-1-s1-a0-h0"], "{second:#?}");
        apply(&second, &mut pods, &mut secrets);
        assert_eq!(decide(&t, &jobs, &pods, &secrets), vec![]);
        for pod in &mut pods {
            pod.state = PodState::Running;
        }
        assert_eq!(decide(&t, &jobs, &pods, &secrets), vec![]);
    }

    #[test]
    fn a_deleted_pod_is_reported_and_its_slice_replaced() {
        let t = template("2x4");
        let mut j = job("llm-1", 2, 8);
        j.registrations =
            vec![registration("llm-1.w1", "llm-1-s0-a0-h0"), registration("llm-1.w2", "llm-1-s1-a0-h0")];
        let secrets = vec![ObservedSecret { name: "llm-1-token".into(), job_id: Some("llm-1".into()) }];
        let mut pods = vec![
            observed("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Running),
            observed("llm-1-s1-a0-h0", "llm-1", (1, 0, 0), PodState::Deleting),
        ];
        let actions = decide(&t, std::slice::from_ref(&j), &pods, &secrets);
        assert_eq!(created(&actions), ["llm-1-s1-a1-h0"]);
        assert_eq!(actions.len(), 2, "{actions:#?}");
        let Action::ReportLost { job_id, slice, worker_ids, reason } = &actions[1] else {
            panic!("{actions:#?}")
        };
        assert_eq!((job_id.as_str(), *slice, worker_ids.clone()), ("llm-1", 1, vec!["llm-1.w2".to_string()]));
        assert!(reason.contains("llm-1-s1-a0-h0 is being deleted"), "{reason}");

        // The old pod is gone, the replacement is pending: the registration is still reported
        // (the coordinator has not removed it yet) and nothing is created again.
        pods.pop();
        pods.push(observed("llm-1-s1-a1-h0", "llm-1", (1, 1, 0), PodState::Pending));
        let actions = decide(&t, std::slice::from_ref(&j), &pods, &secrets);
        assert_eq!(actions.len(), 1, "{actions:#?}");
        assert!(
            matches!(&actions[0], Action::ReportLost { reason, .. } if reason.contains("llm-1-s1-a0-h0 is gone"))
        );

        // Once the coordinator removed the worker, all is quiet.
        j.registrations[1].removed = true;
        assert_eq!(decide(&t, std::slice::from_ref(&j), &pods, &secrets), vec![]);
    }

    #[test]
    fn an_evicted_pod_is_replaced_and_deleted() {
        let t = template("2x4");
        let mut j = job("llm-1", 1, 8);
        j.registrations = vec![registration("llm-1.w1", "llm-1-s0-a3-h0")];
        let secrets = vec![ObservedSecret { name: "llm-1-token".into(), job_id: Some("llm-1".into()) }];
        let evicted = PodState::Ended {
            phase: "Failed".into(),
            reason: "Evicted: The node was low on resource: memory.".into(),
        };
        let pods = vec![observed("llm-1-s0-a3-h0", "llm-1", (0, 3, 0), evicted)];
        let actions = decide(&t, &[j], &pods, &secrets);
        assert_eq!(
            actions[0],
            Action::DeletePod {
                name: "llm-1-s0-a3-h0".into(),
                reason:
                    "slice 0 is replaced by attempt 4: pod llm-1-s0-a3-h0 is Failed (Evicted: The node was \
                         low on resource: memory.)"
                        .into()
            }
        );
        assert_eq!(created(&actions), ["llm-1-s0-a4-h0"]);
        assert!(matches!(&actions[2], Action::ReportLost { worker_ids, .. } if worker_ids == &["llm-1.w1"]));
    }

    #[test]
    fn an_attempt_is_never_reused_after_its_pod_vanished() {
        // The pod of attempt 2 registered and then disappeared without a trace in the API
        // server: the replacement must not take its name (its instance id would map to the
        // old worker).
        let t = template("2x4");
        let mut j = job("llm-1", 1, 8);
        j.registrations = vec![Registration {
            worker_id: "llm-1.w5".into(),
            instance_id: "llm-1-s0-a2-h0".into(),
            removed: true,
        }];
        let secrets = vec![ObservedSecret { name: "llm-1-token".into(), job_id: Some("llm-1".into()) }];
        let actions = decide(&t, &[j], &[], &secrets);
        assert_eq!(created(&actions), ["llm-1-s0-a3-h0"]);
        assert_eq!(actions.len(), 1, "a removed worker is not reported again: {actions:#?}");
    }

    #[test]
    fn losing_one_host_replaces_the_whole_multi_host_slice() {
        let t = template("4x4");
        let mut j = job("big-2", 1, 16);
        j.registrations =
            (0..4).map(|h| registration(&format!("big-2.w{h}"), &pod_name("big-2", 0, 0, h))).collect();
        let secrets = vec![ObservedSecret { name: "big-2-token".into(), job_id: Some("big-2".into()) }];
        let mut pods: Vec<ObservedPod> = (0..4)
            .map(|h| observed(&pod_name("big-2", 0, 0, h), "big-2", (0, 0, h), PodState::Running))
            .collect();
        pods[2].state = PodState::Deleting;
        let actions = decide(&t, &[j], &pods, &secrets);
        let deleted: Vec<&str> = actions
            .iter()
            .filter_map(|a| match a {
                Action::DeletePod { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deleted, ["big-2-s0-a0-h0", "big-2-s0-a0-h1", "big-2-s0-a0-h3"]);
        assert_eq!(created(&actions).len(), 4);
        assert!(created(&actions).iter().all(|n| n.contains("-a1-")));
        let Some(Action::ReportLost { worker_ids, .. }) = actions.last() else { panic!("{actions:#?}") };
        assert_eq!(worker_ids, &["big-2.w0", "big-2.w1", "big-2.w2", "big-2.w3"]);
    }

    #[test]
    fn a_stopped_job_loses_its_pods_and_secret() {
        let t = template("2x4");
        let mut j = job("llm-1", 2, 8);
        j.running = false;
        let pods = vec![
            observed("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Running),
            observed("llm-1-s1-a0-h0", "llm-1", (1, 0, 0), PodState::Deleting),
            observed("old-3-s0-a0-h0", "old-3", (0, 0, 0), PodState::Pending),
        ];
        let secrets = vec![ObservedSecret { name: "llm-1-token".into(), job_id: Some("llm-1".into()) }];
        let actions = decide(&t, &[j], &pods, &secrets);
        assert_eq!(actions.len(), 3, "{actions:#?}");
        assert_eq!(actions[0], Action::DeleteSecret { name: "llm-1-token".into() });
        assert!(matches!(&actions[1], Action::DeletePod { name, .. } if name == "llm-1-s0-a0-h0"));
        assert!(
            matches!(&actions[2], Action::DeletePod { name, reason } if name == "old-3-s0-a0-h0" && reason.contains("unknown"))
        );
    }

    #[test]
    fn a_job_whose_slice_does_not_fit_fails_with_the_fix() {
        let actions = decide(&template("2x4"), &[job("small-1", 2, 4)], &[], &[]);
        let [Action::FailJob { job_id, reason }] = &actions[..] else { panic!("{actions:#?}") };
        assert_eq!(job_id, "small-1");
        assert!(
            reason.contains("uses 4 devices") && reason.contains("set mesh.ici to use 8 devices"),
            "{reason}"
        );
    }

    #[test]
    fn workers_started_elsewhere_are_left_to_the_lease() {
        // A registration whose instance id is not one of this job's pod names is not ours.
        let t = template("2x4");
        let mut j = job("llm-1", 1, 8);
        j.registrations =
            vec![registration("llm-1.w1", "3f1c9a7e-random"), registration("llm-1.w2", "llm-2-s0-a0-h0")];
        let secrets = vec![ObservedSecret { name: "llm-1-token".into(), job_id: Some("llm-1".into()) }];
        let pods = vec![observed("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Running)];
        assert_eq!(decide(&t, &[j], &pods, &secrets), vec![]);
    }
}
