//! Prometheus metrics of a coordinator node: `GET /metrics` on `Config::metrics_listen`, with
//! `/healthz` (the process answers) and `/readyz` (it has joined the cluster, [`crate::health`]).
//!
//! Two kinds of series, both through the `prometheus-client` crate and served by
//! [`metrics_http`] (hyper, OpenMetrics text). Counters and histograms ([`Counters`]) follow the
//! commands as they are applied on this node (the way [`crate::recorder`] does), so every node,
//! follower or leader, counts what the cluster committed: steps, tokens, step times, recoveries
//! by cause and their durations, lease expiries, checkpoints and their bytes. They start at zero
//! when the process starts, as Prometheus counters may. Gauges ([`Gauges`]) are read from the
//! replicated state and openraft's metrics at scrape time, by a collector: each job's committed
//! step, total, generation and state, the last step's loss and throughput, the Raft term, log
//! and applied (committed) index, and who leads. docs/METRICS.md lists every series.

use crate::ctx::Ctx;
use crate::state::{Command, Response, StepCommit};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::broadcast::error::RecvError;

/// Upper bounds (seconds) of the step time histogram's buckets.
pub const STEP_SECONDS_BUCKETS: [f64; 12] =
    [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Upper bounds (seconds) of the recovery duration histogram's buckets.
pub const RECOVERY_SECONDS_BUCKETS: [f64; 10] = [0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0];

/// The labels of a job's series: its id and its name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    job: String,
    name: String,
}

/// A job's recoveries by cause.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    job: String,
    name: String,
    cause: &'static str,
}

type Histograms = Family<JobLabels, Histogram, fn() -> Histogram>;

fn step_seconds_histogram() -> Histogram {
    Histogram::new(STEP_SECONDS_BUCKETS)
}

fn recovery_seconds_histogram() -> Histogram {
    Histogram::new(RECOVERY_SECONDS_BUCKETS)
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

/// What every job's applied commands added up to on this node since it started.
#[derive(Debug)]
pub struct Counters {
    /// Steps committed (carried steps included).
    steps: Family<JobLabels, Counter>,
    /// Tokens of those steps.
    tokens: Family<JobLabels, Counter>,
    /// Step times (the slowest member's).
    step_seconds: Histograms,
    /// Generation changes begun, by cause (`preemption`, `lease_expired`, `failure`, ...).
    recoveries: Family<CauseLabels, Counter>,
    /// Workers removed whose lease had expired.
    lease_expiries: Family<JobLabels, Counter>,
    /// From a `BeginGeneration` to the next `NewGeneration`.
    recovery_seconds: Histograms,
    /// Checkpoints committed.
    checkpoints: Family<JobLabels, Counter>,
    /// Their bytes.
    checkpoint_bytes: Family<JobLabels, Counter>,
    /// When each job's recovery in progress began (unix seconds).
    recovering_since: Mutex<BTreeMap<String, f64>>,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            steps: Family::default(),
            tokens: Family::default(),
            step_seconds: Family::new_with_constructor(step_seconds_histogram),
            recoveries: Family::default(),
            lease_expiries: Family::default(),
            recovery_seconds: Family::new_with_constructor(recovery_seconds_histogram),
            checkpoints: Family::default(),
            checkpoint_bytes: Family::default(),
            recovering_since: Mutex::default(),
        }
    }
}

