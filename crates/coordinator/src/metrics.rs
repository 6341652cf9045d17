//! Prometheus metrics of a coordinator node: `GET /metrics` on `Config::metrics_listen`.
//!
//! Two kinds of series. Counters and histograms ([`JobCounters`]) follow the commands as they
//! are applied on this node (the way [`crate::recorder`] does), so every node, follower or
//! leader, counts what the cluster committed: steps, tokens, step times, recoveries by cause
//! and their durations, lease expiries, checkpoints and their bytes. They start at zero when the
//! process starts, as Prometheus counters may. Gauges are read from the replicated state and
//! openraft's metrics at scrape time: each job's committed step, total, generation and state, the
//! last step's loss and throughput, the Raft term, log and applied (committed) index, and who
//! leads.
//!
//! The text exposition format (version 0.0.4) is written by hand and served by a minimal
//! HTTP/1.1 responder: the page is small, and it keeps a web stack out of the coordinator.

use crate::ctx::Ctx;
use crate::state::{Command, Response};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::broadcast::error::RecvError;

/// Upper bounds (seconds) of the step time histogram's buckets.
pub const STEP_SECONDS_BUCKETS: [f64; 12] =
    [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Upper bounds (seconds) of the recovery duration histogram's buckets.
pub const RECOVERY_SECONDS_BUCKETS: [f64; 10] = [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0];
/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Largest request head read.
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// A cumulative histogram.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Observations at or below each bound (same order as the bounds).
    pub buckets: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], value: f64) {
        if self.buckets.len() != bounds.len() {
            self.buckets = vec![0; bounds.len()];
        }
        for (b, bound) in self.buckets.iter_mut().zip(bounds) {
            if value <= *bound {
                *b += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }
}

/// What one job's applied commands added up to on this node since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobCounters {
    /// Steps committed (carried steps included).
    pub steps: u64,
    /// Tokens of those steps.
    pub tokens: u64,
    /// Step times (the slowest member's).
    pub step_seconds: Histogram,
    /// Generation changes begun, by cause (`preemption`, `lease_expired`, `failure`, ...).
    pub recoveries: BTreeMap<&'static str, u64>,
    /// Workers removed whose lease had expired.
    pub lease_expiries: u64,
    /// From a `BeginGeneration` to the next `NewGeneration`.
    pub recovery_seconds: Histogram,
    /// When the recovery in progress began (unix seconds).
    recovering_since: Option<f64>,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Their bytes.
    pub checkpoint_bytes: u64,
}

/// The cause of a generation change, from the reason the leader gave.
pub fn recovery_cause(reason: &str) -> &'static str {
    if reason.contains("preempted") {
        "preemption"
    } else if reason.contains("lease expired") {
        "lease_expired"
    } else if reason.contains("failed") {
        "failure"
    } else if reason.contains("named lost") {
        "suspected"
    } else if reason.contains("quiesce") {
        "quiesce_timeout"
    } else if reason.contains("joined") {
        "replacement"
    } else {
        "other"
    }
}

/// Every job's counters.
#[derive(Debug, Default)]
pub struct Counters {
    jobs: Mutex<BTreeMap<String, JobCounters>>,
}

impl Counters {
    /// Counts one applied command (refused ones change nothing).
    pub fn apply(&self, command: &Command, response: &Response) {
        if matches!(response, Response::Refused { .. }) {
            return;
        }
        let Some(job_id) = command.job_id() else { return };
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let job = jobs.entry(job_id.to_string()).or_default();
        let step = |job: &mut JobCounters, commit: &crate::state::StepCommit| {
            job.steps += 1;
            job.tokens += commit.tokens;
            job.step_seconds.observe(&STEP_SECONDS_BUCKETS, commit.step_seconds);
        };
        match command {
            Command::CommitStep { commit, .. } => step(job, commit),
            Command::BeginGeneration { reason, removed, unix, .. } => {
                *job.recoveries.entry(recovery_cause(reason)).or_default() += 1;
                if reason.contains("lease expired") {
                    job.lease_expiries += removed.len().max(1) as u64;
                }
                job.recovering_since.get_or_insert(*unix);
            }
            Command::NewGeneration { carried, unix, .. } => {
                for commit in carried {
                    step(job, commit);
                }
                if let Some(since) = job.recovering_since.take() {
                    job.recovery_seconds.observe(&RECOVERY_SECONDS_BUCKETS, (unix - since).max(0.0));
                }
            }
            Command::CommitCheckpoint { entry, .. } => {
                job.checkpoints += 1;
                job.checkpoint_bytes += entry.bytes;
            }
            _ => {}
        }
    }

