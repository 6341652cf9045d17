//! Reaching a coordinator in a cluster from a laptop, through a kubeconfig context.
//!
//! The chart's client Service carries the `podctl.dev/*` annotations that say where the rest
//! is: the headless peers Service (whose DNS names the coordinators advertise), the TLS Secret
//! (its `ca.pem` verifies them) and the admin token Secret. [`connect`] finds that Service,
//! port-forwards a local port through the API server to every ready coordinator pod, and returns
//! the coordinators' own addresses with a route for each to its local port. Redirects to the
//! leader name those same addresses, so the client follows them through the matching forward;
//! TLS checks the certificate against the coordinator's own name, not `127.0.0.1`.

use crate::Error;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::collections::BTreeMap;
use tokio::net::TcpListener;

/// Labels of the chart's client Service.
pub const CLIENT_SERVICE_SELECTOR: &str = "app.kubernetes.io/name=podctl,app.kubernetes.io/component=client";
/// Annotation: the headless Service the coordinators' `--advertise` names are under.
pub const PEERS_SERVICE_ANNOTATION: &str = "podctl.dev/peers-service";
/// Annotation: the Secret with `ca.pem` (absent when the coordinators serve plaintext).
pub const TLS_SECRET_ANNOTATION: &str = "podctl.dev/tls-secret";
/// Annotation: the Secret with the admin token (key `token`).
pub const TOKEN_SECRET_ANNOTATION: &str = "podctl.dev/admin-token-secret";

/// How to reach the coordinators of one install.
#[derive(Debug)]
pub struct Remote {
    /// The namespace of the install.
    pub namespace: String,
    /// The coordinators' own addresses (`<pod>.<peers>.<namespace>.svc:<port>`), which is what
    /// leader redirects name. Dial each through [`Remote::routes`].
    pub addresses: Vec<String>,
    /// Where to connect for each address: a local port forwarded to that coordinator.
    pub routes: BTreeMap<String, String>,
    /// The TLS Secret of the install; `None` when the coordinators serve plaintext.
    pub tls_secret: Option<String>,
    /// The CA certificate (PEM) from the TLS Secret, when the kubeconfig's user may read it.
    pub ca_pem: Option<Vec<u8>>,
    /// The admin token, when the kubeconfig's user may read its Secret.
    pub token: Option<String>,
    forwards: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Remote {
    fn drop(&mut self) {
        for task in &self.forwards {
            task.abort();
        }
    }
}

/// A client for a kubeconfig context (the current one when `None`), and its namespace.
pub async fn client(context: Option<&str>) -> Result<(kube::Client, String), Error> {
    let kubeconfig = Kubeconfig::read().map_err(|e| Error::Kubeconfig(e.to_string()))?;
    client_from(kubeconfig, context).await
}

/// A client for `context` of a parsed kubeconfig, and the context's namespace.
pub async fn client_from(
    kubeconfig: Kubeconfig,
    context: Option<&str>,
) -> Result<(kube::Client, String), Error> {
    if let Some(name) = context
        && !kubeconfig.contexts.iter().any(|c| c.name == name)
    {
        let known: Vec<&str> = kubeconfig.contexts.iter().map(|c| c.name.as_str()).collect();
        return Err(Error::Kubeconfig(format!(
            "no context '{name}'; the kubeconfig has {}",
            known.join(", ")
        )));
    }
    let options = KubeConfigOptions { context: context.map(str::to_owned), ..Default::default() };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Ok((client, namespace))
}

/// Finds the install in `namespace` and forwards a local port to every ready coordinator.
pub async fn connect(client: kube::Client, namespace: &str) -> Result<Remote, Error> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let found = services
        .list(&ListParams::default().labels(CLIENT_SERVICE_SELECTOR))
        .await
        .map_err(Error::api(format!("list services in {namespace}")))?;
    let service = match &found.items[..] {
        [one] => one,
        [] => {
            return Err(Error::NotFound(format!(
                "no podctl coordinator Service in namespace {namespace}; install the chart there (docs/KUBERNETES.md) \
                 or pick the namespace it is in"
            )));
        }
        many => {
            let names: Vec<String> = many.iter().filter_map(|s| s.metadata.name.clone()).collect();
            return Err(Error::NotFound(format!(
                "{} podctl installs in namespace {namespace} ({}); keep one per namespace",
                many.len(),
                names.join(", ")
            )));
        }
    };
    let name = service.metadata.name.clone().unwrap_or_default();
    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    let spec = service.spec.clone().unwrap_or_default();
    let peers = annotations.get(PEERS_SERVICE_ANNOTATION).ok_or_else(|| {
        Error::NotFound(format!(
            "service {name} has no {PEERS_SERVICE_ANNOTATION} annotation; reinstall the chart"
        ))
    })?;
    let port = spec
        .ports
        .as_ref()
        .and_then(|ports| ports.iter().find(|p| p.name.as_deref() == Some("grpc")).or(ports.first()))
        .and_then(|p| match &p.target_port {
            Some(IntOrString::Int(n)) => u16::try_from(*n).ok(),
            _ => u16::try_from(p.port).ok(),
        })
        .ok_or_else(|| Error::NotFound(format!("service {name} has no port")))?;
    let selector = spec
        .selector
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");

    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let coordinators = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::api(format!("list coordinator pods in {namespace}")))?;
    let ready: Vec<String> =
        coordinators.items.iter().filter(|p| is_ready(p)).filter_map(|p| p.metadata.name.clone()).collect();
    if ready.is_empty() {
        return Err(Error::NotFound(format!(
            "no coordinator pod of service {name} is ready in {namespace}; see `kubectl -n {namespace} get pods -l {selector}`"
        )));
    }

    let mut remote = Remote {
        namespace: namespace.into(),
        addresses: Vec::new(),
        routes: BTreeMap::new(),
        tls_secret: annotations.get(TLS_SECRET_ANNOTATION).filter(|s| !s.is_empty()).cloned(),
        ca_pem: None,
        token: None,
        forwards: Vec::new(),
    };
    for pod in ready {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::PortForward(format!("cannot listen on loopback: {e}")))?;
        let local = listener.local_addr().map_err(|e| Error::PortForward(e.to_string()))?;
        let advertised = format!("{pod}.{peers}.{namespace}.svc:{port}");
        remote.routes.insert(advertised.clone(), local.to_string());
        remote.addresses.push(advertised);
        remote.forwards.push(tokio::spawn(forward(listener, pods.clone(), pod, port)));
    }

    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    if let Some(tls) = &remote.tls_secret {
        remote.ca_pem = read_secret(&secrets, tls, "ca.pem").await?;
    }
    if let Some(token) = annotations.get(TOKEN_SECRET_ANNOTATION) {
        remote.token = read_secret(&secrets, token, "token")
            .await?
            .map(|t| String::from_utf8_lossy(&t).trim().to_string());
    }
    Ok(remote)
}

