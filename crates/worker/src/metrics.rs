//! Prometheus metrics of a worker process: `GET /metrics`, through the `prometheus-client` crate
//! and served by [`metrics_http`] (hyper, OpenMetrics text).
//!
//! The trainer thread sets gauges and adds to counters between steps (atomics); a scrape encodes
//! them. Nothing here waits on training, and a slow scraper cannot hold up a step. Every series
//! is labelled with the job and the worker id, and the id changes when the worker registers
//! again, so a collector encodes the series with the labels of the moment. docs/METRICS.md lists
//! them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// A gauge of `f64`: `set` replaces its value.
pub type Gauge = prometheus_client::metrics::gauge::Gauge<f64, AtomicU64>;

/// A counter of `f64` (steps, bytes, seconds) that the trainer adds to.
#[derive(Debug, Default, Clone)]
pub struct Total(Counter<f64, AtomicU64>);

impl Total {
    /// Adds `value` (never negative: a counter only goes up).
    pub fn add(&self, value: f64) {
        debug_assert!(value >= 0.0, "a counter only goes up: {value}");
        self.0.inc_by(value);
    }

    /// The value.
    pub fn get(&self) -> f64 {
        self.0.get()
    }
}

/// Everything a worker exports.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// Steps this worker holds the state of.
    pub step: Gauge,
    /// The generation it works in.
    pub generation: Gauge,
    /// Steps this process applied.
    pub steps_total: Total,
    /// Tokens this process's ranks processed.
    pub tokens_total: Total,
    /// The last step's wall time.
    pub step_seconds: Gauge,
    /// The last step's tokens per second on this worker.
    pub tokens_per_second: Gauge,
    /// Bytes this worker uploaded for checkpoints.
    pub checkpoint_bytes_total: Total,
    /// Time training stood still for checkpoint copies off the devices.
    pub checkpoint_stall_seconds_total: Total,
    /// The last checkpoint upload's duration.
    pub checkpoint_upload_seconds: Gauge,
    /// Due saves skipped because the previous one was still uploading.
    pub checkpoint_skipped_total: Total,
    /// State taken over from a live peer.
    pub peer_catchups_total: Total,
    /// The last catch-up's duration.
    pub peer_catchup_seconds: Gauge,
    /// Checkpoint restores.
    pub restores_total: Total,
    /// The last restore's duration.
    pub restore_seconds: Gauge,
    /// Steps that failed (a peer lost, an abort).
    pub failed_steps_total: Total,
    /// Device memory the step program needs on each device (compile-time statistics).
    pub device_bytes: Gauge,
}

impl WorkerMetrics {
    /// Every series but the process's memory: name (counters without the `_total` that
    /// OpenMetrics appends), help, metric.
    fn series(&self) -> [(&'static str, &'static str, &dyn EncodeMetric); 16] {
        [
            ("podctl_worker_step", "Steps the worker's state holds.", &self.step),
            ("podctl_worker_generation", "The generation the worker works in.", &self.generation),
            ("podctl_worker_steps", "Steps this process applied.", &self.steps_total.0),
            ("podctl_worker_tokens", "Tokens this process's ranks processed.", &self.tokens_total.0),
            ("podctl_worker_step_seconds", "Wall time of the last step.", &self.step_seconds),
            ("podctl_worker_tokens_per_second", "Throughput of the last step.", &self.tokens_per_second),
            (
                "podctl_worker_checkpoint_bytes",
                "Bytes uploaded for checkpoints.",
                &self.checkpoint_bytes_total.0,
            ),
            (
                "podctl_worker_checkpoint_stall_seconds",
                "Training stalled for checkpoint copies off the devices.",
                &self.checkpoint_stall_seconds_total.0,
            ),
            (
                "podctl_worker_checkpoint_upload_seconds",
                "Duration of the last checkpoint upload.",
                &self.checkpoint_upload_seconds,
            ),
            (
                "podctl_worker_checkpoint_skipped",
                "Due saves skipped while the previous one uploaded.",
                &self.checkpoint_skipped_total.0,
            ),
            (
                "podctl_worker_peer_catchups",
                "States taken over from a live peer.",
                &self.peer_catchups_total.0,
            ),
            (
                "podctl_worker_peer_catchup_seconds",
                "Duration of the last catch-up from a peer.",
                &self.peer_catchup_seconds,
            ),
            ("podctl_worker_restores", "Checkpoint restores.", &self.restores_total.0),
            ("podctl_worker_restore_seconds", "Duration of the last restore.", &self.restore_seconds),
            ("podctl_worker_failed_steps", "Steps that failed.", &self.failed_steps_total.0),
            (
                "podctl_worker_device_bytes",
                "Device memory the step program needs per device.",
                &self.device_bytes,
            ),
        ]
    }
}