    /// A copy of every job's counters.
    pub fn snapshot(&self) -> BTreeMap<String, JobCounters> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// A float as the exposition format spells it.
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

/// Writes the exposition text, one family at a time.
struct Page {
    out: String,
}

impl Page {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", num(value));
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], bounds: &[f64], h: &Histogram) {
        for (i, bound) in bounds.iter().enumerate() {
            let le = num(*bound);
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&format!("{name}_bucket"), &l, h.buckets.get(i).copied().unwrap_or(0) as f64);
        }
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        self.sample(&format!("{name}_bucket"), &l, h.count as f64);
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, h.count as f64);
    }
}

/// What the gauges read: one job as the replicated state has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobGauges {
    /// The job's name.
    pub name: String,
    /// Its state, lower case (`running`, `recovering`, ...).
    pub state: String,
    /// Steps committed.
    pub step: u64,
    /// Steps in all.
    pub total_steps: u64,
    /// The current generation.
    pub generation: u64,
    /// Loss of the last committed step (NaN before one).
    pub loss: f64,
    /// Its tokens per second.
    pub tokens_per_second: f64,
    /// Its step time.
    pub step_seconds: f64,
    /// Workers registered and not removed.
    pub workers: u64,
    /// The last committed checkpoint's step and bytes.
    pub last_checkpoint: Option<(u64, u64)>,
}

/// What the gauges read of Raft on this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RaftGauges {
    /// This node's id.
    pub id: u64,
    /// The current term.
    pub term: u64,
    /// The last log index.
    pub last_log_index: u64,
    /// The last applied (hence committed) index.
    pub applied_index: u64,
    /// The last snapshot's index.
    pub snapshot_index: u64,
    /// The leader this node knows (0: none).
    pub leader_id: u64,
    /// Whether this node leads.
    pub is_leader: bool,
    /// Voting members.
    pub voters: u64,
}

const STATES: [&str; 6] = ["pending", "running", "recovering", "completed", "failed", "stopped"];

