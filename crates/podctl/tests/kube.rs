//! `podctl launch`, `status`, `logs` and `stop` with `--kube-context`, end to end, with no
//! cluster: a Kubernetes API server on loopback (`kube-mock`) holding what the chart installs,
//! a `podctl-coordinator` process with mutual TLS whose controller creates the worker pods in
//! it, a test kubelet that runs each pod's container as a `podctl worker` process (its Secrets
//! mounted as files, its environment and arguments from the pod spec, SIGTERM when the pod is
//! deleted), and a bucket in moto for the bundle and the checkpoints.
//!
//! podctl reaches the coordinator only through the kubeconfig: it finds the client Service,
//! port-forwards through the API server, reads the CA and the admin token from the Secrets,
//! uploads the bundle to the job's checkpoint root, and the pods fetch it from there. One pod is
//! deleted mid-run (a Spot preemption): its slice is replaced under the next attempt and the job
//! completes. Then the GitOps path: `podctl launch --render` prints a declaration that validates
//! against the Kubernetes schemas; applied, the controller submits it once; deleted, the job stops.
//! A second test freezes a worker with SIGSTOP: its slice is replaced within the lease and the
//! grace period, the frozen process is killed with its pod, and the job completes.

use client::{Client, ClientConfig};
use kube_mock::MockApi;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use test_support::{Killed, Moto, free_port, root};

const NS: &str = "train";
const CONTEXT: &str = "gke-test";
const ADMIN: &str = "kube-test-admin-token-0123456789";
const STEPS: u64 = 20;
/// The coordinators' own names, as the chart's peers Service makes them.
const COORDINATOR_NAME: &str = "podctl-0.podctl-peers.train.svc";

fn plugin() -> PathBuf {
    root().join(".venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

/// What every process gets to reach the bucket (Workload Identity stands in for this on GKE).
fn aws_env(command: &mut Command, s3: u16) {
    command
        .env("AWS_ENDPOINT", format!("http://127.0.0.1:{s3}"))
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1");
}

fn meta(name: &str, labels: Value, annotations: Value) -> Value {
    json!({ "name": name, "namespace": NS, "labels": labels, "annotations": annotations })
}

fn secret(name: &str, files: &[(&str, Vec<u8>)]) -> Value {
    let data: BTreeMap<&str, k8s_openapi::ByteString> =
        files.iter().map(|(k, v)| (*k, k8s_openapi::ByteString(v.clone()))).collect();
    json!({ "apiVersion": "v1", "kind": "Secret", "metadata": meta(name, json!({}), json!({})), "data": data })
}

/// What the chart installs, as far as podctl and the controller read it.
fn install(api: &MockApi, tls: &coordinator::TlsFiles) {
    api.put_namespace(NS, &[("pod-security.kubernetes.io/enforce", "baseline")]);
    api.put(
        "services",
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": meta("podctl-workers", json!({}), json!({})),
            "spec": { "clusterIP": "None" }
        }),
    );
    let selector = json!({
        "app.kubernetes.io/name": "podctl",
        "app.kubernetes.io/instance": "podctl",
        "app.kubernetes.io/component": "coordinator"
    });
    api.put(
        "services",
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": meta(
                "podctl",
                json!({ "app.kubernetes.io/name": "podctl", "app.kubernetes.io/component": "client" }),
                json!({
                    "podctl.dev/peers-service": "podctl-peers",
                    "podctl.dev/tls-secret": "podctl-tls",
                    "podctl.dev/admin-token-secret": "podctl-admin-token"
                }),
            ),
            "spec": { "selector": selector, "ports": [{ "name": "grpc", "port": 7001 }] }
        }),
    );
    api.put(
        "pods",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": meta("podctl-0", selector, json!({})),
            "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] }
        }),
    );
    let read = |p: &Path| std::fs::read(p).unwrap();
    api.put(
        "secrets",
        secret(
            "podctl-tls",
            &[
                ("ca.pem", read(&tls.ca)),
                ("server.pem", read(&tls.server_cert)),
                ("server.key", read(&tls.server_key)),
                ("peer.pem", read(&tls.peer_cert)),
                ("peer.key", read(&tls.peer_key)),
            ],
        ),
    );
    api.put(
        "secrets",
        secret(
            "podctl-worker-tls",
            &[
                ("ca.pem", read(&tls.ca)),
                ("client.pem", read(&tls.client_cert)),
                ("client.key", read(&tls.client_key)),
            ],
        ),
    );
    api.put("secrets", secret("podctl-admin-token", &[("token", ADMIN.as_bytes().to_vec())]));
}

