//! `podctl logs JOB [-f] [--slice S] [--tail N]`: the workers' log lines as the coordinator
//! leader keeps them, merged in arrival order and labelled with slice, worker, generation and
//! step ([`format_line`] is pure). With `-f` it follows; when the leader changes the stream ends
//! and it reconnects, skipping lines it already printed (a new leader starts with an empty
//! ring, so lines pushed during the change may be missing).

use crate::connect::ConnectArgs;
use crate::status::clock;
use anyhow::Context;
use clap::Args;
use client::LogLine;
use std::collections::BTreeSet;
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

/// Lines already printed, so a reconnect does not print them twice.
#[derive(Default)]
struct Seen {
    last_ms: u64,
    at_last_ms: BTreeSet<(String, String)>,
}

impl Seen {
    /// Whether `line` is new (and remembers it).
    fn admit(&mut self, line: &LogLine) -> bool {
        let key = (line.worker_id.clone(), line.message.clone());
        match line.unix_ms.cmp(&self.last_ms) {
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => self.at_last_ms.insert(key),
            std::cmp::Ordering::Greater => {
                self.last_ms = line.unix_ms;
                self.at_last_ms = BTreeSet::from([key]);
                true
            }
        }
    }
}

/// Runs `podctl logs`.
pub fn run(args: &LogsArgs) -> anyhow::Result<()> {
    crate::status::runtime()?.block_on(async {
        let (client, _connection) = crate::status::client(&args.connect).await?;
        let printing = async {
            let mut seen = Seen::default();
            let mut tail = args.tail;
            loop {
                let mut stream = client
                    .logs(&args.job, args.follow, args.slice, tail)
                    .await
                    .with_context(|| format!("logs of {}", args.job))?;
                while let Ok(Some(line)) = stream.next().await {
                    if seen.admit(&line) {
                        let mut stdout = std::io::stdout().lock();
                        writeln!(stdout, "{}", format_line(&line))?;
                        stdout.flush()?;
                    }
                }
                if !args.follow {
                    return Ok(());
                }
                let status = client.get_job(&args.job).await?;
                if status.state.is_terminal() {
                    return Ok(());
                }
                // After a leader change, every line it kept (the filter drops repeats).
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
        }
    }

    #[test]
    fn lines_are_labelled_with_slice_worker_generation_and_step() {
        assert_eq!(
            format_line(&line(3_661_042, "w-3", "slow all-reduce\n")),
            "01:01:01.042 s1 w-3 g2 step 12 WARN  slow all-reduce"
        );
        let bare = LogLine { unix_ms: 5, worker_id: "w".into(), message: "hi".into(), ..Default::default() };
        assert_eq!(format_line(&bare), "00:00:00.005 s0 w INFO  hi");
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
}
