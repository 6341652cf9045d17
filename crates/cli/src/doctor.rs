//! `podctl doctor`: whether this machine can run jobs here and submit them to a cluster, one line
//! per check (as `sky check`): `ok` and what was found, or `FAIL`, what is wrong and the command
//! that fixes it. Exits 1 when anything failed.
//!
//! Checks: podctl's Python side (the Python, JAX and the exporter, the PJRT plugin loaded, the
//! bundle cache writable); with `--job FILE`, the spec and credentials for every `s3://` and
//! `gs://` location it names (tried with one listing); with `--coordinator` or
//! `--kube-context`, the TLS and token files and the coordinators themselves. Credentials a cloud
//! VM gets from its metadata server are only recognized (the machine's DMI names the cloud),
//! never fetched: doctor contacts no metadata server.

use crate::connect::ConnectArgs;
use crate::toolchain::{self, Layout, Toolchain};
use anyhow::Result;
use clap::Args;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The Pythons the lock (models/requirements.lock) has wheels for.
const PYTHONS: std::ops::RangeInclusive<u32> = 11..=13;
/// The JAX the exporter is pinned to (pyproject.toml, models/requirements.lock).
const JAX_VERSION: &str = "0.10.2";
/// Upper bound on one check that waits on something: a Python import, a listing, a connection.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args)]
pub struct DoctorArgs {
    /// Also check what this job needs: its spec, and credentials for every s3:// and gs://
    /// location it names.
    #[arg(long)]
    job: Option<PathBuf>,
    /// With --coordinator or --kube-context: the TLS and token files, and the coordinators.
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
}

/// What is wrong, and the command that fixes it.
#[derive(Debug)]
struct Problem {
    what: String,
    fix: String,
}

fn problem(what: impl Into<String>, fix: impl Into<String>) -> Problem {
    Problem { what: what.into(), fix: fix.into() }
}

type Outcome = Result<String, Problem>;

/// Prints each check as it finishes; counts the failures.
#[derive(Default)]
struct Report {
    failed: usize,
}

impl Report {
    fn line(&mut self, name: &str, outcome: Outcome) -> bool {
        match outcome {
            Ok(found) => {
                println!("ok    {name:<14} {found}");
                true
            }
            Err(Problem { what, fix }) => {
                self.failed += 1;
                println!("FAIL  {name:<14} {what}; fix: {fix}");
                false
            }
        }
    }
}

