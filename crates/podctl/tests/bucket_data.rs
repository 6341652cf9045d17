//! A GRPO job whose train and test files are in an S3 bucket (moto's server on loopback, from the
//! project's venv), through the real `podctl` binary on two slices: each worker reads only its
//! share of the train file, in ranged reads; a restart reads nothing from the bucket again (the
//! local cache has every block it needs).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

mod common;
use common::{podctl, root};
use test_support::Moto;

/// Writes GSM8K's fixture as Parquet with `datasets` (row groups of 8 rows, as the hub's files
/// have many) and uploads it and the test split with boto3.
const UPLOAD: &str = r#"
import os, sys, boto3, datasets
root, endpoint, out = sys.argv[1:4]
datasets.disable_progress_bars()
train = datasets.load_dataset("json", data_files=os.path.join(root, "tests/fixtures/gsm8k/train.jsonl"))["train"]
train.to_parquet(os.path.join(out, "train.parquet"), batch_size=8)
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="testing", aws_secret_access_key="testing")
s3.create_bucket(Bucket="data")
s3.upload_file(os.path.join(out, "train.parquet"), "data", "gsm8k/train.parquet")
s3.upload_file(os.path.join(root, "tests/fixtures/gsm8k/test.jsonl"), "data", "gsm8k/test.jsonl")
"#;

/// The last `data <uri>: ...` line of each file in a worker's log: (fetched, size, cached).
fn reads(log: &str) -> BTreeMap<String, (u64, u64, u64)> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.split_once(" data s3://").map(|(_, rest)| rest) else { continue };
        let (uri, rest) = rest.split_once(": ").unwrap();
        let numbers: Vec<u64> = rest.split_whitespace().filter_map(|word| word.parse().ok()).collect();
        let [fetched, size, _requests, cached] = numbers[..] else { panic!("{line}") };
        out.insert(format!("s3://{uri}"), (fetched, size, cached));
    }
    out
}

/// Bytes of `uri`'s blocks in the data cache (the directory whose `source` names it).
fn cached_bytes(cache: &Path, uri: &str) -> u64 {
    let mut total = 0;
    for file_dir in std::fs::read_dir(cache).unwrap().map(|entry| entry.unwrap().path()) {
        if std::fs::read_to_string(file_dir.join("source")).is_ok_and(|source| source.trim() == uri) {
            for version in std::fs::read_dir(&file_dir).unwrap().map(|entry| entry.unwrap().path()) {
                if version.is_dir() {
                    total += std::fs::read_dir(&version)
                        .unwrap()
                        .map(|b| b.unwrap().metadata().unwrap().len())
                        .sum::<u64>();
                }
            }
        }
    }
    total
}

#[test]
fn a_grpo_job_reads_its_share_of_a_bucket_and_a_restart_reads_nothing_again() {
    let server = Moto::start();
    let endpoint = server.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(root().join(".venv/bin/python"))
        .args(["-c", UPLOAD])
        .arg(root())
        .arg(&endpoint)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "upload: {}", String::from_utf8_lossy(&out.stderr));

    let model = root().join("tests/fixtures/hf-gsm8k/model");
    let cache = dir.path().join("data-cache");
    let launch = |name: &str| -> (String, [String; 2]) {
        let run = dir.path().join(name);
        let spec = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &spec,
            format!(
                "name: {name}\nmodel: {{ hf: {model} }}\nmesh: {{ dcn: 2, ici: {{ fsdp: 1, tp: 1 }} }}\nseed: 3\n\
                 data: {{ kind: gsm8k, path: s3://data/gsm8k/train.parquet, test: s3://data/gsm8k/test.jsonl, \
                 tokenizer: {{ kind: hf, path: {model} }}, chat: {{ enable_thinking: false }} }}\n\
                 grpo: {{ prompt_len: 128, max_new_tokens: 16, generations: 4 }}\n\
                 batch: {{ global: 16, micro: 8 }}\nsteps: 2\ntrain: {{ loss_chunk: 16 }}\n\
                 optimizer: {{ lr: 1.0e-3, schedule: constant }}\neval: {{ problems: 4 }}\noutput: {}\n",
                run.display(),
                model = model.display(),
            ),
        )
        .unwrap();
        let out = podctl()
            .arg("launch")
            .arg(&spec)
            .env("AWS_ENDPOINT", &endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("PODCTL_DATA_CACHE", &cache)
            // Blocks of 2 KiB over a train file of tens of KiB: a share is visible.
            .env("PODCTL_DATA_BLOCK_BYTES", "2048")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{name}:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let log =
            |slice: u32| std::fs::read_to_string(run.join(format!("workers/slice-{slice}.log"))).unwrap();
        (stdout, [log(0), log(1)])
    };

    let (stdout, logs) = launch("bucket");
    assert!(stdout.contains("held-out accuracy (greedy"), "{stdout}");
    let train = "s3://data/gsm8k/train.parquet";
    let mut read_by = Vec::new();
    for (slice, log) in logs.iter().enumerate() {
        let reads = reads(log);
        println!("slice {slice}: {reads:?}");
        let (fetched, size, cached) = reads[train];
        // Its share: the footer and the row groups of its prompts (2 of 4 per step), not the file.
        assert!(
            fetched + cached > 0 && fetched + cached < size * 3 / 4,
            "slice {slice}: {fetched} + {cached} of {size}"
        );
        assert!(reads.contains_key("s3://data/gsm8k/test.jsonl"), "slice {slice} evaluates: {reads:?}");
        read_by.push(fetched + cached);
    }

    // The shares differ: the cache holds more of the file than either host read.
    let cached = cached_bytes(&cache, train);
    println!("the cache holds {cached} bytes of {train}; the slices read {read_by:?}");
    assert!(read_by.iter().all(|&share| share < cached), "{read_by:?} of {cached}");

    // The same job again: the workers start afresh, and every block they need is in the cache.
    let (_, logs) = launch("again");
    for (slice, log) in logs.iter().enumerate() {
        let reads = reads(log);
        println!("slice {slice} again: {reads:?}");
        assert_eq!(reads[train].2, read_by[slice], "slice {slice} reads the same share, from the cache");
        for (uri, (fetched, _, cached)) in &reads {
            assert_eq!(
                *fetched, 0,
                "slice {slice} read {uri} from the bucket again ({cached} from the cache)"
            );
        }
    }
}
