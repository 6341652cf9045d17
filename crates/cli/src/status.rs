//! `podctl status [JOB] [--watch] [--json]` and `podctl stop JOB`: what a coordinator knows of
//! a job (or of every job), and stopping one.
//!
//! Rendering is pure ([`render_job`], [`render_list`], [`status_json`], [`watch_line`]): the
//! commands only fetch, pick a form and print. On a terminal `--watch` redraws the frame in
//! place (cursor up, clear to the end of the screen, line wrap off while it runs); piped, it
//! prints one plain line per update; `--json` prints one object, or one line per update.

use crate::connect::{ConnectArgs, Connection};
use crate::outage::{self, Outage};
use anyhow::Context;
use clap::Args;
use client::{Client, ClusterInfo, JobState, JobStatus};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

/// A client of the cluster `connect` names, with deadlines for people waiting at a terminal
/// (the client must not outlive the connection).
pub async fn client(connect: &ConnectArgs) -> anyhow::Result<(Client, Connection)> {
    let mut connection = connect.connect().await?;
    connection.config.call_timeout = Duration::from_secs(5);
    connection.config.retry_for = Duration::from_secs(15);
    Ok((connection.client()?, connection))
}

/// `podctl status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The job (id or name); every job the token may see when omitted.
    pub job: Option<String>,
    /// Keep showing it as it changes (Ctrl-C ends).
    #[arg(long, short)]
    pub watch: bool,
    /// JSON: one object, or one line per update with --watch.
    #[arg(long)]
    pub json: bool,
    /// With --watch, refresh at least this often (milliseconds).
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u32,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `podctl stop`.
#[derive(Args, Debug)]
pub struct StopArgs {
    /// The job (id or name).
    pub job: String,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// Seconds since the epoch.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Runs `podctl stop`.
pub fn stop(args: &StopArgs, runtime: &tokio::runtime::Handle) -> anyhow::Result<()> {
    runtime.block_on(async {
        let (client, _connection) = client(&args.connect).await?;
        let state = client.stop_job(&args.job).await.with_context(|| format!("stopping {}", args.job))?;
        println!("{}: {}", args.job, state_name(state));
        Ok(())
    })
}

/// Runs `podctl status`.
pub fn run(args: &StatusArgs, runtime: &tokio::runtime::Handle) -> anyhow::Result<()> {
    runtime.block_on(async {
        let (client, _connection) = client(&args.connect).await?;
        let mut out = Output::new(args.json, std::io::stdout().is_terminal());
        let watched = async {
            match (&args.job, args.watch) {
                (Some(job), false) => {
                    let status = client.get_job(job).await?;
                    let cluster = client.cluster_info().await.ok();
                    out.job(&status, cluster.as_ref())
                }
                (None, false) => {
                    let jobs = client.list_jobs().await?;
                    let cluster = client.cluster_info().await.ok();
                    out.list(&jobs, cluster.as_ref())
                }
                (Some(job), true) => watch_job(&client, job, args.interval_ms, &mut out).await,
                (None, true) => loop {
                    let jobs = client.list_jobs().await?;
                    let cluster = client.cluster_info().await.ok();
                    out.list(&jobs, cluster.as_ref())?;
                    tokio::time::sleep(Duration::from_millis(args.interval_ms.max(100).into())).await;
                },
            }
        };
        let result = tokio::select! {
            r = watched => r,
            _ = tokio::signal::ctrl_c() => Ok(()),
        };
        out.finish();
        result
    })
}

async fn watch_job(client: &Client, job: &str, interval_ms: u32, out: &mut Output) -> anyhow::Result<()> {
    // Through an election or a cluster without its quorum for a while, the job runs on: so does
    // the watch.
    let mut outage = Outage::new(outage::PATIENCE);
    let begins = |e: &client::ClientError| eprintln!("{}", outage::began(e));
    loop {
        let cluster = client.cluster_info().await.ok();
        let mut stream =
            outage::patiently(&mut outage, || client.watch_job(job, interval_ms), begins).await?;
        // The stream ends when the job does, or when the leader changes: then watch again.
        while let Ok(Some(status)) = stream.next().await {
            out.job(&status, cluster.as_ref())?;
            if status.is_terminal() {
                return Ok(());
            }
        }
        let status = outage::patiently(&mut outage, || client.get_job(job), begins).await?;
        if status.is_terminal() {
            return out.job(&status, cluster.as_ref());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Where frames go: JSON lines, a redrawn terminal frame, or plain text.
struct Output {
    json: bool,
    terminal: bool,
    /// Lines of the frame on screen (terminal redraws).
    drawn: usize,
    /// Frames written.
    frames: usize,
}

impl Output {
    fn new(json: bool, terminal: bool) -> Self {
        Self { json, terminal, drawn: 0, frames: 0 }
    }

    fn job(&mut self, status: &JobStatus, cluster: Option<&ClusterInfo>) -> anyhow::Result<()> {
        if self.json {
            return self.print_json(&status_json(status, cluster));
        }
        if !self.terminal && self.frames > 0 {
            // Piped and watching: one plain line per update.
            self.frames += 1;
            return self.print(&[watch_line(status, unix_now())]);
        }
        let lines = render_job(status, cluster, unix_now());
        self.frame(&lines)
    }

    fn list(&mut self, jobs: &[JobStatus], cluster: Option<&ClusterInfo>) -> anyhow::Result<()> {
        if self.json {
            let jobs: Vec<Value> = jobs.iter().map(|j| status_json(j, None)).collect();
            return self.print_json(&json!({"jobs": jobs, "cluster": cluster.map(cluster_json)}));
        }
        let lines = render_list(jobs, cluster);
        if !self.terminal && self.frames > 0 {
            let mut with_gap = vec![String::new()];
            with_gap.extend(lines);
            self.frames += 1;
            return self.print(&with_gap);
        }
        self.frame(&lines)
    }

    fn print_json(&mut self, value: &Value) -> anyhow::Result<()> {
        self.frames += 1;
        self.print(&[value.to_string()])
    }

    fn frame(&mut self, lines: &[String]) -> anyhow::Result<()> {
        let mut text = String::new();
        if self.terminal {
            if self.frames == 0 {
                // Hide the cursor and stop long lines from wrapping, so every frame is as many
                // screen rows as it has lines.
                text.push_str("\x1b[?25l\x1b[?7l");
            }
            text.push_str(&redraw_prefix(self.drawn));
            self.drawn = lines.len();
        }
        self.frames += 1;
        for line in lines {
            text.push_str(line);
            text.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        Ok(())
    }

    fn print(&mut self, lines: &[String]) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        for line in lines {
            writeln!(stdout, "{line}")?;
        }
        stdout.flush()?;
        Ok(())
    }

    fn finish(&mut self) {
        if self.terminal && self.frames > 0 && !self.json {
            print!("\x1b[?7h\x1b[?25h");
            let _ = std::io::stdout().flush();
        }
    }
}

/// Moves the cursor to the start of a frame of `drawn` lines and clears from there down.
pub fn redraw_prefix(drawn: usize) -> String {
    if drawn == 0 { String::new() } else { format!("\x1b[{drawn}A\r\x1b[J") }
}

/// A job state in lower case (`running`, `recovering`, ...).
pub fn state_name(state: Option<JobState>) -> &'static str {
    match state {
        None => "unknown",
        Some(JobState::Pending) => "pending",
        Some(JobState::Running) => "running",
        Some(JobState::Recovering) => "recovering",
        Some(JobState::Completed) => "completed",
        Some(JobState::Failed) => "failed",
        Some(JobState::Stopped) => "stopped",
    }
}

/// `1234567` as `1.23M`.
fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn bytes(b: u64) -> String {
    let b = b as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// `75` as `1m15s`.
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "-".into();
    }
    let s = seconds.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

/// A unix time as `HH:MM:SS` in the local time zone (`TZ`, else `/etc/localtime`).
pub fn clock(unix: f64) -> String {
    let seconds = unix.max(0.0).floor();
    let nanos = ((unix.max(0.0) - seconds) * 1e9) as u32;
    match chrono::DateTime::from_timestamp(seconds as i64, nanos) {
        Some(utc) => utc.with_timezone(&chrono::Local).format("%H:%M:%S").to_string(),
        None => "--:--:--".into(),
    }
}

/// How long ago `unix` was, as [`duration`] says it; `None` for a time that is not known (0,
/// as a record written before times were kept has it).
pub fn age(now_unix: f64, unix: f64) -> Option<String> {
    (unix > 0.0 && unix.is_finite()).then(|| duration((now_unix - unix).max(0.0)))
}

fn loss(v: f64) -> String {
    if v.is_finite() { format!("{v:.4}") } else { "-".into() }
}

/// Pads columns to their widest cell (two spaces apart, the last column unpadded).
pub fn table(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
                }
            }
            line.trim_end().to_string()
        })
        .collect()
}

