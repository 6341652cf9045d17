//! The checkpoint bucket: moto's S3 server (from the project's venv) on the hub's loopback, and
//! in front of it, on the hub's address, a small HTTP proxy that injects the object store's
//! failures as real answers on the wire: `503 SlowDown` (throttling), `500 InternalError`,
//! connections dropped without an answer, and answers held back.
//!
//! The proxy relays bytes untouched while no fault is on. A fault applies to every connection
//! opened while it lasts; starting one also closes the connections open, so that pooled
//! connections meet it too (a closed idle connection is one more dropped connection). Every
//! request the proxy answered with a fault is counted.

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The bucket every S3 job of the harness checkpoints to.
pub const BUCKET: &str = "chaos";

/// How long moto gets to listen.
const MOTO_START: Duration = Duration::from_secs(60);
/// The most of a request head the proxy reads, and how long it waits for a request.
const HEAD_LIMIT: usize = 64 << 10;
const REQUEST_WAIT: Duration = Duration::from_secs(30);
/// How late a slow store answers each request.
const LATENCY: Duration = Duration::from_millis(400);

/// What the proxy does to the requests of new connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Relays them.
    None,
    /// Answers `503 SlowDown`.
    Throttle,
    /// Answers `500 InternalError`.
    Error,
    /// Closes the connection without an answer.
    Drop,
    /// Relays them, each request [`LATENCY`] late.
    Slow,
}

/// Requests the proxy answered with a fault, by fault.
#[derive(Debug, Default)]
pub struct Counts {
    /// `503 SlowDown` answers.
    pub throttled: AtomicU64,
    /// `500` answers.
    pub errors: AtomicU64,
    /// Connections dropped.
    pub dropped: AtomicU64,
    /// Requests held back.
    pub delayed: AtomicU64,
}

impl Counts {
    /// (throttled, errors, dropped, delayed) now.
    pub fn snapshot(&self) -> [u64; 4] {
        [&self.throttled, &self.errors, &self.dropped, &self.delayed].map(|c| c.load(Ordering::Relaxed))
    }
}

/// moto and the proxy in front of it.
pub struct ObjectStore {
    moto: Child,
    /// The proxy's address: the S3 endpoint workers, coordinators and the CLI use.
    pub endpoint: SocketAddr,
    fault: watch::Sender<Fault>,
    /// What the proxy did.
    pub counts: Arc<Counts>,
}

impl ObjectStore {
    /// Starts moto (`venv/bin/moto_server`) on loopback, makes the bucket, and the proxy on
    /// `listen` (port 0: any) in `runtime`.
    pub fn start(
        venv: &Path,
        listen: Ipv4Addr,
        log: &Path,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<Self> {
        let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port();
        let binary = venv.join("bin/moto_server");
        let moto = Command::new(&binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| {
                format!("starting {} (scripts/setup.sh --test installs it)", binary.display())
            })?;
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut store = ObjectStore {
            moto,
            endpoint: upstream,
            fault: watch::channel(Fault::None).0,
            counts: Arc::default(),
        };
        store.make_bucket(upstream)?;
        let listener = {
            let _inside = runtime.enter();
            let std_listener = std::net::TcpListener::bind((listen, 0))?;
            std_listener.set_nonblocking(true)?;
            TcpListener::from_std(std_listener)?
        };
        store.endpoint = listener.local_addr()?;
        runtime.spawn(serve(listener, upstream, store.fault.subscribe(), store.counts.clone()));
        Ok(store)
    }

    fn make_bucket(&mut self, moto: SocketAddr) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Ok(mut stream) = std::net::TcpStream::connect_timeout(&moto, Duration::from_secs(2)) {
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                // moto accepts an unsigned PUT.
                write!(
                    stream,
                    "PUT /{BUCKET} HTTP/1.1\r\nHost: {moto}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )?;
                let mut answer = String::new();
                stream.read_to_string(&mut answer)?;
                if !answer.starts_with("HTTP/1.1 200") {
                    bail!("moto refused to make bucket {BUCKET}: {answer}");
                }
                return Ok(());
            }
            if let Ok(Some(status)) = self.moto.try_wait() {
                bail!("moto_server exited ({status})");
            }
            if started.elapsed() > MOTO_START {
                bail!("moto_server did not listen within {MOTO_START:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sets what the proxy does from now on (closing the connections open when a fault starts).
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// The variables that point an S3 client (object_store's `from_env`) at the proxy.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", format!("http://{}", self.endpoint)),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "chaos".into()),
            ("AWS_SECRET_ACCESS_KEY", "chaos".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

impl Drop for ObjectStore {
    fn drop(&mut self) {
        let _ = self.moto.kill();
        let _ = self.moto.wait();
    }
}

async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    counts: Arc<Counts>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        let mut fault = fault.clone();
        let counts = counts.clone();
        tokio::spawn(async move {
            let now = *fault.borrow_and_update();
            match now {
                Fault::None | Fault::Slow => {
                    // Relays until either side closes or a fault starts.
                    tokio::select! {
                        _ = relay(client, upstream, now == Fault::Slow, &counts) => {}
                        _ = fault.changed() => {}
                    }
                }
                Fault::Throttle | Fault::Error | Fault::Drop => {
                    let _ = tokio::time::timeout(REQUEST_WAIT, refuse(client, now, &counts)).await;
                }
            }
        });
    }
}

/// Relays one connection; with `slow`, holds back every request that follows a quiet moment.
async fn relay(client: TcpStream, upstream: SocketAddr, slow: bool, counts: &Counts) -> std::io::Result<()> {
    let server = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream)).await??;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 << 10];
        let mut last = Instant::now() - Duration::from_secs(1);
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                return server_write.shutdown().await;
            }
            // A read after a quiet moment starts a request (a body streams without pauses).
            if slow && last.elapsed() > Duration::from_millis(100) {
                counts.delayed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(LATENCY).await;
            }
            server_write.write_all(&buf[..n]).await?;
            last = Instant::now();
        }
    };
    let down = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::try_join!(up, down)?;
    Ok(())
}

/// Reads one request (head and `Content-Length` body) and answers it with `fault`.
async fn refuse(mut client: TcpStream, fault: Fault, counts: &Counts) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let body_start = loop {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if head.len() > HEAD_LIMIT {
            return Ok(());
        }
    };
    if fault == Fault::Drop {
        counts.dropped.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    let length = String::from_utf8_lossy(&head[..body_start])
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<u64>().ok())?
        })
        .unwrap_or(0);
    let mut left = length.saturating_sub((head.len() - body_start) as u64);
    while left > 0 {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        left = left.saturating_sub(n as u64);
    }
    let (status, code, message) = if fault == Fault::Throttle {
        counts.throttled.fetch_add(1, Ordering::Relaxed);
        ("503 Slow Down", "SlowDown", "Please reduce your request rate.")
    } else {
        counts.errors.fetch_add(1, Ordering::Relaxed);
        ("500 Internal Server Error", "InternalError", "We encountered an internal error. Please try again.")
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message>\
         <RequestId>chaos</RequestId></Error>"
    );
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(answer.as_bytes()).await?;
    client.shutdown().await
}
