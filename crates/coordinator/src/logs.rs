//! The workers' log lines: a bounded ring per job on the leader, which `podctl logs` reads and
//! follows, and the job's run record, which keeps them across leader changes.
//!
//! The leader writes each job's new lines into its run record ([`LogRecord`]: under the run
//! directory in local mode, under the checkpoint root as `runs/<job>.<attempt>/logs/` on a
//! cluster) before it answers the worker's push, at most twice a second per job: the pushes that
//! arrive meanwhile ride in the same object (a group commit). A worker offers a batch again until
//! a leader takes it, and lines carry the worker's count (`seq`), so a line pushed twice is kept
//! once. A new leader starts with an empty ring and reads the record's newest lines into it the
//! first time someone asks for the job's logs: `podctl logs -f` that reconnects after a leader
//! change gets every line, those pushed during the election included. When the record cannot be
//! written the lines stay in memory (and are tried again with the next write): logs never stall
//! a worker.
//!
//! Objects are `h<hour>/<unix ms>-<node>-<n>.jsonl` (one JSON line per log line), hours since the
//! epoch grouping them so the newest are found without listing a long run's whole history.

use checkpoint::{Storage, StoreOptions};
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path as Key;
use proto::v1::LogLine;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

/// Largest message of one line kept; longer ones are cut.
pub const MAX_LINE_BYTES: usize = 16 << 10;
/// Lines a follower may fall behind before it skips.
const FOLLOW_BUFFER: usize = 1024;
/// Least time between two writes of one job's lines: pushes arriving meanwhile share a write.
const WRITE_EVERY: Duration = Duration::from_millis(500);
/// Most lines in one object of the run record.
const LINES_PER_OBJECT: usize = 2000;
/// Largest object of the run record read back (a few times what a full one holds).
const MAX_OBJECT_BYTES: u64 = 64 << 20;
/// Longest a reader waits for the run record's history before serving the ring alone.
const HISTORY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a job's log lines are kept beyond the leader's memory.
pub struct LogRecord {
    storage: Storage,
}

impl LogRecord {
    /// The record of `job_id` for a coordinator that writes run records into the jobs' run
    /// directories (`record_runs`, local mode), else under the job's checkpoint root; `None`
    /// for a cluster job without one.
    pub fn location(job: &crate::state::Job, record_runs: bool) -> Option<String> {
        if record_runs {
            return Some(format!("{}/logs/{}", job.shape.output_dir.trim_end_matches('/'), job.id));
        }
        (!job.checkpoint_uri.is_empty()).then(|| {
            format!("{}/runs/{}.{}/logs", job.checkpoint_uri.trim_end_matches('/'), job.id, job.attempt)
        })
    }

    /// Opens the record at `uri`.
    pub fn open(uri: &str, options: &StoreOptions) -> Result<Self, String> {
        Ok(Self { storage: Storage::open(uri, options).map_err(|e| e.to_string())? })
    }

    fn key(&self, parts: &[&str]) -> Key {
        parts.iter().fold(self.storage.root().clone(), |key, part| key.join(*part))
    }

    /// Writes `lines` as objects of at most [`LINES_PER_OBJECT`], named by `now_ms` and the
    /// writing node.
    async fn put(&self, lines: &[LogLine], node: u64, now_ms: u64, count: &mut u64) -> Result<(), String> {
        for chunk in lines.chunks(LINES_PER_OBJECT) {
            let mut text = String::new();
            for line in chunk {
                text.push_str(&serde_json::to_string(&Stored::from(line)).map_err(|e| e.to_string())?);
                text.push('\n');
            }
            *count += 1;
            let hour = format!("h{:08}", now_ms / 3_600_000);
            let name = format!("{now_ms:013}-{node}-{count:06}.jsonl");
            let key = self.key(&[&hour, &name]);
            self.storage.object_store().put(&key, text.into()).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The newest `max` lines of the record, oldest first.
    async fn newest(&self, max: usize) -> Result<Vec<LogLine>, String> {
        let store = self.storage.object_store();
        let root = self.storage.root().clone();
        let listed = store.list_with_delimiter(Some(&root)).await.map_err(|e| e.to_string())?;
        let mut hours = listed.common_prefixes;
        hours.sort();
        // Objects newest first; each object's lines in order.
        let mut objects: Vec<Vec<LogLine>> = Vec::new();
        let mut lines = 0;
        'hours: for hour in hours.iter().rev() {
            let mut metas: Vec<_> = store.list(Some(hour)).try_collect().await.map_err(|e| e.to_string())?;
            metas.sort_by(|a, b| b.location.cmp(&a.location));
            for meta in metas {
                if meta.size > MAX_OBJECT_BYTES {
                    tracing::warn!(object = %meta.location, "skipping a log object of {} bytes", meta.size);
                    continue;
                }
                let bytes = store.get(&meta.location).await.map_err(|e| e.to_string())?;
                let bytes = bytes.bytes().await.map_err(|e| e.to_string())?;
                let parsed: Vec<LogLine> = String::from_utf8_lossy(&bytes)
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Stored>(l).ok())
                    .map(LogLine::from)
                    .collect();
                lines += parsed.len();
                objects.push(parsed);
                if lines >= max {
                    break 'hours;
                }
            }
        }
        let mut all: Vec<LogLine> = objects.into_iter().rev().flatten().collect();
        all.drain(..all.len().saturating_sub(max));
        Ok(all)
    }
}

