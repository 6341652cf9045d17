//! The controller's decision: a pure function of (desired jobs, what the API server holds, now).
//!
//! [`decide`] calls nothing and reads no clock (the loop passes `now`): the reconcile loop lists
//! the API server, asks the coordinator what it wants, calls this and carries out the
//! [`Action`]s. The same inputs give the same actions on any node, which is what makes a
//! failover safe: names are deterministic, so a new leader that decides again creates nothing
//! twice (a create the old leader already made answers `AlreadyExists`), and a loss is reported
//! again until the coordinator has removed the worker (reporting is idempotent there).
//!
//! **The job object** (`slice`'s module documentation): a running job first gets one, owned by
//! the release's workers Service, and the coordinator records its uid; its pods and token Secret
//! are created only then, owned by it. A job whose recorded job object is gone (a user deleted
//! it, or `helm uninstall` deleted the Service and the garbage collector the rest) is stopped.
//!
//! The rules, per slice `s` of a job that runs:
//! - Its **attempt** is the highest attempt among its pods and the registrations whose instance
//!   id is one of its pod names (registrations outlive pods, so an attempt is never reused).
//! - A host of that attempt is **lost** when its pod is being deleted, has ended (evicted,
//!   failed, succeeded, unknown), is gone while the coordinator has a registration from it, or
//!   runs a worker whose every registration has been silent for longer than its lease (a hung
//!   worker holds its TPU VM until its pod goes).
//! - A host whose worker exited on its own with a non-zero code (not evicted, not preempted) has
//!   **crashed**. The slice's crashes are counted by exit code across attempts (each attempt's
//!   pods carry the history before them, [`slice::CRASHES_ANNOTATION`]); the `crash_limit`-th
//!   crash with the same code fails the job, naming the code and the pod. Before that the slice
//!   is replaced after a backoff that doubles with every crash ([`Policy::backoff`]), counted
//!   from the container's end; the crashed pod stays until then (it is the record).
//! - With a lost host, the slice is replaced: every host of attempt `a + 1` is created and every
//!   remaining pod of older attempts deleted. Otherwise missing hosts of the attempt are created
//!   (a creation a failed-over leader had not finished).
//! - Every registration of the job that is still active while its pod is not live (or is being
//!   deleted now) is reported lost, with the pod's reason: that is the coordinator's
//!   preemption notice.
//!
//! Pods and job objects of jobs that ended or that the coordinator does not know are deleted
//! (the garbage collector takes the Secrets with the job objects). A job whose slice has another
//! number of devices than the cluster's slice type (the chart changed it) fails with the fix.

use crate::slice::{self, ObjectRef, WorkerTemplate, parse_pod_name};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A worker registration the coordinator holds for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The coordinator's worker id.
    pub worker_id: String,
    /// The id the worker registered with; pods started by the controller use their pod name.
    pub instance_id: String,
    /// Removed from the job (the coordinator already knows it is gone).
    pub removed: bool,
    /// The leader has heard nothing from it for longer than a lease.
    pub silent: bool,
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
    /// The uid of its job object, once the coordinator recorded it.
    pub object_uid: Option<String>,
    /// The Kueue LocalQueue its pods wait in (`kubernetes.queue`).
    pub queue: Option<String>,
    /// The PriorityClass of its pods (`kubernetes.priority_class`).
    pub priority_class: Option<String>,
}

/// How a crashed worker ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Crash {
    /// Its container's exit code.
    pub exit_code: i32,
    /// When it ended (Unix seconds); none if the kubelet did not say.
    pub finished_unix: Option<f64>,
}

/// Where an observed pod is in its life.
#[derive(Debug, Clone, PartialEq)]
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
        /// Set when the worker itself failed (a non-zero exit nobody caused from outside).
        crash: Option<Crash>,
    },
}

impl PodState {
    /// Still doing its work.
    pub fn is_live(&self) -> bool {
        matches!(self, Self::Pending | Self::Running)
    }
}

/// Pod reasons that say the pod was ended from outside (the kubelet's eviction manager, a node
/// going away or shutting down), whatever its container's exit code.
const DISRUPTIONS: [&str; 6] =
    ["Evicted", "NodeLost", "Shutdown", "Terminated", "NodeShutdown", "Preempting"];

/// A worker pod as listed from the API server.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedPod {
    /// Its name.
    pub name: String,
    /// The job (annotation), when the pod carries it.
    pub job_id: Option<String>,
    /// `(slice, attempt, host)` from its labels, when it carries them.
    pub position: Option<(u32, u32, u32)>,
    /// Where it is.
    pub state: PodState,
    /// Its slice's crashes before its attempt, by exit code.
    pub crashes: BTreeMap<i32, u32>,
}

