//! The reconcile loop against a Kubernetes API server on loopback: the mock's garbage collector,
//! Pod Security admission and scheduler stand in for the cluster's.

use controller::slice::{self, TpuSlice};
use controller::{
    ControlPlane, Controller, ControllerConfig, Declaration, DeclaredJob, DesiredJob, Policy, Registration,
    Resources, WorkerTemplate,
};
use kube_mock::{MockApi, Placement};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NS: &str = "train";

/// The coordinator, as far as the controller sees it.
#[derive(Default)]
struct Plane {
    leading: AtomicBool,
    jobs: Mutex<Vec<DesiredJob>>,
    lost: Mutex<Vec<(String, Vec<String>, String)>>,
    failed: Mutex<Vec<(String, String)>>,
    declared: Mutex<Vec<DeclaredJob>>,
    stopped: Mutex<Vec<(String, String)>>,
}

impl ControlPlane for Plane {
    fn leading(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }
    fn desired(&self) -> Vec<DesiredJob> {
        self.jobs.lock().unwrap().clone()
    }
    fn lost(&self, job_id: &str, worker_ids: &[String], reason: &str) {
        self.lost.lock().unwrap().push((job_id.into(), worker_ids.to_vec(), reason.into()));
    }
    async fn fail(&self, job_id: &str, reason: &str) {
        self.failed.lock().unwrap().push((job_id.into(), reason.into()));
        self.jobs.lock().unwrap().iter_mut().filter(|j| j.id == job_id).for_each(|j| j.running = false);
    }
    async fn record_object(&self, job_id: &str, uid: &str) {
        for job in self.jobs.lock().unwrap().iter_mut().filter(|j| j.id == job_id) {
            job.object_uid.get_or_insert_with(|| uid.to_string());
        }
    }
    fn declared(&self) -> Vec<DeclaredJob> {
        self.declared.lock().unwrap().clone()
    }
    async fn submit(&self, source: &str, declaration: &Declaration) -> Result<String, String> {
        if declaration.spec_yaml.contains("refuse me") {
            return Err("job spec field `steps`: must be at least 1".into());
        }
        let mut declared = self.declared.lock().unwrap();
        let job_id = format!("declared-{}", declared.len() + 1);
        declared.push(DeclaredJob { source: source.into(), job_id: job_id.clone(), running: true });
        Ok(job_id)
    }
    async fn stop(&self, job_id: &str, reason: &str) {
        self.stopped.lock().unwrap().push((job_id.into(), reason.into()));
        self.declared
            .lock()
            .unwrap()
            .iter_mut()
            .filter(|j| j.job_id == job_id)
            .for_each(|j| j.running = false);
        self.jobs.lock().unwrap().iter_mut().filter(|j| j.id == job_id).for_each(|j| j.running = false);
    }
}

impl Plane {
    fn leading(job: DesiredJob) -> Arc<Plane> {
        let plane = Plane { jobs: Mutex::new(vec![job]), ..Plane::default() };
        plane.leading.store(true, Ordering::SeqCst);
        Arc::new(plane)
    }

    fn with_job(&self, f: impl FnOnce(&mut DesiredJob)) {
        f(&mut self.jobs.lock().unwrap()[0]);
    }

    /// The worker in pod `pod` registered as `worker_id`.
    fn register(&self, worker_id: &str, pod: &str) {
        self.with_job(|j| {
            j.registrations.push(Registration {
                worker_id: worker_id.into(),
                instance_id: pod.into(),
                removed: false,
                silent: false,
            })
        });
    }

    /// The coordinator removed the worker (after the report, a new generation).
    fn remove(&self, worker_id: &str) {
        self.with_job(|j| {
            j.registrations.iter_mut().filter(|r| r.worker_id == worker_id).for_each(|r| r.removed = true)
        });
    }
}

fn template_in(namespace: &str, topology: &str) -> WorkerTemplate {
    let slice = TpuSlice::new("tpu-v6e-slice", topology, None).unwrap();
    WorkerTemplate {
        namespace: namespace.into(),
        instance: "podctl".into(),
        image: "ghcr.io/podctl/podctl-worker:0.1.0".into(),
        coordinator: "podctl.train.svc:7001".into(),
        resources: Resources::for_slice(&slice).unwrap(),
        slice,
        spot: true,
        grace_period_seconds: 30,
        host_network: false,
        service_account: Some("podctl-worker".into()),
        subdomain: "podctl-workers".into(),
        tls_secret: Some("podctl-worker-tls".into()),
    }
}