/// Runs each pod's container as a process, as a kubelet would: Secret volumes become files (the
/// keys their `items` name, or all), `emptyDir` volumes empty directories, mount paths in the
/// arguments and environment their local directories, `fieldRef` variables are filled in, a pod
/// being deleted gets SIGTERM, SIGKILL past its `terminationGracePeriodSeconds`, and is removed
/// once its process has exited; a process that exits on its own ends its pod (Succeeded, or
/// Failed with its container's exit code).
struct Kubelet {
    api: Arc<MockApi>,
    dir: PathBuf,
    s3: u16,
    /// Each running pod's process, when it got SIGTERM, and its grace period.
    running: BTreeMap<String, (Child, Option<Instant>, Duration)>,
    started: Vec<String>,
    /// Every started pod's `terminationGracePeriodSeconds`.
    grace_periods: BTreeMap<String, u64>,
}

impl Kubelet {
    fn tick(&mut self) {
        let pods = self.api.list("pods", NS);
        for (name, pod) in &pods {
            let worker = pod["metadata"]["labels"]["app.kubernetes.io/component"] == "worker";
            if !worker || self.started.contains(name) || !pod["metadata"]["deletionTimestamp"].is_null() {
                continue;
            }
            let child = self.start(name, pod);
            self.api.set_pod_status(NS, name, "Running", None);
            let grace = pod["spec"]["terminationGracePeriodSeconds"].as_u64().expect("a grace period");
            self.grace_periods.insert(name.clone(), grace);
            self.running.insert(name.clone(), (child, None, Duration::from_secs(grace)));
            self.started.push(name.clone());
        }
        let mut ended = Vec::new();
        for (name, (child, terminated, grace)) in self.running.iter_mut() {
            let deleting = pods.get(name).is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null());
            match terminated {
                None if deleting => {
                    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
                    *terminated = Some(Instant::now());
                }
                Some(at) if at.elapsed() > *grace => {
                    let _ = child.kill();
                }
                _ => {}
            }
            if let Ok(Some(status)) = child.try_wait() {
                use std::os::unix::process::ExitStatusExt;
                let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
                ended.push((name.clone(), deleting, code));
            }
        }
        for (name, deleting, code) in ended {
            self.running.remove(&name);
            if deleting || !pods.contains_key(&name) {
                self.api.remove("pods", NS, &name);
            } else {
                self.api.set_container_exit(NS, &name, code, if code == 0 { "Completed" } else { "Error" });
            }
        }
    }

    fn start(&self, name: &str, pod: &Value) -> Child {
        let here = self.dir.join(name);
        let secrets = self.api.list("secrets", NS);
        let mut mounts = BTreeMap::new();
        for volume in pod["spec"]["volumes"].as_array().unwrap() {
            let dir = here.join(volume["name"].as_str().unwrap());
            std::fs::create_dir_all(&dir).unwrap();
            mounts.insert(volume["name"].as_str().unwrap().to_string(), dir.clone());
            if volume.get("emptyDir").is_some() {
                continue;
            }
            let secret: k8s_openapi::api::core::v1::Secret =
                serde_json::from_value(secrets[volume["secret"]["secretName"].as_str().unwrap()].clone())
                    .unwrap();
            let mut data = secret.data.unwrap();
            match volume["secret"]["items"].as_array() {
                // Only the keys the volume names, at their paths (a missing one fails the pod).
                Some(items) => {
                    for item in items {
                        let value =
                            data.remove(item["key"].as_str().unwrap()).expect("a projected key exists");
                        std::fs::write(dir.join(item["path"].as_str().unwrap()), value.0).unwrap();
                    }
                }
                None => {
                    for (key, value) in data {
                        std::fs::write(dir.join(key), value.0).unwrap();
                    }
                }
            }
        }
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["command"], json!(["podctl"]));
        let paths: Vec<(String, String)> = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let local = mounts[m["name"].as_str().unwrap()].display().to_string();
                (m["mountPath"].as_str().unwrap().to_string(), local)
            })
            .collect();
        let local = |value: &str| -> String {
            for (path, local) in &paths {
                if let Some(rest) = value.strip_prefix(path.as_str()) {
                    return format!("{local}{rest}");
                }
            }
            value.to_string()
        };
        let args: Vec<String> =
            container["args"].as_array().unwrap().iter().map(|a| local(a.as_str().unwrap())).collect();
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_podctl"));
        command.arg("--log").arg("info").args(&args).env_clear().env("PATH", std::env::var("PATH").unwrap());
        for var in container["env"].as_array().unwrap() {
            let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => name.to_string(),
                Some("metadata.namespace") => NS.to_string(),
                Some("status.podIP") => "127.0.0.1".to_string(),
                Some(other) => panic!("the test kubelet does not know fieldRef {other}"),
                None => local(var["value"].as_str().unwrap()),
            };
            command.env(var["name"].as_str().unwrap(), value);
        }
        // What the worker image sets. The pod's own variables put the bundle cache on its cache
        // volume (each pod fetches the bundle).
        command.env("PODCTL_PJRT_PLUGIN", plugin());
        aws_env(&mut command, self.s3);
        command.stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for (child, _, _) in self.running.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn podctl(kubeconfig: &Path, s3: u16) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_podctl"));
    command
        .env("PODCTL_HOME", root())
        .env("PODCTL_CACHE", root().join("target/test-cache"))
        .env("KUBECONFIG", kubeconfig)
        .env_remove("PODCTL_COORDINATOR")
        .env_remove("PODCTL_TOKEN");
    aws_env(&mut command, s3);
    command
}