/// A log line as the run record keeps it.
#[derive(Serialize, Deserialize)]
struct Stored {
    job_id: String,
    worker_id: String,
    slice: u32,
    unix_ms: u64,
    level: String,
    message: String,
    step: u64,
    generation: u64,
    #[serde(default)]
    seq: u64,
}

impl From<&LogLine> for Stored {
    fn from(l: &LogLine) -> Self {
        Self {
            job_id: l.job_id.clone(),
            worker_id: l.worker_id.clone(),
            slice: l.slice,
            unix_ms: l.unix_ms,
            level: l.level.clone(),
            message: l.message.clone(),
            step: l.step,
            generation: l.generation,
            seq: l.seq,
        }
    }
}

impl From<Stored> for LogLine {
    fn from(s: Stored) -> Self {
        let Stored { job_id, worker_id, slice, unix_ms, level, message, step, generation, seq } = s;
        Self { job_id, worker_id, slice, unix_ms, level, message, step, generation, seq }
    }
}

/// What makes a line the same line seen again: its worker and number, or, for a line without a
/// number, its worker, time and text.
#[derive(Hash, PartialEq, Eq)]
enum Identity {
    Numbered(String, u64),
    Bare(String, u64, String),
}

fn identity(line: &LogLine) -> Identity {
    match line.seq {
        0 => Identity::Bare(line.worker_id.clone(), line.unix_ms, line.message.clone()),
        seq => Identity::Numbered(line.worker_id.clone(), seq),
    }
}

/// The one writer of a job's record, and what it needs between writes.
#[derive(Default)]
struct Writer {
    record: Option<Arc<LogRecord>>,
    last_write: Option<Instant>,
    objects: u64,
    /// Whether the last write failed (logged once, and once when writes work again).
    failing: bool,
}

struct JobLogs {
    lines: VecDeque<LogLine>,
    follow: broadcast::Sender<LogLine>,
    /// The highest `seq` kept per worker: a numbered line at or below it is here already.
    newest: BTreeMap<String, u64>,
    /// Lines not yet in the run record, oldest first.
    unwritten: VecDeque<LogLine>,
    /// Whether the run record's newest lines were read into `lines`.
    history_read: bool,
    writer: Arc<tokio::sync::Mutex<Writer>>,
}

impl JobLogs {
    fn new() -> Self {
        Self {
            lines: VecDeque::new(),
            follow: broadcast::channel(FOLLOW_BUFFER).0,
            newest: BTreeMap::new(),
            unwritten: VecDeque::new(),
            history_read: false,
            writer: Arc::default(),
        }
    }
}

/// Every job's ring of lines.
pub struct LogBuffers {
    jobs: Mutex<BTreeMap<String, JobLogs>>,
    lines_per_job: usize,
}

fn cut(line: &mut LogLine) {
    if line.message.len() > MAX_LINE_BYTES {
        let mut cut = MAX_LINE_BYTES;
        while !line.message.is_char_boundary(cut) {
            cut -= 1;
        }
        line.message.truncate(cut);
    }
}

impl LogBuffers {
    /// Rings of `lines_per_job` lines.
    pub fn new(lines_per_job: usize) -> Self {
        Self { jobs: Mutex::new(BTreeMap::new()), lines_per_job: lines_per_job.max(1) }
    }

    fn with_job<T>(&self, job_id: &str, f: impl FnOnce(&mut JobLogs) -> T) -> T {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        f(jobs.entry(job_id.to_string()).or_insert_with(JobLogs::new))
    }