pub fn run(args: &DoctorArgs, runtime: &tokio::runtime::Handle) -> Result<ExitCode> {
    let mut report = Report::default();
    let tools = check_toolchain(&mut report, runtime);
    let job = args.job.as_deref().and_then(|path| check_job(&mut report, runtime, path));
    let plugin_from_job = job.as_ref().and_then(|j| j.runtime.plugin.clone());
    if let Some(tools) = &tools {
        report.line("plugin", check_plugin(tools, plugin_from_job.as_deref(), args.connect.is_remote()));
    }
    report.line("cache", check_cache());
    if args.connect.is_remote() {
        runtime.block_on(check_cluster(&mut report, &args.connect));
    }
    if report.failed > 0 {
        println!("{} problem{} found", report.failed, if report.failed == 1 { "" } else { "s" });
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// podctl's layout, its Python, and JAX and the exporter in that Python.
fn check_toolchain(report: &mut Report, runtime: &tokio::runtime::Handle) -> Option<Toolchain> {
    let version = env!("CARGO_PKG_VERSION");
    let tools = match Toolchain::discover() {
        Ok(tools) => tools,
        Err(error) => {
            report.line(
                "podctl",
                Err(problem(
                    format!("{version}: {error:#}"),
                    "python3 -m venv ENV && ENV/bin/pip install podctl-*.whl, then run ENV/bin/podctl \
                     (or scripts/setup.sh in a checkout)",
                )),
            );
            return None;
        }
    };
    let layout = match &tools.layout {
        Layout::Installed { prefix } => format!("installed in {}", prefix.display()),
        Layout::Checkout { home } => format!("the checkout {}", home.display()),
    };
    report.line("podctl", Ok(format!("{version}, {layout}")));
    let setup = "scripts/setup.sh";
    let found = match runtime.block_on(inspect_python(&tools)) {
        Ok(found) => found,
        Err(what) => {
            let fix = match &tools.layout {
                Layout::Checkout { .. } => setup.to_string(),
                Layout::Installed { .. } => {
                    "create the environment again: python3 -m venv ENV && ENV/bin/pip \
                                             install podctl-*.whl"
                        .to_string()
                }
            };
            report.line("python", Err(problem(what, fix)));
            return None;
        }
    };
    let minor = found.python.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()).unwrap_or(0);
    let python = match PYTHONS.contains(&minor) {
        true => Ok(format!("{} (Python {})", tools.python.display(), found.python)),
        false => Err(problem(
            format!(
                "{} is Python {}; podctl's pinned JAX has wheels for 3.{}-3.{}",
                tools.python.display(),
                found.python,
                PYTHONS.start(),
                PYTHONS.end()
            ),
            match &tools.layout {
                Layout::Checkout { .. } => "PYTHON=/path/to/python3.12 scripts/setup.sh".to_string(),
                Layout::Installed { .. } => {
                    "python3.12 -m venv ENV && ENV/bin/pip install podctl-*.whl (any of 3.11-3.13)"
                        .to_string()
                }
            },
        )),
    };
    report.line("python", python);
    let jax_fix = tools.pip_install(&format!("'jax=={JAX_VERSION}' 'jaxlib=={JAX_VERSION}'"));
    let jax = match (&found.jax, &found.exporter) {
        (Err(error), _) => Err(problem(format!("JAX does not import: {error}"), jax_fix)),
        (Ok(versions), _) if versions != &format!("jax {JAX_VERSION}, jaxlib {JAX_VERSION}") => Err(problem(
            format!("{versions}, but the exporter is pinned to jax and jaxlib {JAX_VERSION}"),
            jax_fix,
        )),
        (Ok(_), Err(error)) => Err(problem(
            format!("the exporter (podctl_models) does not import: {error}"),
            match &tools.layout {
                Layout::Checkout { .. } => setup.to_string(),
                Layout::Installed { .. } => tools.pip_install("podctl-*.whl"),
            },
        )),
        (Ok(versions), Ok(exporter)) => Ok(format!("{versions}; exporter {exporter}")),
    };
    report.line("jax", jax).then_some(tools)
}

/// What podctl's Python reports about itself.
struct PythonFound {
    python: String,
    jax: Result<String, String>,
    exporter: Result<String, String>,
}

const INSPECT: &str = r#"
import json, os, sys
found = {"python": "%d.%d.%d" % sys.version_info[:3]}
try:
    import jax, jaxlib
    found["jax"] = "jax %s, jaxlib %s" % (jax.__version__, jaxlib.__version__)
except Exception as e:
    found["jax_error"] = "%s: %s" % (type(e).__name__, e)
try:
    import podctl_models.export
    found["exporter"] = os.path.dirname(podctl_models.export.__file__)
except Exception as e:
    found["exporter_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(found))
"#;

async fn inspect_python(tools: &Toolchain) -> Result<PythonFound, String> {
    let run = tokio::process::Command::new(&tools.python)
        .args(["-c", INSPECT])
        .env("PYTHONPATH", tools.models_dir())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(CHECK_TIMEOUT, run).await {
        Err(_) => return Err(format!("{} did not answer within {CHECK_TIMEOUT:?}", tools.python.display())),
        Ok(Err(e)) => return Err(format!("cannot run {}: {e}", tools.python.display())),
        Ok(Ok(output)) => output,
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let parsed: Option<serde_json::Value> = serde_json::from_str(stdout.trim()).ok();
    let Some(found) = parsed.filter(|_| output.status.success()) else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no message");
        return Err(format!("{} failed ({}): {last}", tools.python.display(), output.status));
    };
    let field = |ok: &str, error: &str| match (found[ok].as_str(), found[error].as_str()) {
        (Some(value), _) => Ok(value.to_string()),
        (None, error) => Err(error.unwrap_or("unknown error").to_string()),
    };
    Ok(PythonFound {
        python: found["python"].as_str().unwrap_or("?").to_string(),
        jax: field("jax", "jax_error"),
        exporter: field("exporter", "exporter_error"),
    })
}

/// The plugin a local run would load, loaded. A submission needs none here: the cluster's
/// workers load their own (a macOS laptop has no CPU plugin wheel).
fn check_plugin(tools: &Toolchain, from_job: Option<&Path>, remote: bool) -> Outcome {
    let Some(path) = tools.find_plugin(from_job) else {
        return match remote {
            true => Ok("none here; the cluster's workers load their own".to_string()),
            false => {
                Err(problem(tools.missing_plugin(), tools.pip_install(toolchain::CPU_PLUGIN_REQUIREMENT)))
            }
        };
    };
    match pjrt::Plugin::load(&path) {
        Ok(plugin) => {
            let (major, minor) = plugin.api_version();
            Ok(format!("{} (PJRT C API {major}.{minor})", path.display()))
        }
        Err(error) => Err(problem(
            format!("{} does not load: {error}", path.display()),
            match from_job {
                Some(_) => "fix runtime.plugin in the job (or drop it to use the CPU plugin)".to_string(),
                None if std::env::var_os("PODCTL_PJRT_PLUGIN").is_some() => {
                    "fix PODCTL_PJRT_PLUGIN (or unset it to use the CPU plugin)".to_string()
                }
                None => tools.pip_install(toolchain::CPU_PLUGIN_REQUIREMENT),
            },
        )),
    }
}

/// The bundle cache exists or can be made, and takes a file.
fn check_cache() -> Outcome {
    let dir = toolchain::cache_dir(|name| std::env::var_os(name)).ok_or_else(|| {
        problem("no cache directory: HOME is not set", "export PODCTL_CACHE=/a/directory/you/own")
    })?;
    let probe = dir.join(format!(".doctor-{}", std::process::id()));
    let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&probe, b"podctl doctor"));
    let _ = std::fs::remove_file(&probe);
    match written {
        Ok(()) => Ok(format!("{} is writable", dir.display())),
        Err(e) => Err(problem(
            format!("cannot write in {}: {e}", dir.display()),
            format!("export PODCTL_CACHE=/a/directory/you/own (or chown -R $(id -u) {})", dir.display()),
        )),
    }
}

