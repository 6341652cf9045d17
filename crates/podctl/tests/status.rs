//! `podctl status`, `logs` and `stop` through the real binary against an in-process
//! coordinator on loopback (a job with no workers: it stays pending until stopped).

use client::{Client, ClientConfig, LogLine, Submission};
use coordinator::{Config, Embedded};
use serde_json::Value;
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

const ADMIN: &str = "admin-token-for-cli-tests-0123456789";

/// `podctl` with no saved context and no connection settings in its environment; times shown
/// in India's zone (UTC+05:30, no daylight saving), which tells local times from UTC.
fn bare_podctl(config_home: Option<&Path>) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_podctl"));
    for var in ["PODCTL_COORDINATOR", "PODCTL_TOKEN", "PODCTL_CONTEXT", "PODCTL_CONFIG"] {
        command.env_remove(var);
    }
    let home = config_home.map_or_else(|| Path::new("/nonexistent").to_path_buf(), Path::to_path_buf);
    command.env("XDG_CONFIG_HOME", home).env("TZ", "IST-5:30");
    command
}

async fn output(mut command: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("podctl answers within a minute")
        .unwrap()
}

async fn podctl(args: &[&str], addr: &str, token: &str) -> Output {
    let mut command = bare_podctl(None);
    command.args(args).args(["--coordinator", addr, "--insecure-plaintext"]);
    if !token.is_empty() {
        command.env("PODCTL_TOKEN", token);
    }
    output(command).await
}

/// `podctl` with only the saved contexts under `config_home` to say where the cluster is.
async fn with_context(args: &[&str], config_home: &Path) -> Output {
    let mut command = bare_podctl(Some(config_home));
    command.args(args);
    output(command).await
}

