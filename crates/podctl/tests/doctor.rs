//! `podctl doctor` against what it checks, for real: a job's object-store roots on moto's S3
//! server with and without the AWS variables, Google credentials of a kind the GCS client cannot
//! use, a coordinator with the right and a wrong token, and one that is not there. Every problem
//! is one `FAIL` line that names the fix, and the exit status is 1. (The wheel's own checks, the
//! Python side and the plugin, are tested by `install.rs` from an installed wheel.)

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;
use common::podctl;
use test_support::{Killed, Moto, free_port};

const ADMIN: &str = "doctor-test-admin-token-0123456789";

/// `podctl doctor ARGS` with only `env` of the credential variables (the rest of the test's
/// environment is kept: PATH, the checkout through PODCTL_HOME).
fn doctor(args: &[&str], env: &[(&str, &str)], home: &Path) -> Output {
    let mut command = podctl();
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") || name.starts_with("GOOGLE_") || name.starts_with("PODCTL_TOKEN") {
            command.env_remove(name);
        }
    }
    command.env("HOME", home).arg("doctor").args(args).envs(env.iter().copied()).output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "exit {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The line of check `name`.
fn line<'a>(report: &'a str, name: &str) -> &'a str {
    report
        .lines()
        .find(|l| {
            l.split_whitespace().nth(1) == Some(name.split_whitespace().next().unwrap()) && l.contains(name)
        })
        .unwrap_or_else(|| panic!("no {name} line:\n{report}"))
}

#[test]
fn object_store_credentials_are_checked_for_every_root_a_job_names() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let moto = Moto::with_bucket("ckpt");
    let job = dir.path().join("job.yaml");
    let spec = |uri: &str| {
        format!(
            "name: doctor\nmodel: tiny\nmesh: {{ ici: {{ fsdp: 2, tp: 1 }} }}\nbatch: {{ global: 8, micro: 4 }}\n\
             seq_len: 64\nsteps: 5\ndata: {{ kind: arithmetic }}\ncheckpoint: {{ every: 5, uri: {uri} }}\n"
        )
    };
    let job_arg = job.display().to_string();
    let args = ["--job", job_arg.as_str()];
    let endpoint = moto.endpoint();
    let moto_env = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_REGION", "us-east-1"),
    ];

    // No AWS variables: the S3 root fails, naming them; nothing is contacted.
    std::fs::write(&job, spec("s3://ckpt/runs/doctor")).unwrap();
    let out = doctor(&args, &[], home);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let s3 = line(&report, "store s3");
    assert!(s3.starts_with("FAIL") && s3.contains("no AWS credentials"), "{s3}");
    assert!(s3.contains("fix: export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=..."), "{s3}");
    assert!(line(&report, "job").starts_with("ok"), "{report}");

    // With them, the root is listed on the server.
    let out = doctor(&args, &moto_env, home);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(
        line(&report, "store s3").contains("credentials from AWS_ACCESS_KEY_ID; listed 0 entries"),
        "{report}"
    );

    // A bucket that does not exist fails its listing.
    std::fs::write(&job, spec("s3://no-such-bucket/runs/doctor")).unwrap();
    let out = doctor(&args, &moto_env, home);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let s3 = line(&report, "store s3");
    assert!(s3.starts_with("FAIL") && s3.contains("listing failed") && s3.contains("no-such-bucket"), "{s3}");

    // gs:// with credentials of a kind podctl's GCS client does not take (workload identity
    // federation), and without any: both fail naming gcloud's command. HOME has no gcloud file.
    std::fs::write(&job, spec("gs://bucket/runs/doctor")).unwrap();
    let external = dir.path().join("external.json");
    std::fs::write(&external, r#"{"type": "external_account", "audience": "x"}"#).unwrap();
    let external = external.display().to_string();
    let out = doctor(&args, &[("GOOGLE_APPLICATION_CREDENTIALS", external.as_str())], home);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let gs = line(&report, "store gs");
    assert!(
        gs.contains("of type external_account") && gs.ends_with("fix: gcloud auth application-default login"),
        "{gs}"
    );
    let on_gce =
        std::fs::read_to_string("/sys/class/dmi/id/product_name").is_ok_and(|p| p.contains("Google"));
    if !on_gce {
        let out = doctor(&args, &[], home);
        let gs = text(&out);
        let gs = line(&gs, "store gs");
        assert!(gs.starts_with("FAIL") && gs.ends_with("fix: gcloud auth application-default login"), "{gs}");
    }

    // A spec that does not load is a problem too.
    std::fs::write(&job, spec("s3://ckpt/runs/doctor").replace("steps: 5", "steps: 0")).unwrap();
    let out = doctor(&args, &moto_env, home);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let job_line = line(&report, "job");
    assert!(
        job_line.starts_with("FAIL") && job_line.contains("steps") && job_line.contains("fix: edit"),
        "{job_line}"
    );
}

/// One `podctl coordinator` node with TLS (its own cluster), killed when dropped.
fn coordinator(dir: &Path) -> (Killed, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_podctl"))
        .args(["coordinator", "--id", "1", "--listen", &addr, "--peers", &format!("1={addr}")])
        .arg("--data-dir")
        .arg(dir.join("node"))
        .arg("--tls-dir")
        .arg(dir.join("tls"))
        .env("PODCTL_ADMIN_TOKEN", ADMIN)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("node.log")).unwrap())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("listening on "), "the node printed {first:?}");
    (Killed(child), addr)
}

#[test]
fn a_cluster_is_checked_through_its_tls_and_token_files() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    coordinator::tls::create_dev_ca(&dir.path().join("tls"), &[]).unwrap();
    let (_node, addr) = coordinator(dir.path());
    let token = dir.path().join("admin-token");
    std::fs::write(&token, ADMIN).unwrap();
    let tls = dir.path().join("tls").display().to_string();
    let token = token.display().to_string();

    let out = doctor(&["--coordinator", &addr, "--tls-dir", &tls, "--token-file", &token], &[], home);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(line(&report, "tls").starts_with("ok") && line(&report, "token").starts_with("ok"), "{report}");
    assert!(line(&report, "coordinators").contains("leader 1 at"), "{report}");

    // A wrong token is refused by the coordinator.
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "not-the-admin-token-0123456789").unwrap();
    let wrong = wrong.display().to_string();
    let out = doctor(&["--coordinator", &addr, "--tls-dir", &tls, "--token-file", &wrong], &[], home);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        line(&report, "coordinators")
            .ends_with("fix: pass the admin token: --token-file FILE (or PODCTL_TOKEN)"),
        "{report}"
    );

    // Files that are not there, and no coordinator where one is named.
    let missing = dir.path().join("missing").display().to_string();
    let out = doctor(&["--coordinator", &addr, "--ca", &missing, "--token-file", &missing], &[], home);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        line(&report, "tls").starts_with("FAIL") && line(&report, "token").starts_with("FAIL"),
        "{report}"
    );
    assert!(!report.contains("coordinators"), "nothing is dialled without the files:\n{report}");
    let nobody = format!("127.0.0.1:{}", free_port());
    let out = doctor(&["--coordinator", &nobody, "--tls-dir", &tls, "--token-file", &token], &[], home);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    let reached = line(&report, "coordinators");
    assert!(reached.starts_with("FAIL") && reached.contains("fix: check the addresses"), "{reached}");
}
