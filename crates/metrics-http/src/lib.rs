//! The `/metrics` endpoint of podctl's processes (coordinator nodes and workers): a
//! prometheus-client [`Registry`] served as OpenMetrics text over HTTP/1.1.
//!
//! The HTTP is hyper's, the stack tonic already brings into every podctl binary; nothing here
//! parses HTTP. Routes: `GET`/`HEAD /metrics` (the registry encoded at request time, so its
//! collectors read their state then), `GET`/`HEAD /healthz` (the process answers) and, for a
//! process with a [`Readiness`] check, `/readyz` (200 when ready, 503 with the reason when
//! not); another path is 404, another method 405. What a client can make the server hold is bounded:
//! - a request head over [`MAX_HEAD_BYTES`] is refused by hyper's parser with 431 (a URI too long
//!   with 414, a malformed head with 400); request bodies are never read;
//! - one request per connection (a scrape is one GET every few seconds; no idle keep-alive
//!   connections to account for), and [`CONNECTION_TIMEOUT`] for the whole exchange;
//! - at most [`MAX_CONNECTIONS`] connections at once; past that, new ones wait in the listen
//!   backlog.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE as CONTENT_TYPE_HEADER, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The content type of the page: the OpenMetrics text format, which Prometheus asks for first.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of every other answer.
const TEXT: &str = "text/plain; charset=utf-8";
/// Largest request head read (hyper's smallest read buffer); a larger one is answered 431.
pub const MAX_HEAD_BYTES: usize = 8 << 10;
/// Longest a connection may take, from accept to the last byte of the answer.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Why a connection ended without a complete exchange (the server goes on; it only logs these).
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The client did not finish within [`CONNECTION_TIMEOUT`].
    #[error("the client took longer than {CONNECTION_TIMEOUT:?}; connection closed")]
    Timeout,
    /// HTTP failed: a malformed or oversized request (already answered with a 4xx where hyper
    /// could), or the client went away.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
}

/// A readiness check: `Ok(what is ready)` is answered 200, `Err(why not)` 503.
pub type Readiness = Box<dyn Fn() -> Result<String, String> + Send + Sync>;

/// What the endpoint serves.
pub struct Pages {
    /// Encoded at `/metrics`.
    pub registry: Registry,
    /// Asked at `/readyz`; without one, `/readyz` is not served.
    pub readiness: Option<Readiness>,
}

impl From<Registry> for Pages {
    fn from(registry: Registry) -> Self {
        Pages { registry, readiness: None }
    }
}

/// Serves `pages` on `listener` until `shutdown` completes.
pub async fn serve(listener: TcpListener, pages: Arc<Pages>, shutdown: impl Future<Output = ()>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => return,
            permit = permits.clone().acquire_owned() => permit,
        };
        // The semaphore is never closed.
        let Ok(permit) = permit else { return };
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: pass, rather than spin.
                tracing::warn!("metrics listener: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let pages = pages.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, &pages).await {
                tracing::debug!("metrics request: {e}");
            }
            drop(permit);
        });
    }
}

/// Answers the one request of a connection (TCP, or any byte stream: the fuzz target's is in
/// memory).
pub async fn serve_connection<IO>(io: IO, pages: &Pages) -> Result<(), ConnectionError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let service = hyper::service::service_fn(|request: Request<Incoming>| {
        std::future::ready(Ok::<_, Infallible>(respond(request.method(), request.uri().path(), pages)))
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(io), service);
    tokio::time::timeout(CONNECTION_TIMEOUT, connection).await.map_err(|_| ConnectionError::Timeout)??;
    Ok(())
}