    /// Appends lines to their job's ring (dropping the oldest when full), to followers and to
    /// what the run record has yet to get; a numbered line the ring already had is skipped.
    pub fn push(&self, mut line: LogLine) {
        cut(&mut line);
        let limit = self.lines_per_job;
        self.with_job(&line.job_id.clone(), |logs| {
            // A worker's lines before it registers carry no id: they cannot be told apart from
            // another unregistered worker's, so they are kept every time.
            if line.seq > 0 && !line.worker_id.is_empty() {
                let newest = logs.newest.entry(line.worker_id.clone()).or_default();
                if line.seq <= *newest {
                    return;
                }
                *newest = line.seq;
            }
            if logs.lines.len() == limit {
                logs.lines.pop_front();
            }
            if logs.unwritten.len() == limit {
                logs.unwritten.pop_front();
            }
            // No follower is fine.
            let _ = logs.follow.send(line.clone());
            logs.unwritten.push_back(line.clone());
            logs.lines.push_back(line);
        });
    }

    /// Writes the job's unwritten lines into its run record at `uri` (opened on first use) as
    /// one writer at a time, at most every [`WRITE_EVERY`]; returns once the lines pushed before
    /// the call are written, or the write failed (logged; they are tried again next time).
    pub async fn write(&self, job_id: &str, uri: &str, options: &StoreOptions, node: u64) {
        let writer = self.with_job(job_id, |logs| logs.writer.clone());
        let mut writer = writer.lock().await;
        if let Some(last) = writer.last_write {
            tokio::time::sleep_until((last + WRITE_EVERY).into()).await;
        }
        let batch: Vec<LogLine> = self.with_job(job_id, |logs| logs.unwritten.drain(..).collect());
        if batch.is_empty() {
            return;
        }
        let record = match &writer.record {
            Some(record) => Ok(record.clone()),
            None => LogRecord::open(uri, options).map(Arc::new),
        };
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
        let Writer { objects, .. } = &mut *writer;
        let written = match &record {
            Ok(record) => record.put(&batch, node, now_ms, objects).await,
            Err(e) => Err(e.clone()),
        };
        writer.last_write = Some(Instant::now());
        match written {
            Ok(()) => {
                writer.record = record.ok();
                if std::mem::take(&mut writer.failing) {
                    tracing::warn!(job_id, "the workers' log lines reach the run record {uri} again");
                }
            }
            Err(error) => {
                if !std::mem::replace(&mut writer.failing, true) {
                    tracing::warn!(
                        job_id,
                        "cannot write the workers' log lines into the run record {uri}: {error}; they \
                         stay in this node's memory and are tried again with the next lines"
                    );
                }
                let limit = self.lines_per_job;
                self.with_job(job_id, |logs| {
                    for line in batch.into_iter().rev() {
                        logs.unwritten.push_front(line);
                    }
                    let over = logs.unwritten.len().saturating_sub(limit);
                    logs.unwritten.drain(..over);
                });
            }
        }
    }

    /// Reads the newest lines of the job's run record at `uri` into its ring, once: a new leader
    /// has none of the lines its predecessors took. Lines the ring already has are kept once.
    pub async fn read_history(&self, job_id: &str, uri: &str, options: &StoreOptions) {
        if self.with_job(job_id, |logs| logs.history_read) {
            return;
        }
        let read = async { LogRecord::open(uri, options)?.newest(self.lines_per_job).await };
        let history = match tokio::time::timeout(HISTORY_TIMEOUT, read).await {
            Ok(Ok(history)) => history,
            Ok(Err(error)) => {
                tracing::warn!(job_id, "cannot read the workers' earlier log lines from {uri}: {error}");
                return;
            }
            Err(_) => {
                tracing::warn!(
                    job_id,
                    "reading the workers' earlier log lines from {uri} took over {HISTORY_TIMEOUT:?}"
                );
                return;
            }
        };
        let limit = self.lines_per_job;
        self.with_job(job_id, |logs| {
            if logs.history_read {
                return;
            }
            let known: HashSet<Identity> = history.iter().map(identity).collect();
            let mut merged: VecDeque<LogLine> = history.into_iter().collect();
            merged.extend(logs.lines.drain(..).filter(|l| !known.contains(&identity(l))));
            let over = merged.len().saturating_sub(limit);
            merged.drain(..over);
            for line in merged.iter().filter(|l| l.seq > 0) {
                let newest = logs.newest.entry(line.worker_id.clone()).or_default();
                *newest = (*newest).max(line.seq);
            }
            logs.lines = merged;
            logs.history_read = true;
        });
    }

