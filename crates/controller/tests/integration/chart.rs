//! The Helm chart and the controller's manifests against the Kubernetes API schemas, and the
//! chart installed the way docs/gke.md installs it.
//!
//! helm is the pinned one `scripts/install-helm.sh` puts in `.tools/`; `kubernetes-validate`
//! (PyPI, pinned in `scripts/requirements/kubernetes.txt`) is in `.venv/`. `scripts/setup.sh --test`
//! installs both; these tests fail, naming it, when they are missing.
//!
//! docs/gke.md's shell blocks are read as the commands a user runs (variables assigned in them
//! are expanded, `$(...)` results are stood in for): its `helm install` flags render the chart,
//! the coordinators' `--kube-*` flags give the worker pods they would create, and those pods are
//! held to the Secrets and the identities the same page sets up.

use controller::{DesiredJob, ObjectRef, Resources, TpuSlice, WorkerTemplate};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The Kubernetes version manifests are validated against (the chart's `kubeVersion` floor).
const KUBERNETES: &str = "1.32";
/// The namespace every rendering uses.
const NS: &str = "train";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tool(relative: &str) -> PathBuf {
    let path = root().join(relative);
    assert!(path.exists(), "{} is missing: run scripts/setup.sh --test", path.display());
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

/// `helm template` of the chart with extra arguments (values files, `--set`s).
fn template(args: &[String]) -> String {
    let output = helm().args(["template", "podctl", "charts/podctl", "--namespace", NS]).args(args).output();
    check(&format!("helm template {args:?}"), &output.unwrap())
}

/// The chart's objects, by `kind/name`.
fn objects(rendered: &str) -> BTreeMap<String, Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(rendered).expect("helm renders YAML");
    docs.into_iter()
        .map(|d| (format!("{}/{}", d["kind"].as_str().unwrap(), d["metadata"]["name"].as_str().unwrap()), d))
        .collect()
}

/// docs/gke.md's shell commands, each as its words after expansion, in order.
struct Walkthrough {
    commands: Vec<Vec<String>>,
}

impl Walkthrough {
    /// Reads the ```sh blocks. Assignments (`A=x B=$A`) set variables for the commands after
    /// them; `$(...)` is replaced by `outputs[...]` (what the command would print), a heredoc's
    /// body is skipped.
    fn read(outputs: &BTreeMap<&str, &str>) -> Self {
        let text = std::fs::read_to_string(root().join("docs/gke.md")).unwrap();
        let mut blocks = Vec::new();
        let mut block: Option<String> = None;
        for line in text.lines() {
            match (&mut block, line) {
                (None, "```sh") => block = Some(String::new()),
                (Some(b), "```") => blocks.push(std::mem::take(b)),
                (Some(b), line) => {
                    b.push_str(line);
                    b.push('\n');
                }
                (None, _) => {}
            }
            if line == "```" {
                block = None;
            }
        }
        // What the reader's shell has already.
        let mut vars = BTreeMap::from([
            ("PWD".to_string(), "/podctl".to_string()),
            ("PATH".to_string(), "/usr/bin".to_string()),
        ]);
        let mut commands = Vec::new();
        for block in blocks {
            let joined = block.replace("\\\n", " ");
            let mut heredoc: Option<String> = None;
            for line in joined.lines() {
                if let Some(end) = &heredoc {
                    if line.trim() == end {
                        heredoc = None;
                    }
                    continue;
                }
                let words = split_words(line);
                if let Some(pos) = words.iter().position(|w| w.starts_with("<<")) {
                    heredoc = Some(words[pos].trim_start_matches("<<").to_string());
                }
                // `a && b`, `a; b`: separate commands.
                for command in words.split(|w| w == "&&" || w == ";") {
                    // `for NAME in a b; do ... done` runs its body once, with the first value.
                    if let [keyword, name, _in, first, ..] = command
                        && keyword == "for"
                    {
                        vars.insert(name.clone(), expand(first, &vars, outputs));
                        continue;
                    }
                    if matches!(command, [only] if only == "do" || only == "done") {
                        continue;
                    }
                    let expanded: Vec<String> = command.iter().map(|w| expand(w, &vars, outputs)).collect();
                    let assignments = expanded.iter().take_while(|w| is_assignment(w)).count();
                    if assignments == expanded.len() {
                        for a in &expanded {
                            let (name, value) = a.split_once('=').unwrap();
                            vars.insert(name.to_string(), value.to_string());
                        }
                    } else if !expanded.is_empty() {
                        commands.push(expanded);
                    }
                }
            }
        }
        Self { commands }
    }

    /// The commands that begin with these words.
    fn starting(&self, prefix: &[&str]) -> Vec<&Vec<String>> {
        self.commands
            .iter()
            .filter(|c| c.len() >= prefix.len() && c.iter().zip(prefix).all(|(a, b)| a == b))
            .collect()
    }

    /// The only command that begins with these words.
    fn one(&self, prefix: &[&str]) -> &Vec<String> {
        let found = self.starting(prefix);
        assert_eq!(found.len(), 1, "docs/gke.md should run `{}` once: {found:?}", prefix.join(" "));
        found[0]
    }

    /// Files of each Secret it creates (`kubectl ... create secret generic NAME --from-file=...`).
    fn secrets(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut secrets = BTreeMap::new();
        for command in self.starting(&["kubectl"]) {
            let Some(at) = command.windows(3).position(|w| w == ["create", "secret", "generic"]) else {
                continue;
            };
            let files: BTreeSet<String> = command
                .iter()
                .filter_map(|w| w.strip_prefix("--from-file="))
                .map(|path| {
                    assert!(!path.ends_with('/'), "a whole directory goes into a Secret: {command:?}");
                    path.rsplit('/').next().unwrap().to_string()
                })
                .collect();
            secrets.insert(command[at + 3].clone(), files);
        }
        secrets
    }

    /// Whether it grants `role` on `resource` (a bucket, a service account) to `member`.
    fn grants(&self, resource: &str, member: &str, role: &str) -> bool {
        self.commands.iter().any(|c| {
            c.iter().any(|w| w == "add-iam-policy-binding")
                && c.contains(&resource.to_string())
                && flag(c, "--member").as_deref() == Some(member)
                && flag(c, "--role").as_deref() == Some(role)
        })
    }
}

/// Splits a shell line into words: quotes group, `$(...)` stays whole (as written, for
/// [`expand`]), a `#` word starts a comment.
fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = line.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match (quote, c) {
            (_, '$') if line[at..].starts_with("$(") => {
                let end = at + 2 + matching_paren(&line[at + 2..]);
                word.get_or_insert_default().push_str(&line[at..=end]);
                while chars.peek().is_some_and(|&(i, _)| i <= end) {
                    chars.next();
                }
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, '#') if word.is_none() => break,
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    words
}

/// The index of the `)` that closes a `(` just before `text` (parentheses in quotes do not count).
fn matching_paren(text: &str) -> usize {
    let (mut depth, mut quote) = (0, None);
    for (at, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(') => depth += 1,
            (None, ')') if depth == 0 => return at,
            (None, ')') => depth -= 1,
            _ => {}
        }
    }
    panic!("unclosed $( in {text}")
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// `$VAR`, `${VAR}` and `$(command)` in a word.
fn expand(word: &str, vars: &BTreeMap<String, String>, outputs: &BTreeMap<&str, &str>) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(inner) = rest.strip_prefix('(') {
            let end = matching_paren(inner);
            let command = &inner[..end];
            let output =
                outputs.get(command).unwrap_or_else(|| panic!("no stand-in output for $({command})"));
            out.push_str(output);
            rest = &inner[end + 1..];
            continue;
        }
        let (name, after) = match rest.strip_prefix('{') {
            Some(inner) => {
                let end = inner.find('}').unwrap();
                (&inner[..end], &inner[end + 1..])
            }
            None => {
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            }
        };
        out.push_str(
            vars.get(name).unwrap_or_else(|| panic!("${name} is used in docs/gke.md before it is set")),
        );
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The value of `--name=value` or `--name value` in a command.
fn flag(command: &[String], name: &str) -> Option<String> {
    command.iter().enumerate().find_map(|(i, w)| match w.strip_prefix(name) {
        Some("") => command.get(i + 1).cloned(),
        Some(rest) => rest.strip_prefix('=').map(str::to_string),
        None => None,
    })
}

/// What `$(...)` prints in docs/gke.md, for the test.
fn stand_ins() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([("gcloud config get-value account", "you@example.com")])
}

/// The arguments of `helm install` in docs/gke.md that shape the rendering (its `--set`s).
fn docs_helm_args(walkthrough: &Walkthrough) -> Vec<String> {
    let install = walkthrough.one(&["helm", "install"]);
    assert_eq!(&install[2..4], ["podctl", "charts/podctl"], "{install:?}");
    let mut args = Vec::new();
    for (i, word) in install.iter().enumerate() {
        if word == "--set" {
            args.extend(["--set".to_string(), install[i + 1].clone()]);
        }
    }
    args
}

/// The worker pods the coordinators of a rendered chart would create for a 2-slice job,
/// from their `--kube-*` flags (the names `podctl-coordinator` parses, crates/coordinator's
/// command.rs).
fn worker_pods(rendered: &BTreeMap<String, Value>) -> Vec<Pod> {
    let template = worker_template(rendered);
    let pods: Vec<Value> =
        serde_saphyr::from_multiple(&render(&template, &rendered["Service/podctl-workers"])).unwrap();
    pods.into_iter().filter(|d| d["kind"] == "Pod").map(|d| serde_json::from_value(d).unwrap()).collect()
}

/// The worker template the coordinators of a rendered chart build from their `--kube-*` flags.
fn worker_template(rendered: &BTreeMap<String, Value>) -> WorkerTemplate {
    let container = &rendered["StatefulSet/podctl"]["spec"]["template"]["spec"]["containers"][0];
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    for arg in container["args"].as_array().unwrap() {
        let arg = arg.as_str().unwrap();
        if let Some(kube) = arg.strip_prefix("--kube")
            && arg != "--kubernetes"
        {
            let (name, value) = kube.split_once('=').unwrap_or((kube, ""));
            flags.insert(name.to_string(), value.to_string());
        }
    }
    let known = [
        "-namespace",
        "-instance",
        "-worker-image",
        "-coordinator-address",
        "-worker-subdomain",
        "-worker-service-account",
        "-worker-tls-secret",
        "-tpu-accelerator",
        "-tpu-topology",
        "-tpu-chips-per-host",
        "-spot",
        "-grace-period-seconds",
        "-worker-network",
        "-worker-cpu",
        "-worker-memory",
        "-worker-ephemeral-storage",
        "-crash-limit",
        "-crash-backoff-seconds",
    ];
    for name in flags.keys() {
        assert!(
            known.contains(&name.as_str()),
            "the chart passes --kube{name}, which this test does not map"
        );
    }
    let slice = TpuSlice::new(
        &flags["-tpu-accelerator"],
        &flags["-tpu-topology"],
        flags.get("-tpu-chips-per-host").map(|c| c.parse().unwrap()),
    )
    .unwrap();
    // What the coordinator's command line does with the resource flags (command.rs).
    let host = Resources::for_slice(&slice);
    let resources = Resources {
        cpu: flags.get("-worker-cpu").cloned().or(host.as_ref().map(|h| h.cpu.clone())).unwrap(),
        memory: flags.get("-worker-memory").cloned().or(host.as_ref().map(|h| h.memory.clone())).unwrap(),
        ephemeral_storage: flags.get("-worker-ephemeral-storage").cloned().unwrap_or_else(|| "50Gi".into()),
    };
    WorkerTemplate {
        namespace: NS.into(),
        instance: flags["-instance"].clone(),
        image: flags["-worker-image"].clone(),
        coordinator: flags["-coordinator-address"].clone(),
        slice,
        resources,
        spot: flags.contains_key("-spot"),
        grace_period_seconds: flags["-grace-period-seconds"].parse().unwrap(),
        host_network: match flags["-worker-network"].as_str() {
            "host" => true,
            "pod" => false,
            other => panic!("--kube-worker-network={other}"),
        },
        service_account: flags.get("-worker-service-account").cloned(),
        subdomain: flags["-worker-subdomain"].clone(),
        tls_secret: flags.get("-worker-tls-secret").cloned(),
    }
}

/// What the coordinators would create for a 2-slice job: its job object (owned by the workers
/// Service), token Secret and pods, as YAML documents.
fn render(template: &WorkerTemplate, service: &Value) -> String {
    let job = DesiredJob {
        id: "qwen-sft".into(),
        running: true,
        slices: 2,
        devices_per_slice: template.slice.chips(),
        worker_token: "a-worker-token".into(),
        registrations: vec![],
        object_uid: None,
        queue: Some("team-a".into()),
        priority_class: Some("training".into()),
    };
    let owner = ObjectRef {
        name: service["metadata"]["name"].as_str().unwrap().into(),
        uid: "6f9619ff-8b86-d011-b42d-00c04fc964ff".into(),
    };
    template.render(&job, &owner, "0b3f2a9e-5d1c-4e7a-9c2b-7f1e8d6a5b4c")
}

const DEFAULT_VALUES: &[&str] = &[];
const ALTERNATIVE_VALUES: &[&str] = &["--values", "charts/podctl/ci/alternatives-values.yaml"];

/// Every way the tests render the chart: its defaults, the other side of each choice,
/// docs/gke.md's.
fn renderings() -> Vec<(String, Vec<String>)> {
    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        ("the defaults".into(), owned(DEFAULT_VALUES)),
        ("ci/alternatives-values.yaml".into(), owned(ALTERNATIVE_VALUES)),
        ("docs/gke.md's helm install".into(), docs_helm_args(&Walkthrough::read(&stand_ins()))),
    ]
}

