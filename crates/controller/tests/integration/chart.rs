//! The Helm chart and the controller's manifests against the Kubernetes API schemas.
//!
//! helm is the pinned one `scripts/install-helm.sh` puts in `.tools/`; `kubernetes-validate`
//! (PyPI, pinned in `scripts/requirements/kubernetes.txt`) is in `.venv/`. `scripts/setup.sh`
//! installs both; these tests fail, naming it, when they are missing.

use controller::{DesiredJob, TpuSlice, WorkerTemplate};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The Kubernetes version manifests are validated against (the chart's `kubeVersion` floor).
const KUBERNETES: &str = "1.32";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tool(relative: &str) -> PathBuf {
    let path = root().join(relative);
    assert!(path.exists(), "{} is missing: run scripts/setup.sh", path.display());
    path
}

fn helm() -> Command {
    let mut command = Command::new(tool(".tools/helm-4.1.4/helm"));
    // Nothing from the user's helm or kube configuration.
    let home = tempfile::tempdir().unwrap().keep();
    command.env("HELM_CONFIG_HOME", &home).env("HELM_CACHE_HOME", &home).env("HELM_DATA_HOME", &home);
    command.env("KUBECONFIG", home.join("none"));
    command.current_dir(root());
    command
}

fn check(what: &str, output: &Output) -> String {
    let text =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{what} failed:\n{text}");
    text
}

fn validate(what: &str, manifests: &str) -> String {
    let mut child = Command::new(tool(".venv/bin/kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", KUBERNETES, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(manifests.as_bytes()).unwrap();
    check(&format!("kubernetes-validate of {what}"), &child.wait_with_output().unwrap())
}

fn template(values: Option<&str>) -> String {
    let mut command = helm();
    command.args(["template", "podctl", "charts/podctl", "--namespace", "train"]);
    if let Some(values) = values {
        command.args(["--values", values]);
    }
    check("helm template", &command.output().unwrap())
}

const VALUES: [Option<&str>; 2] = [None, Some("charts/podctl/ci/multihost-values.yaml")];

#[test]
fn the_chart_lints_strictly() {
    for values in VALUES {
        let mut command = helm();
        command.args(["lint", "--strict", "charts/podctl"]);
        if let Some(values) = values {
            command.args(["--values", values]);
        }
        let text = check("helm lint --strict", &command.output().unwrap());
        assert!(text.contains("0 chart(s) failed"), "{text}");
    }
}

#[test]
fn the_rendered_chart_validates_strictly() {
    for values in VALUES {
        let rendered = template(values);
        let report = validate(&format!("the chart with {values:?}"), &rendered);
        for kind in [
            "statefulset/podctl",
            "service/podctl-peers",
            "service/podctl",
            "service/podctl-workers",
            "role/podctl",
            "rolebinding/podctl",
            "serviceaccount/podctl",
            "serviceaccount/podctl-worker",
            "poddisruptionbudget/podctl",
            "networkpolicy/podctl",
        ] {
            assert!(
                report.contains(&format!("passed for resource {kind} ")),
                "{kind} not validated:\n{report}"
            );
        }
    }
}

#[test]
fn the_chart_wires_the_controller_to_its_own_objects() {
    let rendered = template(Some("charts/podctl/ci/multihost-values.yaml"));
    for arg in [
        "--kubernetes",
        "--kube-worker-subdomain=podctl-workers",
        "--kube-coordinator-address=podctl.train.svc:7001",
        "--kube-worker-service-account=podctl-worker",
        "--kube-worker-tls-secret=podctl-worker-tls",
        "--kube-tpu-topology=4x4",
        "--kube-tpu-chips-per-host=4",
        "--peers=1=podctl-0.podctl-peers.train.svc:7001,2=podctl-1.podctl-peers.train.svc:7001,3=podctl-2.podctl-peers.train.svc:7001",
    ] {
        assert!(rendered.contains(&format!("- {arg}\n")), "the StatefulSet lacks {arg}:\n{rendered}");
    }
    assert!(!rendered.contains("--kube-spot"), "spot is off in the multi-host values");
    assert!(rendered.contains("iam.gke.io/gcp-service-account: podctl@my-project.iam.gserviceaccount.com"));
}

#[test]
fn worker_manifests_validate_like_the_chart() {
    for (topology, slices) in [("2x4", 2), ("4x4", 2)] {
        let template = WorkerTemplate {
            namespace: "train".into(),
            instance: "podctl".into(),
            image: "ghcr.io/podctl/podctl-worker:0.1.0".into(),
            coordinator: "podctl.train.svc:7001".into(),
            slice: TpuSlice::new("tpu-v6e-slice", topology, None).unwrap(),
            spot: true,
            grace_period_seconds: 30,
            service_account: Some("podctl-worker".into()),
            subdomain: "podctl-workers".into(),
            tls_secret: Some("podctl-tls".into()),
        };
        let job = DesiredJob {
            id: "llm-3".into(),
            running: true,
            slices,
            devices_per_slice: template.slice.chips(),
            worker_token: "a-worker-token".into(),
            registrations: vec![],
        };
        let rendered = template.render(&job);
        let report = validate(&format!("the worker pods of {topology}"), &rendered);
        let pods = slices * template.slice.hosts();
        assert_eq!(report.matches("passed for resource pod/").count() as u32, pods, "{report}");
        assert!(report.contains("passed for resource secret/llm-3-token"), "{report}");
    }
}

#[test]
fn the_worker_image_installs_the_pinned_libtpu() {
    let read = |relative: &str| std::fs::read_to_string(root().join(relative)).unwrap();
    let lock = read("models/requirements.lock");
    let pin = lock.lines().find(|l| l.starts_with("libtpu==")).expect("libtpu is pinned");
    let dockerfile = read("deploy/worker.Dockerfile");
    assert!(
        dockerfile.contains(&format!(" {pin}\n")),
        "deploy/worker.Dockerfile must install {pin}, the pin of models/requirements.lock"
    );
    // The plugin the worker loads when the pod names none.
    assert!(dockerfile.contains("PODCTL_PJRT_PLUGIN=/opt/libtpu/libtpu.so"), "{dockerfile}");
}
