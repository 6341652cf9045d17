//! A small Kubernetes API server on loopback, for tests (there is no cluster here).
//!
//! It speaks enough of the core v1 API for podctl's controller and `podctl launch
//! --kube-context`: list (equality label selectors), get, create (`AlreadyExists` on a
//! duplicate name), delete (a pod gets a `deletionTimestamp`, as with a grace period, until the
//! test plays the kubelet with [`MockApi::remove`]), watch (JSON lines from a resource version),
//! and pod port-forward over WebSocket (`v4.channel.k8s.io`) to a TCP address the test names.
//! Secrets' `stringData` becomes `data`, as the real server does. Every write is logged
//! ([`MockApi::requests`]) so tests can assert that nothing was created twice.
//!
//! What the control plane around the API server does, as far as podctl's tests need it:
//! - **garbage collection**: an object whose owner references all name objects that are gone
//!   is deleted (background propagation), at once rather than a few seconds later; logged as
//!   `GC <plural>/<name>` in [`MockApi::requests`];
//! - **Pod Security admission** ([`pod_security`]): a pod created in a namespace labelled
//!   `pod-security.kubernetes.io/enforce` is refused (403) when it violates that level;
//! - **scheduling**, on demand ([`MockApi::schedule`]): pending pods are bound to the nodes the
//!   test added, by node selector, resources and required pod (anti-)affinity.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Message, handshake::derive_accept_key, protocol::Role};

pub mod pod_security;
mod scheduler;

pub use scheduler::Placement;

type Body = BoxBody<Bytes, Infallible>;
/// (plural, namespace, name).
type Key = (String, String, String);

#[derive(Default)]
struct Store {
    objects: BTreeMap<Key, Value>,
    /// Every change: (resource version, plural, namespace, event type, object).
    events: Vec<(u64, String, String, &'static str, Value)>,
    version: u64,
    uid: u64,
    requests: Vec<String>,
    forwards: BTreeMap<(String, String), SocketAddr>,
}

impl Store {
    fn record(&mut self, plural: &str, ns: &str, kind: &'static str, mut object: Value) -> Value {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.events.push((self.version, plural.into(), ns.into(), kind, object.clone()));
        object
    }
}

struct Shared {
    store: Mutex<Store>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn with<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let (out, version) = {
            let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            let out = f(&mut store);
            (out, store.version)
        };
        self.changed.send_replace(version);
        out
    }
}

/// The API server; stops when dropped.
pub struct MockApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockApi {
    /// Serves on `127.0.0.1:0`.
    pub async fn start() -> MockApi {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("bound address");
        let shared = Arc::new(Shared { store: Mutex::default(), changed: watch::channel(0).0 });
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        MockApi { addr, shared, task }
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client of this server with `namespace` as its default.
    pub fn client(&self, namespace: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().expect("a URL"));
        config.default_namespace = namespace.into();
        kube::Client::try_from(config).expect("a client of the mock")
    }