impl Counters {
    /// Counts one applied command of the job named `name` (refused ones change nothing). A
    /// job's series exist, at zero, from its first command on.
    pub fn apply(&self, command: &Command, response: &Response, name: &str) {
        if matches!(response, Response::Refused { .. }) {
            return;
        }
        let Some(job_id) = command.job_id() else { return };
        let job = JobLabels { job: job_id.to_string(), name: name.to_string() };
        for family in
            [&self.steps, &self.tokens, &self.lease_expiries, &self.checkpoints, &self.checkpoint_bytes]
        {
            drop(family.get_or_create(&job));
        }
        for family in [&self.step_seconds, &self.recovery_seconds] {
            drop(family.get_or_create(&job));
        }
        let step = |commit: &StepCommit| {
            self.steps.get_or_create(&job).inc();
            self.tokens.get_or_create(&job).inc_by(commit.tokens);
            self.step_seconds.get_or_create(&job).observe(commit.step_seconds);
        };
        let mut recovering = self.recovering_since.lock().unwrap_or_else(|e| e.into_inner());
        match command {
            Command::CommitStep { commit, .. } => step(commit),
            Command::BeginGeneration { reason, removed, unix, .. } => {
                let cause = CauseLabels {
                    job: job.job.clone(),
                    name: job.name.clone(),
                    cause: recovery_cause(reason),
                };
                self.recoveries.get_or_create(&cause).inc();
                if reason.contains("lease expired") {
                    self.lease_expiries.get_or_create(&job).inc_by(removed.len().max(1) as u64);
                }
                recovering.entry(job.job.clone()).or_insert(*unix);
            }
            Command::NewGeneration { carried, unix, .. } => {
                carried.iter().for_each(step);
                if let Some(since) = recovering.remove(&job.job) {
                    self.recovery_seconds.get_or_create(&job).observe((unix - since).max(0.0));
                }
            }
            Command::CommitCheckpoint { entry, .. } => {
                self.checkpoints.get_or_create(&job).inc();
                self.checkpoint_bytes.get_or_create(&job).inc_by(entry.bytes);
            }
            _ => {}
        }
    }

    /// Puts every family in `registry`.
    fn register(&self, registry: &mut Registry) {
        // prometheus-client appends `_total` to counters (OpenMetrics) and a full stop to help.
        let counters = [
            (
                "podctl_steps_committed",
                "Steps committed (counted on this node since it started)",
                &self.steps,
            ),
            ("podctl_tokens", "Tokens of the committed steps", &self.tokens),
            (
                "podctl_lease_expiries",
                "Workers removed from a job because their lease expired",
                &self.lease_expiries,
            ),
            ("podctl_checkpoints_committed", "Checkpoints committed", &self.checkpoints),
            ("podctl_checkpoint_bytes", "Bytes of the committed checkpoints", &self.checkpoint_bytes),
        ];
        for (name, help, family) in counters {
            registry.register(name, help, family.clone());
        }
        registry.register("podctl_recoveries", "Generation changes begun, by cause", self.recoveries.clone());
        registry.register(
            "podctl_step_seconds",
            "Step time of committed steps (the slowest member's)",
            self.step_seconds.clone(),
        );
        registry.register(
            "podctl_recovery_seconds",
            "From the start of a generation change to the new generation",
            self.recovery_seconds.clone(),
        );
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

/// The gauges of one scrape; as a [`Collector`], it encodes them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gauges {
    /// Raft on this node.
    pub raft: RaftGauges,
    /// Every job, by id.
    pub jobs: BTreeMap<String, JobGauges>,
}

impl Gauges {
    /// The gauges of a node now.
    pub fn read(ctx: &Ctx) -> Self {
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
        Gauges { raft, jobs }
    }
}

/// One gauge family: its descriptor, then a sample per label set.
fn gauges<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, f64)>,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let r = &self.raft;
        let node = r.id.to_string();
        let raft: [(&str, &str, f64); 7] = [
            ("podctl_raft_term", "The current Raft term.", r.term as f64),
            (
                "podctl_raft_last_log_index",
                "Index of the last entry in this node's Raft log.",
                r.last_log_index as f64,
            ),
            (
                "podctl_raft_commit_index",
                "Index of the last committed entry applied on this node.",
                r.applied_index as f64,
            ),
            ("podctl_raft_snapshot_index", "Index of this node's last snapshot.", r.snapshot_index as f64),
            ("podctl_raft_leader_id", "The leader this node knows of (0: none).", r.leader_id as f64),
            ("podctl_raft_is_leader", "1 when this node leads.", f64::from(u8::from(r.is_leader))),
            ("podctl_raft_voters", "Voting members of the cluster.", r.voters as f64),
        ];
        for (name, help, value) in raft {
            gauges(&mut encoder, name, help, [([("node", node.as_str())], value)])?;
        }

        type Get = fn(&JobGauges) -> f64;
        let per_job: [(&str, &str, Get); 9] = [
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
        for (name, help, get) in per_job {
            let samples = self.jobs.iter().map(|(id, j)| ([("job", id.as_str()), ("name", &j.name)], get(j)));
            gauges(&mut encoder, name, help, samples)?;
        }
        let states = self.jobs.iter().flat_map(|(id, j)| {
            STATES.map(|state| {
                (
                    [("job", id.as_str()), ("name", &j.name), ("state", state)],
                    f64::from(u8::from(j.state == state)),
                )
            })
        });
        gauges(&mut encoder, "podctl_job_state", "1 for the job's state, 0 for the others.", states)
    }
}

