//! The controller inside a coordinator node, against a Kubernetes API server on loopback
//! (`kube-mock`), with simulated workers standing in for the pods' processes.

use crate::common::*;
use crate::sim::{self, SimOptions};
use client::JobState;
use controller::{Controller, ControllerConfig, Policy, Resources, TpuSlice, WorkerTemplate};
use coordinator::kubernetes::Plane;
use k8s_openapi::api::core::v1::Secret;
use kube_mock::MockApi;
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "train";

fn live_pods(api: &MockApi) -> Vec<String> {
    api.list("pods", NS)
        .into_iter()
        .filter(|(_, p)| p["metadata"]["deletionTimestamp"].is_null())
        .map(|(name, _)| name)
        .collect()
}

/// The chart's workers Service, which owns every job object.
fn install(api: &MockApi) {
    api.put(
        "services",
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "podctl-workers", "namespace": NS },
            "spec": { "clusterIP": "None" }
        }),
    );
}

/// One-chip slices, so the test spec's mesh (ici 1x1) fits.
fn template(coordinator: &str) -> WorkerTemplate {
    let slice = TpuSlice::new("tpu-v6e-slice", "1x1", None).unwrap();
    WorkerTemplate {
        namespace: NS.into(),
        instance: "podctl".into(),
        image: "ghcr.io/podctl/podctl-worker:0.1.0".into(),
        coordinator: coordinator.into(),
        resources: Resources::for_slice(&slice).unwrap(),
        slice,
        spot: true,
        grace_period_seconds: 30,
        host_network: false,
        service_account: None,
        subdomain: "podctl-workers".into(),
        tls_secret: None,
    }
}