impl ObservedPod {
    /// Reads what the decision needs from a pod.
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let name = pod.metadata.name.clone()?;
        let annotations = pod.metadata.annotations.as_ref();
        let job_id = annotations.and_then(|a| a.get(slice::JOB_ID_ANNOTATION)).cloned();
        let crashes = annotations
            .and_then(|a| a.get(slice::CRASHES_ANNOTATION))
            .and_then(|text| serde_json::from_str::<BTreeMap<String, u32>>(text).ok())
            .map(|history| {
                history.into_iter().filter_map(|(code, n)| Some((code.parse().ok()?, n))).collect()
            })
            .unwrap_or_default();
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
                    let pod_reason = status.and_then(|s| s.reason.clone());
                    let terminated = status
                        .and_then(|s| s.container_statuses.as_ref())
                        .and_then(|c| c.first())
                        .and_then(|c| c.state.as_ref())
                        .and_then(|s| s.terminated.as_ref());
                    let disrupted = pod_reason.as_deref().is_some_and(|r| DISRUPTIONS.contains(&r))
                        || status.and_then(|s| s.conditions.as_ref()).is_some_and(|conditions| {
                            conditions.iter().any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
                        });
                    let crash = terminated
                        .filter(|t| phase == "Failed" && !disrupted && t.exit_code != 0)
                        .map(|t| Crash {
                            exit_code: t.exit_code,
                            finished_unix: t
                                .finished_at
                                .as_ref()
                                .map(|at| at.0.timestamp_millis() as f64 / 1e3),
                        });
                    let container_reason = terminated.map(|t| match &t.reason {
                        Some(reason) => format!("exit code {}: {reason}", t.exit_code),
                        None => format!("exit code {}", t.exit_code),
                    });
                    let reason = [pod_reason, status.and_then(|s| s.message.clone()), container_reason]
                        .into_iter()
                        .flatten()
                        .collect::<Vec<_>>()
                        .join(": ");
                    PodState::Ended { phase, reason, crash }
                }
            }
        };
        Some(Self { name, job_id, position, state, crashes })
    }

    fn describe(&self) -> String {
        match &self.state {
            PodState::Pending | PodState::Running => format!("pod {} is replaced with its slice", self.name),
            PodState::Deleting => {
                format!("pod {} is being deleted (preemption, eviction or a user)", self.name)
            }
            PodState::Ended { phase, reason, .. } if reason.is_empty() => {
                format!("pod {} is {phase}", self.name)
            }
            PodState::Ended { phase, reason, .. } => format!("pod {} is {phase} ({reason})", self.name),
        }
    }

    fn crash(&self) -> Option<&Crash> {
        match &self.state {
            PodState::Ended { crash, .. } => crash.as_ref(),
            _ => None,
        }
    }
}

/// A job object as listed from the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedJobObject {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
    /// The job (annotation), when it carries it.
    pub job_id: Option<String>,
}

impl ObservedJobObject {
    /// Reads what the decision needs from a ConfigMap.
    pub fn from_config_map(object: &ConfigMap) -> Option<Self> {
        Some(Self {
            name: object.metadata.name.clone()?,
            uid: object.metadata.uid.clone()?,
            job_id: object
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(slice::JOB_ID_ANNOTATION))
                .cloned(),
        })
    }
}

/// What the controller found in the API server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// The release's workers Service, owner of every job object; none when it is missing (the
    /// release is being uninstalled): then no job object is created.
    pub owner: Option<ObjectRef>,
    /// The job objects of the release.
    pub objects: Vec<ObservedJobObject>,
    /// The worker pods of the release.
    pub pods: Vec<ObservedPod>,
}

/// The restart budget: how crashes are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The crashes of one slice with the same exit code that fail the job.
    pub crash_limit: u32,
    /// The wait before replacing a slice after its first crash; it doubles with every crash of
    /// the slice, up to five minutes (the kubelet's CrashLoopBackOff, 10 s doubling to 5 min).
    pub crash_backoff: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self { crash_limit: 3, crash_backoff: Duration::from_secs(10) }
    }
}

impl Policy {
    /// The wait before the next attempt of a slice that has crashed `crashes` times.
    pub fn backoff(&self, crashes: u32) -> Duration {
        let doubled = self.crash_backoff.saturating_mul(1 << crashes.saturating_sub(1).min(16));
        doubled.min(Duration::from_secs(300).max(self.crash_backoff))
    }
}

/// What the controller should do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create a job's job object; its uid is then recorded with the coordinator.
    CreateJobObject {
        /// The job.
        job_id: String,
        /// The object.
        object: Box<ConfigMap>,
    },
    /// Record with the coordinator the job object a leader before this one created.
    RecordJobObject {
        /// The job.
        job_id: String,
        /// The object's uid.
        uid: String,
    },
    /// Delete a job object (the garbage collector then deletes what it owns).
    DeleteJobObject {
        /// Its name.
        name: String,
        /// Why, for the log.
        reason: String,
    },
    /// Create a job's token Secret (before its pods; `AlreadyExists` is fine).
    CreateSecret(Box<Secret>),
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
    /// The job can never run on this cluster's slices, or crashed its restart budget away.
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
    /// Stop a job (its declaration or its job object was deleted).
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