/// A key of a Secret; `None` when the user may not read it (RBAC), an error otherwise.
async fn read_secret(secrets: &Api<Secret>, name: &str, key: &str) -> Result<Option<Vec<u8>>, Error> {
    match secrets.get(name).await {
        Ok(secret) => {
            let value = secret.data.unwrap_or_default().remove(key).map(|b| b.0);
            value.map(Some).ok_or_else(|| Error::NotFound(format!("secret {name} has no key {key}")))
        }
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(None),
        Err(e) => Err(Error::api(format!("read secret {name}"))(e)),
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Accepts local connections and carries each over its own port-forward to `pod:port`.
async fn forward(listener: TcpListener, pods: Api<Pod>, pod: String, port: u16) {
    loop {
        let Ok((mut local, peer)) = listener.accept().await else { return };
        let pods = pods.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            if let Err(e) = carry(&mut local, &pods, &pod, port).await {
                tracing::warn!(%peer, pod, "port-forward: {e}");
            }
        });
    }
}

async fn carry(
    local: &mut tokio::net::TcpStream,
    pods: &Api<Pod>,
    pod: &str,
    port: u16,
) -> Result<(), Error> {
    let mut forwarder = pods
        .portforward(pod, &[port])
        .await
        .map_err(|e| Error::PortForward(format!("to {pod}:{port}: {e}")))?;
    let mut remote = forwarder
        .take_stream(port)
        .ok_or_else(|| Error::PortForward(format!("no stream for port {port} of {pod}")))?;
    tokio::io::copy_bidirectional(local, &mut remote)
        .await
        .map_err(|e| Error::PortForward(format!("to {pod}:{port}: {e}")))?;
    drop(remote);
    forwarder.join().await.map_err(|e| Error::PortForward(format!("to {pod}:{port}: {e}")))
}