    /// A kubeconfig with one context, `context`, pointing here.
    pub fn kubeconfig_yaml(&self, context: &str, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: {context}\nclusters:\n- name: mock\n  cluster:\n    \
             server: {}\ncontexts:\n- name: {context}\n  context:\n    cluster: mock\n    user: tester\n    \
             namespace: {namespace}\nusers:\n- name: tester\n  user:\n    token: mock-token\n",
            self.url()
        )
    }

    /// Stores an object (a test's fixture: services, coordinator pods), as if created; returns
    /// it as stored (with its uid).
    pub fn put(&self, plural: &str, object: impl serde::Serialize) -> Value {
        let object = serde_json::to_value(object).expect("serializable");
        let ns = object["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        let name = object["metadata"]["name"].as_str().expect("a name").to_string();
        self.shared.with(|s| {
            let object = create(s, plural, &ns, object);
            s.objects.insert((plural.into(), ns, name), object.clone());
            object
        })
    }

    /// A namespace with these labels (`pod-security.kubernetes.io/enforce: baseline` makes the
    /// server refuse pods that break the baseline level there).
    pub fn put_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let mut object = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name, "labels": labels } });
        object["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        self.shared.with(|s| {
            let object = create(s, "namespaces", "", object);
            s.objects.insert(("namespaces".into(), String::new(), name.into()), object);
        });
    }

    /// A node with these labels and allocatable resources (`[("google.com/tpu", "4")]`), for
    /// [`MockApi::schedule`].
    pub fn add_node(&self, name: &str, labels: &[(&str, &str)], allocatable: &[(&str, &str)]) {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let allocatable: BTreeMap<&str, &str> = allocatable.iter().copied().collect();
        let object = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": name, "labels": labels },
            "status": { "allocatable": allocatable }
        });
        self.shared.with(|s| {
            let object = create(s, "nodes", "", object);
            s.objects.insert(("nodes".into(), String::new(), name.into()), object);
        });
    }

    /// Binds every pending, unbound pod that fits a node, as kube-scheduler would (see
    /// [`Placement`]); returns each pod's placement, by `namespace/name`.
    pub fn schedule(&self) -> BTreeMap<String, Placement> {
        self.shared.with(scheduler::schedule)
    }

    /// The objects of a kind in a namespace, by name.
    pub fn list(&self, plural: &str, ns: &str) -> BTreeMap<String, Value> {
        self.shared.with(|s| {
            s.objects
                .iter()
                .filter(|((p, n, _), _)| p == plural && n == ns)
                .map(|((_, _, name), o)| (name.clone(), o.clone()))
                .collect()
        })
    }

    /// Sets a pod's phase, reason and message (the kubelet or the eviction manager did).
    pub fn set_pod_status(&self, ns: &str, name: &str, phase: &str, reason: Option<&str>) {
        self.shared.with(|s| {
            let key = ("pods".to_string(), ns.to_string(), name.to_string());
            let Some(mut pod) = s.objects.get(&key).cloned() else { panic!("no pod {name}") };
            pod["status"] = json!({ "phase": phase });
            if let Some(reason) = reason {
                pod["status"]["reason"] = json!(reason);
                pod["status"]["message"] = json!(format!("the mock's kubelet says {reason}"));
            }
            let pod = s.record("pods", ns, "MODIFIED", pod);
            s.objects.insert(key, pod);
        });
    }

    /// The pod's container ended with `exit_code` (the kubelet saw it exit: `Error`, or
    /// `OOMKilled`): the pod is `Failed`, its container `terminated` now.
    pub fn set_container_exit(&self, ns: &str, name: &str, exit_code: i32, reason: &str) {
        self.shared.with(|s| {
            let key = ("pods".to_string(), ns.to_string(), name.to_string());
            let Some(mut pod) = s.objects.get(&key).cloned() else { panic!("no pod {name}") };
            let container = pod["spec"]["containers"][0]["name"].clone();
            let finished = k8s_openapi::chrono::Utc::now()
                .to_rfc3339_opts(k8s_openapi::chrono::SecondsFormat::Millis, true);
            pod["status"] = json!({
                "phase": if exit_code == 0 { "Succeeded" } else { "Failed" },
                "containerStatuses": [{
                    "name": container, "ready": false, "restartCount": 0, "image": "", "imageID": "",
                    "state": { "terminated": { "exitCode": exit_code, "reason": reason, "finishedAt": finished } }
                }]
            });
            let pod = s.record("pods", ns, "MODIFIED", pod);
            s.objects.insert(key, pod);
        });
    }

    /// Deletes an object as a user's `kubectl delete` would (see [`delete`]); what it owned is
    /// garbage collected.
    pub fn delete(&self, plural: &str, ns: &str, name: &str) {
        self.shared.with(|s| delete(s, plural, ns, name)).expect("the object exists");
    }

    /// Removes an object for good (the kubelet finished a pod's deletion).
    pub fn remove(&self, plural: &str, ns: &str, name: &str) {
        self.shared.with(|s| {
            if let Some(object) = s.objects.remove(&(plural.into(), ns.into(), name.into())) {
                s.record(plural, ns, "DELETED", object);
                collect_garbage(s);
            }
        });
    }

    /// Port-forwards to pod `name` in `ns` connect to `target`.
    pub fn forward(&self, ns: &str, name: &str, target: SocketAddr) {
        self.shared.with(|s| s.forwards.insert((ns.into(), name.into()), target));
    }

    /// Every write so far: `POST pods/<name> 201`, `DELETE secrets/<name> 200`, ...
    pub fn requests(&self) -> Vec<String> {
        self.shared.with(|s| s.requests.clone())
    }
}

fn create(s: &mut Store, plural: &str, ns: &str, mut object: Value) -> Value {
    s.uid += 1;
    let metadata = &mut object["metadata"];
    metadata["namespace"] = json!(ns);
    metadata["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", s.uid));
    metadata["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    if plural == "pods" && object.get("status").is_none_or(Value::is_null) {
        object["status"] = json!({ "phase": "Pending" });
    }
    if plural == "secrets" {
        // The server keeps `data` only, base64 in JSON (k8s-openapi's ByteString does that).
        let mut secret: Secret = serde_json::from_value(object).expect("a Secret");
        let data = secret.data.get_or_insert_default();
        for (k, v) in secret.string_data.take().unwrap_or_default() {
            data.insert(k, ByteString(v.into_bytes()));
        }
        object = serde_json::to_value(secret).expect("serializable");
    }
    s.record(plural, ns, "ADDED", object)
}