#[test]
fn the_chart_lints_strictly() {
    for (what, args) in renderings() {
        let output = helm().args(["lint", "--strict", "charts/podctl"]).args(&args).output().unwrap();
        let text = check(&format!("helm lint --strict with {what}"), &output);
        assert!(text.contains("0 chart(s) failed"), "{text}");
    }
}

#[test]
fn the_rendered_chart_validates_strictly() {
    for (what, args) in renderings() {
        let rendered = template(&args);
        let report = validate(&what, &rendered);
        let host_network =
            objects(&rendered)["StatefulSet/podctl"].to_string().contains("--kube-worker-network=host");
        let mut kinds = vec![
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
        ];
        if !host_network {
            kinds.push("networkpolicy/podctl-workers");
        }
        for kind in kinds {
            assert!(
                report.contains(&format!("passed for resource {kind} ")),
                "{kind} not validated with {what}:\n{report}"
            );
        }
        // What its coordinators would create validates too: the job object, the token Secret
        // and the worker pods.
        let rendered = objects(&rendered);
        let manifests = render(&worker_template(&rendered), &rendered["Service/podctl-workers"]);
        let report = validate(&format!("what the controller creates with {what}"), &manifests);
        assert!(report.contains("passed for resource configmap/qwen-sft-job "), "{report}");
        assert!(report.contains("passed for resource secret/qwen-sft-token "), "{report}");
        assert_eq!(report.matches("passed for resource pod/").count(), 2, "{report}");
    }
}