fn config(topology: &str) -> ControllerConfig {
    ControllerConfig {
        template: template_in(NS, topology),
        resync: Duration::from_millis(200),
        policy: Policy::default(),
    }
}

fn job(id: &str, slices: u32) -> DesiredJob {
    DesiredJob {
        id: id.into(),
        running: true,
        slices,
        devices_per_slice: 8,
        worker_token: "worker-token-of-llm".into(),
        registrations: vec![],
        object_uid: None,
        queue: None,
        priority_class: None,
    }
}

/// What the chart installs that the controller relies on: the namespace under the `baseline`
/// Pod Security level (docs/gke.md labels it so) and the workers Service, which owns the job
/// objects.
fn install(api: &MockApi, namespace: &str) {
    api.put_namespace(namespace, &[("pod-security.kubernetes.io/enforce", "baseline")]);
    api.put(
        "services",
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "podctl-workers", "namespace": namespace },
            "spec": { "clusterIP": "None" }
        }),
    );
}

/// Names of pods that exist and are not being deleted.
fn live_pods(api: &MockApi) -> BTreeSet<String> {
    api.list("pods", NS)
        .into_iter()
        .filter(|(_, p)| p["metadata"]["deletionTimestamp"].is_null() && p["status"]["phase"] != "Failed")
        .map(|(name, _)| name)
        .collect()
}

async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Runs the controller until the returned sender fires.
fn spawn(controller: Controller<Plane>) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));
    (stop, running)
}