fn progress_bar(step: u64, total: u64, width: usize) -> String {
    let filled =
        if total == 0 { 0 } else { ((step.min(total) as f64 / total as f64) * width as f64) as usize };
    format!("[{}{}]", "#".repeat(filled), "-".repeat(width - filled))
}

/// Events shown in the frame.
const EVENTS_SHOWN: usize = 6;

/// One job as a frame of lines: header, progress, checkpoint, slices, recent events.
pub fn render_job(s: &JobStatus, cluster: Option<&ClusterInfo>, now_unix: f64) -> Vec<String> {
    let mut lines = Vec::new();
    let leader = match cluster {
        Some(c) if c.leader_id != 0 => format!("{}@{} (term {})", c.leader_id, c.leader_address, c.term),
        _ => s.leader.clone(),
    };
    lines.push(format!(
        "job {} ({})  {}  generation {}  leader {}",
        s.name,
        s.job_id,
        state_name(s.state).to_uppercase(),
        s.generation,
        leader
    ));
    if let Some(members) = cluster.and_then(members_line) {
        lines.push(members);
    }
    let pct = if s.total_steps == 0 { 0.0 } else { 100.0 * s.step as f64 / s.total_steps as f64 };
    let mut progress = format!(
        "step {}/{} {} {pct:.1}%  loss {}  {} tok/s  {:.3} s/step",
        s.step,
        s.total_steps,
        progress_bar(s.step, s.total_steps, 20),
        loss(s.loss),
        si(s.tokens_per_second),
        s.step_seconds
    );
    if s.mfu > 0.0 {
        progress.push_str(&format!("  MFU {:.1}%", 100.0 * s.mfu));
    }
    if s.state == Some(JobState::Running) && s.step_seconds > 0.0 && s.step < s.total_steps {
        progress.push_str(&format!("  eta {}", duration((s.total_steps - s.step) as f64 * s.step_seconds)));
    }
    lines.push(progress);
    if let Some(phases) = phase_line(&s.metrics, s.step_seconds) {
        lines.push(phases);
    }
    if let Some(rewards) = rewards_line(&s.metrics) {
        lines.push(rewards);
    }
    if let Some(accuracy) = s.metrics.get("eval_accuracy") {
        let before = s.metrics.get("eval_accuracy_initial");
        let before = before.map(|b| format!(" (before training {:.1}%)", 100.0 * b)).unwrap_or_default();
        lines.push(format!("held-out accuracy {:.1}%{before}", 100.0 * accuracy));
    }
    if !s.message.is_empty() {
        lines.push(format!("message: {}", s.message));
    }
    lines.push(match &s.last_checkpoint {
        Some(c) => format!(
            "checkpoint step {}  {}  {}  {}",
            c.step,
            bytes(c.bytes),
            age(now_unix, c.committed_unix).map_or("saved at an unknown time".into(), |a| format!("{a} ago")),
            c.uri
        ),
        None => "checkpoint none yet".into(),
    });
    if !s.slices.is_empty() {
        let mut rows = vec![
            ["SLICE", "WORKER", "HOST", "RANKS", "HEALTH", "STEP", "HEARTBEAT"].map(String::from).to_vec(),
        ];
        for sl in &s.slices {
            let ranks = sl.virtual_ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            rows.push(vec![
                sl.slice.to_string(),
                sl.worker_id.clone(),
                sl.host.clone(),
                if ranks.is_empty() { "-".into() } else { ranks },
                sl.health.clone(),
                sl.step.to_string(),
                format!("{:.1}s ago", sl.heartbeat_age_seconds),
            ]);
        }
        lines.extend(table(&rows));
    }
    if !s.events.is_empty() {
        lines.push("recent events".into());
        let start = s.events.len().saturating_sub(EVENTS_SHOWN);
        let rows: Vec<Vec<String>> = s.events[start..]
            .iter()
            .map(|e| {
                vec![
                    format!("  {}", clock(e.unix_seconds)),
                    e.kind.clone(),
                    format!("step {}", e.step),
                    e.detail.clone(),
                ]
            })
            .collect();
        lines.extend(table(&rows));
    }
    lines
}