fn text(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn spec(dir: &Path) -> String {
    format!(
        "name: watched\nmodel: tiny\nmesh: {{ dcn: 2, ici: {{ fsdp: 1, tp: 1 }} }}\n\
         batch: {{ global: 4, micro: 1 }}\nseq_len: 16\nsteps: 10\ndata: {{ kind: arithmetic }}\noutput: {}\n",
        dir.join("run").display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_logs_and_stop_against_a_local_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(1, "127.0.0.1:0".parse().unwrap(), dir.path().join("raft"), ADMIN);
    config.insecure_plaintext = true;
    let node = Embedded::start(config).await.unwrap();
    let addr = node.addr().to_string();
    let admin = Client::new(ClientConfig::new(vec![addr.clone()], ADMIN, None)).unwrap();
    let submitted = admin
        .submit(&Submission {
            spec_yaml: spec(dir.path()),
            bundle_uri: "file:///nowhere".into(),
            bundle_id: "00ff".into(),
            start_over: false,
        })
        .await
        .unwrap();
    let job = submitted.job_id.clone();

    // One JSON object, with the cluster's leader and term.
    let out = text(&podctl(&["status", &job, "--json"], &addr, ADMIN).await);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["job_id"], job.as_str());
    assert_eq!(v["name"], "watched");
    assert_eq!(v["state"], "pending");
    assert_eq!((v["step"].as_u64(), v["total_steps"].as_u64()), (Some(0), Some(10)));
    assert!(v["loss"].is_null(), "{v}");
    assert_eq!(v["leader"], format!("1@{addr}"));
    assert!(v["cluster"]["term"].as_u64().unwrap() >= 1, "{v}");

    // Piped, plain text: no escape sequences, in the frame or in the logs (debug: the gRPC
    // stack's own lines).
    let out = podctl(&["--log", "debug", "status", "watched"], &addr, ADMIN).await;
    let one = text(&out);
    assert!(
        one.starts_with(&format!("job watched ({job})  PENDING  generation 0  leader 1@{addr}")),
        "{one}"
    );
    assert!(one.contains("step 0/10") && !one.contains('\x1b'), "{one}");
    let logged = String::from_utf8_lossy(&out.stderr);
    assert!(logged.contains("DEBUG") && !logged.contains('\x1b'), "{logged}");
    let list = text(&podctl(&["status"], &addr, ADMIN).await);
    assert!(list.contains("NAME") && list.contains("watched") && list.contains("pending"), "{list}");

    // Logs the job's workers pushed, merged and labelled, one slice of them.
    let workers = admin.with_token(&submitted.job_token).unwrap();
    let line = |slice, unix_ms, message: &str| LogLine {
        job_id: job.clone(),
        worker_id: format!("w{slice}"),
        slice,
        unix_ms,
        level: "info".into(),
        message: message.into(),
        step: 3,
        generation: 1,
        seq: 0,
    };
    workers
        .push_logs(vec![line(0, 1_000, "zero"), line(1, 2_000, "one"), line(0, 3_000, "two")])
        .await
        .unwrap();
    let logs = text(&podctl(&["logs", &job], &addr, &submitted.job_token).await);
    // In local time: 1970-01-01 00:00:01 UTC is 05:30:01 in India.
    assert_eq!(
        logs.lines().collect::<Vec<_>>(),
        [
            "05:30:01.000 s0 w0 g1 step 3 INFO  zero",
            "05:30:02.000 s1 w1 g1 step 3 INFO  one",
            "05:30:03.000 s0 w0 g1 step 3 INFO  two"
        ]
    );
    let slice0 = text(&podctl(&["logs", &job, "--slice", "0", "--tail", "1"], &addr, ADMIN).await);
    assert_eq!(slice0.trim(), "05:30:03.000 s0 w0 g1 step 3 INFO  two");

    // A saved context alone says where the cluster is and how to authenticate: status, logs and
    // (below) stop with no connection flag or variable.
    let config_home = dir.path().join("config");
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, ADMIN).unwrap();
    let token_file = token_file.display().to_string();
    let add = [
        "context",
        "add",
        "here",
        "--coordinator",
        &addr,
        "--insecure-plaintext",
        "--token-file",
        &token_file,
    ];
    let saved = text(&with_context(&add, &config_home).await);
    assert!(saved.contains("saved context here (the current context)"), "{saved}");
    let file = std::fs::read_to_string(config_home.join("podctl/config.yaml")).unwrap();
    assert!(file.contains("current-context: here") && !file.contains(ADMIN), "{file}");
    let listed = text(&with_context(&["context", "list"], &config_home).await);
    assert!(listed.lines().nth(1).is_some_and(|l| l.starts_with("*") && l.contains(&addr)), "{listed}");
    let status = text(&with_context(&["status", &job, "--json"], &config_home).await);
    let v: Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!((v["job_id"].as_str(), v["state"].as_str()), (Some(job.as_str()), Some("pending")));
    let logs = text(&with_context(&["logs", &job, "--tail", "1"], &config_home).await);
    assert_eq!(logs.trim(), "05:30:03.000 s0 w0 g1 step 3 INFO  two");
    // A context that is not there is bad usage, named.
    let out = with_context(&["status", "--context", "nope"], &config_home).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no context named \"nope\""), "{out:?}");

    // A watch prints JSON lines until the job ends; stopping it ends the watch. The stop waits
    // for the watch's first line, so the watch has seen the job before it ends.
    let mut watch = bare_podctl(None)
        .args(["status", &job, "--watch", "--json", "--interval-ms", "200"])
        .args(["--coordinator", &addr, "--insecure-plaintext"])
        .env("PODCTL_TOKEN", ADMIN)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the watch prints within a minute")
        .unwrap()
        .expect("the watch printed a line");
    let stopped = text(&with_context(&["stop", "watched"], &config_home).await);
    assert_eq!(stopped.trim(), "watched: stopped");
    let mut states = vec![first];
    while let Some(line) = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the watch ends once the job is stopped")
        .unwrap()
    {
        states.push(line);
    }
    assert!(watch.wait().await.unwrap().success());
    let watched = states.join("\n");
    let states: Vec<String> = states
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["state"].as_str().unwrap().to_string())
        .collect();
    assert!(states.len() >= 2, "{watched}");
    assert_eq!(states.first().map(String::as_str), Some("pending"));
    assert_eq!(states.last().map(String::as_str), Some("stopped"));

    // No token: a message that names the fix, status 2 (bad usage).
    let out = podctl(&["status"], &addr, "").await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PODCTL_TOKEN"), "{out:?}");
    // A token the cluster refuses, and no coordinator at the address: status 3 (cannot reach or
    // authenticate), which a script may retry.
    let out = podctl(&["status"], &addr, "not-the-admin-token").await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"), "{out:?}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let out = podctl(&["status"], &closed, ADMIN).await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    node.stop().await.unwrap();
}