/// Deletes as the API server does: a pod gets a `deletionTimestamp` (its grace period runs
/// until [`MockApi::remove`]), anything else goes at once.
fn delete(s: &mut Store, plural: &str, ns: &str, name: &str) -> Option<Value> {
    let key = (plural.to_string(), ns.to_string(), name.to_string());
    let mut object = s.objects.get(&key).cloned()?;
    if plural != "pods" {
        s.objects.remove(&key);
        s.record(plural, ns, "DELETED", object.clone());
        collect_garbage(s);
        return Some(object);
    }
    if object["metadata"]["deletionTimestamp"].is_null() {
        object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
        object = s.record(plural, ns, "MODIFIED", object);
        s.objects.insert(key, object.clone());
    }
    Some(object)
}

/// Kubernetes' garbage collector, background propagation: every object whose owner references
/// all name objects that no longer exist is deleted, until none is left (a pod being deleted
/// still exists, as it does for the collector).
fn collect_garbage(s: &mut Store) {
    loop {
        let orphaned: Vec<Key> = s
            .objects
            .iter()
            .filter(|((_, ns, _), object)| {
                let owners = object["metadata"]["ownerReferences"].as_array().filter(|o| !o.is_empty());
                owners.is_some_and(|owners| {
                    owners.iter().all(|owner| {
                        !s.objects.iter().any(|((_, owner_ns, _), candidate)| {
                            owner_ns == ns && candidate["metadata"]["uid"] == owner["uid"]
                        })
                    })
                }) && object["metadata"]["deletionTimestamp"].is_null()
            })
            .map(|(key, _)| key.clone())
            .collect();
        if orphaned.is_empty() {
            return;
        }
        for (plural, ns, name) in orphaned {
            s.requests.push(format!("GC {plural}/{name}"));
            delete(s, &plural, &ns, &name);
        }
    }
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()
    });
    respond(code, &body)
}

fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("a response")
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => out.push(b),
                    None => out.extend_from_slice(&bytes[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (decode(k), decode(v))))
        .collect()
}

/// Whether an object's labels satisfy an equality selector `a=b,c=d`.
fn matches(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else { return true };
    selector.split(',').all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        object["metadata"]["labels"][k].as_str() == Some(v.trim_start_matches('='))
    })
}

/// Pod Security admission: why the namespace's `enforce` level refuses the pod, if it does.
fn admit_pod(s: &Store, ns: &str, name: &str, pod: &Value) -> Option<String> {
    let namespace = s.objects.get(&("namespaces".to_string(), String::new(), ns.to_string()))?;
    let level = namespace["metadata"]["labels"][pod_security::ENFORCE_LABEL].as_str()?;
    let violations = pod_security::violations(level, &pod["spec"]);
    (!violations.is_empty()).then(|| {
        format!(
            "pods \"{name}\" is forbidden: violates PodSecurity \"{level}:latest\": {}",
            violations.join(", ")
        )
    })
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path: Vec<String> = req.uri().path().trim_matches('/').split('/').map(str::to_owned).collect();
    // /api/v1/namespaces/{ns}/{plural}[/{name}[/portforward]]
    let (ns, plural, name, sub) = match path.as_slice() {
        [api, v1, nss, ns, plural, rest @ ..] if api == "api" && v1 == "v1" && nss == "namespaces" => {
            (ns.clone(), plural.clone(), rest.first().cloned(), rest.get(1).cloned())
        }
        _ => return Ok(status(StatusCode::NOT_FOUND, "NotFound", format!("no route {}", req.uri().path()))),
    };
    let q = query(&req);
    if sub.as_deref() == Some("portforward") {
        return Ok(portforward(shared, req, ns, name.unwrap_or_default(), q));
    }
    let method = req.method().clone();
    let response = match (method, name) {
        (Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            watch_response(shared, plural, ns, q)
        }
        (Method::GET, None) => shared.with(|s| {
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|((p, n, _), o)| p == &plural && n == &ns && matches(o, q.get("labelSelector")))
                .map(|(_, o)| o.clone())
                .collect();
            let body = json!({
                "kind": "List", "apiVersion": "v1",
                "metadata": { "resourceVersion": s.version.to_string() }, "items": items
            });
            respond(StatusCode::OK, &body)
        }),
        (Method::GET, Some(name)) => {
            shared.with(|s| match s.objects.get(&(plural.clone(), ns, name.clone())) {
                Some(o) => respond(StatusCode::OK, o),
                None => status(StatusCode::NOT_FOUND, "NotFound", format!("{plural} \"{name}\" not found")),
            })
        }
        (Method::POST, None) => {
            let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let Ok(object) = serde_json::from_slice::<Value>(&bytes) else {
                return Ok(status(StatusCode::BAD_REQUEST, "BadRequest", "the body is not JSON".into()));
            };
            let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
            shared.with(|s| {
                let key = (plural.clone(), ns.clone(), name.clone());
                let refused = (plural == "pods").then(|| admit_pod(s, &ns, &name, &object)).flatten();
                let (code, response) = if let Some(message) = refused {
                    (StatusCode::FORBIDDEN, status(StatusCode::FORBIDDEN, "Forbidden", message))
                } else if s.objects.contains_key(&key) {
                    let message = format!("{plural} \"{name}\" already exists");
                    (StatusCode::CONFLICT, status(StatusCode::CONFLICT, "AlreadyExists", message))
                } else {
                    let object = create(s, &plural, &ns, object);
                    s.objects.insert(key, object.clone());
                    // An owner that is already gone: the collector deletes it right away.
                    collect_garbage(s);
                    (StatusCode::CREATED, respond(StatusCode::CREATED, &object))
                };
                s.requests.push(format!("POST {plural}/{name} {}", code.as_u16()));
                response
            })
        }
        (Method::DELETE, Some(name)) => shared.with(|s| {
            let response = match delete(s, &plural, &ns, &name) {
                None => status(StatusCode::NOT_FOUND, "NotFound", format!("{plural} \"{name}\" not found")),
                Some(object) => respond(StatusCode::OK, &object),
            };
            s.requests.push(format!("DELETE {plural}/{name} {}", response.status().as_u16()));
            response
        }),
        (method, _) => {
            status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", format!("{method} is not mocked"))
        }
    };
    Ok(response)
}