/// The actions that bring what the API server holds to what `desired` asks for, at `now_unix`.
///
/// Order: job objects first, each job's Secret before the pods that mount it, deletions of
/// replaced pods before their replacements, reports last (so the report names the
/// replacement's attempt in the log).
pub fn decide(
    template: &WorkerTemplate,
    policy: &Policy,
    now_unix: f64,
    desired: &[DesiredJob],
    observed: &Observed,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut reports = Vec::new();
    let running: BTreeMap<&str, &DesiredJob> =
        desired.iter().filter(|j| j.running).map(|j| (j.id.as_str(), j)).collect();

    for object in &observed.objects {
        let job = object.job_id.as_deref().and_then(|j| running.get(j));
        let current = job.is_some_and(|j| j.object_uid.as_ref().is_none_or(|uid| uid == &object.uid));
        if !current {
            let reason = match &object.job_id {
                Some(job) => {
                    format!("job {job} is over, unknown to the coordinator, or has another job object")
                }
                None => "it names no job".into(),
            };
            actions.push(Action::DeleteJobObject { name: object.name.clone(), reason });
        }
    }
    for pod in &observed.pods {
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
        if let Some(reason) = template.device_refusal(job.devices_per_slice) {
            actions.push(Action::FailJob { job_id: job.id.clone(), reason });
            continue;
        }
        let found =
            |matches: &dyn Fn(&ObservedJobObject) -> bool| observed.objects.iter().find(|o| matches(o));
        let owner = match &job.object_uid {
            None => {
                match found(&|o| o.job_id.as_deref() == Some(job.id.as_str())) {
                    Some(object) => actions
                        .push(Action::RecordJobObject { job_id: job.id.clone(), uid: object.uid.clone() }),
                    None => {
                        if let Some(owner) = &observed.owner {
                            let object = Box::new(template.job_object(job, owner));
                            actions.push(Action::CreateJobObject { job_id: job.id.clone(), object });
                        }
                    }
                }
                continue;
            }
            Some(uid) => match found(&|o| &o.uid == uid) {
                Some(object) => ObjectRef { name: object.name.clone(), uid: uid.clone() },
                None => {
                    let reason = format!(
                        "its job object, configmap {}, was deleted (kubectl delete, or helm uninstall); \
                         Kubernetes deleted its pods and token Secret with it",
                        slice::job_object_name(&job.id)
                    );
                    actions.push(Action::StopJob { job_id: job.id.clone(), reason });
                    continue;
                }
            },
        };
        let job_pods: Vec<&ObservedPod> = observed
            .pods
            .iter()
            .filter(|p| p.job_id.as_deref() == Some(job.id.as_str()) && p.position.is_some())
            .collect();
        let mut job_actions = Vec::new();
        for slice in 0..job.slices {
            let context = SliceContext { template, policy, now_unix, job, owner: &owner, slice };
            if let Err(failure) = context.decide(&job_pods, &mut job_actions, &mut reports) {
                job_actions = vec![failure];
                break;
            }
        }
        // The pods mount the token Secret: make sure it is there first.
        if job_actions.iter().any(|a| matches!(a, Action::CreatePod(_))) {
            actions.push(Action::CreateSecret(Box::new(template.token_secret(job, &owner))));
        }
        actions.extend(job_actions);
    }
    actions.extend(reports);
    actions
}

/// One slice of one job, and what it is decided with.
struct SliceContext<'a> {
    template: &'a WorkerTemplate,
    policy: &'a Policy,
    now_unix: f64,
    job: &'a DesiredJob,
    owner: &'a ObjectRef,
    slice: u32,
}

