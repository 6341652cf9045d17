//! The processes under test: three `podctl-coordinator` nodes with mutual TLS on the hub, and
//! one `podctl worker` per slice in the slice's namespace. All of them are real processes killed
//! with real signals.

use crate::net::Network;
use anyhow::{Context, Result, bail};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The admin token of the harness's cluster (it never leaves the hub namespace).
pub const ADMIN: &str = "podctl-chaos-admin-token-0123456789abcdef";

/// How long a coordinator node gets to open its port.
const NODE_START: Duration = Duration::from_secs(60);

/// Sends `signal` to `pid` (a child this harness started and has not reaped).
pub fn signal(pid: u32, signal: Signal) -> Result<()> {
    let raw = i32::try_from(pid).with_context(|| format!("pid {pid} is out of range"))?;
    kill(Pid::from_raw(raw), signal).with_context(|| format!("kill -{signal} {pid}"))
}

/// Pins the calling thread, and every thread and process it starts afterwards, to one CPU: two
/// harnesses side by side (the goodput bench's calm and failing runs) then share only what the
/// machine shares between its CPUs, and its drift in pace reaches both alike.
pub fn pin_to_cpu(cpu: usize) -> Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu).with_context(|| format!("CPU {cpu} is out of range"))?;
    sched_setaffinity(Pid::from_raw(0), &set).with_context(|| format!("pinning to CPU {cpu}"))
}

/// One coordinator node.
pub struct Node {
    /// Its Raft id (1-based).
    pub id: u64,
    /// Its address.
    pub addr: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn spawn(&mut self, bin: &Path) -> Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut child = Command::new(bin)
            .args(&self.args)
            .env("PODCTL_ADMIN_TOKEN", ADMIN)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info,openraft=warn,h2=warn,hyper=warn,tower=warn")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        // Its first line says it listens; read on a thread so a node that hangs fails the run.
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let Ok(line) = rx.recv_timeout(NODE_START) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("coordinator {} did not listen within {NODE_START:?}; see {}", self.id, self.log.display());
        };
        if !line.starts_with("listening on ") {
            let _ = child.kill();
            let _ = child.wait();
            bail!("coordinator {} printed {line:?}; see {}", self.id, self.log.display());
        }
        self.child = Some(child);
        Ok(())
    }

    /// Whether its process runs.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends `sig` (SIGSTOP and SIGCONT hang and resume it).
    pub fn signal(&self, sig: Signal) -> Result<()> {
        let child = self.child.as_ref().with_context(|| format!("coordinator {} is not running", self.id))?;
        signal(child.id(), sig)
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// The coordinator cluster.
pub struct Coordinators {
    bin: PathBuf,
    /// The nodes, by id - 1.
    pub nodes: Vec<Node>,
    /// The development CA's directory (`podctl-coordinator dev-ca`): `ca.pem`, the nodes'
    /// server certificate and the client certificate workers and the harness present.
    pub tls_dir: PathBuf,
}

impl Coordinators {
    /// Starts three nodes on the hub's address, with `env` (the object store's variables).
    pub fn start(bin: &Path, dir: &Path, env: &[(String, String)]) -> Result<Coordinators> {
        let tls_dir = dir.join("tls");
        let made = Command::new(bin)
            .arg("dev-ca")
            .arg("--dir")
            .arg(&tls_dir)
            .args(["--host", &Network::HUB.to_string()])
            .stdout(Stdio::null())
            .status()
            .context("running podctl-coordinator dev-ca")?;
        if !made.success() {
            bail!("podctl-coordinator dev-ca --dir {} failed ({made})", tls_dir.display());
        }
        let addrs: Vec<String> = (0..3)
            .map(|_| {
                let listener = std::net::TcpListener::bind((Network::HUB, 0))?;
                Ok(listener.local_addr()?.to_string())
            })
            .collect::<Result<_>>()?;
        let peers =
            addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(",");
        let mut nodes: Vec<Node> = addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| {
                let id = i as u64 + 1;
                let data = dir.join(format!("node{id}"));
                Node {
                    id,
                    addr: addr.clone(),
                    args: vec![
                        "--id".into(),
                        id.to_string(),
                        "--listen".into(),
                        addr.clone(),
                        "--peers".into(),
                        peers.clone(),
                        "--data-dir".into(),
                        data.display().to_string(),
                        "--tls-dir".into(),
                        tls_dir.display().to_string(),
                    ],
                    env: env.to_vec(),
                    log: dir.join(format!("node{id}.log")),
                    child: None,
                }
            })
            .collect();
        for node in &mut nodes {
            node.spawn(bin)?;
        }
        Ok(Coordinators { bin: bin.to_path_buf(), nodes, tls_dir })
    }

    /// The nodes' addresses, comma-separated.
    pub fn addresses(&self) -> String {
        self.nodes.iter().map(|n| n.addr.as_str()).collect::<Vec<_>>().join(",")
    }

    /// Restarts node `id` from its data directory.
    pub fn restart(&mut self, id: u64) -> Result<()> {
        let bin = self.bin.clone();
        self.nodes[id as usize - 1].spawn(&bin)
    }

    /// Whether every node's process runs.
    pub fn all_alive(&mut self) -> bool {
        self.nodes.iter_mut().all(Node::alive)
    }
}

