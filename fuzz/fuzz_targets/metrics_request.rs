//! Any bytes as a request to the `/metrics` endpoint (metrics-http: hyper's HTTP/1.1 and the
//! route table), over an in-memory connection the client closes after sending. The answer is
//! nothing (an incomplete request) or one HTTP/1.x response: 200 with exactly the page or the
//! health answer (nothing else is ever served), or a 4xx; never a 5xx, never a panic. The
//! registry encodes the same page afterwards: no request changes what the endpoint serves.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::sync::LazyLock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PAGE: &str = "# HELP podctl_fuzz_things Things counted.\n# TYPE podctl_fuzz_things counter\n\
                    podctl_fuzz_things_total 7\n# EOF\n";

static PAGES: LazyLock<metrics_http::Pages> = LazyLock::new(|| {
    let mut registry = Registry::default();
    let counter: Counter = Counter::default();
    counter.inc_by(7);
    registry.register("podctl_fuzz_things", "Things counted", counter);
    metrics_http::Pages { registry, readiness: Some(Box::new(|| Ok("ready".into()))) }
});

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime")
});

fn page() -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &PAGES.registry).expect("the registry encodes");
    text
}

fuzz_target!(|data: &[u8]| {
    let answer = RUNTIME.block_on(async {
        let (mut client, server) = tokio::io::duplex(16 << 10);
        let serving = metrics_http::serve_connection(server, &PAGES);
        let asking = async {
            // The server may stop reading (an oversized head) and close: then writing fails.
            if client.write_all(data).await.is_ok() {
                let _ = client.shutdown().await;
            }
            let mut answer = Vec::new();
            let _ = client.read_to_end(&mut answer).await;
            answer
        };
        tokio::join!(serving, asking).1
    });
    if !answer.is_empty() {
        let answer = String::from_utf8(answer).expect("answers are text");
        let (head, body) = answer.split_once("\r\n\r\n").expect("a complete head");
        // hyper answers in the request's version (HTTP/1.0 or 1.1).
        let status: u16 = ["HTTP/1.1 ", "HTTP/1.0 "]
            .iter()
            .find_map(|version| head.strip_prefix(version))
            .and_then(|rest| rest.get(..3)?.parse().ok())
            .unwrap_or_else(|| panic!("not a status line: {head:?}"));
        match status {
            200 => assert!([PAGE, "ok\n", "ready\n", ""].contains(&body), "200 with {body:?}"),
            400..=499 => assert!(!body.contains("podctl_fuzz_things"), "{status} with the page"),
            _ => panic!("status {status}: {answer:?}"),
        }
    }
    assert_eq!(page(), PAGE);
});
