//! What tests share: moto's S3 server on loopback ([`Moto`]), a free port, a child process killed
//! when dropped, the checkout's root.
//!
//! **Architecture Invariant:** a dev-dependency only, and std only, so that any crate's tests can
//! use it, the checkpoint crate's included, without a cycle (checked: `test-support:` in
//! docs/ARCHITECTURE.md, and no crate lists it under `[dependencies]`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long moto gets to listen (it starts a Python interpreter; a loaded CI machine is slow).
const MOTO_START: Duration = Duration::from_secs(60);

/// The checkout's root (where `.venv` is).
pub fn root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// The Python environment `scripts/setup.sh` makes, `.venv` in the checkout (`PODCTL_VENV`
/// overrides).
pub fn venv() -> PathBuf {
    std::env::var_os("PODCTL_VENV").map_or_else(|| root().join(".venv"), PathBuf::from)
}

/// A loopback port free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A child process, killed (and reaped) when dropped.
#[derive(Debug)]
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// moto's S3 server from the [`venv`] (`scripts/setup.sh --test` installs it),
/// listening on loopback; stopped when dropped. It takes any credentials (tests give
/// `testing`/`testing`, region `us-east-1`).
#[derive(Debug)]
pub struct Moto {
    port: u16,
    process: Killed,
}

impl Moto {
    /// Starts moto on a free port and waits until it listens.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Starts moto on `port` and waits until it listens.
    pub fn start_on(port: u16) -> Self {
        let binary = venv().join("bin/moto_server");
        assert!(binary.exists(), "{} is missing: run scripts/setup.sh --test", binary.display());
        let child = Command::new(&binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut moto = Self { port, process: Killed(child) };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = moto.process.0.try_wait().unwrap() {
                panic!("moto on port {port} exited with {status} before it listened");
            }
            assert!(
                started.elapsed() < MOTO_START,
                "moto did not listen on port {port} within {MOTO_START:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// Starts moto on a free port with `bucket` made.
    pub fn with_bucket(bucket: &str) -> Self {
        let moto = Self::start();
        moto.create_bucket(bucket);
        moto
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its endpoint, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Makes `bucket` (moto takes an unsigned PUT).
    pub fn create_bucket(&self, bucket: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {answer}");
    }
}