/// How the worker processes are started.
pub struct WorkerLauncher {
    /// The `podctl` binary.
    pub podctl: PathBuf,
    /// The PJRT plugin.
    pub plugin: PathBuf,
    /// Compiled programs shared by every worker process.
    pub compile_cache: PathBuf,
    /// The coordinators' addresses.
    pub coordinators: String,
    /// The development CA's directory: workers present its client certificate.
    pub tls_dir: PathBuf,
    /// Variables every worker gets (the object store's).
    pub env: Vec<(String, String)>,
}

/// One slice's worker processes, one at a time.
pub struct Slot {
    /// The slice.
    pub slice: usize,
    /// Processes started for it so far.
    pub started: u32,
    /// The process now running, if any.
    pub child: Option<Child>,
    /// Its host label (`slice<k>.p<n>`), which the coordinator shows next to its worker ids.
    pub host: String,
    /// When it was started.
    pub since: Instant,
    /// The log every process of the slice appends to.
    pub log: PathBuf,
    /// The host's local disk: the worker's working and temporary directory, which a node
    /// restart deletes.
    pub local: PathBuf,
}

impl Slot {
    /// A slot with no process yet; its host's local disk is `local`.
    pub fn new(slice: usize, log: PathBuf, local: PathBuf) -> Slot {
        Slot { slice, started: 0, child: None, host: String::new(), since: Instant::now(), log, local }
    }

    /// Starts a worker process for the slice in its namespace, on a new host.
    pub fn spawn(
        &mut self,
        launcher: &WorkerLauncher,
        network: &Network,
        job_id: &str,
        token: &Path,
    ) -> Result<()> {
        self.started += 1;
        self.host = format!("slice{}.p{}", self.slice, self.started);
        self.start(launcher, network, job_id, token)
    }

    /// Starts a fresh worker process on the same host (after [`Slot::wipe_local_state`]: a
    /// rebooted machine).
    pub fn restart_host(
        &mut self,
        launcher: &WorkerLauncher,
        network: &Network,
        job_id: &str,
        token: &Path,
    ) -> Result<()> {
        self.started += 1;
        self.start(launcher, network, job_id, token)
    }