/// The exposition text of a node: pure, so tests check the format without a server.
pub fn render(
    raft: &RaftGauges,
    jobs: &BTreeMap<String, JobGauges>,
    counters: &BTreeMap<String, JobCounters>,
) -> String {
    let mut p = Page { out: String::new() };
    let node = raft.id.to_string();
    let n = [("node", node.as_str())];
    p.family("podctl_raft_term", "gauge", "The current Raft term.");
    p.sample("podctl_raft_term", &n, raft.term as f64);
    p.family("podctl_raft_last_log_index", "gauge", "Index of the last entry in this node's Raft log.");
    p.sample("podctl_raft_last_log_index", &n, raft.last_log_index as f64);
    p.family("podctl_raft_commit_index", "gauge", "Index of the last committed entry applied on this node.");
    p.sample("podctl_raft_commit_index", &n, raft.applied_index as f64);
    p.family("podctl_raft_snapshot_index", "gauge", "Index of this node's last snapshot.");
    p.sample("podctl_raft_snapshot_index", &n, raft.snapshot_index as f64);
    p.family("podctl_raft_leader_id", "gauge", "The leader this node knows of (0: none).");
    p.sample("podctl_raft_leader_id", &n, raft.leader_id as f64);
    p.family("podctl_raft_is_leader", "gauge", "1 when this node leads.");
    p.sample("podctl_raft_is_leader", &n, f64::from(u8::from(raft.is_leader)));
    p.family("podctl_raft_voters", "gauge", "Voting members of the cluster.");
    p.sample("podctl_raft_voters", &n, raft.voters as f64);

    let name_of = |id: &str| jobs.get(id).map_or("", |j| j.name.as_str());
    type Gauge = fn(&JobGauges) -> f64;
    let gauges: [(&str, &str, Gauge); 9] = [
        ("podctl_job_step", "Steps committed.", |j| j.step as f64),
        ("podctl_job_total_steps", "Steps the job runs.", |j| j.total_steps as f64),
        ("podctl_job_generation", "The job's current generation.", |j| j.generation as f64),
        ("podctl_job_loss", "Loss of the last committed step.", |j| j.loss),
        ("podctl_job_tokens_per_second", "Tokens per second of the last committed step.", |j| {
            j.tokens_per_second
        }),
        ("podctl_job_step_seconds", "Step time of the last committed step.", |j| j.step_seconds),
        ("podctl_job_workers", "Workers registered and not removed.", |j| j.workers as f64),
        ("podctl_job_last_checkpoint_step", "Step of the last committed checkpoint (0: none).", |j| {
            j.last_checkpoint.map_or(0.0, |c| c.0 as f64)
        }),
        ("podctl_job_last_checkpoint_bytes", "Bytes of the last committed checkpoint.", |j| {
            j.last_checkpoint.map_or(0.0, |c| c.1 as f64)
        }),
    ];
    for (name, help, get) in gauges {
        p.family(name, "gauge", help);
        for (id, j) in jobs {
            p.sample(name, &[("job", id), ("name", &j.name)], get(j));
        }
    }
    p.family("podctl_job_state", "gauge", "1 for the job's state, 0 for the others.");
    for (id, j) in jobs {
        for state in STATES {
            let value = f64::from(u8::from(j.state == state));
            p.sample("podctl_job_state", &[("job", id), ("name", &j.name), ("state", state)], value);
        }
    }

    type Get = fn(&JobCounters) -> f64;
    let counter_families: [(&str, &str, Get); 5] = [
        ("podctl_steps_committed_total", "Steps committed (counted on this node since it started).", |c| {
            c.steps as f64
        }),
        ("podctl_tokens_total", "Tokens of the committed steps.", |c| c.tokens as f64),
        ("podctl_lease_expiries_total", "Workers removed from a job because their lease expired.", |c| {
            c.lease_expiries as f64
        }),
        ("podctl_checkpoints_committed_total", "Checkpoints committed.", |c| c.checkpoints as f64),
        ("podctl_checkpoint_bytes_total", "Bytes of the committed checkpoints.", |c| {
            c.checkpoint_bytes as f64
        }),
    ];
    for (name, help, get) in counter_families {
        p.family(name, "counter", help);
        for (id, c) in counters {
            p.sample(name, &[("job", id), ("name", name_of(id))], get(c));
        }
    }
    p.family("podctl_recoveries_total", "counter", "Generation changes begun, by cause.");
    for (id, c) in counters {
        for (cause, n) in &c.recoveries {
            let labels = [("job", id.as_str()), ("name", name_of(id)), ("cause", cause)];
            p.sample("podctl_recoveries_total", &labels, *n as f64);
        }
    }
    p.family("podctl_step_seconds", "histogram", "Step time of committed steps (the slowest member's).");
    for (id, c) in counters {
        p.histogram(
            "podctl_step_seconds",
            &[("job", id), ("name", name_of(id))],
            &STEP_SECONDS_BUCKETS,
            &c.step_seconds,
        );
    }
    p.family(
        "podctl_recovery_seconds",
        "histogram",
        "From the start of a generation change to the new generation.",
    );
    for (id, c) in counters {
        p.histogram(
            "podctl_recovery_seconds",
            &[("job", id), ("name", name_of(id))],
            &RECOVERY_SECONDS_BUCKETS,
            &c.recovery_seconds,
        );
    }
    p.out
}