/// The job's object-store locations (credentials, one listing each), then the spec itself,
/// whose Hugging Face model may live in one of them.
fn check_job(report: &mut Report, runtime: &tokio::runtime::Handle, path: &Path) -> Option<job::JobSpec> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            report
                .line("job", Err(problem(format!("cannot read {}: {e}", path.display()), "pass --job FILE")));
            return None;
        }
    };
    let mut unusable = BTreeSet::new();
    for url in store_urls(&text) {
        let outcome = runtime.block_on(check_store(&url, &|name| std::env::var_os(name)));
        if !report.line(&format!("store {}", scheme(&url)), outcome.map(|found| format!("{url}: {found}"))) {
            unusable.insert(url);
        }
    }
    let reader = CheckedReader { unusable: &unusable, runtime };
    match job::JobSpec::from_yaml_with(&text, path, &reader) {
        Ok(spec) => {
            report.line("job", Ok(format!("{}: {} ({} steps)", path.display(), spec.name, spec.steps)));
            Some(spec)
        }
        Err(error) => {
            report.line("job", Err(problem(error.to_string(), format!("edit {}", path.display()))));
            None
        }
    }
}

/// Reads a Hugging Face model's config.json unless its store failed its check above (whose
/// client would otherwise look for credentials where doctor must not: a metadata server).
struct CheckedReader<'a> {
    unusable: &'a BTreeSet<String>,
    runtime: &'a tokio::runtime::Handle,
}

impl job::ModelReader for CheckedReader<'_> {
    fn read_config(&self, uri: &str) -> Result<bundle::ModelConfig, String> {
        match self.unusable.iter().find(|url| uri.starts_with(url.as_str())) {
            Some(url) => Err(format!("'{uri}' is not read: {url} failed its check above")),
            None => job::ModelReader::read_config(&crate::models::HfReader(self.runtime.clone()), uri),
        }
    }
}

fn scheme(url: &str) -> &str {
    url.split_once("://").map_or("", |(scheme, _)| scheme)
}

/// Every `s3://` and `gs://` URL in a spec's text (in any field: checkpoint roots, data files,
/// model directories, `init_from`), in order, once each; commented-out lines are skipped.
fn store_urls(text: &str) -> Vec<String> {
    let mut urls = Vec::new();
    for line in text.lines() {
        let line = line.split(" #").next().unwrap_or_default();
        if line.trim_start().starts_with('#') {
            continue;
        }
        for prefix in ["s3://", "gs://"] {
            for (start, _) in line.match_indices(prefix) {
                let url: String = line[start..]
                    .chars()
                    .take_while(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | ',' | '}' | ']'))
                    .collect();
                if url.len() > prefix.len() && !urls.contains(&url) {
                    urls.push(url);
                }
            }
        }
    }
    urls
}