/// The acceptance of issue 29: worker pods are Guaranteed QoS with an ephemeral-storage request,
/// under the runtime's default seccomp profile, with every capability dropped and a read-only
/// root filesystem, however the chart is installed.
#[test]
fn worker_pods_are_guaranteed_and_drop_every_capability() {
    for (what, args) in renderings() {
        for pod in worker_pods(&objects(&template(&args))) {
            let name = pod.metadata.name.clone().unwrap();
            let spec = pod.spec.unwrap();
            assert_eq!(
                spec.security_context.and_then(|s| s.seccomp_profile).map(|p| p.type_).as_deref(),
                Some("RuntimeDefault"),
                "{name} with {what}"
            );
            assert!(spec.init_containers.is_none());
            for container in &spec.containers {
                // Guaranteed: every container requests exactly its limits, for CPU and memory
                // at least (the kubelet's QoS rule).
                let resources = container.resources.clone().unwrap();
                let (requests, limits) = (resources.requests.unwrap(), resources.limits.unwrap());
                assert_eq!(requests, limits, "{name} with {what}");
                for resource in ["cpu", "memory", "ephemeral-storage", "google.com/tpu"] {
                    assert!(requests.contains_key(resource), "{name} requests no {resource} with {what}");
                }
                let sc = container.security_context.clone().unwrap();
                let caps = sc.capabilities.unwrap();
                assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{name} with {what}");
                assert_eq!(caps.add, None, "libtpu needs no capability: {name} with {what}");
                assert_eq!(sc.read_only_root_filesystem, Some(true));
                assert_eq!(sc.allow_privilege_escalation, Some(false));
                assert_eq!(sc.privileged, None);
                // What the worker writes is on volumes: the bundle cache and /tmp.
                let mounts: BTreeSet<&str> =
                    container.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
                assert!(mounts.contains("/var/cache/podctl") && mounts.contains("/tmp"), "{mounts:?}");
            }
            // The job's queue and priority, as its spec asks.
            assert_eq!(spec.priority_class_name.as_deref(), Some("training"));
            assert_eq!(pod.metadata.labels.unwrap()["kueue.x-k8s.io/queue-name"], "team-a");
        }
    }
}