/// The page of a node now.
pub fn page(ctx: &Ctx, counters: &Counters) -> String {
    let m = ctx.raft.metrics().borrow().clone();
    let raft = RaftGauges {
        id: ctx.id,
        term: m.current_term,
        last_log_index: m.last_log_index.unwrap_or(0),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        snapshot_index: m.snapshot.map_or(0, |l| l.index),
        leader_id: m.current_leader.unwrap_or(0),
        is_leader: m.current_leader == Some(ctx.id),
        voters: m.membership_config.membership().voter_ids().count() as u64,
    };
    let jobs = ctx.shared.read(|s| {
        s.jobs
            .iter()
            .map(|(id, j)| {
                let last = j.last_step.clone().unwrap_or_default();
                let gauges = JobGauges {
                    name: j.shape.name.clone(),
                    state: format!("{:?}", j.state).to_lowercase(),
                    step: j.committed_step,
                    total_steps: j.shape.total_steps,
                    generation: j.generation,
                    loss: last.loss.unwrap_or(f64::NAN),
                    tokens_per_second: last.tokens_per_second,
                    step_seconds: last.step_seconds,
                    workers: j.active_workers().count() as u64,
                    last_checkpoint: j.last_checkpoint().map(|c| (c.record.step, c.bytes)),
                };
                (id.clone(), gauges)
            })
            .collect()
    });
    render(&raft, &jobs, &counters.snapshot())
}

/// Counts applied commands until `shutdown` fires.
pub async fn count(ctx: Arc<Ctx>, counters: Arc<Counters>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut applied = ctx.shared.commands.subscribe();
    loop {
        let item = tokio::select! {
            _ = shutdown.changed() => return,
            item = applied.recv() => item,
        };
        match item {
            Ok(a) => counters.apply(&a.command, &a.response),
            Err(RecvError::Lagged(n)) => tracing::warn!("metrics skipped {n} applied commands"),
            Err(RecvError::Closed) => return,
        }
    }
}

/// Serves `/metrics` on `listener` until `shutdown` fires.
pub async fn serve(
    ctx: Arc<Ctx>,
    counters: Arc<Counters>,
    listener: TcpListener,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => accepted,
        };
        let (mut stream, _) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("metrics listener: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ctx = ctx.clone();
        let counters = counters.clone();
        tokio::spawn(async move {
            let answer = tokio::time::timeout(Duration::from_secs(10), async {
                let head = read_head(&mut stream).await?;
                let (status, body) = match request_path(&head) {
                    Some("/metrics") => ("200 OK", page(&ctx, &counters)),
                    Some("/healthz") => ("200 OK", "ok\n".to_string()),
                    Some(_) => ("404 Not Found", "only /metrics and /healthz are served here\n".to_string()),
                    None => ("400 Bad Request", "expected GET <path> HTTP/1.x\n".to_string()),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(response.as_bytes()).await?;
                stream.shutdown().await
            })
            .await;
            if let Ok(Err(e)) = answer {
                tracing::debug!("metrics request: {e}");
            }
        });
    }
}