/// The newest step's phase split (`phase_<name>_seconds` of its report), longest first, each
/// with its share of the step: `phases gradients 1.62s 81% · rollout 0.35s 17% · ...`, and what
/// they add up to. `None` when the report has no phases.
/// A GRPO step's reward and each reward function's mean (`reward_<name>`), e.g. `rewards 0.412 ·
/// numeric_answer 0.380 · format 0.750`; `None` for a step without reward functions.
pub fn rewards_line(metrics: &BTreeMap<String, f64>) -> Option<String> {
    let total = metrics.get("reward")?;
    let functions: Vec<String> = metrics
        .iter()
        .filter_map(|(key, value)| {
            Some(format!("{} {value:.3}", key.strip_prefix("reward_").filter(|n| *n != "std")?))
        })
        .collect();
    (!functions.is_empty()).then(|| format!("rewards {total:.3} · {}", functions.join(" · ")))
}

pub fn phase_line(metrics: &BTreeMap<String, f64>, step_seconds: f64) -> Option<String> {
    let mut phases: Vec<(&str, f64)> = metrics
        .iter()
        .filter_map(|(key, &seconds)| Some((key.strip_prefix("phase_")?.strip_suffix("_seconds")?, seconds)))
        .collect();
    if phases.is_empty() {
        return None;
    }
    phases.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let share = |seconds: f64| match step_seconds > 0.0 {
        true => format!(" {:.0}%", 100.0 * seconds / step_seconds),
        false => String::new(),
    };
    let parts: Vec<String> =
        phases.iter().map(|&(name, seconds)| format!("{name} {seconds:.3}s{}", share(seconds))).collect();
    let total: f64 = phases.iter().map(|&(_, seconds)| seconds).sum();
    Some(format!("phases {}  (sum {total:.3}s of {step_seconds:.3}s)", parts.join(" · ")))
}