#[tokio::test]
async fn the_loop_creates_replaces_reports_and_cleans_up() {
    let api = MockApi::start().await;
    install(&api, NS);
    let plane = Plane::leading(job("llm-1", 2));
    let (stop, running) = spawn(Controller::new(api.client(NS), config("2x4"), plane.clone()));

    let both = names(&["llm-1-s0-a0-h0", "llm-1-s1-a0-h0"]);
    eventually("the job's pods", || (live_pods(&api) == both).then_some(())).await;
    // The job object came first, owned by the workers Service; the Secret and the pods are the
    // job object's.
    let object = &api.list("configmaps", NS)["llm-1-job"];
    assert_eq!(object["metadata"]["ownerReferences"][0]["name"], "podctl-workers");
    assert_eq!(
        plane.desired()[0].object_uid.as_ref(),
        object["metadata"]["uid"].as_str().map(String::from).as_ref()
    );
    let secret = &api.list("secrets", NS)["llm-1-token"];
    assert_eq!(secret["data"]["token"], "d29ya2VyLXRva2VuLW9mLWxsbQ==", "base64 of the worker token");
    assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], object["metadata"]["uid"]);
    for (name, pod) in api.list("pods", NS) {
        let spec = &pod["spec"];
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], object["metadata"]["uid"], "{name}");
        assert_eq!(spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"], "2x4", "{name}");
        assert_eq!(spec["containers"][0]["resources"]["limits"]["google.com/tpu"], "8", "{name}");
        api.set_pod_status(NS, &name, "Running", None);
    }
    plane.register("llm-1.w1", "llm-1-s0-a0-h0");
    plane.register("llm-1.w2", "llm-1-s1-a0-h0");

    // A user (or GKE, for a Spot VM going away) deletes a pod: it is terminating.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(api.client(NS), NS);
    pods.delete("llm-1-s1-a0-h0", &Default::default()).await.unwrap();
    eventually("the replacement of slice 1", || live_pods(&api).contains("llm-1-s1-a1-h0").then_some(()))
        .await;
    let report = eventually("the preemption report", || plane.lost.lock().unwrap().first().cloned()).await;
    assert_eq!((report.0.as_str(), report.1.clone()), ("llm-1", vec!["llm-1.w2".to_string()]));
    assert!(report.2.contains("llm-1-s1-a0-h0 is being deleted"), "{}", report.2);
    // The kubelet finishes; the coordinator removes the worker; the replacement registers.
    api.remove("pods", NS, "llm-1-s1-a0-h0");
    plane.remove("llm-1.w2");
    plane.register("llm-1.w3", "llm-1-s1-a1-h0");

    // The node of slice 0 runs out of memory: its pod is evicted.
    plane.lost.lock().unwrap().clear();
    api.set_pod_status(NS, "llm-1-s0-a0-h0", "Failed", Some("Evicted"));
    eventually("the replacement of slice 0", || live_pods(&api).contains("llm-1-s0-a1-h0").then_some(()))
        .await;
    let report = eventually("the eviction report", || plane.lost.lock().unwrap().first().cloned()).await;
    assert_eq!(report.1, vec!["llm-1.w1".to_string()]);
    assert!(report.2.contains("Failed (Evicted"), "{}", report.2);
    eventually("the evicted pod deleted", || {
        api.list("pods", NS)["llm-1-s0-a0-h0"]["metadata"]["deletionTimestamp"].is_string().then_some(())
    })
    .await;
    assert_eq!(live_pods(&api), names(&["llm-1-s0-a1-h0", "llm-1-s1-a1-h0"]));

    // The job is stopped: its pods go, and its job object, and with it its Secret.
    plane.with_job(|j| j.running = false);
    eventually("the job's pods deleted", || live_pods(&api).is_empty().then_some(())).await;
    eventually("the token secret deleted", || api.list("secrets", NS).is_empty().then_some(())).await;
    assert!(api.list("configmaps", NS).is_empty());

    // Every pod was created exactly once, and the Secret only ever created, never read.
    let creates: Vec<String> = api.requests().into_iter().filter(|r| r.starts_with("POST pods/")).collect();
    assert_eq!(
        creates,
        [
            "POST pods/llm-1-s0-a0-h0 201",
            "POST pods/llm-1-s1-a0-h0 201",
            "POST pods/llm-1-s1-a1-h0 201",
            "POST pods/llm-1-s0-a1-h0 201"
        ]
    );
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// The acceptance of issue 29: deleting a job's job object deletes its worker pods and Secret
/// by owner reference (the controller only stops the job), and so does uninstalling the
/// release, which deletes the workers Service that owns every job object, while a coordinator
/// still running creates nothing new.
#[tokio::test]
async fn deleting_the_job_object_or_the_release_deletes_pods_and_secrets_by_owner_reference() {
    let api = MockApi::start().await;
    install(&api, NS);
    let plane = Plane::leading(job("llm-1", 2));
    plane.jobs.lock().unwrap().push(job("llm-2", 1));
    let (stop, running) = spawn(Controller::new(api.client(NS), config("2x4"), plane.clone()));
    let all = names(&["llm-1-s0-a0-h0", "llm-1-s1-a0-h0", "llm-2-s0-a0-h0"]);
    eventually("both jobs' pods", || (live_pods(&api) == all).then_some(())).await;
    let controller_deletes = || api.requests().into_iter().filter(|r| r.starts_with("DELETE ")).count();
    assert_eq!(controller_deletes(), 0);

    api.delete("configmaps", NS, "llm-1-job");
    // The garbage collector took the pods and the Secret: not the controller.
    assert_eq!(live_pods(&api), names(&["llm-2-s0-a0-h0"]));
    assert!(!api.list("secrets", NS).contains_key("llm-1-token"));
    let collected: Vec<String> = api.requests().into_iter().filter(|r| r.starts_with("GC ")).collect();
    assert_eq!(collected, ["GC pods/llm-1-s0-a0-h0", "GC pods/llm-1-s1-a0-h0", "GC secrets/llm-1-token"]);
    // The controller stops the job, and makes nothing for it again.
    let stopped = eventually("the job stopped", || plane.stopped.lock().unwrap().first().cloned()).await;
    assert_eq!(stopped.0, "llm-1");
    assert!(stopped.1.contains("its job object, configmap llm-1-job, was deleted"), "{}", stopped.1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!api.list("configmaps", NS).contains_key("llm-1-job"));
    assert_eq!(live_pods(&api), names(&["llm-2-s0-a0-h0"]));

    // `helm uninstall` deletes the chart's objects, the workers Service among them: every job
    // object goes, and every pod and Secret with it. The coordinators may still be running for
    // their grace period: they create nothing without the Service.
    api.delete("services", NS, "podctl-workers");
    assert!(live_pods(&api).is_empty() && api.list("secrets", NS).is_empty());
    assert!(api.list("configmaps", NS).is_empty());
    let posts = api.requests().into_iter().filter(|r| r.starts_with("POST ")).count();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(api.requests().into_iter().filter(|r| r.starts_with("POST ")).count(), posts);
    assert_eq!(controller_deletes(), 0, "{:#?}", api.requests());
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// The acceptance of issue 29: a slice that crashes with the same exit code `crash_limit`
/// times fails its job with the reason; before that it is replaced after a doubling backoff.
#[tokio::test]
async fn a_crashing_slice_is_replaced_with_backoff_until_its_limit_fails_the_job() {
    let api = MockApi::start().await;
    install(&api, NS);
    let plane = Plane::leading(job("llm-1", 2));
    let backoff = Duration::from_millis(400);
    let config = ControllerConfig {
        resync: Duration::from_millis(50),
        policy: Policy { crash_limit: 3, crash_backoff: backoff },
        ..config("2x4")
    };
    let (stop, running) = spawn(Controller::new(api.client(NS), config, plane.clone()));
    let both = names(&["llm-1-s0-a0-h0", "llm-1-s1-a0-h0"]);
    eventually("the job's pods", || (live_pods(&api) == both).then_some(())).await;

    // Slice 1's worker exits 1 on its own, three times.
    let mut pod = "llm-1-s1-a0-h0".to_string();
    for (attempt, wait) in [(1, backoff), (2, backoff * 2)] {
        api.set_pod_status(NS, &pod, "Running", None);
        let crashed = Instant::now();
        api.set_container_exit(NS, &pod, 1, "Error");
        let next = slice::pod_name("llm-1", 1, attempt, 0);
        eventually("the crashed slice's next attempt", || live_pods(&api).contains(&next).then_some(()))
            .await;
        // Not before its backoff (a lower bound: a busy machine only makes it later; the
        // container's end is recorded to the millisecond).
        let earliest = wait - Duration::from_millis(5);
        assert!(
            crashed.elapsed() >= earliest,
            "attempt {attempt} after {:?}, before {wait:?}",
            crashed.elapsed()
        );
        let history = api.list("pods", NS)[&next]["metadata"]["annotations"]["podctl.dev/crashes"].clone();
        assert_eq!(history, Value::String(format!("{{\"1\":{attempt}}}")));
        // The crashed pod went with its replacement.
        assert!(!api.list("pods", NS)[&pod]["metadata"]["deletionTimestamp"].is_null());
        pod = next;
    }
    assert!(plane.failed.lock().unwrap().is_empty());
    api.set_container_exit(NS, &pod, 1, "Error");
    let (job_id, reason) =
        eventually("the job failed", || plane.failed.lock().unwrap().first().cloned()).await;
    assert_eq!(job_id, "llm-1");
    assert!(
        reason.starts_with(
            "slice 1 crashed 3 times with exit code 1 (the limit is 3): pod llm-1-s1-a2-h0 is Failed"
        ),
        "{reason}"
    );
    // A failed job's pods go; no fourth attempt was made.
    eventually("the failed job's pods deleted", || live_pods(&api).is_empty().then_some(())).await;
    assert!(!api.list("pods", NS).contains_key("llm-1-s1-a3-h0"));
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// The pods of a 4x4 (four-host) slice of job `big-1` in `namespace`, as its controller makes
/// them, after one pass.
async fn multi_host_pods(api: &MockApi, namespace: &str) {
    install(api, namespace);
    let mut big = job("big-1", 1);
    big.devices_per_slice = 16;
    let config = ControllerConfig { template: template_in(namespace, "4x4"), ..config("4x4") };
    let controller = Controller::new(api.client(namespace), config, Plane::leading(big));
    // The first pass makes the job object, the second the pods.
    controller.pass().await.unwrap();
    assert_eq!(controller.pass().await.unwrap().created, 4);
}

/// Two node pools of four v6e 4x4 hosts each: room for exactly two four-host slices.
fn two_node_pools(api: &MockApi) {
    for pool in ["pool-a", "pool-b"] {
        for n in 0..4 {
            api.add_node(
                &format!("{pool}-{n}"),
                &[
                    ("cloud.google.com/gke-nodepool", pool),
                    ("cloud.google.com/gke-tpu-accelerator", "tpu-v6e-slice"),
                    ("cloud.google.com/gke-tpu-topology", "4x4"),
                    ("cloud.google.com/gke-spot", "true"),
                ],
                &[
                    ("google.com/tpu", "4"),
                    ("cpu", "180"),
                    ("memory", "720Gi"),
                    ("ephemeral-storage", "80Gi"),
                ],
            );
        }
    }
}

/// The node pool each namespace's pods went to, or why one did not fit.
fn pools(placements: &BTreeMap<String, Placement>) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_namespace: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (pod, placement) in placements {
        let ns = pod.split('/').next().unwrap().to_string();
        let pool = match placement {
            Placement::Bound(node) => node.rsplit_once('-').unwrap().0.to_string(),
            Placement::Unschedulable(why) => format!("unschedulable: {why}"),
        };
        by_namespace.entry(ns).or_default().insert(pool);
    }
    by_namespace
}

/// The acceptance of issue 29: the same job id in two namespaces places both. Slices keep apart
/// by a required anti-affinity that spans every namespace, so their slice-group values must
/// differ across namespaces; with the first pass's value (the job key alone) the two jobs'
/// pods, interleaved in the scheduler's queue, take half of each pool and neither slice fits.
#[tokio::test]
async fn the_same_job_id_in_two_namespaces_places_both() {
    let api = MockApi::start().await;
    two_node_pools(&api);
    multi_host_pods(&api, "team-a").await;
    multi_host_pods(&api, "team-b").await;
    let placements = api.schedule();
    assert_eq!(placements.len(), 8);
    let by_namespace = pools(&placements);
    assert_eq!(by_namespace["team-a"].len(), 1, "{placements:#?}");
    assert_eq!(by_namespace["team-b"].len(), 1, "{placements:#?}");
    assert_ne!(by_namespace["team-a"], by_namespace["team-b"]);
    assert!(by_namespace.values().flatten().all(|p| p.starts_with("pool-")), "{placements:#?}");

    // The same pods with a slice-group value that is not namespaced: a deadlock.
    let api = MockApi::start().await;
    two_node_pools(&api);
    multi_host_pods(&api, "team-a").await;
    multi_host_pods(&api, "team-b").await;
    for ns in ["team-a", "team-b"] {
        for (name, mut pod) in api.list("pods", ns) {
            let group = pod["metadata"]["labels"][slice::SLICE_GROUP_LABEL].as_str().unwrap().to_string();
            let unscoped = group.rsplit_once('-').unwrap().0.to_string();
            let text = pod.to_string().replace(&group, &unscoped);
            pod = serde_json::from_str(&text).unwrap();
            api.remove("pods", ns, &name);
            pod["metadata"].as_object_mut().unwrap().remove("resourceVersion");
            api.put("pods", pod);
        }
    }
    let deadlocked = pools(&api.schedule());
    assert!(
        deadlocked.values().flatten().any(|p| p.starts_with("unschedulable: ")),
        "the unscoped value should deadlock: {deadlocked:#?}"
    );
}

#[tokio::test]
async fn the_namespace_s_pod_security_level_refuses_host_network_workers() {
    let api = MockApi::start().await;
    install(&api, NS);
    let mut host = config("2x4");
    host.template.host_network = true;
    let plane = Plane::leading(job("llm-1", 1));
    let controller = Controller::new(api.client(NS), host, plane);
    controller.pass().await.unwrap();
    let pass = controller.pass().await.unwrap();
    assert_eq!((pass.created, pass.failed), (0, 1), "{:#?}", api.requests());
    assert!(api.requests().contains(&"POST pods/llm-1-s0-a0-h0 403".to_string()));
}

#[tokio::test]
async fn two_leaders_at_once_create_nothing_twice() {
    // An old leader that has not noticed it was deposed and the new one decide over the same
    // cluster at the same moment.
    let api = MockApi::start().await;
    install(&api, NS);
    let old = Plane::leading(job("llm-1", 4));
    let new = Plane::leading(job("llm-1", 4));
    let a = Controller::new(api.client(NS), config("2x4"), old.clone());
    let b = Controller::new(api.client(NS), config("2x4"), new.clone());
    // Both make the job object: one creates it, the other finds it; both record the same.
    let (pa, pb) = tokio::join!(a.pass(), b.pass());
    assert_eq!(pa.unwrap().recorded + pb.unwrap().recorded, 2);
    assert_eq!(old.desired()[0].object_uid, new.desired()[0].object_uid);
    let (pa, pb) = tokio::join!(a.pass(), b.pass());
    let (pa, pb) = (pa.unwrap(), pb.unwrap());
    assert_eq!(pa.created + pb.created, 4, "{pa:?} {pb:?}");
    assert_eq!(pa.failed + pb.failed, 0);
    let created = |kind: &str| {
        api.requests()
            .into_iter()
            .filter(|r| r.ends_with(" 201") && r.starts_with(&format!("POST {kind}/")))
            .count()
    };
    assert_eq!(
        (created("pods"), created("configmaps"), created("secrets")),
        (4, 1, 1),
        "{:#?}",
        api.requests()
    );
    assert_eq!(live_pods(&api).len(), 4);
    // And deciding again changes nothing.
    let again = b.pass().await.unwrap();
    assert_eq!((again.created, again.deleted, again.reported), (0, 0, 0));
}

#[tokio::test]
async fn a_follower_does_nothing_and_a_misfit_job_fails() {
    let api = MockApi::start().await;
    install(&api, NS);
    let mut misfit = job("llm-1", 2);
    misfit.devices_per_slice = 4;
    let plane = Plane::leading(misfit);
    plane.leading.store(false, Ordering::SeqCst);
    let controller = Controller::new(api.client(NS), config("2x4"), plane.clone());
    let pass = controller.pass().await.unwrap();
    assert_eq!(pass.created, 0);
    assert!(api.requests().is_empty(), "{:?}", api.requests());

    // Leading, with slices of 8 chips for a job whose slice uses 4: the job fails.
    plane.leading.store(true, Ordering::SeqCst);
    controller.pass().await.unwrap();
    let failed = plane.failed.lock().unwrap().clone();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].1.contains("uses 4 devices") && failed[0].1.contains("have 8 chips"), "{failed:?}");
    assert!(api.requests().is_empty(), "{:?}", api.requests());
}