/// Credentials for `url`'s store, then one listing under it.
async fn check_store(url: &str, env: &dyn Fn(&str) -> Option<OsString>) -> Outcome {
    let source = match scheme(url) {
        "s3" => aws_credentials(env)?,
        _ => gcp_credentials(env)?,
    };
    if source.from_metadata {
        // Listing would ask the metadata server for a token; that is the VM's business.
        return Ok(format!("credentials from {} (not contacted)", source.name));
    }
    let options = checkpoint::StoreOptions {
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
        max_retries: 0,
        ..Default::default()
    };
    let list = async {
        let storage = checkpoint::Storage::open(url, &options).map_err(|e| e.to_string())?;
        let prefix = url.split_once("://").and_then(|(_, rest)| rest.split_once('/')).map(|(_, p)| p);
        let prefix = prefix.filter(|p| !p.is_empty()).map(object_store::path::Path::from);
        storage.object_store().list_with_delimiter(prefix.as_ref()).await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(CHECK_TIMEOUT, list).await {
        Ok(Ok(listing)) => Ok(format!(
            "credentials from {}; listed {} entries",
            source.name,
            listing.objects.len() + listing.common_prefixes.len()
        )),
        Ok(Err(error)) => {
            Err(problem(format!("credentials from {}, but listing failed: {error}", source.name), source.fix))
        }
        Err(_) => Err(problem(format!("listing did not answer within {CHECK_TIMEOUT:?}"), source.fix)),
    }
}

/// Where a store client finds credentials, and what to do when the store refuses them.
struct Credentials {
    name: String,
    from_metadata: bool,
    fix: String,
}

const AWS_FIX: &str = "export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... (with the AWS CLI: eval \"$(aws \
                       configure export-credentials --format env)\")";
const GCP_FIX: &str = "gcloud auth application-default login";

/// The AWS variables podctl's S3 client reads (it reads no `~/.aws` profile), or the instance's
/// role where DMI says this is EC2.
fn aws_credentials(env: &dyn Fn(&str) -> Option<OsString>) -> Result<Credentials, Problem> {
    let set = |name: &str| env(name).is_some_and(|v| !v.is_empty());
    let found = |name: &str, from_metadata| Credentials {
        name: name.to_string(),
        from_metadata,
        fix: AWS_FIX.into(),
    };
    if set("AWS_ACCESS_KEY_ID") && set("AWS_SECRET_ACCESS_KEY") {
        return Ok(found("AWS_ACCESS_KEY_ID", false));
    }
    if set("AWS_ACCESS_KEY_ID") {
        return Err(problem("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not", AWS_FIX));
    }
    if let Some(file) = env("AWS_WEB_IDENTITY_TOKEN_FILE") {
        return match std::fs::metadata(&file) {
            Ok(_) if set("AWS_ROLE_ARN") => Ok(found("AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN", false)),
            Ok(_) => Err(problem("AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not", AWS_FIX)),
            Err(e) => Err(problem(
                format!("AWS_WEB_IDENTITY_TOKEN_FILE {}: {e}", Path::new(&file).display()),
                AWS_FIX,
            )),
        };
    }
    if set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") || set("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
        return Ok(found("the container's credentials endpoint", true));
    }
    if dmi("sys_vendor").is_some_and(|v| v.contains("Amazon EC2")) {
        return Ok(found("this EC2 instance's role", true));
    }
    Err(problem(
        "no AWS credentials: podctl reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (not ~/.aws profiles)",
        AWS_FIX,
    ))
}