impl SliceContext<'_> {
    /// Pushes the slice's actions; `Err` carries the job's failure when the slice crashed its
    /// budget away.
    fn decide(
        &self,
        job_pods: &[&ObservedPod],
        actions: &mut Vec<Action>,
        reports: &mut Vec<Action>,
    ) -> Result<(), Action> {
        let (template, job, slice) = (self.template, self.job, self.slice);
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
        let mut crashed: Option<(&ObservedPod, &Crash)> = None;
        let mut hung = BTreeSet::new();
        if let Some(a) = attempt {
            for h in 0..hosts {
                let gone = match pods.get(&(a, h)) {
                    Some(pod) if !pod.state.is_live() => {
                        if let Some(crash) = pod.crash() {
                            crashed.get_or_insert((pod, crash));
                        }
                        Some(pod.describe())
                    }
                    Some(pod) => {
                        registered.get(&(a, h)).filter(|regs| regs.iter().all(|r| r.silent)).map(|regs| {
                            hung.insert(pod.name.clone());
                            let ids: Vec<&str> = regs.iter().map(|r| r.worker_id.as_str()).collect();
                            format!(
                                "pod {} runs, but its worker ({}) has sent no heartbeat for longer than its \
                                 lease: hung or cut off",
                                pod.name,
                                ids.join(", ")
                            )
                        })
                    }
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
        // The crash history: what the attempt's pods carried, and its own crash.
        let mut history: BTreeMap<i32, u32> = attempt
            .map(|a| pods.range((a, 0)..=(a, u32::MAX)).flat_map(|(_, p)| p.crashes.clone()).collect())
            .unwrap_or_default();
        let mut waiting = false;
        if let Some((pod, crash)) = crashed {
            let count = history.entry(crash.exit_code).or_insert(0);
            *count += 1;
            if *count >= self.policy.crash_limit {
                return Err(Action::FailJob {
                    job_id: job.id.clone(),
                    reason: format!(
                        "slice {slice} crashed {count} times with exit code {} (the limit is {}): {}; \
                         `podctl logs {} --slice {slice}` (or `kubectl logs {}`) shows why",
                        crash.exit_code,
                        self.policy.crash_limit,
                        pod.describe(),
                        job.id,
                        pod.name
                    ),
                });
            }
            let crashes: u32 = history.values().sum();
            let until = crash.finished_unix.map(|at| at + self.policy.backoff(crashes).as_secs_f64());
            waiting = until.is_some_and(|until| self.now_unix < until);
        }
        let current = match (attempt, &lost_reason) {
            (None, _) => 0,
            (Some(a), Some(_)) => a + 1,
            (Some(a), None) => a,
        };

        // Pods of older attempts go: the slice is replaced as a whole. While a crashed slice
        // waits out its backoff, the crashed pod stays: it holds the crash's time and history.
        let mut not_live: BTreeSet<String> = BTreeSet::new();
        for (&(a, _), pod) in &pods {
            if !pod.state.is_live() || a < current || hung.contains(&pod.name) {
                not_live.insert(pod.name.clone());
            }
            let keep = waiting && pod.crash().is_some();
            if a < current && pod.state != PodState::Deleting && !keep {
                let reason = match &lost_reason {
                    Some(lost) => format!("slice {slice} is replaced by attempt {current}: {lost}"),
                    None => format!("attempt {current} of slice {slice} replaced it"),
                };
                actions.push(Action::DeletePod { name: pod.name.clone(), reason });
            }
        }
        if !waiting {
            for h in 0..hosts {
                if !pods.contains_key(&(current, h)) {
                    let pod = template.pod(job, self.owner, slice, current, h, &history);
                    actions.push(Action::CreatePod(Box::new(pod)));
                }
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slice::{Resources, TpuSlice, pod_name};
    use k8s_openapi::api::core::v1::PodAffinityTerm;

    const NOW: f64 = 1_800_000_000.0;

    fn template(topology: &str) -> WorkerTemplate {
        let slice = TpuSlice::new("tpu-v6e-slice", topology, None).unwrap();
        WorkerTemplate {
            namespace: "train".into(),
            instance: "podctl".into(),
            image: "example.com/podctl:1".into(),
            coordinator: "podctl.train.svc:7001".into(),
            resources: Resources::for_slice(&slice).unwrap_or(Resources {
                cpu: "100".into(),
                memory: "300Gi".into(),
                ephemeral_storage: "50Gi".into(),
            }),
            slice,
            spot: true,
            grace_period_seconds: 30,
            host_network: false,
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
            object_uid: Some(format!("uid-of-{id}")),
            queue: None,
            priority_class: None,
        }
    }

    fn owner() -> ObjectRef {
        ObjectRef { name: "podctl-workers".into(), uid: "uid-of-the-service".into() }
    }

    /// What the API server holds: the release's Service, the job objects of `jobs` that have
    /// one recorded, and `pods`.
    fn observed(jobs: &[DesiredJob], pods: Vec<ObservedPod>) -> Observed {
        let objects = jobs
            .iter()
            .filter_map(|j| {
                Some(ObservedJobObject {
                    name: slice::job_object_name(&j.id),
                    uid: j.object_uid.clone()?,
                    job_id: Some(j.id.clone()),
                })
            })
            .collect();
        Observed { owner: Some(owner()), objects, pods }
    }

    fn run(t: &WorkerTemplate, jobs: &[DesiredJob], pods: &[ObservedPod]) -> Vec<Action> {
        decide(t, &Policy::default(), NOW, jobs, &observed(jobs, pods.to_vec()))
    }

    fn pod_at(name: &str, job_id: &str, position: (u32, u32, u32), state: PodState) -> ObservedPod {
        ObservedPod {
            name: name.into(),
            job_id: Some(job_id.into()),
            position: Some(position),
            state,
            crashes: BTreeMap::new(),
        }
    }

    /// The pods the actions create, as the API server would then list them.
    fn apply(actions: &[Action], pods: &mut Vec<ObservedPod>) {
        for action in actions {
            match action {
                Action::CreatePod(pod) => pods.push(ObservedPod::from_pod(pod).unwrap()),
                Action::DeletePod { name, .. } => {
                    pods.iter_mut().filter(|p| &p.name == name).for_each(|p| p.state = PodState::Deleting)
                }
                _ => {}
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

    fn deleted(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::DeletePod { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    fn registration(worker_id: &str, instance_id: &str) -> Registration {
        Registration {
            worker_id: worker_id.into(),
            instance_id: instance_id.into(),
            removed: false,
            silent: false,
        }
    }

    fn crashed(exit_code: i32, finished_unix: f64) -> PodState {
        PodState::Ended {
            phase: "Failed".into(),
            reason: format!("exit code {exit_code}: Error"),
            crash: Some(Crash { exit_code, finished_unix: Some(finished_unix) }),
        }
    }

    #[test]
    fn a_two_slice_v6e_8_spot_job_gets_exactly_its_pods() {
        let t = template("2x4");
        let actions = run(&t, &[job("llm-1", 2, 8)], &[]);
        assert_eq!(actions.len(), 3, "{actions:#?}");
        let Action::CreateSecret(secret) = &actions[0] else { panic!("{actions:#?}") };
        assert_eq!(secret.metadata.name.as_deref(), Some("llm-1-token"));
        assert_eq!(secret.string_data.as_ref().unwrap()["token"], "wt");
        let owned = serde_json::json!([{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "llm-1-job", "uid": "uid-of-llm-1", "controller": true
        }]);
        assert_eq!(serde_json::to_value(&secret.metadata.owner_references).unwrap(), owned);
        assert_eq!(created(&actions), ["llm-1-s0-a0-h0", "llm-1-s1-a0-h0"]);

        let Action::CreatePod(pod) = &actions[2] else { panic!() };
        let json = serde_json::to_value(pod).unwrap();
        let resources = serde_json::json!({
            "cpu": "172", "ephemeral-storage": "50Gi", "google.com/tpu": "8", "memory": "1152Gi"
        });
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
                "annotations": { "podctl.dev/job-id": "llm-1" },
                "ownerReferences": owned
            },
            "spec": {
                "restartPolicy": "Never",
                "hostname": "llm-1-s1-a0-h0",
                "subdomain": "podctl-workers",
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
                "securityContext": { "seccompProfile": { "type": "RuntimeDefault" } },
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
                        { "name": "PODCTL_CACHE", "value": "/var/cache/podctl" },
                        { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                        { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                        { "name": "PODCTL_BIND", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "PODCTL_INSTANCE_ID", "value": "llm-1-s1-a0-h0" },
                        { "name": "PODCTL_SLICE", "value": "1" },
                        { "name": "TPU_WORKER_ID", "value": "0" },
                        { "name": "TPU_WORKER_HOSTNAMES", "value": "llm-1-s1-a0-h0.podctl-workers" }
                    ],
                    "resources": { "limits": resources, "requests": resources },
                    "volumeMounts": [
                        { "name": "token", "mountPath": "/var/run/podctl/token", "readOnly": true },
                        { "name": "cache", "mountPath": "/var/cache/podctl" },
                        { "name": "tmp", "mountPath": "/tmp" },
                        { "name": "tls", "mountPath": "/var/run/podctl/tls", "readOnly": true }
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "capabilities": { "drop": ["ALL"] },
                        "readOnlyRootFilesystem": true
                    }
                }],
                "volumes": [
                    { "name": "token", "secret": { "secretName": "llm-1-token", "defaultMode": 256 } },
                    { "name": "cache", "emptyDir": {} },
                    { "name": "tmp", "emptyDir": {} },
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
    fn a_job_gets_its_job_object_before_anything_else() {
        let t = template("2x4");
        let mut fresh = job("llm-1", 2, 8);
        fresh.object_uid = None;
        let actions = run(&t, std::slice::from_ref(&fresh), &[]);
        let [Action::CreateJobObject { job_id, object }] = &actions[..] else { panic!("{actions:#?}") };
        assert_eq!((job_id.as_str(), object.metadata.name.as_deref()), ("llm-1", Some("llm-1-job")));
        let owners = object.metadata.owner_references.clone().unwrap();
        assert_eq!((owners[0].kind.as_str(), owners[0].uid.as_str()), ("Service", "uid-of-the-service"));
        // Without the release's Service (being uninstalled), nothing is made at all.
        let bare = Observed { owner: None, ..observed(&[], vec![]) };
        assert_eq!(decide(&t, &Policy::default(), NOW, std::slice::from_ref(&fresh), &bare), vec![]);
        // A leader before this one made the object but did not record it: it is recorded.
        let made =
            ObservedJobObject { name: "llm-1-job".into(), uid: "u1".into(), job_id: Some("llm-1".into()) };
        let found = Observed { objects: vec![made], ..observed(&[], vec![]) };
        assert_eq!(
            decide(&t, &Policy::default(), NOW, &[fresh], &found),
            vec![Action::RecordJobObject { job_id: "llm-1".into(), uid: "u1".into() }]
        );
    }

    #[test]
    fn a_deleted_job_object_stops_its_job_and_stray_objects_go() {
        let t = template("2x4");
        let j = job("llm-1", 1, 8);
        let gone = Observed {
            objects: vec![ObservedJobObject {
                name: "old-2-job".into(),
                uid: "u9".into(),
                job_id: Some("old-2".into()),
            }],
            ..observed(&[], vec![pod_at("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Deleting)])
        };
        let actions = decide(&t, &Policy::default(), NOW, &[j], &gone);
        assert_eq!(actions.len(), 2, "{actions:#?}");
        assert!(matches!(&actions[0], Action::DeleteJobObject { name, .. } if name == "old-2-job"));
        let Action::StopJob { job_id, reason } = &actions[1] else { panic!("{actions:#?}") };
        assert_eq!(job_id, "llm-1");
        assert!(reason.contains("configmap llm-1-job, was deleted"), "{reason}");
    }

    #[test]
    fn multi_host_slices_name_every_host_of_their_attempt() {
        let t = template("4x4");
        let actions = run(&t, &[job("big-2", 1, 16)], &[]);
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
        // Submissions to such a cluster are refused (one slice across hosts does not train yet).
        let refusal = t.refusal(16).unwrap();
        assert!(refusal.contains("span 4 hosts") && refusal.contains("several single-host slices over DCN"));
        assert_eq!(template("2x4").refusal(8), None);
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
        let jobs = [job("big-2", 2, 16)];
        let actions = run(&t, &jobs, &[]);
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
        assert!(labels(&pods[5])["podctl.dev/slice-group"].starts_with("big-2-s1-a0-"));

        // Host 2 of slice 1 is preempted: the replacement attempt keeps off the pool its
        // predecessor is leaving (whose pods are still there, terminating) and off slice 0's.
        let mut observed_pods: Vec<ObservedPod> =
            pods.iter().map(|p| ObservedPod::from_pod(p).unwrap()).collect();
        observed_pods.iter_mut().for_each(|p| p.state = PodState::Running);
        observed_pods[6].state = PodState::Deleting;
        let actions = run(&t, &jobs, &observed_pods);
        let replacements = created_pods(&actions);
        assert_eq!(replacements.len(), 4, "{actions:#?}");
        for pod in &replacements {
            assert!(labels(pod)["podctl.dev/slice-group"].starts_with("big-2-s1-a1-"));
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
        let mut pods = vec![];
        let first = run(&t, &jobs, &pods);
        // The old leader died after its Secret and first pod.
        apply(&first[..2], &mut pods);
        let second = run(&t, &jobs, &pods);
        assert_eq!(created(&second), ["llm-1-s1-a0-h0"], "{second:#?}");
        apply(&second, &mut pods);
        assert_eq!(run(&t, &jobs, &pods), vec![]);
        for pod in &mut pods {
            pod.state = PodState::Running;
        }
        assert_eq!(run(&t, &jobs, &pods), vec![]);
    }

    #[test]
    fn a_deleted_pod_is_reported_and_its_slice_replaced() {
        let t = template("2x4");
        let mut j = job("llm-1", 2, 8);
        j.registrations =
            vec![registration("llm-1.w1", "llm-1-s0-a0-h0"), registration("llm-1.w2", "llm-1-s1-a0-h0")];
        let mut pods = vec![
            pod_at("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Running),
            pod_at("llm-1-s1-a0-h0", "llm-1", (1, 0, 0), PodState::Deleting),
        ];
        let actions = run(&t, std::slice::from_ref(&j), &pods);
        assert_eq!(created(&actions), ["llm-1-s1-a1-h0"]);
        assert_eq!(actions.len(), 3, "the Secret, the pod, the report: {actions:#?}");
        let Action::ReportLost { job_id, slice, worker_ids, reason } = &actions[2] else {
            panic!("{actions:#?}")
        };
        assert_eq!((job_id.as_str(), *slice, worker_ids.clone()), ("llm-1", 1, vec!["llm-1.w2".to_string()]));
        assert!(reason.contains("llm-1-s1-a0-h0 is being deleted"), "{reason}");

        // The old pod is gone, the replacement is pending: the registration is still reported
        // (the coordinator has not removed it yet) and nothing is created again.
        pods.pop();
        pods.push(pod_at("llm-1-s1-a1-h0", "llm-1", (1, 1, 0), PodState::Pending));
        let actions = run(&t, std::slice::from_ref(&j), &pods);
        assert_eq!(actions.len(), 1, "{actions:#?}");
        assert!(
            matches!(&actions[0], Action::ReportLost { reason, .. } if reason.contains("llm-1-s1-a0-h0 is gone"))
        );

        // Once the coordinator removed the worker, all is quiet.
        j.registrations[1].removed = true;
        assert_eq!(run(&t, std::slice::from_ref(&j), &pods), vec![]);
    }

    #[test]
    fn an_evicted_pod_is_replaced_and_deleted() {
        let t = template("2x4");
        let mut j = job("llm-1", 1, 8);
        j.registrations = vec![registration("llm-1.w1", "llm-1-s0-a3-h0")];
        // The eviction manager killed the worker (SIGKILL: 137), which is no crash of its own.
        let evicted = PodState::Ended {
            phase: "Failed".into(),
            reason: "Evicted: The node was low on resource: memory.".into(),
            crash: None,
        };
        let pods = vec![pod_at("llm-1-s0-a3-h0", "llm-1", (0, 3, 0), evicted)];
        let actions = run(&t, &[j], &pods);
        assert!(matches!(&actions[0], Action::CreateSecret(_)), "{actions:#?}");
        assert_eq!(
            actions[1],
            Action::DeletePod {
                name: "llm-1-s0-a3-h0".into(),
                reason:
                    "slice 0 is replaced by attempt 4: pod llm-1-s0-a3-h0 is Failed (Evicted: The node was \
                         low on resource: memory.)"
                        .into()
            }
        );
        assert_eq!(created(&actions), ["llm-1-s0-a4-h0"]);
        assert!(matches!(&actions[3], Action::ReportLost { worker_ids, .. } if worker_ids == &["llm-1.w1"]));
    }

    #[test]
    fn crashes_are_retried_with_backoff_until_the_same_exit_code_reaches_the_limit() {
        let t = template("2x4");
        let policy = Policy { crash_limit: 3, crash_backoff: Duration::from_secs(10) };
        let mut j = job("llm-1", 2, 8);
        j.registrations = vec![registration("llm-1.w2", "llm-1-s1-a0-h0")];
        let mut pods = vec![
            pod_at("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Running),
            pod_at("llm-1-s1-a0-h0", "llm-1", (1, 0, 0), crashed(1, NOW)),
        ];
        let at = |now: f64, pods: &[ObservedPod]| {
            decide(
                &t,
                &policy,
                now,
                std::slice::from_ref(&j),
                &observed(std::slice::from_ref(&j), pods.to_vec()),
            )
        };

        // First crash: the worker is reported lost at once, the pod stays, nothing is created
        // before the first backoff (10 s) is over.
        let actions = at(NOW + 9.0, &pods);
        assert_eq!(actions.len(), 1, "{actions:#?}");
        assert!(
            matches!(&actions[0], Action::ReportLost { reason, .. } if reason.contains("exit code 1: Error"))
        );
        let actions = at(NOW + 10.0, &pods);
        assert_eq!(created(&actions), ["llm-1-s1-a1-h0"]);
        assert_eq!(deleted(&actions), ["llm-1-s1-a0-h0"]);
        let Some(Action::CreatePod(replacement)) = actions.iter().find(|a| matches!(a, Action::CreatePod(_)))
        else {
            panic!()
        };
        // The replacement carries the slice's crash history.
        let history = &replacement.metadata.annotations.as_ref().unwrap()[slice::CRASHES_ANNOTATION];
        assert_eq!(history, r#"{"1":1}"#);

        // It crashes too, with the same code: the backoff doubles (20 s).
        let mut second = ObservedPod::from_pod(replacement).unwrap();
        second.state = crashed(1, NOW + 30.0);
        pods[1] = second;
        assert!(created(&at(NOW + 49.0, &pods)).is_empty());
        let actions = at(NOW + 50.0, &pods);
        assert_eq!(created(&actions), ["llm-1-s1-a2-h0"]);
        let Some(Action::CreatePod(third)) = actions.iter().find(|a| matches!(a, Action::CreatePod(_)))
        else {
            panic!()
        };
        assert_eq!(third.metadata.annotations.as_ref().unwrap()[slice::CRASHES_ANNOTATION], r#"{"1":2}"#);

        // Another code counts on its own; the third crash with code 1 ends the job.
        let mut third = ObservedPod::from_pod(third).unwrap();
        third.state = crashed(137, NOW + 60.0);
        pods[1] = third.clone();
        let actions = at(NOW + 200.0, &pods);
        assert_eq!(created(&actions), ["llm-1-s1-a3-h0"], "{actions:#?}");
        third.state = crashed(1, NOW + 60.0);
        pods[1] = third;
        let actions = at(NOW + 61.0, &pods);
        let [Action::FailJob { job_id, reason }] = &actions[..] else { panic!("{actions:#?}") };
        assert_eq!(job_id, "llm-1");
        assert!(
            reason.starts_with(
                "slice 1 crashed 3 times with exit code 1 (the limit is 3): pod llm-1-s1-a2-h0 is Failed"
            ),
            "{reason}"
        );
        assert!(reason.contains("podctl logs llm-1 --slice 1"), "{reason}");
    }

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let policy = Policy { crash_limit: 5, crash_backoff: Duration::from_secs(10) };
        let waits: Vec<u64> = (1..=7).map(|n| policy.backoff(n).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(
            Policy { crash_limit: 1, crash_backoff: Duration::from_millis(200) }.backoff(1).as_millis(),
            200
        );
    }

    #[test]
    fn a_running_pod_whose_worker_went_silent_is_replaced() {
        let t = template("2x4");
        let mut j = job("llm-1", 2, 8);
        j.registrations =
            vec![registration("llm-1.w1", "llm-1-s0-a0-h0"), registration("llm-1.w2", "llm-1-s1-a0-h0")];
        let pods = vec![
            pod_at("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Running),
            pod_at("llm-1-s1-a0-h0", "llm-1", (1, 0, 0), PodState::Running),
        ];
        assert_eq!(run(&t, std::slice::from_ref(&j), &pods), vec![]);
        // The worker of slice 1 froze: the coordinator removed it after its lease, and it never
        // registered again.
        j.registrations[1].silent = true;
        j.registrations[1].removed = true;
        let actions = run(&t, std::slice::from_ref(&j), &pods);
        assert_eq!(deleted(&actions), ["llm-1-s1-a0-h0"]);
        assert_eq!(created(&actions), ["llm-1-s1-a1-h0"]);
        let Action::DeletePod { reason, .. } = &actions[1] else { panic!("{actions:#?}") };
        assert!(reason.contains("has sent no heartbeat for longer than its lease"), "{reason}");
        // A worker that was removed but registers again under a new id is alive: left alone.
        j.registrations.push(registration("llm-1.w3", "llm-1-s1-a0-h0"));
        assert_eq!(run(&t, std::slice::from_ref(&j), &pods), vec![]);
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
            silent: true,
        }];
        let actions = run(&t, &[j], &[]);
        assert_eq!(created(&actions), ["llm-1-s0-a3-h0"]);
        assert_eq!(
            actions.len(),
            2,
            "the Secret and the pod; a removed worker is not reported again: {actions:#?}"
        );
    }

    #[test]
    fn losing_one_host_replaces_the_whole_multi_host_slice() {
        let t = template("4x4");
        let mut j = job("big-2", 1, 16);
        j.registrations =
            (0..4).map(|h| registration(&format!("big-2.w{h}"), &pod_name("big-2", 0, 0, h))).collect();
        let mut pods: Vec<ObservedPod> = (0..4)
            .map(|h| pod_at(&pod_name("big-2", 0, 0, h), "big-2", (0, 0, h), PodState::Running))
            .collect();
        pods[2].state = PodState::Deleting;
        let actions = run(&t, &[j], &pods);
        assert_eq!(deleted(&actions), ["big-2-s0-a0-h0", "big-2-s0-a0-h1", "big-2-s0-a0-h3"]);
        assert_eq!(created(&actions).len(), 4);
        assert!(created(&actions).iter().all(|n| n.contains("-a1-")));
        let Some(Action::ReportLost { worker_ids, .. }) = actions.last() else { panic!("{actions:#?}") };
        assert_eq!(worker_ids, &["big-2.w0", "big-2.w1", "big-2.w2", "big-2.w3"]);
    }

    #[test]
    fn a_stopped_job_loses_its_pods_and_job_object() {
        let t = template("2x4");
        let mut j = job("llm-1", 2, 8);
        j.running = false;
        let pods = vec![
            pod_at("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Running),
            pod_at("llm-1-s1-a0-h0", "llm-1", (1, 0, 0), PodState::Deleting),
            pod_at("old-3-s0-a0-h0", "old-3", (0, 0, 0), PodState::Pending),
        ];
        let actions = decide(
            &t,
            &Policy::default(),
            NOW,
            std::slice::from_ref(&j),
            &observed(std::slice::from_ref(&j), pods),
        );
        assert_eq!(actions.len(), 3, "{actions:#?}");
        assert!(matches!(&actions[0], Action::DeleteJobObject { name, .. } if name == "llm-1-job"));
        assert!(matches!(&actions[1], Action::DeletePod { name, .. } if name == "llm-1-s0-a0-h0"));
        assert!(
            matches!(&actions[2], Action::DeletePod { name, reason } if name == "old-3-s0-a0-h0" && reason.contains("unknown"))
        );
    }

    #[test]
    fn a_job_whose_slice_does_not_fit_fails_with_the_fix() {
        let actions = run(&template("2x4"), &[job("small-1", 2, 4)], &[]);
        let [Action::FailJob { job_id, reason }] = &actions[..] else { panic!("{actions:#?}") };
        assert_eq!(job_id, "small-1");
        assert!(
            reason.contains("uses 4 devices") && reason.contains("set mesh.ici to use 8 devices"),
            "{reason}"
        );
    }

    #[test]
    fn queued_jobs_wait_in_kueue_as_one_group_with_their_priority() {
        let t = template("2x4");
        let mut j = job("llm-1", 2, 8);
        j.queue = Some("team-a".into());
        j.priority_class = Some("high".into());
        let pods = created_pods(&run(&t, &[j], &[]));
        assert_eq!(pods.len(), 2);
        for pod in &pods {
            let labels = pod.metadata.labels.as_ref().unwrap();
            assert_eq!(labels[slice::KUEUE_QUEUE_LABEL], "team-a");
            assert!(labels[slice::KUEUE_GROUP_LABEL].starts_with("llm-1-"));
            assert_eq!(
                labels[slice::KUEUE_GROUP_LABEL],
                pods[0].metadata.labels.as_ref().unwrap()[slice::KUEUE_GROUP_LABEL]
            );
            assert_eq!(pod.metadata.annotations.as_ref().unwrap()[slice::KUEUE_GROUP_COUNT_ANNOTATION], "2");
            assert_eq!(pod.spec.as_ref().unwrap().priority_class_name.as_deref(), Some("high"));
        }
    }

    #[test]
    fn workers_started_elsewhere_are_left_to_the_lease() {
        // A registration whose instance id is not one of this job's pod names is not ours.
        let t = template("2x4");
        let mut j = job("llm-1", 1, 8);
        j.registrations =
            vec![registration("llm-1.w1", "3f1c9a7e-random"), registration("llm-1.w2", "llm-2-s0-a0-h0")];
        let pods = vec![pod_at("llm-1-s0-a0-h0", "llm-1", (0, 0, 0), PodState::Running)];
        assert_eq!(run(&t, &[j], &pods), vec![]);
    }

    #[test]
    fn pods_say_how_they_ended() {
        let pod = |status: serde_json::Value| {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": { "name": "p", "annotations": { "podctl.dev/crashes": "{\"1\":2}" } },
                "status": status
            }))
            .unwrap();
            ObservedPod::from_pod(&pod).unwrap()
        };
        let terminated = |code: i32, reason: &str| {
            serde_json::json!([{
                "name": "worker", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                "state": { "terminated": { "exitCode": code, "reason": reason, "finishedAt": "2027-01-15T08:00:00Z" } }
            }])
        };
        let crashed =
            pod(serde_json::json!({ "phase": "Failed", "containerStatuses": terminated(1, "Error") }));
        assert_eq!(crashed.crashes, BTreeMap::from([(1, 2)]));
        let Some(crash) = crashed.crash() else { panic!("{crashed:?}") };
        assert_eq!((crash.exit_code, crash.finished_unix), (1, Some(1_800_000_000.0)));
        assert!(crashed.describe().ends_with("is Failed (exit code 1: Error)"), "{}", crashed.describe());
        // Ended from outside: not the worker's fault.
        let evicted = pod(serde_json::json!({
            "phase": "Failed", "reason": "Evicted", "containerStatuses": terminated(137, "Error")
        }));
        assert!(evicted.crash().is_none() && !evicted.state.is_live());
        let disrupted = pod(serde_json::json!({
            "phase": "Failed", "containerStatuses": terminated(143, "Error"),
            "conditions": [{ "type": "DisruptionTarget", "status": "True" }]
        }));
        assert!(disrupted.crash().is_none());
        let done =
            pod(serde_json::json!({ "phase": "Succeeded", "containerStatuses": terminated(0, "Completed") }));
        assert!(done.crash().is_none());
    }
}
