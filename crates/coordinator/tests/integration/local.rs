//! Local mode: one in-process node, simulated workers over loopback gRPC.

use crate::common::*;
use crate::sim::{self, SimOptions};
use client::{JobState, LogLine};
use std::time::Duration;

fn metrics_steps(run_dir: &std::path::Path) -> Vec<u64> {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_job_runs_to_the_end_with_checkpoints_kv_logs_and_a_run_record() {
    let dir = tempfile::tempdir().unwrap();
    let (node, addr) = embedded(dir.path(), None, true).await;
    let admin = client(vec![addr.clone()], ADMIN, None);
    let submitted = admin.submit(&submit_request(spec("demo", 2, 12, Some(4), dir.path()))).await.unwrap();
    let job = submitted.job_id.clone();
    let worker_client = admin.with_token(&submitted.job_token).unwrap();

    // A rendezvous: a reader waits for a key that a writer puts later.
    let reader = {
        let c = worker_client.clone();
        let job = job.clone();
        tokio::spawn(async move { c.kv_get(&job, "coordinator_address", Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    worker_client.kv_put(&job, "coordinator_address", b"10.0.0.1:1234".to_vec(), None).await.unwrap();
    assert_eq!(reader.await.unwrap().unwrap(), b"10.0.0.1:1234");
    let missing = worker_client.kv_get(&job, "nothing", Duration::from_millis(100)).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::DeadlineExceeded, "{missing}");

    let workers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|n| {
            tokio::spawn(sim::run(worker_client.clone(), job.clone(), n.into(), SimOptions::quick(12, 4)))
        })
        .collect();
    let mut reports = Vec::new();
    for w in workers {
        reports
            .push(tokio::time::timeout(Duration::from_secs(60), w).await.expect("workers finish").unwrap());
    }
    for r in &reports {
        assert!(r.stop_reason.contains("Completed"), "{r:?}");
        assert_eq!(r.generations, vec![1]);
        assert!(r.refusals.is_empty(), "{:?}", r.refusals);
        // Every ack of a step came after its commit, and commits only went forward.
        assert!(r.acks.iter().all(|(step, committed)| committed >= step), "{:?}", r.acks);
        assert!(r.acks.windows(2).all(|w| w[0].1 <= w[1].1));
    }
    // Every member hears each save committed: the last to report finalizes it, the others wait on
    // their calls for it (the parts live in the leader's memory only, so a member answered "not
    // yet" would have to report again). The final save's answers may be cut short by the stop
    // that completion sends; the catalog below has it.
    for r in &reports {
        assert_eq!(r.checkpoints.get(..2), Some(&[4, 8][..]), "{reports:?}");
    }

    let status = admin.get_job(&job).await.unwrap();
    assert_eq!(status.state, Some(JobState::Completed));
    assert_eq!(status.step, 12);
    assert!((status.loss - sim::loss_of(12)).abs() < 1e-12, "{}", status.loss);
    assert_eq!(status.slices.len(), 2);
    assert_eq!(status.leader, format!("1@{addr}"));
    // Retention keeps the last two, though all three saves share the generation's save id, and
    // the job completes only once it has run: the first one's objects and marker are gone.
    let kept = admin.checkpoints(&job).await.unwrap();
    assert_eq!(kept.iter().map(|c| c.step).collect::<Vec<_>>(), [8, 12], "{kept:?}");
    let last = std::path::PathBuf::from(kept[1].uri.strip_prefix("file://").unwrap());
    assert!(last.join("COMMITTED").is_file() && last.join("manifest.json").is_file());
    let root = dir.path().join("checkpoints");
    let dirs: Vec<String> =
        std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(dirs.len(), 2, "only the kept checkpoints remain under the root: {dirs:?}");
    assert!(dirs.iter().all(|d| !d.starts_with("000000000004-")), "{dirs:?}");

    // The run record: every step once, in order, and the plots at the end.
    let run = dir.path().join("run");
    eventually("the run record's plots", Duration::from_secs(10), || async {
        run.join("loss.png").is_file().then_some(())
    })
    .await;
    assert_eq!(metrics_steps(&run), (1..=12).collect::<Vec<_>>());
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert!(events.contains("\"checkpoint\"") && events.contains("\"completed\""), "{events}");

    // Logs: pushed lines come back, filtered by slice and tailed.
    let line = |slice, message: &str| LogLine {
        job_id: job.clone(),
        slice,
        message: message.into(),
        ..Default::default()
    };
    worker_client.push_logs(vec![line(0, "one"), line(1, "two"), line(0, "three")]).await.unwrap();
    let mut stream = admin.logs(&job, false, Some(0), 0).await.unwrap();
    let mut got = Vec::new();
    while let Some(l) = stream.next().await.unwrap() {
        got.push(l.message);
    }
    assert_eq!(got, ["one", "three"]);
    node.stop().await.unwrap();
}

/// CI saw a leader kill lose checkpoint 20: its reports reached the new leader after step 25's
/// save committed, and retention had taken its directory for an abandoned save's in between (or
/// the leader had forgotten the parts reported before).
#[tokio::test]
async fn a_save_whose_report_comes_after_a_later_commit_still_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (node, addr) = embedded(dir.path(), None, true).await;
    let admin = client(vec![addr.clone()], ADMIN, None);
    // Every checkpoint kept, so each can be verified at the end.
    let every_kept = spec("late", 2, 24, Some(4), dir.path()).replace("keep: 2", "keep: 10");
    let submitted = admin.submit(&submit_request(every_kept)).await.unwrap();
    let job = submitted.job_id.clone();
    let wc = admin.with_token(&submitted.job_token).unwrap();
    // Both members report their part of step 4's save after steps 8 and 12 committed (its
    // directory is nobody's pending save meanwhile); a reports its part of step 8's after 12 and
    // 16 did, b at once (b's part is pending meanwhile).
    let [four_a, four_b, eight_a] = [(); 3].map(|()| sim::LateSave::default());
    let lates = [vec![(4, four_a.clone()), (8, eight_a.clone())], vec![(4, four_b.clone())]];
    let workers = ["a", "b"].into_iter().zip(lates).map(|(name, late_saves)| {
        let opts = SimOptions { late_saves, ..SimOptions::quick(24, 4) };
        tokio::spawn(sim::run(wc.clone(), job.clone(), name.into(), opts))
    });
    for worker in workers.collect::<Vec<_>>() {
        let report = tokio::time::timeout(Duration::from_secs(60), worker).await.unwrap().unwrap();
        assert!(report.stop_reason.contains("Completed"), "{report:?}");
    }
    let answer = |cell: &sim::LateSave| cell.lock().unwrap().clone();
    let four = [answer(&four_a), answer(&four_b)];
    assert!(four.contains(&Some(Ok(true))), "one of the late reports committed step 4: {four:?}");
    assert_eq!(answer(&eight_a), Some(Ok(true)), "a's late report committed step 8");
    let run = dir.path().join("run");
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    let commits: Vec<&str> = events.lines().filter(|l| l.contains("\"checkpoint\"")).collect();
    let committed_at = |step: u64| commits.iter().position(|l| l.contains(&format!("/{step:012}-")));
    let at = |step| committed_at(step).unwrap_or_else(|| panic!("step {step} committed: {commits:#?}"));
    assert!(at(4) > at(12) && at(8) > at(16), "the late saves committed after later ones: {commits:#?}");
    // Each committed checkpoint is whole: none lost a member's part to retention.
    let kept = admin.checkpoints(&job).await.unwrap();
    assert_eq!(kept.iter().map(|c| c.step).collect::<Vec<_>>(), [4, 8, 12, 16, 20, 24], "{kept:?}");
    let storage = checkpoint::Storage::open(
        &format!("file://{}", dir.path().join("checkpoints").display()),
        &Default::default(),
    )
    .unwrap();
    let commits =
        checkpoint::committed_newest_first(&checkpoint::StoreCommitLog::new(storage.clone())).await.unwrap();
    assert_eq!(commits.len(), 6, "{commits:?}");
    for commit in &commits {
        let opened = checkpoint::Checkpoint::open(&storage, commit, &Default::default()).await;
        let verified = match opened {
            Ok(c) => c.verify().await.map(drop),
            Err(e) => Err(e),
        };
        assert!(verified.is_ok(), "checkpoint {}: {verified:?}", commit.step);
    }
    node.stop().await.unwrap();
}

#[tokio::test]
async fn a_lost_worker_is_replaced_and_no_step_is_lost_or_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let (node, addr) = embedded(dir.path(), None, true).await;
    let admin = client(vec![addr.clone()], ADMIN, None);
    let submitted = admin.submit(&submit_request(spec("elastic", 3, 40, None, dir.path()))).await.unwrap();
    let job = submitted.job_id.clone();
    let wc = admin.with_token(&submitted.job_token).unwrap();
    let spawn =
        |name: &str| tokio::spawn(sim::run(wc.clone(), job.clone(), name.into(), SimOptions::quick(40, 0)));
    let a = spawn("a");
    let b = spawn("b");
    let c = spawn("c");
    eventually("step 8", Duration::from_secs(30), || async {
        (admin.get_job(&job).await.ok()?.step >= 8).then_some(())
    })
    .await;
    // c vanishes: its session and reports stop, its lease runs out.
    c.abort();
    let recovered = eventually("generation 2 with two members", Duration::from_secs(30), || async {
        let s = admin.get_job(&job).await.ok()?;
        (s.generation == 2 && s.state == Some(JobState::Running)).then_some(s)
    })
    .await;
    let mut ranks: Vec<Vec<u32>> = recovered
        .slices
        .iter()
        .filter(|s| !s.virtual_ranks.is_empty())
        .map(|s| s.virtual_ranks.clone())
        .collect();
    ranks.sort_by_key(|r| r.len());
    assert_eq!(ranks.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 2], "{:?}", recovered.slices);
    let mut all: Vec<u32> = ranks.concat();
    all.sort();
    assert_eq!(all, vec![0, 1, 2], "the orphan rank went to a survivor: {:?}", recovered.slices);
    assert!(recovered.events.iter().any(|e| e.detail.contains("lease expired")), "{:?}", recovered.events);

    // A replacement joins: it takes a rank back and fetches the state from a peer.
    let d = spawn("d");
    let reports =
        [a, b, d].map(|h| async { tokio::time::timeout(Duration::from_secs(90), h).await.unwrap().unwrap() });
    let [ra, rb, rd] = futures::future::join_all(reports).await.try_into().unwrap();
    for r in [&ra, &rb] {
        assert_eq!(r.generations, vec![1, 2, 3], "{r:?}");
        assert!(r.stop_reason.contains("Completed"));
    }
    assert_eq!(rd.generations, vec![3]);
    assert!(rd.resumes[0].contains("Peer"), "{:?}", rd.resumes);
    let status = admin.get_job(&job).await.unwrap();
    assert_eq!((status.state, status.step, status.generation), (Some(JobState::Completed), 40, 3));
    assert_eq!(status.slices.iter().filter(|s| !s.virtual_ranks.is_empty()).count(), 3);

    let run = dir.path().join("run");
    eventually("the run record's plots", Duration::from_secs(10), || async {
        run.join("loss.png").is_file().then_some(())
    })
    .await;
    assert_eq!(metrics_steps(&run), (1..=40).collect::<Vec<_>>(), "every step committed exactly once");
    node.stop().await.unwrap();
}