/// Reads [`Gauges`] from the node at every scrape.
struct StateCollector(Arc<Ctx>);

impl std::fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateCollector").field("node", &self.0.id).finish_non_exhaustive()
    }
}

impl Collector for StateCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> std::fmt::Result {
        Gauges::read(&self.0).encode(encoder)
    }
}

/// A node's registry: the counters as they are, the gauges as `gauges` reads them.
fn registry(counters: &Counters, gauges: impl Collector) -> Registry {
    let mut registry = Registry::default();
    counters.register(&mut registry);
    registry.register_collector(Box::new(gauges));
    registry
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
            Ok(a) => {
                let name = a
                    .command
                    .job_id()
                    .and_then(|id| ctx.shared.read(|s| s.jobs.get(id).map(|j| j.shape.name.clone())));
                counters.apply(&a.command, &a.response, name.as_deref().unwrap_or_default())
            }
            Err(RecvError::Lagged(n)) => tracing::warn!("metrics skipped {n} applied commands"),
            Err(RecvError::Closed) => return,
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` (joined the cluster: [`crate::health`]) on
/// `listener` until `shutdown` fires.
pub async fn serve(
    ctx: Arc<Ctx>,
    counters: Arc<Counters>,
    listener: TcpListener,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let pages = metrics_http::Pages {
        registry: registry(&counters, StateCollector(ctx.clone())),
        readiness: Some(Box::new(move || {
            let metrics = ctx.raft.metrics().borrow().clone();
            crate::health::readiness(ctx.id, &metrics, ctx.config.timeouts.election_max)
        })),
    };
    metrics_http::serve(listener, Arc::new(pages), async move { drop(shutdown.changed().await) }).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(step: u64, seconds: f64) -> Command {
        Command::CommitStep {
            job_id: "j1".into(),
            generation: 1,
            commit: StepCommit { step, tokens: 100, step_seconds: seconds, ..Default::default() },
            unix: 0.0,
        }
    }

    fn lease_expired() -> Command {
        Command::BeginGeneration {
            job_id: "j1".into(),
            generation: 2,
            reason: "w3 lease expired (silent for 3.2 s)".into(),
            removed: vec!["w3".into()],
            after_step: 0,
            unix: 100.0,
        }
    }

    /// The page a node with these counters and gauges serves.
    fn page(counters: &Counters, gauges: Gauges) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry(counters, gauges)).unwrap();
        text
    }

    #[test]
    fn counters_follow_steps_recoveries_and_checkpoints() {
        let c = Counters::default();
        c.apply(&commit(1, 0.02), &Response::Applied, "arith");
        c.apply(&commit(2, 0.3), &Response::Applied, "arith");
        c.apply(
            &commit(3, 9.0),
            &Response::Refused { why: crate::state::Refusal::StaleGeneration, reason: "stale".into() },
            "arith",
        );
        c.apply(&lease_expired(), &Response::Applied, "arith");
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
            "arith",
        );
        let text = page(&c, Gauges::default());
        let j = r#"job="j1",name="arith""#;
        for line in [
            format!("podctl_steps_committed_total{{{j}}} 3\n"),
            format!("podctl_tokens_total{{{j}}} 250\n"),
            format!("podctl_step_seconds_count{{{j}}} 3\n"),
            // 0.02 and 0.04 are at most 0.05; 0.3 is not.
            format!("podctl_step_seconds_bucket{{le=\"0.05\",{j}}} 2\n"),
            format!("podctl_step_seconds_bucket{{le=\"+Inf\",{j}}} 3\n"),
            format!("podctl_recoveries_total{{{j},cause=\"lease_expired\"}} 1\n"),
            format!("podctl_lease_expiries_total{{{j}}} 1\n"),
            format!("podctl_recovery_seconds_count{{{j}}} 1\n"),
            format!("podctl_recovery_seconds_sum{{{j}}} 1.5\n"),
            format!("podctl_checkpoints_committed_total{{{j}}} 0\n"),
        ] {
            assert!(text.contains(&line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn the_page_is_openmetrics_text_with_escaped_labels() {
        let c = Counters::default();
        c.apply(&commit(1, 0.2), &Response::Applied, "my \"job\"");
        let job = JobGauges {
            name: "my \"job\"".into(),
            state: "running".into(),
            step: 1,
            total_steps: 10,
            generation: 1,
            loss: f64::NAN,
            ..Default::default()
        };
        let raft = RaftGauges { id: 1, term: 3, applied_index: 42, is_leader: true, ..Default::default() };
        let text = page(&c, Gauges { raft, jobs: BTreeMap::from([("j1".to_string(), job)]) });
        let j = r#"job="j1",name="my \"job\"""#;
        for line in [
            "# TYPE podctl_raft_term gauge\n".to_string(),
            "podctl_raft_term{node=\"1\"} 3.0\n".into(),
            "podctl_raft_commit_index{node=\"1\"} 42.0\n".into(),
            format!("podctl_job_step{{{j}}} 1.0\n"),
            format!("podctl_job_loss{{{j}}} NaN\n"),
            format!("podctl_job_state{{{j},state=\"running\"}} 1.0\n"),
            format!("podctl_job_state{{{j},state=\"failed\"}} 0.0\n"),
            "# TYPE podctl_steps_committed counter\n".into(),
            format!("podctl_steps_committed_total{{{j}}} 1\n"),
            "# TYPE podctl_step_seconds histogram\n".into(),
            format!("podctl_step_seconds_bucket{{le=\"0.25\",{j}}} 1\n"),
        ] {
            assert!(text.contains(&line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn the_grafana_dashboard_names_only_series_the_page_has() {
        let c = Counters::default();
        c.apply(&commit(1, 0.2), &Response::Applied, "arith");
        c.apply(&lease_expired(), &Response::Applied, "arith");
        let jobs = BTreeMap::from([("j1".to_string(), JobGauges::default())]);
        let text = page(&c, Gauges { raft: RaftGauges::default(), jobs });
        let served: std::collections::BTreeSet<&str> =
            text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
        let dashboard = include_str!("../../../deploy/grafana/podctl.json");
        let mut used = 0;
        for (i, _) in dashboard.match_indices("podctl_") {
            let name: String =
                dashboard[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // Workers serve their own page (crates/worker/src/metrics.rs checks those).
            if name.starts_with("podctl_worker_") {
                continue;
            }
            assert!(
                served.contains(name.as_str()),
                "the dashboard uses {name}, which /metrics does not serve"
            );
            used += 1;
        }
        assert!(used > 20, "{used}");
    }

    #[test]
    fn causes() {
        assert_eq!(recovery_cause("w1 preempted (SIGTERM)"), "preemption");
        assert_eq!(recovery_cause("replacement w4 joined"), "replacement");
        assert_eq!(recovery_cause("no answer to the quiesce from w2"), "quiesce_timeout");
        assert_eq!(recovery_cause("w3 lease expired (silent for 3.2 s)"), "lease_expired");
    }
}