/// The coordinator nodes and whether they answer the node that answered:
/// `coordinators 1 leader · 2 ok · 3 UNREACHABLE for 25s (connection refused)`; `None` without
/// members.
pub fn members_line(c: &ClusterInfo) -> Option<String> {
    if c.members.is_empty() {
        return None;
    }
    let members: Vec<String> = c
        .members
        .iter()
        .map(|m| {
            let state = match m.reachability.as_str() {
                _ if m.id == c.leader_id => "leader".to_string(),
                "unreachable" => {
                    let why = match m.unreachable_error.as_str() {
                        "" => String::new(),
                        error => format!(" ({})", error.chars().take(80).collect::<String>()),
                    };
                    format!("UNREACHABLE for {}{why}", duration(m.unreachable_seconds))
                }
                "self" | "answering" => "ok".to_string(),
                _ => "?".to_string(),
            };
            let learner = if m.voter { "" } else { " learner" };
            format!("{}{learner} {state}", m.id)
        })
        .collect();
    Some(format!("coordinators {}", members.join(" · ")))
}

/// Every job as a table, with who leads.
pub fn render_list(jobs: &[JobStatus], cluster: Option<&ClusterInfo>) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(c) = cluster {
        lines.push(format!(
            "leader {}@{}  term {}  commit index {}  members {}",
            c.leader_id,
            c.leader_address,
            c.term,
            c.commit_index,
            c.members.len()
        ));
        lines.extend(members_line(c));
    }
    if jobs.is_empty() {
        lines.push("no jobs".into());
        return lines;
    }
    let mut rows =
        vec![["NAME", "ID", "STATE", "STEP", "LOSS", "TOK/S", "GEN", "SLICES"].map(String::from).to_vec()];
    for j in jobs {
        let healthy = j.slices.iter().filter(|s| s.health == "ok").count();
        rows.push(vec![
            j.name.clone(),
            j.job_id.clone(),
            state_name(j.state).into(),
            format!("{}/{}", j.step, j.total_steps),
            loss(j.loss),
            si(j.tokens_per_second),
            j.generation.to_string(),
            format!("{healthy}/{} ok", j.slices.len()),
        ]);
    }
    lines.extend(table(&rows));
    lines
}