/// What podctl's GCS client reads: a service account (`GOOGLE_SERVICE_ACCOUNT*`), else
/// application default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, else gcloud's file),
/// else, on a Google Compute Engine VM, its metadata server.
fn gcp_credentials(env: &dyn Fn(&str) -> Option<OsString>) -> Result<Credentials, Problem> {
    let found = |name: String| Credentials { name, from_metadata: false, fix: GCP_FIX.into() };
    if env("GOOGLE_SERVICE_ACCOUNT_KEY").is_some() {
        return Ok(found("GOOGLE_SERVICE_ACCOUNT_KEY".into()));
    }
    let file = ["GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_APPLICATION_CREDENTIALS"]
        .into_iter()
        .find_map(|name| env(name).map(|path| (name.to_string(), PathBuf::from(path))));
    let well_known = env("HOME")
        .map(|home| PathBuf::from(home).join(".config/gcloud/application_default_credentials.json"));
    let (name, path) = match (file, well_known) {
        (Some(file), _) => file,
        (None, Some(path)) if path.exists() => ("gcloud's application default credentials".to_string(), path),
        _ if dmi("product_name").is_some_and(|v| v.contains("Google Compute Engine")) => {
            return Ok(Credentials {
                name: "this Compute Engine VM's service account".into(),
                from_metadata: true,
                fix: GCP_FIX.into(),
            });
        }
        _ => {
            return Err(problem(
                "no Google credentials: neither GOOGLE_APPLICATION_CREDENTIALS nor gcloud's application default \
                 credentials",
                GCP_FIX,
            ));
        }
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| problem(format!("{name} {}: {e}", path.display()), GCP_FIX))?;
    let kind = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["type"].as_str().map(String::from));
    match kind.as_deref() {
        Some("service_account" | "authorized_user") => Ok(found(format!("{name} ({})", path.display()))),
        other => Err(problem(
            format!(
                "{name} {} is {}; podctl's GCS client takes a service account key or gcloud's authorized_user \
                 credentials",
                path.display(),
                other.map_or("not a credentials file".to_string(), |t| format!("of type {t}"))
            ),
            GCP_FIX,
        )),
    }
}

/// A DMI field of this machine (Linux), which names the cloud a VM runs on.
fn dmi(field: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/sys/class/dmi/id").join(field)).ok()
}

