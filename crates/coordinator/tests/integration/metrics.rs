//! `/metrics` of an in-process node during a job of simulated workers: the series move as steps
//! and checkpoints commit, a lost worker shows as a lease expiry and a recovery, and Raft's
//! term and commit index are there.

use crate::common::*;
use crate::sim::{self, SimOptions};
use client::JobState;
use coordinator::Embedded;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP GET; the status line and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: podctl\r\n\r\n").as_bytes()).await.unwrap();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut text)).await.unwrap().unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample `name` whose labels contain every one of `labels` (`k="v"`).
fn value(page: &str, name: &str, labels: &[&str]) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, v) = line.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|l| rest.contains(l))).then(|| v.parse().unwrap())
    })
}

async fn scrape(node: &Embedded) -> String {
    let (status, body) = get(node.metrics_addr().expect("metrics are served"), "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    body
}

#[tokio::test]
async fn metrics_move_with_steps_checkpoints_and_a_lost_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = local_config(&dir.path().join("raft"), None);
    config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let node = Embedded::start(config).await.unwrap();
    let addr = node.addr().to_string();
    let admin = client(vec![addr], ADMIN, None);
    let submitted =
        admin.submit(&submit_request(spec("scraped", 2, 400, Some(5), dir.path()))).await.unwrap();
    let job = submitted.job_id.clone();
    let label = format!("job=\"{job}\"");
    let wc = admin.with_token(&submitted.job_token).unwrap();

    let (status, _) = get(node.metrics_addr().unwrap(), "/nothing").await;
    assert!(status.contains("404"), "{status}");
    let page = scrape(&node).await;
    assert_eq!(value(&page, "podctl_raft_is_leader", &["node=\"1\""]), Some(1.0), "{page}");
    assert!(value(&page, "podctl_raft_term", &[]).unwrap() >= 1.0);
    assert_eq!(value(&page, "podctl_job_step", &[&label]), Some(0.0));
    assert_eq!(value(&page, "podctl_job_state", &[&label, "state=\"pending\""]), Some(1.0));
    let index_before = value(&page, "podctl_raft_commit_index", &[]).unwrap();

    let opts = SimOptions {
        step_time: Duration::from_millis(30),
        heartbeat: Duration::from_millis(200),
        total_steps: 400,
        checkpoint_every: 5,
        late_saves: Vec::new(),
    };
    let a = tokio::spawn(sim::run(wc.clone(), job.clone(), "a".into(), opts.clone()));
    let b = tokio::spawn(sim::run(wc.clone(), job.clone(), "b".into(), opts));

    // Steps and a checkpoint commit: the counters, the histogram and the gauges move.
    let first = eventually("steps and a checkpoint in /metrics", Duration::from_secs(30), || async {
        let page = scrape(&node).await;
        let steps = value(&page, "podctl_steps_committed_total", &[&label])?;
        let bytes = value(&page, "podctl_checkpoint_bytes_total", &[&label])?;
        (steps >= 6.0 && bytes > 0.0).then_some(page)
    })
    .await;
    assert_eq!(value(&first, "podctl_job_state", &[&label, "state=\"running\""]), Some(1.0), "{first}");
    assert_eq!(value(&first, "podctl_job_generation", &[&label]), Some(1.0));
    assert!(value(&first, "podctl_job_tokens_per_second", &[&label]).unwrap() > 0.0, "{first}");
    assert!(value(&first, "podctl_job_last_checkpoint_bytes", &[&label]).unwrap() > 0.0);
    assert!(value(&first, "podctl_checkpoints_committed_total", &[&label]).unwrap() >= 1.0);
    let steps = value(&first, "podctl_steps_committed_total", &[&label]).unwrap();
    assert_eq!(value(&first, "podctl_step_seconds_count", &[&label]), Some(steps));
    assert_eq!(value(&first, "podctl_step_seconds_bucket", &[&label, "le=\"+Inf\""]), Some(steps));
    assert!(value(&first, "podctl_raft_commit_index", &[]).unwrap() > index_before);

    let later = eventually("more steps", Duration::from_secs(30), || async {
        let page = scrape(&node).await;
        (value(&page, "podctl_steps_committed_total", &[&label])? >= steps + 5.0).then_some(page)
    })
    .await;
    assert!(value(&later, "podctl_job_step", &[&label]).unwrap() >= steps + 5.0);

    // b vanishes: its lease expires, the job recovers into generation 2 on a alone.
    b.abort();
    let recovered = eventually("a lease expiry and a recovery", Duration::from_secs(30), || async {
        let page = scrape(&node).await;
        let done = value(&page, "podctl_recovery_seconds_count", &[&label])? >= 1.0
            && value(&page, "podctl_job_generation", &[&label])? >= 2.0;
        done.then_some(page)
    })
    .await;
    assert!(value(&recovered, "podctl_lease_expiries_total", &[&label]).unwrap() >= 1.0, "{recovered}");
    assert!(
        value(&recovered, "podctl_recoveries_total", &[&label, "cause=\"lease_expired\""]).unwrap() >= 1.0,
        "{recovered}"
    );
    // The job keeps going on the survivor.
    let steps_then = value(&recovered, "podctl_steps_committed_total", &[&label]).unwrap();
    eventually("steps after the recovery", Duration::from_secs(30), || async {
        let page = scrape(&node).await;
        (value(&page, "podctl_steps_committed_total", &[&label])? > steps_then).then_some(())
    })
    .await;

    admin.stop_job(&job).await.unwrap();
    let page = eventually("the stopped state", Duration::from_secs(10), || async {
        let page = scrape(&node).await;
        (value(&page, "podctl_job_state", &[&label, "state=\"stopped\""])? == 1.0).then_some(page)
    })
    .await;
    assert_eq!(value(&page, "podctl_job_state", &[&label, "state=\"running\""]), Some(0.0));
    assert_eq!(admin.get_job(&job).await.unwrap().state, Some(JobState::Stopped));
    let _ = tokio::time::timeout(Duration::from_secs(10), a).await;
    node.stop().await.unwrap();
}