#[test]
fn the_role_reads_no_secret() {
    for (what, args) in renderings() {
        let rendered = objects(&template(&args));
        let rules = rendered["Role/podctl"]["rules"].as_array().unwrap().clone();
        let verbs = |resource: &str| -> BTreeSet<String> {
            rules
                .iter()
                .filter(|r| r["resources"].as_array().unwrap().iter().any(|x| x == resource))
                .flat_map(|r| r["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()))
                .collect()
        };
        assert_eq!(verbs("secrets"), BTreeSet::from(["create".to_string()]), "{what}");
        let services: Vec<&Value> = rules
            .iter()
            .filter(|r| r["resources"].as_array().unwrap().iter().any(|x| x == "services"))
            .collect();
        assert_eq!(services.len(), 1);
        assert_eq!(services[0]["resourceNames"], serde_json::json!(["podctl-workers"]), "{what}");
        assert!(rules.iter().all(|r| r["verbs"].as_array().unwrap().iter().all(|v| v != "*")));
    }
}

#[test]
fn the_chart_wires_the_controller_to_its_own_objects() {
    let rendered = template(&ALTERNATIVE_VALUES.iter().map(|a| a.to_string()).collect::<Vec<_>>());
    for arg in [
        "--kubernetes",
        "--kube-worker-subdomain=podctl-workers",
        "--kube-coordinator-address=podctl.train.svc:7001",
        "--kube-worker-service-account=podctl-worker",
        "--kube-worker-tls-secret=podctl-worker-tls",
        "--kube-tpu-topology=2x2",
        "--kube-worker-network=host",
        "--kube-grace-period-seconds=60",
        "--kube-worker-cpu=170",
        "--kube-worker-memory=600Gi",
        "--kube-worker-ephemeral-storage=80Gi",
        "--kube-crash-limit=2",
        "--kube-crash-backoff-seconds=30",
        "--metrics-listen=0.0.0.0:9090",
        "--peers=1=podctl-0.podctl-peers.train.svc:7001,2=podctl-1.podctl-peers.train.svc:7001,3=podctl-2.podctl-peers.train.svc:7001",
    ] {
        assert!(rendered.contains(&format!("- {arg}\n")), "the StatefulSet lacks {arg}:\n{rendered}");
    }
    assert!(!rendered.contains("--kube-spot"), "spot is off in the alternative values");
    let alternatives = objects(&rendered);
    let defaults = objects(&template(&[]));
    let annotation = "iam.gke.io/gcp-service-account";
    let gsa = "podctl@my-project.iam.gserviceaccount.com";
    assert_eq!(alternatives["ServiceAccount/podctl"]["metadata"]["annotations"][annotation], gsa);
    // On the host network the workers act as their node's service account: an annotation on
    // theirs would do nothing, so there is none.
    assert!(alternatives["ServiceAccount/podctl-worker"]["metadata"]["annotations"][annotation].is_null());
    let pod = &alternatives["StatefulSet/podctl"]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    // Ready when it has joined the Raft cluster (`/readyz`), not when a port opens.
    assert_eq!(
        container["readinessProbe"]["httpGet"],
        serde_json::json!({ "path": "/readyz", "port": "metrics" })
    );
    assert_eq!(container["ports"][1], serde_json::json!({ "name": "metrics", "containerPort": 9090 }));
    // The alternative values ask for `preferred`; the default is `required`.
    assert!(pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"].is_array());
    let anti = &defaults["StatefulSet/podctl"]["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    assert_eq!(
        anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    // gRPC comes from the release's pods (the workers on the pod network) by label, never by
    // address; with host-network workers, from anywhere (no policy can select node addresses
    // on Dataplane V2) and there is no worker policy (host-network pods are outside them).
    let ingress = |o: &BTreeMap<String, Value>| o["NetworkPolicy/podctl"]["spec"]["ingress"].clone();
    assert_eq!(
        ingress(&defaults)[0]["from"],
        serde_json::json!([{ "podSelector": { "matchLabels": {
            "app.kubernetes.io/name": "podctl", "app.kubernetes.io/instance": "podctl"
        } } }])
    );
    assert!(!serde_json::to_string(&ingress(&defaults)).unwrap().contains("ipBlock"));
    assert!(ingress(&alternatives)[0]["from"].is_null());
    assert!(defaults.contains_key("NetworkPolicy/podctl-workers"));
    assert!(!alternatives.contains_key("NetworkPolicy/podctl-workers"));
    let workers = &defaults["NetworkPolicy/podctl-workers"]["spec"];
    assert_eq!(workers["podSelector"]["matchLabels"]["app.kubernetes.io/component"], "worker");
    assert_eq!(
        workers["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "worker"
    );
    // The metrics port is opened to the peers the values name, and to nobody by default.
    assert_eq!(ingress(&alternatives)[1]["ports"][0]["port"], "metrics");
    assert_eq!(ingress(&defaults).as_array().unwrap().len(), 1);
}

#[test]
fn worker_tls_secrets_must_not_be_the_coordinators() {
    for (set, expected) in [
        ("tls.workerSecretName=podctl-tls", "the coordinators' Secret, which holds the server key"),
        ("tls.workerSecretName=", "tls.workerSecretName is empty"),
        ("coordinator.antiAffinity=sometimes", "use required or preferred"),
        (
            "tpu.topology=4x4",
            "tpu.topology 4x4 of tpu-v6e-slice is one slice across 4 hosts, and training one slice across several \
             hosts is not built yet; what works is several single-host slices over DCN",
        ),
    ] {
        let output = helm().args(["template", "podctl", "charts/podctl", "--set", set]).output().unwrap();
        let text = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && text.contains(expected), "--set {set}: {text}");
    }
}

/// The acceptance of issues 23 and 29: installed as docs/gke.md installs it, no worker pod
/// mounts a Secret holding a CA, server or peer key; the workers and coordinators write the
/// bucket as the identities the page sets up (Workload Identity, the pod network); the
/// NetworkPolicy admits the workers by label, never by address; every pod passes the Pod
/// Security level the page's namespace enforces; and no step leads to a multi-host slice type.
#[test]
fn installed_as_docs_gke_md_says_workers_hold_no_signing_key_and_use_the_documented_identity() {
    let walkthrough = Walkthrough::read(&stand_ins());
    let secrets = walkthrough.secrets();
    let forbidden = ["ca.key", "server.key", "peer.key"];
    // The coordinators' Secret holds the server and peer keys but never the CA's.
    for file in ["server.key", "peer.pem", "peer.key"] {
        assert!(secrets["podctl-tls"].contains(file), "{secrets:?}");
    }
    for (name, files) in &secrets {
        assert!(!files.contains("ca.key"), "docs/gke.md puts the CA key into Secret {name}");
    }

    let helm_args = docs_helm_args(&walkthrough);
    let installed = objects(&template(&helm_args));
    let pods = worker_pods(&installed);
    assert_eq!(pods.len(), 2, "a 2-slice v6e-8 job");
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        let mounted: BTreeSet<&str> =
            spec.containers[0].volume_mounts.iter().flatten().map(|m| m.name.as_str()).collect();
        for volume in spec.volumes.iter().flatten().filter(|v| mounted.contains(v.name.as_str())) {
            if volume.empty_dir.is_some() {
                continue; // the bundle cache and /tmp
            }
            let secret = volume.secret.as_ref().expect("worker pods mount Secrets and scratch space only");
            let name = secret.secret_name.clone().unwrap();
            if name == "qwen-sft-token" {
                continue; // the job's token, the controller's own Secret
            }
            // A Secret docs/gke.md creates, holding no signing key, of which the pod projects
            // exactly the client's files.
            let files = secrets
                .get(&name)
                .unwrap_or_else(|| panic!("workers mount {name}, which docs/gke.md never creates"));
            assert!(files.iter().all(|f| !forbidden.contains(&f.as_str())), "{name} holds {files:?}");
            let projected: BTreeSet<&str> = secret.items.iter().flatten().map(|i| i.key.as_str()).collect();
            assert_eq!(projected, BTreeSet::from(["ca.pem", "client.pem", "client.key"]), "{name}");
            assert!(projected.iter().all(|k| files.contains(*k)), "{name} lacks one of {projected:?}");
        }
    }

    // The pod network (the default): workers and coordinators are the Google service account
    // through Workload Identity, each Kubernetes service account bound to it.
    let bucket = "gs://my-project-podctl";
    let gsa = "podctl@my-project.iam.gserviceaccount.com";
    let node_sa = "podctl-node@my-project.iam.gserviceaccount.com";
    let annotation = "iam.gke.io/gcp-service-account";
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!((spec.host_network, spec.dns_policy.as_deref()), (None, None));
        assert_eq!(
            spec.service_account_name.as_deref(),
            installed["ServiceAccount/podctl-worker"]["metadata"]["name"].as_str()
        );
    }
    let pool = "serviceAccount:my-project.svc.id.goog";
    for account in ["podctl", "podctl-worker"] {
        assert_eq!(
            installed[&format!("ServiceAccount/{account}")]["metadata"]["annotations"][annotation],
            gsa
        );
        assert!(
            walkthrough.grants(gsa, &format!("{pool}[{NS}/{account}]"), "roles/iam.workloadIdentityUser"),
            "{account}"
        );
    }
    assert!(walkthrough.grants(bucket, &format!("serviceAccount:{gsa}"), "roles/storage.objectAdmin"));
    // The nodes get no bucket: only the pods' own identity writes it.
    assert!(!walkthrough.grants(bucket, &format!("serviceAccount:{node_sa}"), "roles/storage.objectAdmin"));
    let cluster = walkthrough.one(&["gcloud", "container", "clusters", "create"]);
    assert_eq!(flag(cluster, "--workload-pool").as_deref(), Some("my-project.svc.id.goog"));
    let tpu_pools: Vec<_> = walkthrough
        .starting(&["gcloud", "container", "node-pools", "create"])
        .into_iter()
        .filter(|c| flag(c, "--machine-type").is_some_and(|m| m.starts_with("ct6e-")))
        .collect();
    assert_eq!(tpu_pools.len(), 1, "{tpu_pools:?}");
    let tpu_pool = tpu_pools[0];
    // A single-host v6e-8 pool of Spot VMs, whose pods get the GKE metadata server.
    assert_eq!(flag(tpu_pool, "--machine-type").as_deref(), Some("ct6e-standard-8t"));
    assert!(tpu_pool.contains(&"--spot".to_string()) && flag(tpu_pool, "--tpu-topology").is_none());
    assert_eq!(flag(tpu_pool, "--workload-metadata").as_deref(), Some("GKE_METADATA"), "{tpu_pool:?}");
    assert_eq!(flag(tpu_pool, "--service-account").as_deref(), Some(node_sa));

    // The NetworkPolicy is enforced (Dataplane V2) and lets the workers in by label.
    assert!(cluster.contains(&"--enable-dataplane-v2".to_string()), "{cluster:?}");
    let policy = installed["NetworkPolicy/podctl"]["spec"]["ingress"].to_string();
    assert!(!policy.contains("ipBlock") && policy.contains("podSelector"), "{policy}");
    let labels: BTreeMap<String, String> = pods[0].metadata.labels.clone().unwrap();
    for (key, value) in
        installed["NetworkPolicy/podctl"]["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
            .as_object()
            .unwrap()
    {
        assert_eq!(labels.get(key).map(String::as_str), value.as_str(), "the policy must select the workers");
    }

    // The namespace's Pod Security level admits every pod the install makes.
    let label = walkthrough.one(&["kubectl", "label", "namespace"]);
    assert_eq!(label[3], NS);
    let level = label
        .iter()
        .find_map(|w| w.strip_prefix("pod-security.kubernetes.io/enforce="))
        .expect("docs/gke.md enforces a Pod Security level");
    assert_eq!(level, "baseline");
    let coordinator = &installed["StatefulSet/podctl"]["spec"]["template"]["spec"];
    assert_eq!(kube_mock::pod_security::violations("restricted", coordinator), Vec::<String>::new());
    for pod in &pods {
        let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
        assert_eq!(kube_mock::pod_security::violations(level, &spec), Vec::<String>::new());
    }
    // Host-network workers would need the privileged level: the page does not lead there.
    let mut host_args = helm_args.clone();
    host_args.extend(["--set".into(), "workers.hostNetwork=true".into()]);
    let host_pods = worker_pods(&objects(&template(&host_args)));
    let spec = serde_json::to_value(host_pods[0].spec.as_ref().unwrap()).unwrap();
    assert_eq!(kube_mock::pod_security::violations(level, &spec), ["host namespaces (hostNetwork=true)"]);

    // No step installs a multi-host slice type, and the chart would refuse one.
    assert!(!helm_args.iter().any(|a| a.starts_with("tpu.")), "{helm_args:?}");
    assert!(walkthrough.starting(&["helm", "upgrade"]).is_empty());
}

#[test]
fn the_docs_reader_reads_shell_as_written() {
    assert_eq!(split_words(r#"a "b c" 'd$e' f # g"#), ["a", "b c", "d$e", "f"]);
    assert_eq!(split_words("--set \"x={$Y}\" #"), ["--set", "x={$Y}"]);
    assert_eq!(
        split_words(r#"N=$(gcloud x --format "value(a)") --member user:$(id -u)"#),
        [r#"N=$(gcloud x --format "value(a)")"#, "--member", "user:$(id -u)"]
    );
    let vars = BTreeMap::from([("A".to_string(), "1".to_string()), ("B_2".to_string(), "2".to_string())]);
    let outputs = BTreeMap::from([("id -u", "0")]);
    assert_eq!(expand("x$A-${B_2}y$(id -u)", &vars, &outputs), "x1-2y0");
    assert!(is_assignment("REGISTRY=$REGION-docker") && !is_assignment("--set=a") && !is_assignment("a=b"));
    let command: Vec<String> = ["x", "--a", "1", "--b=2"].map(String::from).to_vec();
    assert_eq!(
        (flag(&command, "--a"), flag(&command, "--b"), flag(&command, "--c")),
        (Some("1".into()), Some("2".into()), None)
    );
}

#[test]
fn the_worker_image_installs_the_pinned_libtpu_by_hash_on_pinned_bases() {
    let read = |relative: &str| std::fs::read_to_string(root().join(relative)).unwrap();
    // The wheel's `tpu` extra pins libtpu; the test lock has the hashes of its files.
    let pyproject = read("pyproject.toml");
    let pin = pyproject
        .split('"')
        .find(|s| s.starts_with("libtpu=="))
        .expect("pyproject.toml's tpu extra pins libtpu");
    let pin = pin.split(';').next().unwrap().trim();
    let requirements = read("deploy/worker-libtpu.txt");
    let line = requirements
        .lines()
        .find(|l| l.starts_with("libtpu=="))
        .expect("deploy/worker-libtpu.txt pins libtpu");
    let (version, hash) = line.split_once(" --hash=sha256:").expect("with its wheel's hash");
    assert_eq!(
        version, pin,
        "deploy/worker-libtpu.txt must pin {pin}, the pin of pyproject.toml's tpu extra"
    );
    assert!(hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()), "{line}");
    assert!(
        read("scripts/requirements/test.lock").contains(&format!("--hash=sha256:{hash}")),
        "deploy/worker-libtpu.txt's hash is not one of {pin}'s files in scripts/requirements/test.lock"
    );
    let dockerfile = read("deploy/worker.Dockerfile");
    assert!(
        dockerfile.contains("--require-hashes --target /opt/pip -r /tmp/worker-libtpu.txt"),
        "{dockerfile}"
    );
    // The plugin the worker loads when the pod names none.
    assert!(dockerfile.contains("PODCTL_PJRT_PLUGIN=/opt/libtpu/libtpu.so"), "{dockerfile}");
    // Every base image by digest (a tag alone can name other bytes tomorrow).
    for file in ["deploy/worker.Dockerfile", "deploy/coordinator.Dockerfile"] {
        for from in read(file).lines().filter(|l| l.starts_with("FROM ")) {
            let image = from.split_whitespace().nth(1).unwrap();
            let digest = image.split_once("@sha256:").map(|(_, d)| d).unwrap_or_default();
            assert!(
                digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
                "{file}: `{from}` is not pinned by digest (deploy/pin-base-images.sh pins it)"
            );
        }
    }
}
