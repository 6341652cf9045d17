//! The workers' log lines, kept per job in a bounded ring on the leader, for `podctl logs`.
//!
//! Lines are not replicated: they are for people watching a run, and the run record and the
//! workers' own output keep the durable copy. A new leader starts with empty rings.

use proto::v1::LogLine;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use tokio::sync::broadcast;

/// Largest message of one line kept; longer ones are cut.
pub const MAX_LINE_BYTES: usize = 16 << 10;
/// Lines a follower may fall behind before it skips.
const FOLLOW_BUFFER: usize = 1024;

struct JobLogs {
    lines: VecDeque<LogLine>,
    follow: broadcast::Sender<LogLine>,
}

/// Every job's ring of lines.
pub struct LogBuffers {
    jobs: Mutex<BTreeMap<String, JobLogs>>,
    lines_per_job: usize,
}

impl LogBuffers {
    /// Rings of `lines_per_job` lines.
    pub fn new(lines_per_job: usize) -> Self {
        Self { jobs: Mutex::new(BTreeMap::new()), lines_per_job: lines_per_job.max(1) }
    }

    /// Appends a line to its job's ring (dropping the oldest when full) and to followers.
    pub fn push(&self, mut line: LogLine) {
        if line.message.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !line.message.is_char_boundary(cut) {
                cut -= 1;
            }
            line.message.truncate(cut);
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let logs = jobs.entry(line.job_id.clone()).or_insert_with(|| JobLogs {
            lines: VecDeque::new(),
            follow: broadcast::channel(FOLLOW_BUFFER).0,
        });
        if logs.lines.len() == self.lines_per_job {
            logs.lines.pop_front();
        }
        // No follower is fine.
        let _ = logs.follow.send(line.clone());
        logs.lines.push_back(line);
    }

    /// The last `tail` lines of a job (all kept when 0), only `slice`'s when given, and a
    /// receiver of the lines that come after them.
    pub fn read(
        &self,
        job_id: &str,
        tail: usize,
        slice: Option<u32>,
    ) -> (Vec<LogLine>, broadcast::Receiver<LogLine>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let logs = jobs.entry(job_id.to_string()).or_insert_with(|| JobLogs {
            lines: VecDeque::new(),
            follow: broadcast::channel(FOLLOW_BUFFER).0,
        });
        let matching: Vec<LogLine> =
            logs.lines.iter().filter(|l| slice.is_none_or(|s| l.slice == s)).cloned().collect();
        let skip = if tail == 0 { 0 } else { matching.len().saturating_sub(tail) };
        (matching.into_iter().skip(skip).collect(), logs.follow.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(job: &str, slice: u32, message: &str) -> LogLine {
        LogLine { job_id: job.into(), slice, message: message.into(), ..Default::default() }
    }

    #[test]
    fn the_ring_keeps_the_newest_lines_and_tails() {
        let logs = LogBuffers::new(3);
        for i in 0..5 {
            logs.push(line("j", i % 2, &format!("m{i}")));
        }
        let (all, _) = logs.read("j", 0, None);
        assert_eq!(all.iter().map(|l| l.message.as_str()).collect::<Vec<_>>(), ["m2", "m3", "m4"]);
        let (tail, _) = logs.read("j", 1, None);
        assert_eq!(tail[0].message, "m4");
        let (slice1, _) = logs.read("j", 0, Some(1));
        assert_eq!(slice1.iter().map(|l| l.message.as_str()).collect::<Vec<_>>(), ["m3"]);
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
}
