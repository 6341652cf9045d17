//! Prometheus metrics of a worker process: `GET /metrics` in the text exposition format.
//!
//! The trainer thread updates plain atomics between steps; a scrape formats them. Nothing here
//! waits on training, and a slow scraper cannot hold up a step.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Largest request head read.
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// An `f64` in an atomic.
#[derive(Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Sets the value.
    pub fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }

    /// Adds to the value (one writer: the trainer thread).
    pub fn add(&self, value: f64) {
        self.set(self.get() + value);
    }

    /// The value.
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// Everything a worker exports.
#[derive(Default)]
pub struct WorkerMetrics {
    /// Steps this worker holds the state of.
    pub step: Gauge,
    /// The generation it works in.
    pub generation: Gauge,
    /// Steps this process applied.
    pub steps_total: Gauge,
    /// Tokens this process's ranks processed.
    pub tokens_total: Gauge,
    /// The last step's wall time.
    pub step_seconds: Gauge,
    /// The last step's tokens per second on this worker.
    pub tokens_per_second: Gauge,
    /// Bytes this worker uploaded for checkpoints.
    pub checkpoint_bytes_total: Gauge,
    /// Time training stood still for checkpoint copies off the devices.
    pub checkpoint_stall_seconds_total: Gauge,
    /// The last checkpoint upload's duration.
    pub checkpoint_upload_seconds: Gauge,
    /// Due saves skipped because the previous one was still uploading.
    pub checkpoint_skipped_total: Gauge,
    /// State taken over from a live peer, and the time it took.
    pub peer_catchups_total: Gauge,
    /// The last catch-up's duration.
    pub peer_catchup_seconds: Gauge,
    /// Checkpoint restores, and the time the last one took.
    pub restores_total: Gauge,
    /// The last restore's duration.
    pub restore_seconds: Gauge,
    /// Steps that failed (a peer lost, an abort).
    pub failed_steps_total: Gauge,
    /// Device memory the step program needs on each device (compile-time statistics).
    pub device_bytes: Gauge,
}

impl WorkerMetrics {
    /// The page: every series, labelled with the job and the worker.
    pub fn render(&self, job: &str, worker: &str) -> String {
        let series: [(&str, &str, &str, &Gauge); 16] = [
            ("podctl_worker_step", "gauge", "Steps the worker's state holds.", &self.step),
            ("podctl_worker_generation", "gauge", "The generation the worker works in.", &self.generation),
            ("podctl_worker_steps_total", "counter", "Steps this process applied.", &self.steps_total),
            (
                "podctl_worker_tokens_total",
                "counter",
                "Tokens this process's ranks processed.",
                &self.tokens_total,
            ),
            ("podctl_worker_step_seconds", "gauge", "Wall time of the last step.", &self.step_seconds),
            (
                "podctl_worker_tokens_per_second",
                "gauge",
                "Throughput of the last step.",
                &self.tokens_per_second,
            ),
            (
                "podctl_worker_checkpoint_bytes_total",
                "counter",
                "Bytes uploaded for checkpoints.",
                &self.checkpoint_bytes_total,
            ),
            (
                "podctl_worker_checkpoint_stall_seconds_total",
                "counter",
                "Training stalled for checkpoint copies off the devices.",
                &self.checkpoint_stall_seconds_total,
            ),
            (
                "podctl_worker_checkpoint_upload_seconds",
                "gauge",
                "Duration of the last checkpoint upload.",
                &self.checkpoint_upload_seconds,
            ),
            (
                "podctl_worker_checkpoint_skipped_total",
                "counter",
                "Due saves skipped while the previous one uploaded.",
                &self.checkpoint_skipped_total,
            ),
            (
                "podctl_worker_peer_catchups_total",
                "counter",
                "States taken over from a live peer.",
                &self.peer_catchups_total,
            ),
            (
                "podctl_worker_peer_catchup_seconds",
                "gauge",
                "Duration of the last catch-up from a peer.",
                &self.peer_catchup_seconds,
            ),
            ("podctl_worker_restores_total", "counter", "Checkpoint restores.", &self.restores_total),
            (
                "podctl_worker_restore_seconds",
                "gauge",
                "Duration of the last restore.",
                &self.restore_seconds,
            ),
            ("podctl_worker_failed_steps_total", "counter", "Steps that failed.", &self.failed_steps_total),
            (
                "podctl_worker_device_bytes",
                "gauge",
                "Device memory the step program needs per device.",
                &self.device_bytes,
            ),
        ];
        let labels = format!("job=\"{}\",worker=\"{}\"", escape(job), escape(worker));
        let mut page = String::new();
        for (name, kind, help, gauge) in series {
            let _ = writeln!(
                page,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {}",
                gauge.get()
            );
        }
        let _ = writeln!(
            page,
            "# HELP podctl_worker_rss_bytes Resident host memory of the process.\n\
             # TYPE podctl_worker_rss_bytes gauge\npodctl_worker_rss_bytes{{{labels}}} {}",
            crate::agent::rss_bytes()
        );
        page
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Serves `render()` at `/metrics` on `listener` for as long as the runtime runs.
pub async fn serve(listener: TcpListener, render: impl Fn() -> String + Send + Sync + Clone + 'static) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let render = render.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
                    let n = stream.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                let first = String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_string();
                let (status, body) = match first.split_whitespace().nth(1) {
                    Some("/metrics") => ("200 OK", render()),
                    Some(_) => ("404 Not Found", "only /metrics is served here\n".to_string()),
                    None => ("400 Bad Request", "expected GET <path> HTTP/1.x\n".to_string()),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(response.as_bytes()).await?;
                stream.shutdown().await
            })
            .await;
        });
    }
}