/// A 2-slice job whose checkpoints (and bundle) go to the bucket.
fn job_spec(dir: &Path, name: &str, steps: u64) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text = format!(
        "name: {name}\nmodel: tiny\nmesh: {{ dcn: 2, ici: {{ fsdp: 2, tp: 1 }} }}\n\
         batch: {{ global: 16, micro: 4 }}\nseq_len: 128\nsteps: {steps}\nseed: 3\n\
         data: {{ kind: arithmetic }}\ncheckpoint: {{ every: 10, uri: s3://ckpt/runs/kube }}\noutput: {}\n",
        dir.join(name).display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `kubernetes-validate --strict` of manifests, as the chart's tests do (crates/controller).
fn validate(manifests: &str) -> String {
    let mut child = Command::new(root().join(".venv/bin/kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.32", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubernetes-validate is in .venv: run scripts/setup.sh --test");
    child.stdin.take().unwrap().write_all(manifests.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubernetes-validate:\n{text}");
    text
}

/// A log line without its terminal colours (the worker's log styles field names).
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find('\x1b') {
        out.push_str(&rest[..at]);
        let end = rest[at..].find('m').map_or(rest.len(), |m| at + m + 1);
        rest = &rest[end..];
    }
    out + rest
}

fn output(command: &mut Command) -> (bool, String, String) {
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The chart's objects in the mock API server, one coordinator process with the chart's flags,
/// the test kubelet ticking, and a bucket in moto; torn down when dropped.
struct Cluster {
    _moto: Moto,
    _coordinator: Killed,
    api: Arc<MockApi>,
    s3: u16,
    addr: String,
    kubeconfig: PathBuf,
    tls: coordinator::TlsFiles,
    kubelet: Arc<std::sync::Mutex<Kubelet>>,
    stop: Arc<AtomicBool>,
    ticking: Option<std::thread::JoinHandle<()>>,
}

impl Cluster {
    async fn start(dir: &Path, lease_ms: u64) -> Cluster {
        let moto = Moto::with_bucket("ckpt");
        let s3 = moto.port();
        let tls = coordinator::tls::create_dev_ca(&dir.join("tls"), &[COORDINATOR_NAME.into()]).unwrap();
        let api = Arc::new(MockApi::start().await);
        install(&api, &tls);
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig_yaml(CONTEXT, NS)).unwrap();

        // One coordinator with the chart's flags (the controller on; `podctl coordinator` is what
        // the chart's `podctl-coordinator` runs), told about the API server by the kubeconfig
        // instead of a service account. Slices of 2 chips (the test's mesh), so the worker pods'
        // resources are named.
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut coordinator = Command::new(env!("CARGO_BIN_EXE_podctl"));
        coordinator
            .arg("coordinator")
            .args(["--id", "1", "--listen", &addr, "--peers", &format!("1={addr}"), "--data-dir"])
            .arg(dir.join("raft"))
            .arg("--tls-dir")
            .arg(dir.join("tls"))
            .args(["--lease-ms", &lease_ms.to_string(), "--heartbeat-ms", "500"])
            .args(["--kubernetes", "--kube-namespace", NS, "--kube-instance", "podctl"])
            .args(["--kube-worker-image", "podctl-worker:test", "--kube-coordinator-address", &addr])
            .args([
                "--kube-worker-subdomain",
                "podctl-workers",
                "--kube-worker-tls-secret",
                "podctl-worker-tls",
            ])
            .args(["--kube-tpu-accelerator", "tpu-v6e-slice", "--kube-tpu-topology", "1x2", "--kube-spot"])
            .args(["--kube-worker-cpu", "2", "--kube-worker-memory", "8Gi"])
            .env("KUBECONFIG", &kubeconfig)
            .env("PODCTL_ADMIN_TOKEN", ADMIN)
            .env("RUST_LOG", "info,openraft=warn,h2=warn,hyper=warn,tower=warn,kube=warn")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("coordinator.log")).unwrap());
        aws_env(&mut coordinator, s3);
        let mut coordinator = Killed(coordinator.spawn().unwrap());
        let mut line = String::new();
        BufReader::new(coordinator.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("listening on "), "the coordinator printed {line:?}");
        api.forward(NS, "podctl-0", addr.parse().unwrap());

        let kubelet = Arc::new(std::sync::Mutex::new(Kubelet {
            api: api.clone(),
            dir: dir.join("pods"),
            s3,
            running: BTreeMap::new(),
            started: Vec::new(),
            grace_periods: BTreeMap::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let ticking = {
            let (kubelet, stop) = (kubelet.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    kubelet.lock().unwrap().tick();
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Cluster {
            _moto: moto,
            _coordinator: coordinator,
            api,
            s3,
            addr,
            kubeconfig,
            tls,
            kubelet,
            stop,
            ticking: Some(ticking),
        }
    }

    /// The test's own client of the coordinator (mutual TLS, the admin token).
    fn admin(&self) -> Client {
        Client::new(ClientConfig::new(
            vec![self.addr.clone()],
            ADMIN,
            Some(coordinator::tls::client_tls(&self.tls).unwrap()),
        ))
        .unwrap()
    }

    /// `podctl launch` of `spec` through the kubeconfig, started; the job's id once submitted.
    fn launch(&self, spec: &Path, err: &Path) -> (Child, BufReader<std::process::ChildStdout>, String) {
        let mut launch = podctl(&self.kubeconfig, self.s3)
            .args(["launch"])
            .arg(spec)
            .args(["--kube-context", CONTEXT])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(err).unwrap())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(launch.stdout.take().unwrap());
        let mut printed = String::new();
        let job = loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "launch printed no job line:\n{printed}");
            printed.push_str(&line);
            if line.starts_with("job ") && line.contains(" submitted") {
                break line.split_whitespace().nth(1).unwrap().to_string();
            }
        };
        (launch, stdout, job)
    }

    /// Pods created (201) so far, in order.
    fn created_pods(&self) -> Vec<String> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.starts_with("POST pods/") && r.ends_with(" 201"))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(ticking) = self.ticking.take() {
            let _ = ticking.join();
        }
    }
}

/// Waits for `launch` to end; its status and what it printed after the job line.
async fn finished(
    launch: Child,
    mut stdout: BufReader<std::process::ChildStdout>,
) -> (std::process::ExitStatus, String) {
    let status = tokio::task::spawn_blocking(move || {
        let mut launch = launch;
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        (launch.wait().unwrap(), rest)
    });
    tokio::time::timeout(Duration::from_secs(400), status).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_status_logs_and_stop_through_a_kubeconfig_with_a_preemption() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let cluster = Cluster::start(dir, 3000).await;
    let (api, s3, kubeconfig, kubelet) = (&cluster.api, cluster.s3, &cluster.kubeconfig, &cluster.kubelet);

    // A context that is not there names the ones that are.
    let (ok, _, err) = output(podctl(kubeconfig, s3).args(["status", "--kube-context", "nope"]));
    assert!(!ok && err.contains("no context 'nope'") && err.contains(CONTEXT), "{err}");
    // Kubernetes workers cannot read a bundle on this machine: the checkpoint root must be a bucket.
    let local = dir.join("local.yaml");
    std::fs::write(
        &local,
        "name: local\nmodel: tiny\nmesh: { dcn: 2, ici: { fsdp: 2, tp: 1 } }\nbatch: { global: 16, micro: 4 }\n\
         seq_len: 128\nsteps: 5\ndata: { kind: arithmetic }\n",
    )
    .unwrap();
    let (ok, _, err) =
        output(podctl(kubeconfig, s3).arg("launch").arg(&local).args(["--kube-context", CONTEXT]));
    assert!(!ok && err.contains("job spec field `checkpoint`") && err.contains("gs://"), "{err}");

    let spec = job_spec(dir, "kube", STEPS);
    let (launch, stdout, job) = cluster.launch(&spec, &dir.join("launch.err"));
    // The test watches the job directly (mutual TLS, the admin token).
    let admin = cluster.admin();
    let started = Instant::now();
    while admin.get_job(&job).await.map(|s| s.step).unwrap_or(0) < 6 {
        assert!(started.elapsed() < Duration::from_secs(300), "the pods' workers did not reach step 6");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Spot preemption: GKE deletes the pod of slice 1.
    api.delete("pods", NS, &format!("{job}-s1-a0-h0"));

    let (status, rest) = finished(launch, stdout).await;
    let launch_err = std::fs::read_to_string(dir.join("launch.err")).unwrap();
    assert!(status.success(), "launch failed:\n{rest}\n{launch_err}");
    assert!(rest.contains(&format!("done: {STEPS} steps")), "{rest}");
    assert!(launch_err.contains("bundle uploaded to s3://ckpt/runs/kube/bundles/"), "{launch_err}");
    // The recovery names the preemption, heard first from the worker (its SIGTERM notice) or
    // from the controller (the pod being deleted): either is the same event.
    assert!(
        launch_err.lines().any(|l| l.contains(": recovery generation") && l.contains(" preempted (")),
        "{launch_err}"
    );

    // Every pod was created once: two slices, then the preempted slice's next attempt.
    assert_eq!(
        cluster.created_pods(),
        [
            format!("POST pods/{job}-s0-a0-h0 201"),
            format!("POST pods/{job}-s1-a0-h0 201"),
            format!("POST pods/{job}-s1-a1-h0 201")
        ]
    );

    let context = ["--kube-context", CONTEXT];
    let (ok, out, err) = output(podctl(kubeconfig, s3).args(["status", &job, "--json"]).args(context));
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["state"].as_str(), v["step"].as_u64()), (Some("completed"), Some(STEPS)), "{v}");
    let (ok, out, err) = output(podctl(kubeconfig, s3).args(["logs", &job, "--slice", "1"]).args(context));
    assert!(ok, "{err}");
    // Slice 1's lines only, and a second worker process of slice 1 among them: the replacement
    // (which compiles before it registers, so the survivor may finish the job alone meanwhile)
    // or the deleted pod's process registering again (the mock does not kill it at once).
    let registered_again = out.contains(&format!(" s1 {job}.w3 g"));
    let replacement_compiling = out.matches("compiling the job's bundle").count() >= 2;
    assert!((registered_again || replacement_compiling) && !out.contains(" s0 "), "{out}");
    // The preempted pod's worker left on SIGTERM with its pod's grace period as its deadline
    // (the default 15 s, GKE's share of a Spot VM's notice for user pods).
    let grace = kubelet.lock().unwrap().grace_periods[&format!("{job}-s1-a0-h0")];
    assert_eq!(grace, 15);
    let log = std::fs::read_to_string(dir.join(format!("pods/{job}-s1-a0-h0.log"))).unwrap();
    let notice = log.lines().find(|l| l.contains("SIGTERM: leaving the job")).map(plain);
    assert!(
        notice.as_ref().is_some_and(|l| l.contains(&format!(" deadline={grace}s"))),
        "{notice:?} in\n{log}"
    );
    // Every pod fetched the bundle from the bucket (its own output, as `kubectl logs` shows it;
    // the coordinator's copy of worker logs is best effort).
    for pod in ["s0-a0-h0", "s1-a0-h0", "s1-a1-h0"] {
        let log = std::fs::read_to_string(dir.join(format!("pods/{job}-{pod}.log"))).unwrap();
        assert!(log.contains("fetched the bundle from s3://ckpt/runs/kube/bundles/"), "{pod}:\n{log}");
    }
    let (ok, out, err) = output(podctl(kubeconfig, s3).args(["stop", &job]).args(context));
    assert!(ok, "{err}");
    assert_eq!(out.trim(), format!("{job}: completed"));

    // GitOps: the job as a manifest (its bundle is in the bucket already: nothing is uploaded),
    // valid against the Kubernetes schemas like the chart's; applied, the leader submits it once
    // and creates its pods; deleted, its job stops and the pods go.
    // The same job continued for 10 more steps (same root and seed: it resumes from the first
    // job's final checkpoint; with the same steps it would be done at once, with no pods).
    let gitops = job_spec(dir, "gitops", STEPS + 10);
    let (ok, manifest, err) = output(podctl(kubeconfig, s3).arg("launch").arg(&gitops).arg("--render"));
    assert!(ok, "{err}");
    assert!(!err.contains("bundle uploaded"), "{err}");
    let report = validate(&manifest);
    assert!(report.contains("passed for resource configmap/podctl-job-gitops"), "{report}");
    let mut declaration: Value = serde_json::from_str(&manifest).unwrap();
    declaration["metadata"]["namespace"] = json!(NS);
    api.put("configmaps", declaration);
    let started = Instant::now();
    let declared = loop {
        let jobs = admin.list_jobs().await.unwrap();
        if let Some(job) = jobs.iter().find(|j| j.name == "gitops") {
            break job.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the declaration was not submitted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        declared.events.iter().any(
            |e| e.kind == "submitted" && e.detail.starts_with("declared by configmap/podctl-job-gitops/")
        ),
        "{declared:?}"
    );
    let gitops = declared.job_id.clone();
    let first_pod = format!("POST pods/{gitops}-s0-a0-h0 201");
    while !api.requests().contains(&first_pod) {
        assert!(started.elapsed() < Duration::from_secs(60), "no pods for the declared job");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api.delete("configmaps", NS, "podctl-job-gitops");
    while admin.get_job(&gitops).await.unwrap().state != Some(client::JobState::Stopped) {
        assert!(started.elapsed() < Duration::from_secs(90), "deleting the declaration did not stop its job");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let jobs = admin.list_jobs().await.unwrap();
    assert_eq!(jobs.iter().filter(|j| j.name == "gitops").count(), 1, "submitted once");
    while api
        .list("pods", NS)
        .iter()
        .any(|(name, p)| name.starts_with(&gitops) && p["metadata"]["deletionTimestamp"].is_null())
    {
        assert!(started.elapsed() < Duration::from_secs(90), "the stopped job's pods stay");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The acceptance of issue 29: a worker frozen with SIGSTOP (alive to the kubelet, silent to the
/// coordinator) has its slice replaced within the lease plus the grace period, its pod and the
/// frozen process go, and the job goes on to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_s_slice_is_replaced_within_its_lease_and_grace_period() {
    const LEASE: Duration = Duration::from_secs(3);
    const STEPS: u64 = 30;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let cluster = Cluster::start(dir, LEASE.as_millis() as u64).await;
    let (launch, stdout, job) = cluster.launch(&job_spec(dir, "frozen", STEPS), &dir.join("launch.err"));
    let admin = cluster.admin();
    let started = Instant::now();
    while admin.get_job(&job).await.map(|s| s.step).unwrap_or(0) < 4 {
        assert!(started.elapsed() < Duration::from_secs(300), "the pods' workers did not reach step 4");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let frozen = format!("{job}-s1-a0-h0");
    let pid = cluster.kubelet.lock().unwrap().running[&frozen].0.id();
    assert!(Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
    let stopped = Instant::now();
    let replacement = format!("POST pods/{job}-s1-a1-h0 201");
    while !cluster.created_pods().contains(&replacement) {
        assert!(stopped.elapsed() < Duration::from_secs(60), "slice 1 was never replaced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let replaced_after = stopped.elapsed();
    let grace = Duration::from_secs(cluster.kubelet.lock().unwrap().grace_periods[&frozen]);
    assert!(
        replaced_after <= LEASE + grace,
        "replaced {replaced_after:?} after the freeze; the lease ({LEASE:?}) and grace period ({grace:?}) allow less"
    );
    // The frozen pod is deleted: SIGTERM cannot wake it, SIGKILL after its grace period does.
    while cluster.api.list("pods", NS).contains_key(&frozen) {
        assert!(stopped.elapsed() < LEASE + 3 * grace, "the frozen pod stays");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (status, rest) = finished(launch, stdout).await;
    let launch_err = std::fs::read_to_string(dir.join("launch.err")).unwrap();
    assert!(status.success(), "launch failed:\n{rest}\n{launch_err}");
    assert!(rest.contains(&format!("done: {STEPS} steps")), "{rest}");
    // The recovery names the silence; the other slice never stopped.
    let events = admin.get_job(&job).await.unwrap().events;
    assert!(events.iter().any(|e| e.kind == "recovery" && e.detail.contains("lease expired")), "{events:#?}");
    assert_eq!(
        cluster.created_pods(),
        [format!("POST pods/{job}-s0-a0-h0 201"), format!("POST pods/{job}-s1-a0-h0 201"), replacement]
    );
    println!("slice 1 replaced {replaced_after:?} after its worker froze (lease {LEASE:?}, grace {grace:?})");
}