async fn read_head(stream: &mut tokio::net::TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST_BYTES {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The path of a `GET` (or `HEAD`) request head, without its query.
fn request_path(head: &str) -> Option<&str> {
    let mut parts = head.lines().next()?.split_whitespace();
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !matches!(method, "GET" | "HEAD") || !version.starts_with("HTTP/1") {
        return None;
    }
    Some(target.split('?').next().unwrap_or(target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StepCommit;

    fn commit(step: u64, seconds: f64) -> Command {
        Command::CommitStep {
            job_id: "j1".into(),
            generation: 1,
            commit: StepCommit { step, tokens: 100, step_seconds: seconds, ..Default::default() },
            unix: 0.0,
        }
    }

    #[test]
    fn counters_follow_steps_recoveries_and_checkpoints() {
        let c = Counters::default();
        c.apply(&commit(1, 0.02), &Response::Applied);
        c.apply(&commit(2, 0.3), &Response::Applied);
        c.apply(&commit(3, 9.0), &Response::Refused { reason: "stale".into() });
        c.apply(
            &Command::BeginGeneration {
                job_id: "j1".into(),
                generation: 2,
                reason: "w3 lease expired (silent for 3.2 s)".into(),
                removed: vec!["w3".into()],
                unix: 100.0,
            },
            &Response::Applied,
        );
        c.apply(
            &Command::NewGeneration {
                job_id: "j1".into(),
                generation: 2,
                start_step: 2,
                members: vec![],
                carried: vec![StepCommit { step: 3, tokens: 50, step_seconds: 0.04, ..Default::default() }],
                removed: vec![],
                reason: "2 workers answered the quiesce".into(),
                unix: 101.5,
            },
            &Response::Applied,
        );
        let job = &c.snapshot()["j1"];
        assert_eq!((job.steps, job.tokens), (3, 250));
        assert_eq!(job.step_seconds.count, 3);
        // 0.02 and 0.04 are at most 0.05; 0.3 is not.
        assert_eq!(job.step_seconds.buckets[2], 2);
        assert_eq!(job.recoveries.get("lease_expired"), Some(&1));
        assert_eq!(job.lease_expiries, 1);
        assert_eq!(job.recovery_seconds.count, 1);
        assert!((job.recovery_seconds.sum - 1.5).abs() < 1e-9);
    }

    #[test]
    fn the_page_is_valid_exposition_text() {
        let c = Counters::default();
        c.apply(&commit(1, 0.2), &Response::Applied);
        let jobs = BTreeMap::from([(
            "j1".to_string(),
            JobGauges {
                name: "my \"job\"".into(),
                state: "running".into(),
                step: 1,
                total_steps: 10,
                generation: 1,
                loss: f64::NAN,
                ..Default::default()
            },
        )]);
        let raft = RaftGauges { id: 1, term: 3, applied_index: 42, is_leader: true, ..Default::default() };
        let text = render(&raft, &jobs, &c.snapshot());
        assert!(text.contains("podctl_raft_term{node=\"1\"} 3\n"), "{text}");
        assert!(text.contains("podctl_raft_commit_index{node=\"1\"} 42\n"));
        assert!(text.contains("podctl_job_step{job=\"j1\",name=\"my \\\"job\\\"\"} 1\n"), "{text}");
        assert!(text.contains("podctl_job_loss{job=\"j1\",name=\"my \\\"job\\\"\"} NaN\n"));
        assert!(text.contains("state=\"running\"} 1\n") && text.contains("state=\"failed\"} 0\n"));
        assert!(
            text.contains("podctl_step_seconds_bucket{job=\"j1\",name=\"my \\\"job\\\"\",le=\"0.25\"} 1\n")
        );
        assert!(
            text.contains("podctl_step_seconds_bucket{job=\"j1\",name=\"my \\\"job\\\"\",le=\"+Inf\"} 1\n")
        );
        assert!(text.contains("podctl_steps_committed_total{job=\"j1\",name=\"my \\\"job\\\"\"} 1\n"));
        // Every sample line is `name{labels} value` and every family is declared once, first.
        let mut declared = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                assert!(declared.insert(rest.split(' ').next().unwrap().to_string()), "{line}");
            } else if !line.starts_with("# HELP ") {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| declared.contains(*f)))
                    .unwrap_or(name);
                assert!(declared.contains(family), "{line} before its # TYPE");
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok() || ["NaN", "+Inf"].contains(&value), "{line}");
            }
        }
    }

    #[test]
    fn the_grafana_dashboard_names_only_series_the_page_has() {
        let c = Counters::default();
        c.apply(&commit(1, 0.2), &Response::Applied);
        let jobs = BTreeMap::from([("j1".to_string(), JobGauges::default())]);
        let text = render(&RaftGauges::default(), &jobs, &c.snapshot());
        let declared: std::collections::BTreeSet<&str> =
            text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
        let dashboard = include_str!("../../../deploy/grafana/podctl.json");
        let mut used = 0;
        for (i, _) in dashboard.match_indices("podctl_") {
            let name: String =
                dashboard[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // Workers serve their own page (crates/worker/src/metrics.rs, which this crate cannot see).
            if name.starts_with("podctl_worker_") {
                continue;
            }
            let family =
                ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
            assert!(declared.contains(family), "the dashboard uses {name}, which /metrics does not serve");
            used += 1;
        }
        assert!(used > 20, "{used}");
    }

    #[test]
    fn causes_and_request_lines() {
        assert_eq!(recovery_cause("w1 preempted (SIGTERM)"), "preemption");
        assert_eq!(recovery_cause("replacement w4 joined"), "replacement");
        assert_eq!(recovery_cause("no answer to the quiesce from w2"), "quiesce_timeout");
        assert_eq!(request_path("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"), Some("/metrics"));
        assert_eq!(request_path("POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(request_path(""), None);
    }
}