#[tokio::test]
async fn declared_jobs_are_submitted_once_and_stopped_when_their_declaration_goes() {
    let api = MockApi::start().await;
    install(&api, NS);
    let plane = Plane::leading(DesiredJob { running: false, ..job("llm-1", 1) });
    let controller = Controller::new(api.client(NS), config("2x4"), plane.clone());
    let declaration = |spec: &str| Declaration {
        spec_yaml: spec.into(),
        bundle_uri: "gs://b/runs/bundles/ab12".into(),
        bundle_id: "ab12".into(),
    };
    api.put("configmaps", declaration("name: a\n").config_map("podctl-job-a", Some(NS), "podctl"));
    // Another install's declaration is not this controller's.
    api.put("configmaps", declaration("name: b\n").config_map("other-job-b", Some(NS), "other"));
    api.put("configmaps", declaration("refuse me").config_map("podctl-job-bad", Some(NS), "podctl"));

    let pass = controller.pass().await.unwrap();
    assert_eq!(pass.submitted, 1);
    let declared = plane.declared();
    assert_eq!(declared.len(), 1);
    assert!(declared[0].source.starts_with("configmap/podctl-job-a/"), "{declared:?}");
    // Passes after that submit nothing: the job is known (the refused one is retried, quietly).
    for _ in 0..3 {
        assert_eq!(controller.pass().await.unwrap().submitted, 0);
    }
    assert_eq!(plane.declared().len(), 1);

    api.delete("configmaps", NS, "podctl-job-a");
    let pass = controller.pass().await.unwrap();
    assert_eq!(pass.stopped, 1);
    assert_eq!(
        plane.stopped.lock().unwrap().clone(),
        [("declared-1".to_string(), "its declaration, configmap podctl-job-a, was deleted".to_string())]
    );
    assert_eq!(controller.pass().await.unwrap().stopped, 0);
}
