//! The reconcile loop against a Kubernetes API server on loopback.

use controller::{
    ControlPlane, Controller, ControllerConfig, Declaration, DeclaredJob, DesiredJob, Registration, TpuSlice,
    WorkerTemplate,
};
use kube_mock::MockApi;
use std::collections::BTreeSet;
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

fn config(topology: &str) -> ControllerConfig {
    ControllerConfig {
        template: WorkerTemplate {
            namespace: NS.into(),
            instance: "podctl".into(),
            image: "ghcr.io/podctl/podctl-worker:0.1.0".into(),
            coordinator: "podctl.train.svc:7001".into(),
            slice: TpuSlice::new("tpu-v6e-slice", topology, None).unwrap(),
            spot: true,
            grace_period_seconds: 30,
            host_network: true,
            service_account: Some("podctl-worker".into()),
            subdomain: "podctl-workers".into(),
            tls_secret: Some("podctl-tls".into()),
        },
        resync: Duration::from_millis(200),
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
    }
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

#[tokio::test]
async fn the_loop_creates_replaces_reports_and_cleans_up() {
    let api = MockApi::start().await;
    let plane = Plane::leading(job("llm-1", 2));
    let controller = Controller::new(api.client(NS), config("2x4"), plane.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));

    let both = names(&["llm-1-s0-a0-h0", "llm-1-s1-a0-h0"]);
    eventually("the job's pods", || (live_pods(&api) == both).then_some(())).await;
    let secret = &api.list("secrets", NS)["llm-1-token"];
    assert_eq!(secret["data"]["token"], "d29ya2VyLXRva2VuLW9mLWxsbQ==", "base64 of the worker token");
    for (name, pod) in api.list("pods", NS) {
        let spec = &pod["spec"];
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

    // The job is stopped: its pods and its secret go.
    plane.with_job(|j| j.running = false);
    eventually("the job's pods deleted", || live_pods(&api).is_empty().then_some(())).await;
    eventually("the token secret deleted", || api.list("secrets", NS).is_empty().then_some(())).await;

    // Every pod was created exactly once.
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

#[tokio::test]
async fn two_leaders_at_once_create_nothing_twice() {
    // An old leader that has not noticed it was deposed and the new one decide over the same
    // cluster at the same moment.
    let api = MockApi::start().await;
    let old = Plane::leading(job("llm-1", 4));
    let new = Plane::leading(job("llm-1", 4));
    let a = Controller::new(api.client(NS), config("2x4"), old);
    let b = Controller::new(api.client(NS), config("2x4"), new);
    let (pa, pb) = tokio::join!(a.pass(), b.pass());
    let (pa, pb) = (pa.unwrap(), pb.unwrap());
    assert_eq!(pa.created + pb.created, 4, "{pa:?} {pb:?}");
    assert_eq!(pa.failed + pb.failed, 0);
    let created =
        api.requests().into_iter().filter(|r| r.ends_with(" 201") && r.starts_with("POST pods/")).count();
    assert_eq!(created, 4, "{:#?}", api.requests());
    assert_eq!(live_pods(&api).len(), 4);
    // And deciding again changes nothing.
    let again = b.pass().await.unwrap();
    assert_eq!((again.created, again.deleted, again.reported), (0, 0, 0));
}

#[tokio::test]
async fn a_follower_does_nothing_and_a_misfit_job_fails() {
    let api = MockApi::start().await;
    let plane = Plane::leading(job("llm-1", 2));
    plane.leading.store(false, Ordering::SeqCst);
    let controller = Controller::new(api.client(NS), config("4x4"), plane.clone());
    let pass = controller.pass().await.unwrap();
    assert_eq!(pass.created, 0);
    assert!(api.requests().is_empty(), "{:?}", api.requests());

    // Leading, with slices of 16 chips for a job whose slice uses 8: the job fails.
    plane.leading.store(true, Ordering::SeqCst);
    controller.pass().await.unwrap();
    let failed = plane.failed.lock().unwrap().clone();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].1.contains("uses 8 devices") && failed[0].1.contains("have 16 chips"), "{failed:?}");
    assert!(api.requests().is_empty(), "{:?}", api.requests());
}

#[tokio::test]
async fn declared_jobs_are_submitted_once_and_stopped_when_their_declaration_goes() {
    let api = MockApi::start().await;
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