    /// The last `tail` lines of a job (all kept when 0), only `slice`'s when given, and a
    /// receiver of the lines that come after them.
    pub fn read(
        &self,
        job_id: &str,
        tail: usize,
        slice: Option<u32>,
    ) -> (Vec<LogLine>, broadcast::Receiver<LogLine>) {
        self.with_job(job_id, |logs| {
            let matching: Vec<LogLine> =
                logs.lines.iter().filter(|l| slice.is_none_or(|s| l.slice == s)).cloned().collect();
            let skip = if tail == 0 { 0 } else { matching.len().saturating_sub(tail) };
            (matching.into_iter().skip(skip).collect(), logs.follow.subscribe())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(job: &str, slice: u32, message: &str) -> LogLine {
        LogLine { job_id: job.into(), slice, message: message.into(), ..Default::default() }
    }

    fn numbered(worker: &str, seq: u64) -> LogLine {
        LogLine {
            job_id: "j".into(),
            worker_id: worker.into(),
            unix_ms: 1000 + seq,
            message: format!("{worker} line {seq}"),
            seq,
            ..Default::default()
        }
    }

    fn messages(lines: &[LogLine]) -> Vec<&str> {
        lines.iter().map(|l| l.message.as_str()).collect()
    }

    #[test]
    fn the_ring_keeps_the_newest_lines_and_tails() {
        let logs = LogBuffers::new(3);
        for i in 0..5 {
            logs.push(line("j", i % 2, &format!("m{i}")));
        }
        let (all, _) = logs.read("j", 0, None);
        assert_eq!(messages(&all), ["m2", "m3", "m4"]);
        let (tail, _) = logs.read("j", 1, None);
        assert_eq!(tail[0].message, "m4");
        let (slice1, _) = logs.read("j", 0, Some(1));
        assert_eq!(messages(&slice1), ["m3"]);
        assert!(logs.read("other", 0, None).0.is_empty());
    }

    #[test]
    fn followers_get_new_lines_and_long_lines_are_cut() {
        let logs = LogBuffers::new(10);
        let (_, mut follow) = logs.read("j", 0, None);
        logs.push(line("j", 0, &"é".repeat(MAX_LINE_BYTES)));
        let got = follow.try_recv().unwrap();
        assert!(got.message.len() <= MAX_LINE_BYTES);
        assert!(got.message.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_numbered_line_pushed_again_is_kept_once() {
        let logs = LogBuffers::new(10);
        for seq in [1, 2, 1, 2, 3] {
            logs.push(numbered("w1", seq));
        }
        logs.push(numbered("w2", 1));
        assert_eq!(
            messages(&logs.read("j", 0, None).0),
            ["w1 line 1", "w1 line 2", "w1 line 3", "w2 line 1"]
        );
    }

    #[tokio::test]
    async fn a_new_leader_reads_the_lines_its_predecessor_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("file://{}/logs", dir.path().display());
        let options = StoreOptions::default();
        // The old leader took lines 1..=4 of w1 and wrote them, then 1 of w2.
        let old = LogBuffers::new(100);
        for seq in 1..=4 {
            old.push(numbered("w1", seq));
        }
        old.write("j", &uri, &options, 1).await;
        old.push(numbered("w2", 1));
        old.write("j", &uri, &options, 1).await;
        // The new one gets w1's lines 4 (pushed again: the old leader's answer was lost) and 5
        // before anyone asks for the logs.
        let new = LogBuffers::new(100);
        new.push(numbered("w1", 4));
        new.push(numbered("w1", 5));
        new.read_history("j", &uri, &options).await;
        let expected = ["w1 line 1", "w1 line 2", "w1 line 3", "w1 line 4", "w2 line 1", "w1 line 5"];
        assert_eq!(messages(&new.read("j", 0, None).0), expected);
        // Read once: a second call changes nothing, and lines pushed again are still refused.
        new.read_history("j", &uri, &options).await;
        new.push(numbered("w2", 1));
        assert_eq!(messages(&new.read("j", 0, None).0), expected);
        // A ring smaller than the history keeps the newest lines.
        let small = LogBuffers::new(2);
        small.read_history("j", &uri, &options).await;
        assert_eq!(messages(&small.read("j", 0, None).0), ["w1 line 4", "w2 line 1"]);
    }

    #[tokio::test]
    async fn lines_the_record_did_not_take_are_written_with_the_next_ones() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the record's directory should be: writes fail.
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, "not a directory").unwrap();
        let logs = LogBuffers::new(100);
        logs.push(numbered("w1", 1));
        logs.write("j", &format!("file://{}/logs", blocked.display()), &StoreOptions::default(), 1).await;
        assert_eq!(logs.with_job("j", |l| l.unwritten.len()), 1);
        // The same lines reach a record that works.
        let uri = format!("file://{}/logs", dir.path().display());
        logs.push(numbered("w1", 2));
        logs.write("j", &uri, &StoreOptions::default(), 1).await;
        assert_eq!(logs.with_job("j", |l| l.unwritten.len()), 0);
        let reader = LogBuffers::new(100);
        reader.read_history("j", &uri, &StoreOptions::default()).await;
        assert_eq!(messages(&reader.read("j", 0, None).0), ["w1 line 1", "w1 line 2"]);
    }
}