/// One plain line per update when piped.
pub fn watch_line(s: &JobStatus, now_unix: f64) -> String {
    let unhealthy: Vec<String> = s
        .slices
        .iter()
        .filter(|sl| sl.health != "ok")
        .map(|sl| format!("{}={}", sl.slice, sl.health))
        .collect();
    let mut line = format!(
        "{} {} {} step {}/{} loss {} {} tok/s gen {}",
        clock(now_unix),
        s.name,
        state_name(s.state),
        s.step,
        s.total_steps,
        loss(s.loss),
        si(s.tokens_per_second),
        s.generation
    );
    if !unhealthy.is_empty() {
        line.push_str(&format!(" slices {}", unhealthy.join(",")));
    }
    line
}

fn finite(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}

fn cluster_json(c: &ClusterInfo) -> Value {
    json!({
        "leader_id": c.leader_id,
        "leader_address": c.leader_address,
        "term": c.term,
        "commit_index": c.commit_index,
        "members": c.members.iter().map(|m| json!({
            "id": m.id,
            "address": m.address,
            "voter": m.voter,
            "reachability": m.reachability,
            "unreachable_seconds": m.unreachable_seconds,
            "unreachable_error": m.unreachable_error,
        })).collect::<Vec<_>>(),
    })
}

/// A job as one JSON object (a loss not yet known is `null`).
pub fn status_json(s: &JobStatus, cluster: Option<&ClusterInfo>) -> Value {
    let mut v = json!({
        "job_id": s.job_id,
        "name": s.name,
        "state": state_name(s.state),
        "message": s.message,
        "generation": s.generation,
        "step": s.step,
        "total_steps": s.total_steps,
        "loss": finite(s.loss),
        "tokens_per_second": finite(s.tokens_per_second),
        "step_seconds": finite(s.step_seconds),
        "mfu": finite(s.mfu),
        "slices": s.slices.iter().map(|sl| json!({
            "slice": sl.slice,
            "worker_id": sl.worker_id,
            "host": sl.host,
            "virtual_ranks": sl.virtual_ranks,
            "health": sl.health,
            "step": sl.step,
            "heartbeat_age_seconds": finite(sl.heartbeat_age_seconds),
        })).collect::<Vec<_>>(),
        "last_checkpoint": s.last_checkpoint.as_ref().map(|c| json!({
            "step": c.step,
            "uri": c.uri,
            // Not known: null, not the epoch.
            "committed_unix": (c.committed_unix > 0.0).then_some(c.committed_unix),
            "bytes": c.bytes,
        })),
        "events": s.events.iter().map(|e| json!({
            "unix_seconds": e.unix_seconds, "kind": e.kind, "step": e.step, "detail": e.detail,
        })).collect::<Vec<_>>(),
        "leader": s.leader,
        "metrics": s.metrics.iter().map(|(k, v)| (k.clone(), finite(*v))).collect::<serde_json::Map<_, _>>(),
    });
    if let Some(c) = cluster {
        v["cluster"] = cluster_json(c);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use client::{CheckpointInfo, Event, SliceStatus};

    fn sample() -> JobStatus {
        JobStatus {
            job_id: "j-000001".into(),
            name: "tiny-arith".into(),
            state: Some(JobState::Running),
            generation: 2,
            step: 150,
            total_steps: 300,
            loss: 2.5,
            tokens_per_second: 12_345.0,
            step_seconds: 0.5,
            slices: vec![
                SliceStatus {
                    slice: 0,
                    worker_id: "w1".into(),
                    host: "host-a".into(),
                    virtual_ranks: vec![0, 2],
                    health: "ok".into(),
                    step: 150,
                    heartbeat_age_seconds: 0.2,
                },
                SliceStatus {
                    slice: 1,
                    worker_id: "w4".into(),
                    host: "host-b".into(),
                    virtual_ranks: vec![1],
                    health: "late".into(),
                    step: 149,
                    heartbeat_age_seconds: 2.5,
                },
            ],
            last_checkpoint: Some(CheckpointInfo {
                step: 100,
                uri: "file:///ckpt/100".into(),
                committed_unix: 1000.0,
                bytes: 3 << 20,
            }),
            events: (0u32..8)
                .map(|i| Event {
                    unix_seconds: 3600.0 + f64::from(i),
                    kind: if i == 7 { "recovery".into() } else { "checkpoint".into() },
                    step: u64::from(i) * 10,
                    detail: format!("event {i}"),
                })
                .collect(),
            leader: "1@127.0.0.1:7001".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_job_frame_shows_progress_slices_checkpoint_events_and_leader() {
        let lines = render_job(&sample(), None, 1030.0);
        let text = lines.join("\n");
        assert_eq!(lines[0], "job tiny-arith (j-000001)  RUNNING  generation 2  leader 1@127.0.0.1:7001");
        assert_eq!(
            lines[1],
            "step 150/300 [##########----------] 50.0%  loss 2.5000  12.3k tok/s  0.500 s/step  eta 1m15s"
        );
        assert_eq!(lines[2], "checkpoint step 100  3.0 MiB  30s ago  file:///ckpt/100");
        assert_eq!(lines[3], "SLICE  WORKER  HOST    RANKS  HEALTH  STEP  HEARTBEAT");
        assert_eq!(lines[4], "0      w1      host-a  0,2    ok      150   0.2s ago");
        assert_eq!(lines[5], "1      w4      host-b  1      late    149   2.5s ago");
        assert_eq!(lines[6], "recent events");
        // The last six events, oldest first, with their local time.
        assert_eq!(lines.len(), 7 + EVENTS_SHOWN, "{text}");
        assert!(
            lines[7].starts_with(&format!("  {}  checkpoint  step 20  event 2", clock(3602.0))),
            "{text}"
        );
        assert_eq!(lines.last().unwrap(), &format!("  {}  recovery    step 70  event 7", clock(3607.0)));
    }

    #[test]
    fn cluster_info_names_the_term_and_a_fresh_job_shows_dashes() {
        let cluster = ClusterInfo {
            leader_id: 2,
            leader_address: "10.0.0.2:7001".into(),
            term: 5,
            ..Default::default()
        };
        let fresh = JobStatus {
            job_id: "j2".into(),
            name: "new".into(),
            state: Some(JobState::Pending),
            total_steps: 10,
            loss: f64::NAN,
            message: "waiting for 2 workers".into(),
            ..Default::default()
        };
        let lines = render_job(&fresh, Some(&cluster), 0.0);
        assert_eq!(lines[0], "job new (j2)  PENDING  generation 0  leader 2@10.0.0.2:7001 (term 5)");
        assert_eq!(lines[1], "step 0/10 [--------------------] 0.0%  loss -  0 tok/s  0.000 s/step");
        assert_eq!(lines[2], "message: waiting for 2 workers");
        assert_eq!(lines[3], "checkpoint none yet");
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn the_list_is_a_table_and_piped_updates_are_single_lines() {
        let lines = render_list(&[sample()], None);
        assert_eq!(lines[0], "NAME        ID        STATE    STEP     LOSS    TOK/S  GEN  SLICES");
        assert_eq!(lines[1], "tiny-arith  j-000001  running  150/300  2.5000  12.3k  2    1/2 ok");
        assert_eq!(render_list(&[], None), ["no jobs"]);
        assert_eq!(
            watch_line(&sample(), 3661.0),
            format!(
                "{} tiny-arith running step 150/300 loss 2.5000 12.3k tok/s gen 2 slices 1=late",
                clock(3661.0)
            )
        );
    }

    #[test]
    fn json_is_one_object_with_null_for_unknown_numbers() {
        let mut s = sample();
        s.loss = f64::NAN;
        let v: Value = serde_json::from_str(&status_json(&s, None).to_string()).unwrap();
        assert_eq!(v["state"], "running");
        assert_eq!(v["step"], 150);
        assert!(v["loss"].is_null());
        assert_eq!(v["slices"][1]["health"], "late");
        assert_eq!(v["last_checkpoint"]["bytes"], 3 << 20);
        assert_eq!(v["events"].as_array().unwrap().len(), 8);
        assert!(v.get("cluster").is_none());
    }

    #[test]
    fn the_newest_step_s_phases_show_longest_first_with_their_shares() {
        let mut s = sample();
        s.metrics = [
            ("reward", 0.5),
            ("phase_rollout_seconds", 0.1),
            ("phase_gradients_seconds", 0.375),
            ("phase_apply_seconds", 0.005),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let lines = render_job(&s, None, 1030.0);
        assert_eq!(
            lines[2],
            "phases gradients 0.375s 75% · rollout 0.100s 20% · apply 0.005s 1%  (sum 0.480s of 0.500s)"
        );
        assert_eq!(lines[3], "checkpoint step 100  3.0 MiB  30s ago  file:///ckpt/100");
        assert_eq!(phase_line(&BTreeMap::new(), 0.5), None);
        let unknown_step = phase_line(&s.metrics, 0.0).unwrap();
        s.metrics.extend([("reward_numeric_answer".to_string(), 0.25), ("reward_format".to_string(), 0.75)]);
        s.metrics.insert("reward_std".to_string(), 0.1);
        assert_eq!(render_job(&s, None, 1030.0)[3], "rewards 0.500 · format 0.750 · numeric_answer 0.250");
        assert!(unknown_step.starts_with("phases gradients 0.375s · rollout"), "{unknown_step}");
    }

    #[test]
    fn an_unknown_checkpoint_time_is_not_an_age_and_members_show_their_reachability() {
        let mut s = sample();
        s.last_checkpoint.as_mut().unwrap().committed_unix = 0.0;
        let lines = render_job(&s, None, 1.8e9);
        assert_eq!(lines[2], "checkpoint step 100  3.0 MiB  saved at an unknown time  file:///ckpt/100");
        assert!(status_json(&s, None)["last_checkpoint"]["committed_unix"].is_null());
        assert_eq!(age(100.0, 40.0).as_deref(), Some("1m00s"));
        let member = |id, reachability: &str, seconds, error: &str| client::Member {
            id,
            address: format!("10.0.0.{id}:7001"),
            voter: true,
            reachability: reachability.into(),
            unreachable_seconds: seconds,
            unreachable_error: error.into(),
            ..Default::default()
        };
        let cluster = ClusterInfo {
            leader_id: 1,
            leader_address: "10.0.0.1:7001".into(),
            term: 3,
            members: vec![
                member(1, "self", 0.0, ""),
                member(2, "answering", 0.0, ""),
                member(3, "unreachable", 25.2, "transport error"),
            ],
            ..Default::default()
        };
        let lines = render_job(&s, Some(&cluster), 1.8e9);
        assert_eq!(lines[1], "coordinators 1 leader · 2 ok · 3 UNREACHABLE for 25s (transport error)");
        let listed = render_list(&[], Some(&cluster));
        assert_eq!(listed[1], lines[1]);
        let v = status_json(&s, Some(&cluster));
        assert_eq!(v["cluster"]["members"][2]["reachability"], "unreachable");
    }

    #[test]
    fn redraws_move_up_over_the_previous_frame() {
        assert_eq!(redraw_prefix(0), "");
        assert_eq!(redraw_prefix(7), "\x1b[7A\r\x1b[J");
        assert_eq!(duration(59.6), "1m00s");
        assert_eq!(duration(7200.0), "2h00m");
        assert_eq!(
            table(&[vec!["a".into(), "bb".into()], vec!["ccc".into(), "d".into()]]),
            ["a    bb", "ccc  d"]
        );
    }
}
