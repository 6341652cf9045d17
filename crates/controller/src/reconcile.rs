//! The reconcile loop: list, decide, act; then wait for a watch event or the next tick.
//!
//! Each pass lists the worker pods, job objects and job declarations afresh and reads the
//! release's workers Service (a consistent read from the API server, not a cache), so a decision
//! is never made over a stale view; the watch only wakes the loop early. Token Secrets are only
//! ever created, never read: the controller needs no permission to list or watch Secrets (the
//! garbage collector deletes them with their job objects). The loop acts only while
//! [`ControlPlane::leading`] says so: on a coordinator that is the Raft leader whose state is
//! caught up. Errors of one action are logged and the next pass tries again; nothing here gives
//! up.

use crate::decide::{Action, Observed, ObservedJobObject, ObservedPod, Policy, decide};
use crate::declare::{self, Declaration, DeclaredJob, ObservedDeclaration, decide_declarations};
use crate::slice::ObjectRef;
use crate::{DesiredJob, Error, WorkerTemplate};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// What the controller needs from the coordinator. Implemented by the coordinator; this crate
/// never names it.
pub trait ControlPlane: Send + Sync + 'static {
    /// Whether this node may act now: it leads and has applied everything committed.
    fn leading(&self) -> bool;

    /// The jobs, as the coordinator wants them.
    fn desired(&self) -> Vec<DesiredJob>;

    /// Workers whose pods are gone: the coordinator treats them as preempted (the recovery
    /// path). Called again on every pass until the workers are removed from the job.
    fn lost(&self, job_id: &str, worker_ids: &[String], reason: &str);

    /// A job that can never run on this cluster, or that crashed its restart budget away: fail
    /// it with `reason`.
    fn fail(&self, job_id: &str, reason: &str) -> impl Future<Output = ()> + Send;

    /// Records the uid of a job's job object (once; a job keeps its first), so that its
    /// deletion is noticed even after the garbage collector took the pods.
    fn record_object(&self, job_id: &str, uid: &str) -> impl Future<Output = ()> + Send;

    /// Every job a declaration submitted, ended ones included (they are not submitted again).
    fn declared(&self) -> Vec<DeclaredJob>;

    /// Submits a declared job; the coordinator refuses a second job from the same `source`.
    /// The job's id, or why it was refused.
    fn submit(
        &self,
        source: &str,
        declaration: &Declaration,
    ) -> impl Future<Output = Result<String, String>> + Send;

    /// Stops a job, saying why.
    fn stop(&self, job_id: &str, reason: &str) -> impl Future<Output = ()> + Send;
}

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// The worker pods' template (namespace, image, slice type, ...).
    pub template: WorkerTemplate,
    /// A pass at least this often, watch or not (job submissions and stops are seen this way).
    pub resync: Duration,
    /// The restart budget.
    pub policy: Policy,
}

/// The loop over one namespace.
pub struct Controller<P> {
    config: ControllerConfig,
    plane: Arc<P>,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    services: Api<Service>,
    /// Declarations already refused (told once in the log, not every pass).
    refused: Mutex<BTreeSet<String>>,
}

/// What one pass did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Pods created (an `AlreadyExists` answer is not counted).
    pub created: usize,
    /// Pods and secrets deleted.
    pub deleted: usize,
    /// Workers reported lost.
    pub reported: usize,
    /// Declared jobs submitted.
    pub submitted: usize,
    /// Jobs stopped because their declaration or job object was deleted.
    pub stopped: usize,
    /// Job objects created and recorded: the next pass can create their pods at once.
    pub recorded: usize,
    /// Actions that failed (retried next pass).
    pub failed: usize,
    /// The pods' list version, to watch from.
    pub resource_version: String,
}

type Events = Pin<Box<dyn Stream<Item = Result<WatchEvent<Pod>, kube::Error>> + Send>>;

impl<P: ControlPlane> Controller<P> {
    /// A controller acting through `client` in the template's namespace.
    pub fn new(client: kube::Client, config: ControllerConfig, plane: Arc<P>) -> Self {
        let ns = &config.template.namespace;
        Self {
            pods: Api::namespaced(client.clone(), ns),
            secrets: Api::namespaced(client.clone(), ns),
            config_maps: Api::namespaced(client.clone(), ns),
            services: Api::namespaced(client, ns),
            refused: Mutex::default(),
            config,
            plane,
        }
    }