fn watch_response(
    shared: Arc<Shared>,
    plural: String,
    ns: String,
    q: BTreeMap<String, String>,
) -> Response<Body> {
    let mut from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let timeout = Duration::from_secs(q.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(290));
    let selector = q.get("labelSelector").cloned();
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let mut changed = shared.changed.subscribe();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let events: Vec<(u64, Value)> = shared.with(|s| {
                s.events
                    .iter()
                    .filter(|(v, p, n, _, o)| {
                        *v > from && p == &plural && n == &ns && matches(o, selector.as_ref())
                    })
                    .map(|(v, _, _, kind, o)| (*v, json!({ "type": kind, "object": o })))
                    .collect()
            });
            for (version, event) in events {
                from = version;
                let line = Bytes::from(format!("{event}\n"));
                if tx.send(Ok(Frame::data(line))).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                r = changed.changed() => if r.is_err() { return },
                () = tx.closed() => return,
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx))))
        .expect("a response")
}

fn portforward(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    ns: String,
    pod: String,
    q: BTreeMap<String, String>,
) -> Response<Body> {
    let Some(target) = shared.with(|s| s.forwards.get(&(ns, pod.clone())).copied()) else {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("pods \"{pod}\" not found"));
    };
    let Some(port) = q.get("ports").and_then(|p| p.parse::<u16>().ok()) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "one port, please".into());
    };
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not a WebSocket upgrade".into());
    };
    let accept = derive_accept_key(key.as_bytes());
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(req).await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        let _ = relay(ws, port, target).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, "v4.channel.k8s.io")
        .body(Full::new(Bytes::new()).boxed())
        .expect("a response")
}

/// The v4 port-forward protocol: channel 0 carries data, channel 1 errors; the first frame of
/// each names the port.
async fn relay(
    ws: WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
    port: u16,
    target: SocketAddr,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (mut sink, mut stream) = ws.split();
    let [lo, hi] = port.to_le_bytes();
    sink.send(Message::binary(vec![0, lo, hi])).await?;
    sink.send(Message::binary(vec![1, lo, hi])).await?;
    let tcp = TcpStream::connect(target).await?;
    let (mut read, mut write) = tcp.into_split();
    let upstream = async {
        while let Some(message) = stream.next().await {
            match message? {
                Message::Binary(data) if data.len() > 1 && data[0] == 0 => {
                    write.write_all(&data[1..]).await?
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
        write.shutdown().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    };
    let downstream = async {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = read.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            let mut frame = Vec::with_capacity(n + 1);
            frame.push(0);
            frame.extend_from_slice(&buf[..n]);
            sink.send(Message::binary(frame)).await?;
        }
        sink.close().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    };
    tokio::try_join!(upstream, downstream)?;
    Ok(())
}