/// A worker's series with the labels of the moment.
#[derive(Debug)]
struct Labelled {
    metrics: Arc<WorkerMetrics>,
    job: String,
    /// The id the coordinator knows the worker by (empty until it registers).
    worker: Arc<Mutex<String>>,
}

impl Collector for Labelled {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let labels = [("job", self.job.as_str()), ("worker", worker.as_str())];
        let rss = ConstGauge::new(rss_bytes() as f64);
        let memory: (&str, &str, &dyn EncodeMetric) =
            ("podctl_worker_rss_bytes", "Resident host memory of the process.", &rss);
        for (name, help, metric) in self.metrics.series().into_iter().chain([memory]) {
            let mut family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The registry of a worker of `job`, labelled with the worker id `worker` holds at each scrape.
pub fn registry(metrics: Arc<WorkerMetrics>, job: String, worker: Arc<Mutex<String>>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Labelled { metrics, job, worker }));
    registry
}

/// Serves `registry` at `/metrics` on `listener` for as long as the runtime runs.
pub async fn serve(listener: TcpListener, registry: Registry) {
    metrics_http::serve(listener, Arc::new(registry.into()), std::future::pending()).await
}

/// This process's resident memory, from procfs (0 where there is none).
pub(crate) fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn the_page_has_every_series_with_the_labels_of_the_moment() {
        let metrics = Arc::new(WorkerMetrics::default());
        let worker = Arc::new(Mutex::new(String::new()));
        let registry = registry(metrics.clone(), "arith-1".into(), worker.clone());
        metrics.step.set(7.0);
        metrics.steps_total.add(1.0);
        metrics.steps_total.add(1.0);
        metrics.checkpoint_stall_seconds_total.add(0.25);
        *worker.lock().unwrap() = "w2".into();
        let text = page(&registry);
        for line in [
            "# TYPE podctl_worker_step gauge\n",
            "podctl_worker_step{job=\"arith-1\",worker=\"w2\"} 7.0\n",
            "# TYPE podctl_worker_steps counter\n",
            "podctl_worker_steps_total{job=\"arith-1\",worker=\"w2\"} 2.0\n",
            "podctl_worker_checkpoint_stall_seconds_total{job=\"arith-1\",worker=\"w2\"} 0.25\n",
            "podctl_worker_failed_steps_total{job=\"arith-1\",worker=\"w2\"} 0.0\n",
            "# TYPE podctl_worker_rss_bytes gauge\n",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
        // Registered again under a new id: the same series, newly labelled.
        *worker.lock().unwrap() = "w5".into();
        let text = page(&registry);
        assert!(text.contains("podctl_worker_steps_total{job=\"arith-1\",worker=\"w5\"} 2.0\n"), "{text}");
        assert!(!text.contains("w2"), "{text}");
    }

    #[test]
    fn the_grafana_dashboard_names_only_series_the_page_has() {
        let registry = registry(Arc::default(), "j".into(), Arc::default());
        let text = page(&registry);
        let served: std::collections::BTreeSet<&str> =
            text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
        let dashboard = include_str!("../../../deploy/grafana/podctl.json");
        let mut used = 0;
        for (i, _) in dashboard.match_indices("podctl_worker_") {
            let name: String =
                dashboard[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            assert!(
                served.contains(name.as_str()),
                "the dashboard uses {name}, which /metrics does not serve"
            );
            used += 1;
        }
        assert!(used > 0, "the dashboard has no worker series");
    }
}