    /// Deletes the host's local disk (its process must be gone).
    pub fn wipe_local_state(&mut self) -> Result<()> {
        match std::fs::remove_dir_all(&self.local) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("deleting {}", self.local.display()))
            }
            _ => Ok(()),
        }
    }

    fn start(
        &mut self,
        launcher: &WorkerLauncher,
        network: &Network,
        job_id: &str,
        token: &Path,
    ) -> Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        use std::io::Write;
        writeln!(&log, "--- worker process {} ({})", self.started, self.host)?;
        std::fs::create_dir_all(&self.local)?;
        let child = Command::new("ip")
            .args(["netns", "exec", network.namespace(self.slice)])
            .arg(&launcher.podctl)
            .args(["--log", "info", "worker", "--coordinator", &launcher.coordinators, "--job", job_id])
            .args(["--slice", &self.slice.to_string(), "--host", &self.host])
            .args(["--bind", &Network::slice_ip(self.slice).to_string()])
            .arg("--plugin")
            .arg(&launcher.plugin)
            .arg("--compile-cache")
            .arg(&launcher.compile_cache)
            .arg("--tls-dir")
            .arg(&launcher.tls_dir)
            .arg("--token-file")
            .arg(token)
            .envs(launcher.env.iter().map(|(k, v)| (k, v)))
            .env("TMPDIR", &self.local)
            .current_dir(&self.local)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting a worker (ip netns exec podctl worker)")?;
        self.child = Some(child);
        self.since = Instant::now();
        Ok(())
    }

    /// The running process's pid (`ip netns exec` execs the worker in place).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Reaps the process if it exited; returns how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())?;
        self.child = None;
        Some(status)
    }

    /// Sends `signal` to the running process.
    pub fn signal(&self, sig: Signal) -> Result<()> {
        signal(self.pid().context("no worker process runs in the slot")?, sig)
    }

    /// SIGKILLs the running process and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits up to `limit` for the process to leave by itself, then kills it.
    pub fn reap(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.child.is_some() && Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a worker logs when one of its saves fails to upload.
const FAILED_SAVE: &str = "checkpoint upload of step";

/// Counts the failed saves the slots' logs tell of as they grow, reading only what is new: a
/// full disk ends only once a save met it (workers run some steps ahead of the committed step,
/// so the step a fault began at says little about which saves it will meet).
#[derive(Debug, Default)]
pub struct FailedSaves {
    /// Per slot: bytes read so far, and an unfinished last line.
    read: Vec<(u64, String)>,
    seen: u64,
    /// Of those, the ones a full disk failed (`ENOSPC`).
    pub no_space: u64,
}

impl FailedSaves {
    /// Failed saves in the slots' logs so far.
    pub fn count(&mut self, slots: &[Slot]) -> u64 {
        use std::io::{Read, Seek, SeekFrom};
        self.read.resize_with(slots.len(), Default::default);
        for (slot, (offset, partial)) in slots.iter().zip(&mut self.read) {
            let Ok(mut file) = std::fs::File::open(&slot.log) else { continue };
            let mut new = Vec::new();
            if file.seek(SeekFrom::Start(*offset)).is_err() || file.read_to_end(&mut new).is_err() {
                continue;
            }
            *offset += new.len() as u64;
            partial.push_str(&String::from_utf8_lossy(&new));
            let Some(end) = partial.rfind('\n') else { continue };
            for line in partial[..end].lines().filter(|l| l.contains(FAILED_SAVE)) {
                self.seen += 1;
                self.no_space += u64::from(line.contains("No space left on device"));
            }
            partial.drain(..=end);
        }
        self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn failed_saves_are_counted_once_each_and_only_when_their_line_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let slots: Vec<Slot> = (0..2)
            .map(|k| {
                Slot::new(k, dir.path().join(format!("worker-{k}.log")), dir.path().join(format!("host-{k}")))
            })
            .collect();
        let mut failed = FailedSaves::default();
        assert_eq!(failed.count(&slots), 0, "no log yet");
        let append = |k: usize, text: &str| {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&slots[k].log).unwrap();
            file.write_all(text.as_bytes()).unwrap();
        };
        append(
            0,
            "step 10 loss 1.0\nWARN the checkpoint upload of step 10 failed: No space left on device\n",
        );
        append(1, "WARN the checkpoint upload of step 10 fai");
        assert_eq!(failed.count(&slots), 1);
        append(1, "led: No space left on device\nstep 11 loss 0.9\n");
        assert_eq!(failed.count(&slots), 2);
        assert_eq!(failed.count(&slots), 2, "read once");
        append(0, "WARN the checkpoint upload of step 20 failed: No space left on device\n");
        assert_eq!(failed.count(&slots), 3);
        assert_eq!(failed.no_space, 3);
    }
}
