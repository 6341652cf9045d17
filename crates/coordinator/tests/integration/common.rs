//! Fixtures: job specs, in-process and process nodes, clients.

use client::ClientTls;
use client::{Client, ClientConfig};
use coordinator::{Config, Embedded, TlsFiles};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN: &str = "admin-token-for-tests-0123456789";

/// A job spec of `dcn` slices and `steps` steps, checkpointing every `every` steps under `dir`.
pub fn spec(name: &str, dcn: usize, steps: u64, every: Option<u64>, dir: &Path) -> String {
    let checkpoint = match every {
        Some(every) => format!(
            "checkpoint: {{ every: {every}, keep: 2, uri: \"file://{}\" }}\n",
            dir.join("checkpoints").display()
        ),
        None => String::new(),
    };
    format!(
        "name: {name}\nmodel: tiny\nmesh: {{ dcn: {dcn}, ici: {{ fsdp: 1, tp: 1 }} }}\n\
         batch: {{ global: {}, micro: 1 }}\nseq_len: 16\nsteps: {steps}\n\
         data: {{ kind: arithmetic }}\noutput: {}\n{checkpoint}",
        2 * dcn,
        dir.join("run").display()
    )
}

pub fn submit_request(spec_yaml: String) -> client::Submission {
    client::Submission {
        spec_yaml,
        bundle_uri: "file:///nowhere/bundle".into(),
        bundle_id: "00ff00ff".into(),
        start_over: false,
    }
}

pub fn client(addrs: Vec<String>, token: &str, tls: Option<ClientTls>) -> Client {
    let mut config = ClientConfig::new(addrs, token, tls);
    config.retry_for = Duration::from_secs(30);
    config.call_timeout = Duration::from_secs(10);
    Client::new(config).unwrap()
}

/// A local-mode config: loopback, port 0, fast timeouts for tests.
pub fn local_config(data_dir: &Path, tls: Option<TlsFiles>) -> Config {
    let mut config = Config::new(1, "127.0.0.1:0".parse().unwrap(), data_dir, ADMIN);
    config.insecure_plaintext = tls.is_none();
    config.tls = tls;
    // Fast beats, but a lease of 15 of them: a loaded machine can stall a test's runtime for a
    // second, and only the tests that cut a worker off should see a lease expire.
    config.timeouts.heartbeat = Duration::from_millis(200);
    config.timeouts.lease = Duration::from_secs(3);
    config.timeouts.formation_wait = Duration::from_secs(30);
    config
}

pub async fn embedded(dir: &Path, tls: Option<TlsFiles>, record: bool) -> (Embedded, String) {
    let mut config = local_config(&dir.join("raft"), tls);
    config.record_runs = record;
    let node = Embedded::start(config).await.unwrap();
    let addr = node.addr().to_string();
    (node, addr)
}

/// Polls `f` every 20 ms until it returns `Some`, or panics after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A free loopback port (bound, noted, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One `podctl-coordinator` process.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    /// Starts node `id` of the cluster `peers` and waits for its "listening on" line.
    pub fn start(id: u64, peers: &[(u64, u16)], data: &Path, tls_dir: &Path, extra: &[&str]) -> Proc {
        Self::start_with_env(id, peers, data, tls_dir, extra, &[])
    }

    /// [`Proc::start`] with extra environment variables (`FAILPOINTS`).
    pub fn start_with_env(
        id: u64,
        peers: &[(u64, u16)],
        data: &Path,
        tls_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        let port = peers.iter().find(|(i, _)| *i == id).unwrap().1;
        let peers_arg = peers.iter().map(|(i, p)| format!("{i}=127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data.join(format!("node{id}.log")))
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_podctl-coordinator"))
            .args(["--id", &id.to_string(), "--listen", &format!("127.0.0.1:{port}"), "--peers", &peers_arg])
            .arg("--data-dir")
            .arg(data.join(format!("node{id}")))
            .arg("--tls-dir")
            .arg(tls_dir)
            .args(extra)
            .env("PODCTL_ADMIN_TOKEN", ADMIN)
            .env("RUST_LOG", "info,openraft=warn,h2=warn,hyper=warn,tower=warn")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr: SocketAddr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("node {id} printed {line:?}; see its log in {}", data.display()));
        assert_eq!(addr.port(), port);
        Proc { child }
    }

    pub fn sigkill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn sigterm(&mut self) {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(15), "node did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn tls_dir(dir: &Path) -> (PathBuf, TlsFiles) {
    let tls = dir.join("tls");
    let files = coordinator::tls::create_dev_ca(&tls, &[]).unwrap();
    (tls, files)
}

/// Asks `addr` alone about the cluster, once (a loaded machine may take a while to answer).
pub async fn info_of(addr: &str, tls: &ClientTls) -> Option<client::ClusterInfo> {
    let mut config = ClientConfig::new(vec![addr.into()], ADMIN, Some(tls.clone()));
    config.retry_for = Duration::ZERO;
    config.call_timeout = Duration::from_secs(5);
    Client::new(config).ok()?.cluster_info().await.ok()
}

/// Asks `addr` alone who leads, and how far it has applied.
pub async fn leader_seen_by(addr: &str, tls: &ClientTls) -> Option<(u64, u64)> {
    let info = info_of(addr, tls).await?;
    (info.leader_id != 0).then_some((info.leader_id, info.commit_index))
}