/// The TLS and token files, then the coordinators, directly or through the kubeconfig context.
async fn check_cluster(report: &mut Report, connect: &ConnectArgs) {
    let mut files_ok = true;
    if let Some(dir) = &connect.tls_dir {
        files_ok &= report.line("tls", read_pems(&[(dir.join(client::tls::CA_CERT), "CERTIFICATE")]));
    } else if let Some(ca) = &connect.ca {
        let mut files = vec![(ca.clone(), "CERTIFICATE")];
        if let (Some(cert), Some(key)) = (&connect.cert, &connect.key) {
            files.extend([(cert.clone(), "CERTIFICATE"), (key.clone(), "PRIVATE KEY")]);
        }
        files_ok &= report.line("tls", read_pems(&files));
    } else if connect.kube_context.is_none() && !connect.insecure_plaintext {
        files_ok &= report.line(
            "tls",
            Err(problem(
                "no CA to check the coordinators' certificates with",
                "pass --ca ca.pem (or --tls-dir DIR; `podctl coordinator dev-ca DIR` writes one for a test \
                 cluster), or --insecure-plaintext on loopback",
            )),
        );
    }
    if let Some(file) = &connect.token_file {
        let token = std::fs::read_to_string(file);
        files_ok &= report.line(
            "token",
            match token {
                Ok(token) if !token.trim().is_empty() => Ok(format!("{} is readable", file.display())),
                Ok(_) => Err(problem(
                    format!("{} is empty", file.display()),
                    "write the admin or job token into it",
                )),
                Err(e) => {
                    Err(problem(format!("cannot read {}: {e}", file.display()), "pass --token-file FILE"))
                }
            },
        );
    } else if connect.token.is_none() && connect.kube_context.is_none() {
        files_ok &= report.line(
            "token",
            Err(problem("no token", "pass --token-file FILE (or set PODCTL_TOKEN) with the admin token")),
        );
    }
    if !files_ok {
        return;
    }
    let reached = tokio::time::timeout(CHECK_TIMEOUT, async {
        let connection = connect.connect().await.map_err(|e| format!("{e:#}"))?;
        let mut config = connection.config.clone();
        config.retry_for = Duration::from_secs(5);
        config.call_timeout = Duration::from_secs(5);
        let client = client::Client::new(config).map_err(|e| e.to_string())?;
        client.cluster_info().await.map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|_| Err(format!("no answer within {CHECK_TIMEOUT:?}")));
    let fix = match &connect.kube_context {
        Some(context) => format!(
            "check `kubectl --context {context} get pods -l app.kubernetes.io/name=podctl` (or get the context: \
             gcloud container clusters get-credentials CLUSTER --location LOCATION)"
        ),
        None => "check the addresses and that the coordinators run: --coordinator HOST:PORT,... (or \
                 PODCTL_COORDINATOR)"
            .to_string(),
    };
    report.line(
        "coordinators",
        match reached {
            Ok(info) if info.leader_id != 0 => Ok(format!(
                "leader {} at {}, {} members",
                info.leader_id,
                info.leader_address,
                info.members.len()
            )),
            Ok(_) => Err(problem("the coordinators answered but have no leader", fix)),
            Err(error) if error.contains("Unauthenticated") || error.contains("PermissionDenied") => {
                Err(problem(error, "pass the admin token: --token-file FILE (or PODCTL_TOKEN)"))
            }
            Err(error) => Err(problem(error, fix)),
        },
    );
}

/// Each file readable and holding a PEM block of its kind.
fn read_pems(files: &[(PathBuf, &str)]) -> Outcome {
    for (file, kind) in files {
        let text = std::fs::read_to_string(file).map_err(|e| {
            problem(format!("cannot read {}: {e}", file.display()), "check the path and its permissions")
        })?;
        if !(text.contains("-----BEGIN ") && text.contains(kind)) {
            return Err(problem(
                format!("{} holds no PEM {kind}", file.display()),
                "pass the PEM files `podctl coordinator dev-ca` or the install's TLS Secret holds",
            ));
        }
    }
    let names: Vec<String> = files.iter().map(|(f, _)| f.display().to_string()).collect();
    Ok(format!("{} readable", names.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn every_object_store_url_of_a_spec_is_found_once() {
        let text = "name: x\n# checkpoint: { uri: s3://old/root }\ndata: { kind: jsonl, train: \"gs://b/train.jsonl\", \
                    test: 'gs://b/test.jsonl' }\ncheckpoint: { every: 5, uri: s3://bucket/runs/x } # s3://not/this\n\
                    grpo: { init_from: s3://bucket/runs/x }\nmodel: { hf: gs://models/qwen3 }\noutput: file:///tmp/run\n";
        assert_eq!(
            store_urls(text),
            ["gs://b/train.jsonl", "gs://b/test.jsonl", "s3://bucket/runs/x", "gs://models/qwen3"]
        );
    }

    #[test]
    fn aws_credentials_come_from_the_variables_and_never_from_a_metadata_server_here() {
        let keys =
            aws_credentials(&env(&[("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b")])).unwrap();
        assert_eq!((keys.name.as_str(), keys.from_metadata), ("AWS_ACCESS_KEY_ID", false));
        let half = aws_credentials(&env(&[("AWS_ACCESS_KEY_ID", "a")])).err().unwrap();
        assert!(half.what.contains("AWS_SECRET_ACCESS_KEY"), "{}", half.what);
        let container =
            aws_credentials(&env(&[("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/x")])).unwrap();
        assert!(container.from_metadata);
        if !dmi("sys_vendor").is_some_and(|v| v.contains("Amazon EC2")) {
            let none = aws_credentials(&env(&[])).err().unwrap();
            assert!(
                none.fix.contains("AWS_ACCESS_KEY_ID") && none.fix.contains("export-credentials"),
                "{}",
                none.fix
            );
        }
    }

    #[test]
    fn google_credentials_are_files_of_a_type_the_client_takes() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let user = file("user.json", r#"{"type": "authorized_user", "client_id": "c"}"#);
        let found = gcp_credentials(&env(&[("GOOGLE_APPLICATION_CREDENTIALS", &user)])).unwrap();
        assert!(
            found.name.starts_with("GOOGLE_APPLICATION_CREDENTIALS") && !found.from_metadata,
            "{}",
            found.name
        );
        let external = file("external.json", r#"{"type": "external_account"}"#);
        let refused = gcp_credentials(&env(&[("GOOGLE_APPLICATION_CREDENTIALS", &external)])).err().unwrap();
        assert!(refused.what.contains("external_account"), "{}", refused.what);
        let missing = dir.path().join("missing.json").display().to_string();
        assert!(gcp_credentials(&env(&[("GOOGLE_APPLICATION_CREDENTIALS", &missing)])).is_err());
        // gcloud's well-known file under HOME.
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".config/gcloud")).unwrap();
        std::fs::write(
            home.join(".config/gcloud/application_default_credentials.json"),
            std::fs::read(&user).unwrap(),
        )
        .unwrap();
        let gcloud = gcp_credentials(&env(&[("HOME", &home.display().to_string())])).unwrap();
        assert!(gcloud.name.starts_with("gcloud's"), "{}", gcloud.name);
        if !dmi("product_name").is_some_and(|v| v.contains("Google Compute Engine")) {
            let none = gcp_credentials(&env(&[("HOME", "/nonexistent")])).err().unwrap();
            assert_eq!(none.fix, GCP_FIX);
        }
    }
}