    /// Runs until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut events: Option<Events> = None;
        loop {
            if self.plane.leading() {
                match self.pass().await {
                    Ok(pass) => {
                        if events.is_none() {
                            events = self.watch(&pass.resource_version).await;
                        }
                        // New job objects: their pods can be made now, not a resync later.
                        if pass.recorded > 0 {
                            continue;
                        }
                    }
                    Err(e) => tracing::warn!("controller: {e}"),
                }
            } else {
                // A follower keeps no watch open: the leader's is the one that matters.
                events = None;
            }
            let next_event = async {
                match events.as_mut() {
                    Some(stream) => stream.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(self.config.resync) => {}
                event = next_event => {
                    match event {
                        Some(Ok(WatchEvent::Error(e))) => {
                            tracing::debug!("pod watch ended: {}", e.message);
                            events = None;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            tracing::debug!("pod watch failed: {e}");
                            events = None;
                        }
                        None => events = None,
                    }
                }
            }
        }
    }

    async fn watch(&self, version: &str) -> Option<Events> {
        let params = WatchParams::default().labels(&self.config.template.pod_selector()).timeout(290);
        match self.pods.watch(&params, version).await {
            Ok(stream) => Some(stream.boxed()),
            Err(e) => {
                tracing::warn!("controller: cannot watch pods: {e}");
                None
            }
        }
    }

    /// One pass: list, decide, act.
    pub async fn pass(&self) -> Result<Pass, Error> {
        let template = &self.config.template;
        let ns = &template.namespace;
        let pods = self
            .pods
            .list(&ListParams::default().labels(&template.pod_selector()))
            .await
            .map_err(Error::api(format!("list worker pods in {ns}")))?;
        let objects = self
            .config_maps
            .list(&ListParams::default().labels(&template.job_object_selector()))
            .await
            .map_err(Error::api(format!("list job objects (configmaps) in {ns}")))?;
        let declarations = self
            .config_maps
            .list(&ListParams::default().labels(&declare::selector(&template.instance)))
            .await
            .map_err(Error::api(format!("list job declarations (configmaps) in {ns}")))?;
        let service = template.owner_service();
        let owner = match self.services.get_opt(service).await {
            Ok(found) => found.and_then(|s| Some(ObjectRef { name: s.metadata.name?, uid: s.metadata.uid? })),
            Err(e) => return Err(Error::api(format!("read service {service} in {ns}"))(e)),
        };
        if owner.is_none() {
            tracing::warn!(
                "controller: service {service} in {ns}, the owner of every job object, is missing (the release \
                 is being uninstalled?): no job gets pods"
            );
        }
        let desired = self.plane.desired();
        let declared = self.plane.declared();
        let mut pass =
            Pass { resource_version: pods.metadata.resource_version.unwrap_or_default(), ..Pass::default() };
        // The lists took time: act only if this node still leads.
        if !self.plane.leading() {
            return Ok(pass);
        }
        let observed = Observed {
            owner,
            objects: objects.items.iter().filter_map(ObservedJobObject::from_config_map).collect(),
            pods: pods.items.iter().filter_map(ObservedPod::from_pod).collect(),
        };
        let observed_declarations: Vec<ObservedDeclaration> =
            declarations.items.iter().filter_map(ObservedDeclaration::from_config_map).collect();
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        let mut actions = decide_declarations(&observed_declarations, &declared);
        actions.extend(decide(template, &self.config.policy, now, &desired, &observed));
        for action in actions {
            self.act(action, &mut pass).await;
        }
        Ok(pass)
    }