/// The answer to `method path`.
fn respond(method: &Method, path: &str, pages: &Pages) -> Response<Full<Bytes>> {
    let answer = |status: StatusCode, content_type: &'static str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(CONTENT_TYPE_HEADER, HeaderValue::from_static(content_type));
        response
    };
    if !matches!(*method, Method::GET | Method::HEAD) {
        let mut response =
            answer(StatusCode::METHOD_NOT_ALLOWED, TEXT, format!("{method} is not served here; use GET\n"));
        response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => {
            let mut page = String::new();
            match prometheus_client::encoding::text::encode(&mut page, &pages.registry) {
                Ok(()) => answer(StatusCode::OK, CONTENT_TYPE, page),
                Err(_) => answer(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    TEXT,
                    "a collector failed to encode its metrics\n".into(),
                ),
            }
        }
        "/healthz" => answer(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" if pages.readiness.is_some() => match (pages.readiness.as_ref().expect("checked"))() {
            Ok(ready) => answer(StatusCode::OK, TEXT, format!("{ready}\n")),
            Err(why) => answer(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
        },
        _ => answer(
            StatusCode::NOT_FOUND,
            TEXT,
            format!(
                "only /metrics, /healthz{} are served here\n",
                if pages.readiness.is_some() { " and /readyz" } else { "" }
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A server of a registry holding one counter at 7, on loopback.
    async fn server() -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        counter.inc_by(7);
        registry.register("podctl_test_things", "Things counted", counter);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        tokio::spawn(serve(listener, Arc::new(registry.into()), async move { drop(stopped.await) }));
        (addr, stop)
    }

    /// Sends `request` as it is and reads the answer to its end.
    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer))
            .await
            .expect("the server answers and closes")
            .unwrap();
        String::from_utf8(answer).unwrap()
    }

    fn status(answer: &str) -> u16 {
        let line = answer.lines().next().unwrap_or_default();
        assert!(line.starts_with("HTTP/1.1 "), "{answer:?}");
        line[9..12].parse().unwrap()
    }

    fn body(answer: &str) -> &str {
        answer.split_once("\r\n\r\n").map_or("", |(_, body)| body)
    }

    const SCRAPE: &[u8] =
        b"GET /metrics HTTP/1.1\r\nHost: test\r\nAccept: application/openmetrics-text\r\n\r\n";

    #[tokio::test]
    async fn readiness_is_served_only_by_a_process_that_has_a_check() {
        let (addr, _stop) = server().await;
        let absent = exchange(addr, b"GET /readyz HTTP/1.1\r\nHost: test\r\n\r\n").await;
        assert_eq!(status(&absent), 404, "{absent}");
        let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let check = ready.clone();
        let pages = Pages {
            registry: Registry::default(),
            readiness: Some(Box::new(move || match check.load(std::sync::atomic::Ordering::SeqCst) {
                true => Ok("joined".into()),
                false => Err("no leader yet".into()),
            })),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(pages), std::future::pending()));
        let ask = b"GET /readyz HTTP/1.1\r\nHost: test\r\n\r\n";
        let not_yet = exchange(addr, ask).await;
        assert_eq!((status(&not_yet), body(&not_yet)), (503, "no leader yet\n"), "{not_yet}");
        ready.store(true, std::sync::atomic::Ordering::SeqCst);
        let now = exchange(addr, ask).await;
        assert_eq!((status(&now), body(&now)), (200, "joined\n"), "{now}");
    }

    #[tokio::test]
    async fn serves_the_page_and_health_and_closes() {
        let (addr, _stop) = server().await;
        let answer = exchange(addr, SCRAPE).await;
        assert_eq!(status(&answer), 200, "{answer}");
        assert!(answer.to_lowercase().contains(&format!("content-type: {CONTENT_TYPE}")), "{answer}");
        assert_eq!(
            body(&answer),
            "# HELP podctl_test_things Things counted.\n# TYPE podctl_test_things counter\n\
             podctl_test_things_total 7\n# EOF\n"
        );
        let head = exchange(addr, b"HEAD /metrics?x=1 HTTP/1.1\r\nHost: test\r\n\r\n").await;
        assert_eq!((status(&head), body(&head)), (200, ""), "{head}");
        let health = exchange(addr, b"GET /healthz HTTP/1.0\r\n\r\n").await;
        assert_eq!(body(&health), "ok\n", "{health}");
        // A client that closes its side once it has asked (`nc -N`) is answered too.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(SCRAPE).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert_eq!(status(&answer), 200, "{answer}");
    }

    #[tokio::test]
    async fn malformed_and_oversized_requests_get_a_4xx_and_change_nothing() {
        let (addr, _stop) = server().await;
        let page = body(&exchange(addr, SCRAPE).await).to_string();
        let long_header =
            format!("GET /metrics HTTP/1.1\r\nHost: t\r\nX-Pad: {}\r\n\r\n", "a".repeat(64 << 10));
        let long_uri = format!("GET /metrics?{} HTTP/1.1\r\n\r\n", "q".repeat(MAX_HEAD_BYTES));
        let many_headers = format!("GET /metrics HTTP/1.1\r\n{}\r\n", "X-A: b\r\n".repeat(200));
        let cases: [(&[u8], u16); 12] = [
            (long_header.as_bytes(), 431),
            (long_uri.as_bytes(), 431),
            (many_headers.as_bytes(), 431),
            (b"BLAH\r\n\r\n", 400),
            (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
            (b"GET /metrics HTTP/1.1\r\nHost: a\x00b\r\n\r\n", 400),
            (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
            (b"GET metrics HTTP/1.1\r\n\r\n", 404),
            (b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
            (b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405),
            (b"DELETE /metrics HTTP/1.1\r\n\r\n", 405),
            (b"GET /metrics/../etc/passwd HTTP/1.1\r\n\r\n", 404),
        ];
        for (request, expected) in cases {
            let answer = exchange(addr, request).await;
            let shown = String::from_utf8_lossy(&request[..request.len().min(60)]);
            assert_eq!(status(&answer), expected, "{shown:?} -> {answer}");
            assert!(!answer.contains("podctl_test_things"), "{shown:?} was served the page: {answer}");
        }
        assert_eq!(body(&exchange(addr, SCRAPE).await), page, "the page changed");
    }

    #[tokio::test(start_paused = true)]
    async fn silent_clients_are_cut_off_and_cannot_keep_a_scrape_out() {
        let (addr, _stop) = server().await;
        let mut silent = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        // Every permit is held by a silent client until its timeout (the clock runs ahead while
        // everything waits), then the scrape is served.
        let started = tokio::time::Instant::now();
        assert_eq!(status(&exchange(addr, SCRAPE).await), 200);
        assert!(started.elapsed() >= CONNECTION_TIMEOUT, "{:?}", started.elapsed());
        let mut byte = [0u8; 1];
        let closed = silent[0].read(&mut byte).await.unwrap();
        assert_eq!(closed, 0, "the server closed the silent connection");
    }
}
