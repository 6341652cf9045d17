//! `podctl logs JOB [-f] [--slice S] [--tail N]`: the workers' log lines as the coordinator
//! leader keeps them, merged in arrival order and labelled with local time, slice, worker,
//! generation and step ([`format_line`] is pure). With `-f` it follows; when the leader changes
//! the stream ends and it reconnects to the new one, which reads the lines its predecessor took
//! from the job's run record (and the workers push again what the old one never answered), so
//! nothing is missing; lines already printed are recognised by their worker's count and skipped.

use crate::connect::ConnectArgs;
use crate::outage::{self, Outage};
use crate::status::clock;
use anyhow::Context;
use clap::Args;
use client::LogLine;
use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::time::Duration;

/// `podctl logs`.
#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The job (id or name).
    pub job: String,
    /// Keep printing new lines (until the job ends or Ctrl-C).
    #[arg(long, short)]
    pub follow: bool,
    /// Only this slice's lines.
    #[arg(long)]
    pub slice: Option<u32>,
    /// Start with the last N lines (0: every line kept).
    #[arg(long, default_value_t = 0)]
    pub tail: u32,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// One line as printed: `HH:MM:SS.mmm s<slice> <worker> g<gen> step <n> LEVEL message`.
pub fn format_line(line: &LogLine) -> String {
    let ms = line.unix_ms % 1000;
    let mut out =
        format!("{}.{ms:03} s{} {}", clock((line.unix_ms / 1000) as f64), line.slice, line.worker_id);
    if line.generation > 0 {
        out.push_str(&format!(" g{}", line.generation));
    }
    if line.step > 0 {
        out.push_str(&format!(" step {}", line.step));
    }
    let level = if line.level.is_empty() { "INFO".to_string() } else { line.level.to_uppercase() };
    out.push_str(&format!(" {level:<5} {}", line.message.trim_end()));
    out
}

/// Lines of unnumbered workers remembered, to recognise them after a reconnect.
const BARE_REMEMBERED: usize = 100_000;

/// Lines already printed, so a reconnect does not print them twice: a worker's lines come in
/// the order it numbered them (`seq`), so the highest number printed per worker says which
/// are new; lines without a number, or sent before their worker registered (no id), are
/// remembered whole, a bounded number of them.
#[derive(Default)]
struct Seen {
    newest: HashMap<String, u64>,
    bare: BTreeSet<(u64, String, String)>,
}

impl Seen {
    /// Whether `line` is new (and remembers it).
    fn admit(&mut self, line: &LogLine) -> bool {
        if line.seq > 0 && !line.worker_id.is_empty() {
            let newest = self.newest.entry(line.worker_id.clone()).or_default();
            let new = line.seq > *newest;
            *newest = (*newest).max(line.seq);
            return new;
        }
        let new = self.bare.insert((line.unix_ms, line.worker_id.clone(), line.message.clone()));
        if self.bare.len() > BARE_REMEMBERED {
            self.bare.pop_first();
        }
        new
    }
}

/// How often `-f` asks whether the job ended.
const ENDED_POLL: Duration = Duration::from_secs(2);
/// Once the job ended, `-f` stops after this long without a line (the workers' last words).
const LAST_WORDS: Duration = Duration::from_secs(3);

/// Runs `podctl logs`.
pub fn run(args: &LogsArgs, runtime: &tokio::runtime::Handle) -> anyhow::Result<()> {
    runtime.block_on(async {
        let (client, _connection) = crate::status::client(&args.connect).await?;
        let printing = async {
            let mut seen = Seen::default();
            let mut tail = args.tail;
            // When the job was seen to have ended, and the last line came.
            let mut ended = false;
            let mut last_line = tokio::time::Instant::now();
            // Following, an election or a cluster without its quorum for a while is waited out.
            let mut outage = Outage::new(if args.follow { outage::PATIENCE } else { Duration::ZERO });
            let begins = |e: &client::ClientError| eprintln!("{}", outage::began(e));
            loop {
                let mut stream = outage::patiently(
                    &mut outage,
                    || client.logs(&args.job, args.follow, args.slice, tail),
                    begins,
                )
                .await
                .with_context(|| format!("logs of {}", args.job))?;
                let mut poll = tokio::time::interval(ENDED_POLL);
                loop {
                    tokio::select! {
                        line = stream.next() => {
                            let Ok(Some(line)) = line else { break };
                            last_line = tokio::time::Instant::now();
                            if seen.admit(&line) {
                                let mut stdout = std::io::stdout().lock();
                                writeln!(stdout, "{}", format_line(&line))?;
                                stdout.flush()?;
                            }
                        }
                        _ = poll.tick(), if args.follow && !ended => {
                            ended = client.get_job(&args.job).await.is_ok_and(|s| s.is_terminal());
                        }
                        () = tokio::time::sleep_until(last_line + LAST_WORDS), if ended => return Ok(()),
                    }
                }
                if !args.follow {
                    return Ok(());
                }
                // The stream ended: the leader changed (or left). The new one serves every line
                // kept, from the run record; the filter drops those already printed.
                tail = 0;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::select! {
            r = printing => r,
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(ms: u64, worker: &str, message: &str) -> LogLine {
        LogLine {
            job_id: "j1".into(),
            worker_id: worker.into(),
            slice: 1,
            unix_ms: ms,
            level: "warn".into(),
            message: message.into(),
            step: 12,
            generation: 2,
            seq: 0,
        }
    }

    #[test]
    fn lines_are_labelled_with_local_time_slice_worker_generation_and_step() {
        assert_eq!(
            format_line(&line(3_661_042, "w-3", "slow all-reduce\n")),
            format!("{}.042 s1 w-3 g2 step 12 WARN  slow all-reduce", clock(3661.0))
        );
        let bare = LogLine { unix_ms: 5, worker_id: "w".into(), message: "hi".into(), ..Default::default() };
        assert_eq!(format_line(&bare), format!("{}.005 s0 w INFO  hi", clock(0.0)));
    }

    #[test]
    fn a_reconnect_does_not_repeat_lines() {
        let mut seen = Seen::default();
        assert!(seen.admit(&line(10, "a", "x")));
        assert!(seen.admit(&line(10, "b", "x")));
        assert!(seen.admit(&line(11, "a", "y")));
        // The backlog again after a reconnect.
        assert!(!seen.admit(&line(10, "a", "x")));
        assert!(!seen.admit(&line(11, "a", "y")));
        assert!(seen.admit(&line(11, "a", "z")));
        assert!(seen.admit(&line(12, "a", "x")));
    }

    #[test]
    fn numbered_lines_are_new_by_their_worker_s_count_whatever_their_time() {
        let numbered = |worker: &str, seq, ms| LogLine { seq, ..line(ms, worker, "m") };
        let mut seen = Seen::default();
        assert!(seen.admit(&numbered("a", 1, 500)));
        // Another worker's batch with earlier times arrives later: still new.
        assert!(seen.admit(&numbered("b", 1, 100)));
        assert!(seen.admit(&numbered("a", 2, 600)));
        // After a reconnect, the new leader's backlog from the run record.
        assert!(!seen.admit(&numbered("a", 1, 500)));
        assert!(!seen.admit(&numbered("a", 2, 600)));
        assert!(!seen.admit(&numbered("b", 1, 100)));
        assert!(seen.admit(&numbered("b", 2, 110)));
        assert!(seen.admit(&numbered("a", 3, 700)));
    }
}