    async fn act(&self, action: Action, pass: &mut Pass) {
        let result = match action {
            Action::CreateJobObject { job_id, object } => {
                let name = object.metadata.name.clone().unwrap_or_default();
                let made = match self.config_maps.create(&PostParams::default(), &object).await {
                    Ok(made) => Ok(made),
                    // A leader before this one made it: record that one.
                    Err(e) if code(&e) == Some(409) => self.config_maps.get(&name).await,
                    Err(e) => Err(e),
                };
                match made {
                    Ok(made) => match made.metadata.uid {
                        Some(uid) => {
                            tracing::info!(job_id, object = name, "created the job object");
                            self.plane.record_object(&job_id, &uid).await;
                            pass.recorded += 1;
                            Ok(())
                        }
                        None => Err(Error::NotFound(format!("configmap {name} came back without a uid"))),
                    },
                    Err(e) => Err(Error::api(format!("create job object {name}"))(e)),
                }
            }
            Action::RecordJobObject { job_id, uid } => {
                self.plane.record_object(&job_id, &uid).await;
                pass.recorded += 1;
                Ok(())
            }
            Action::DeleteJobObject { name, reason } => {
                match self.config_maps.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {
                        tracing::info!(object = name, "deleted the job object: {reason}");
                        pass.deleted += 1;
                        Ok(())
                    }
                    Err(e) if code(&e) == Some(404) => Ok(()),
                    Err(e) => Err(Error::api(format!("delete job object {name}"))(e)),
                }
            }
            Action::CreateSecret(secret) => {
                let name = secret.metadata.name.clone().unwrap_or_default();
                match self.secrets.create(&PostParams::default(), &secret).await {
                    Ok(_) => Ok(()),
                    Err(e) if code(&e) == Some(409) => Ok(()),
                    Err(e) => Err(Error::api(format!("create secret {name}"))(e)),
                }
            }
            Action::CreatePod(pod) => {
                let name = pod.metadata.name.clone().unwrap_or_default();
                match self.pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => {
                        tracing::info!(pod = name, "created worker pod");
                        pass.created += 1;
                        Ok(())
                    }
                    // A leader before this one created it: deterministic names make that safe.
                    Err(e) if code(&e) == Some(409) => Ok(()),
                    Err(e) => Err(Error::api(format!("create pod {name}"))(e)),
                }
            }
            Action::DeletePod { name, reason } => {
                match self.pods.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {
                        tracing::info!(pod = name, "deleted worker pod: {reason}");
                        pass.deleted += 1;
                        Ok(())
                    }
                    Err(e) if code(&e) == Some(404) => Ok(()),
                    Err(e) => Err(Error::api(format!("delete pod {name}"))(e)),
                }
            }
            Action::ReportLost { job_id, slice, worker_ids, reason } => {
                tracing::info!(job_id, slice, ?worker_ids, "workers lost: {reason}");
                self.plane.lost(&job_id, &worker_ids, &reason);
                pass.reported += worker_ids.len();
                Ok(())
            }
            Action::FailJob { job_id, reason } => {
                tracing::warn!(job_id, "failing the job: {reason}");
                self.plane.fail(&job_id, &reason).await;
                Ok(())
            }
            Action::SubmitJob { source, declaration } => {
                match self.plane.submit(&source, &declaration).await {
                    Ok(job_id) => {
                        tracing::info!(job_id, source, "submitted a declared job");
                        pass.submitted += 1;
                        Ok(())
                    }
                    Err(reason) => {
                        self.refuse(&source, &format!("cannot submit the job of {source}: {reason}"));
                        Ok(())
                    }
                }
            }
            Action::StopJob { job_id, reason } => {
                tracing::info!(job_id, "stopping the job: {reason}");
                self.plane.stop(&job_id, &reason).await;
                pass.stopped += 1;
                Ok(())
            }
            Action::RefuseDeclaration { source, reason } => {
                self.refuse(&source, &reason);
                Ok(())
            }
        };
        if let Err(e) = result {
            tracing::warn!("controller: {e}; retrying on the next pass");
            pass.failed += 1;
        }
    }
}

impl<P> Controller<P> {
    /// Logs a refused declaration the first time only: the next passes see it again.
    fn refuse(&self, source: &str, reason: &str) {
        if self.refused.lock().unwrap_or_else(|e| e.into_inner()).insert(source.to_string()) {
            tracing::warn!(source, "controller: {reason}");
        }
    }
}

/// A client with the pod's service account (in a cluster), or else the local kubeconfig.
pub async fn in_cluster() -> Result<kube::Client, Error> {
    kube::Client::try_default()
        .await
        .map_err(|e| Error::Kubeconfig(format!("no in-cluster credentials nor kubeconfig: {e}")))
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(response) => Some(response.code),
        _ => None,
    }
}
