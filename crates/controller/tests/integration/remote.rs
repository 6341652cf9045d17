//! Finding a coordinator through a kubeconfig, and port-forwarding to it through the API server.

use controller::remote;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_mock::MockApi;
use std::collections::BTreeMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "train";

fn meta(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
    let map = |kv: &[(&str, &str)]| {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()
    };
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        labels: Some(map(labels)),
        annotations: Some(map(annotations)),
        ..Default::default()
    }
}

/// What the chart installs, as far as `remote::connect` reads it.
fn install(api: &MockApi, ready: &[bool]) {
    let selector = [
        ("app.kubernetes.io/name", "podctl"),
        ("app.kubernetes.io/instance", "podctl"),
        ("app.kubernetes.io/component", "coordinator"),
    ];
    api.put(
        "services",
        Service {
            metadata: meta(
                "podctl",
                &[("app.kubernetes.io/name", "podctl"), ("app.kubernetes.io/component", "client")],
                &[
                    ("podctl.dev/peers-service", "podctl-peers"),
                    ("podctl.dev/tls-secret", "podctl-tls"),
                    ("podctl.dev/admin-token-secret", "podctl-admin-token"),
                ],
            ),
            spec: Some(ServiceSpec {
                selector: Some(selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
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
    for (i, ready) in ready.iter().enumerate() {
        let condition = PodCondition {
            type_: "Ready".into(),
            status: if *ready { "True" } else { "False" }.into(),
            ..Default::default()
        };
        api.put(
            "pods",
            Pod {
                metadata: meta(&format!("podctl-{i}"), &selector, &[]),
                spec: None,
                status: Some(PodStatus {
                    phase: Some("Running".into()),
                    conditions: Some(vec![condition]),
                    ..Default::default()
                }),
            },
        );
    }
    let secret = |name: &str, key: &str, value: &str| Secret {
        metadata: meta(name, &[], &[]),
        data: Some(BTreeMap::from([(key.to_string(), ByteString(value.as_bytes().to_vec()))])),
        ..Default::default()
    };
    api.put("secrets", secret("podctl-tls", "ca.pem", "-----BEGIN CERTIFICATE-----\n"));
    api.put("secrets", secret("podctl-admin-token", "token", "the-admin-token\n"));
}

async fn echo_server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_kubeconfig_context_leads_to_every_ready_coordinator() {
    let api = MockApi::start().await;
    install(&api, &[true, false, true]);
    let echo = echo_server().await;
    api.forward(NS, "podctl-0", echo);
    api.forward(NS, "podctl-2", echo);

    let kubeconfig = kube::config::Kubeconfig::from_yaml(&api.kubeconfig_yaml("gke-train", NS)).unwrap();
    let Err(e) = remote::client_from(kubeconfig.clone(), Some("gke-other")).await else {
        panic!("a context that is not there")
    };
    let e = e.to_string();
    assert!(e.contains("no context 'gke-other'") && e.contains("gke-train"), "{e}");
    let (client, namespace) = remote::client_from(kubeconfig, Some("gke-train")).await.unwrap();
    assert_eq!(namespace, NS);

    let remote = remote::connect(client, &namespace).await.unwrap();
    assert_eq!(
        remote.addresses,
        ["podctl-0.podctl-peers.train.svc:7001", "podctl-2.podctl-peers.train.svc:7001"]
    );
    assert_eq!(remote.tls_secret.as_deref(), Some("podctl-tls"));
    assert_eq!(remote.ca_pem.as_deref(), Some(&b"-----BEGIN CERTIFICATE-----\n"[..]));
    assert_eq!(remote.token.as_deref(), Some("the-admin-token"));

    // Bytes go through the API server's port-forward to the pod and back, on every route.
    for address in &remote.addresses {
        let local = &remote.routes[address];
        let mut stream = tokio::net::TcpStream::connect(local).await.unwrap();
        stream.write_all(b"hello through the API server").await.unwrap();
        let mut back = [0u8; 28];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"hello through the API server");
    }
}

#[tokio::test]
async fn a_namespace_without_the_chart_says_so() {
    let api = MockApi::start().await;
    let e = remote::connect(api.client(NS), NS).await.map(|r| r.addresses.clone()).unwrap_err().to_string();
    assert!(e.contains("no podctl coordinator Service in namespace train"), "{e}");

    install(&api, &[false]);
    let e = remote::connect(api.client(NS), NS).await.map(|r| r.addresses.clone()).unwrap_err().to_string();
    assert!(e.contains("no coordinator pod of service podctl is ready"), "{e}");
}