fn opts() -> SimOptions {
    SimOptions {
        step_time: Duration::from_millis(30),
        heartbeat: Duration::from_millis(200),
        total_steps: 100_000,
        checkpoint_every: 0,
        late_saves: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_is_a_preemption_and_its_slice_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (node, addr) = embedded(dir.path(), None, false).await;
    let api = MockApi::start().await;
    install(&api);
    let config = ControllerConfig {
        template: template(&addr),
        resync: Duration::from_millis(200),
        policy: Policy::default(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = Controller::new(api.client(NS), config, Arc::new(Plane(node.ctx())));
    let controller = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));

    let admin = client(vec![addr], ADMIN, None);
    let job = admin.submit(&submit_request(spec("kube", 2, 100_000, None, dir.path()))).await.unwrap().job_id;
    let first = vec![format!("{job}-s0-a0-h0"), format!("{job}-s1-a0-h0")];
    eventually("the job's pods", Duration::from_secs(10), || async {
        (live_pods(&api) == first).then_some(())
    })
    .await;

    // The pods' workers authenticate with the token the controller put in the job's Secret.
    let secret: Secret =
        serde_json::from_value(api.list("secrets", NS)[&format!("{job}-token")].clone()).unwrap();
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    let wc = admin.with_token(&token).unwrap();
    let spawn = |pod: &str| tokio::spawn(sim::run(wc.clone(), job.clone(), pod.to_string(), opts()));
    let _a = spawn(&first[0]);
    let b = spawn(&first[1]);
    eventually("step 5", Duration::from_secs(30), || async {
        (admin.get_job(&job).await.ok()?.step >= 5).then_some(())
    })
    .await;

    // GKE deletes the pod of slice 1 (its Spot VM is going away).
    api.delete("pods", NS, &first[1]);
    let status = eventually("generation 2", Duration::from_secs(10), || async {
        let s = admin.get_job(&job).await.ok()?;
        (s.generation >= 2).then_some(s)
    })
    .await;
    let recovery = status.events.iter().find(|e| e.kind == "recovery").expect("a recovery event");
    assert!(
        recovery.detail.contains("preempted")
            && recovery.detail.contains(&format!("pod {} is being deleted", first[1])),
        "{recovery:?}"
    );
    // The slice's worker was told to stop; its replacement pod is there.
    let told = b.await.unwrap();
    assert!(told.stop_reason.contains("removed"), "{}", told.stop_reason);
    let replacement = format!("{job}-s1-a1-h0");
    eventually("the replacement pod", Duration::from_secs(10), || async {
        live_pods(&api).contains(&replacement).then_some(())
    })
    .await;

    // Its worker joins: a generation with both slices again, and training goes on.
    let _c = spawn(&replacement);
    let before = admin.get_job(&job).await.unwrap().step;
    eventually("both slices training again", Duration::from_secs(30), || async {
        let s = admin.get_job(&job).await.ok()?;
        let members = s.slices.iter().filter(|s| !s.virtual_ranks.is_empty()).count();
        (s.state == Some(JobState::Running) && members == 2 && s.step > before + 3).then_some(())
    })
    .await;

    // Stopped: the pods and the token Secret go.
    admin.stop_job(&job).await.unwrap();
    eventually("the pods deleted", Duration::from_secs(10), || async {
        live_pods(&api).is_empty().then_some(())
    })
    .await;
    eventually("the secret deleted", Duration::from_secs(10), || async {
        api.list("secrets", NS).is_empty().then_some(())
    })
    .await;
    let creates: Vec<String> = api.requests().into_iter().filter(|r| r.starts_with("POST pods/")).collect();
    assert_eq!(creates.len(), 3, "every pod created once: {creates:?}");
    stop.send(()).unwrap();
    controller.await.unwrap();
    node.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_laptop_reaches_the_coordinator_through_port_forwards_with_tls() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus, Service, ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    let dir = tempfile::tempdir().unwrap();
    let peer_name = "podctl-0.podctl-peers.train.svc";
    let files = coordinator::tls::create_dev_ca(&dir.path().join("certs"), &[peer_name.into()]).unwrap();
    let (node, addr) = embedded(dir.path(), Some(files.clone()), false).await;

    // What the chart installs, as far as `remote::connect` reads it.
    let api = MockApi::start().await;
    let labels = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let meta = |name: &str, l: BTreeMap<String, String>, a: BTreeMap<String, String>| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        labels: Some(l),
        annotations: Some(a),
        ..Default::default()
    };
    let selector: BTreeMap<String, String> =
        labels(&[("app.kubernetes.io/name", "podctl"), ("app.kubernetes.io/component", "coordinator")]);
    api.put(
        "services",
        Service {
            metadata: meta(
                "podctl",
                labels(&[("app.kubernetes.io/name", "podctl"), ("app.kubernetes.io/component", "client")]),
                labels(&[
                    ("podctl.dev/peers-service", "podctl-peers"),
                    ("podctl.dev/tls-secret", "podctl-tls"),
                    ("podctl.dev/admin-token-secret", "podctl-admin-token"),
                ]),
            ),
            spec: Some(ServiceSpec {
                selector: Some(selector.clone()),
                ports: Some(vec![ServicePort {
                    name: Some("grpc".into()),
                    port: 7001,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        },
    );
    let ready = PodCondition { type_: "Ready".into(), status: "True".into(), ..Default::default() };
    api.put(
        "pods",
        Pod {
            metadata: meta("podctl-0", selector, BTreeMap::new()),
            spec: None,
            status: Some(PodStatus { conditions: Some(vec![ready]), ..Default::default() }),
        },
    );
    let secret = |name: &str, key: &str, value: Vec<u8>| Secret {
        metadata: meta(name, BTreeMap::new(), BTreeMap::new()),
        data: Some(BTreeMap::from([(key.to_string(), ByteString(value))])),
        ..Default::default()
    };
    api.put("secrets", secret("podctl-tls", "ca.pem", std::fs::read(&files.ca).unwrap()));
    api.put("secrets", secret("podctl-admin-token", "token", ADMIN.as_bytes().to_vec()));
    api.forward(NS, "podctl-0", addr.parse().unwrap());

    let remote = controller::remote::connect(api.client(NS), NS).await.unwrap();
    assert_eq!(remote.addresses, [format!("{peer_name}:7001")]);
    let tls = client::ClientTls { ca_pem: remote.ca_pem.clone().unwrap(), identity: None };
    let mut config =
        client::ClientConfig::new(remote.addresses.clone(), remote.token.clone().unwrap(), Some(tls));
    config.routes = remote.routes.clone();
    config.retry_for = Duration::from_secs(10);
    let laptop = client::Client::new(config).unwrap();
    // TLS checks the coordinator's own name through the forward; the token is the admin's.
    let submitted = laptop.submit(&submit_request(spec("remote", 1, 5, None, dir.path()))).await.unwrap();
    assert_eq!(laptop.get_job(&submitted.job_id).await.unwrap().job_id, submitted.job_id);
    node.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_job_is_submitted_once_and_its_deletion_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let (node, addr) = embedded(dir.path(), None, false).await;
    let api = MockApi::start().await;
    install(&api);
    let template = template(&addr);
    // Two controllers acting at once (a leader and one that still believes it leads) see the
    // same declaration: the state machine keeps one job per declaration.
    let mut controllers = Vec::new();
    let (stop, _) = tokio::sync::watch::channel(false);
    for _ in 0..2 {
        let config = ControllerConfig {
            template: template.clone(),
            resync: Duration::from_millis(100),
            policy: Policy::default(),
        };
        let controller = Controller::new(api.client(NS), config, Arc::new(Plane(node.ctx())));
        let mut stopped = stop.subscribe();
        controllers.push(tokio::spawn(controller.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
    }

    let declaration = controller::Declaration {
        spec_yaml: spec("declared", 2, 100_000, None, dir.path()),
        bundle_uri: "gs://bucket/runs/bundles/00ff00ff".into(),
        bundle_id: "00ff00ff".into(),
    };
    api.put("configmaps", declaration.config_map("podctl-job-declared", Some(NS), "podctl"));
    let admin = client(vec![addr], ADMIN, None);
    let job = eventually("the declared job", Duration::from_secs(10), || async {
        admin.list_jobs().await.ok()?.into_iter().find(|j| j.name == "declared")
    })
    .await;
    assert_eq!(job.state, Some(JobState::Pending));
    let pods = vec![format!("{}-s0-a0-h0", job.job_id), format!("{}-s1-a0-h0", job.job_id)];
    eventually("its pods", Duration::from_secs(10), || async { (live_pods(&api) == pods).then_some(()) })
        .await;
    // Many passes of both controllers later, still one job.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let jobs = admin.list_jobs().await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");

    // A GitOps prune: the job stops, its pods go.
    api.delete("configmaps", NS, "podctl-job-declared");
    eventually("the job stopped", Duration::from_secs(10), || async {
        (admin.get_job(&job.job_id).await.ok()?.state == Some(JobState::Stopped)).then_some(())
    })
    .await;
    eventually("the pods deleted", Duration::from_secs(10), || async {
        live_pods(&api).is_empty().then_some(())
    })
    .await;
    let _ = stop.send(true);
    for controller in controllers {
        controller.await.unwrap();
    }
    node.stop().await.unwrap();
}

/// The acceptance of issue 29: a submission that needs one slice across several hosts is
/// refused, with what works instead: on an install whose slices span hosts (every job), and a
/// spec that asks for such a slice by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_needs_one_slice_across_hosts_is_refused_at_submission() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = local_config(&dir.path().join("raft"), None);
    let mut multi_host = template("unused:1");
    multi_host.slice = TpuSlice::new("tpu-v6e-slice", "4x4", None).unwrap();
    config.kubernetes = Some(multi_host);
    let node = coordinator::Embedded::start(config).await.unwrap();
    let admin = client(vec![node.addr().to_string()], ADMIN, None);
    let e = admin.submit(&submit_request(spec("wide", 2, 10, None, dir.path()))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let message = e.to_string();
    assert!(
        message.contains("span 4 hosts")
            && message.contains("training one slice across several hosts is not built yet")
            && message.contains("what works is several single-host slices over DCN"),
        "{message}"
    );
    assert!(admin.list_jobs().await.unwrap().is_empty());

    let by_name = spec("named", 2, 10, None, dir.path()) + "runtime: { accelerator: v6e-16 }\n";
    let e = admin.submit(&submit_request(by_name)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let message = e.to_string();
    assert!(message.contains("v6e-16 is one slice of 16 chips across several hosts"), "{message}");
    assert!(message.contains("runtime.accelerator: v6e-8 and mesh.dcn: 2"), "{message}");
    node.stop().await.unwrap();
}
