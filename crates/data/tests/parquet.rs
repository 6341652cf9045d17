//! Parquet written by Hugging Face `datasets` (`datasets_parquet.py`, run here through the
//! project's Python) reads to exactly the examples the JSONL form of the same rows gives: GSM8K's
//! format, one file and a directory of shards, conversations, renamed columns; a missing column
//! and a bad row are errors that name the file, the row and the column.

use podctl_data::files::{DataFiles, LocalFile, LocalFiles};
use podctl_data::rows::RowFormat;
use podctl_data::{DataConfig, ExampleSource, ParquetSource, Prompt, open_examples};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    let python = std::env::var_os("PODCTL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    python
}

/// Runs the `datasets` script into a new directory; returns it and what the script reports.
fn written() -> (tempfile::TempDir, Value) {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/datasets_parquet.py");
    let out = Command::new(python()).arg(script).arg(dir.path()).output().expect("python runs");
    assert!(
        out.status.success(),
        "datasets_parquet.py failed (is `datasets` in .venv? run scripts/setup.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_slice(&out.stdout).expect("a JSON report");
    (dir, report)
}

fn config(kind: &str, path: &Path, extra: Value) -> DataConfig {
    let mut spec = json!({"kind": kind, "path": path, "tokenizer": {"kind": "char"}});
    if kind == "chat" {
        spec["tokenizer"] = json!({"kind": "hf", "path": "unused"});
    }
    for (key, value) in extra.as_object().expect("an object") {
        spec[key] = value.clone();
    }
    serde_json::from_value(spec).expect("a data config")
}

fn all(source: &dyn ExampleSource) -> Vec<podctl_data::Example> {
    let len = source.num_examples().expect("finite");
    (0..len).map(|i| source.example(i).expect("example")).collect()
}

#[test]
fn datasets_parquet_reads_to_the_rows_of_its_jsonl() {
    let (dir, report) = written();
    println!("written by {report}");
    let files: &dyn DataFiles = &LocalFiles;
    let open = |kind: &str, name: &str, extra: Value| {
        let path = dir.path().join(name);
        let config = config(kind, &path, extra);
        open_examples(&config, &path.display().to_string(), files)
            .unwrap_or_else(|error| panic!("{name}: {error}"))
    };

    // GSM8K: one file, two shards, and the JSONL form: the same 144 examples, columns and all.
    let jsonl = all(&*open("gsm8k", "gsm8k.jsonl", json!({})));
    assert_eq!(jsonl.len(), 144);
    assert_eq!(all(&*open("gsm8k", "gsm8k.parquet", json!({}))), jsonl);
    assert_eq!(all(&*open("gsm8k", "gsm8k_shards", json!({}))), jsonl);
    assert_eq!(all(&*open("gsm8k", "zstd.parquet", json!({}))), jsonl, "zstd reads too");
    assert_eq!(jsonl[3].columns["id"], 3);
    let fixture = std::fs::read_to_string(root().join("tests/fixtures/gsm8k/train.jsonl")).expect("fixture");
    let first: Value = serde_json::from_str(fixture.lines().next().expect("a line")).expect("json");
    assert_eq!(jsonl[0].prompt, Prompt::Text(first["question"].as_str().expect("text").into()));
    assert_eq!(jsonl[0].answer, first["answer"].as_str().expect("text"));

    // Columns named otherwise, through data.columns.
    let renamed =
        open("gsm8k", "renamed.parquet", json!({"columns": {"prompt": "problem", "answer": "solution"}}));
    let renamed = all(&*renamed);
    assert_eq!(
        renamed.iter().map(|e| (&e.prompt, &e.answer)).collect::<Vec<_>>(),
        jsonl.iter().map(|e| (&e.prompt, &e.answer)).collect::<Vec<_>>()
    );

    // Conversations: the same turns, prompts through the last user turn, references from the
    // last assistant turn.
    let chat_jsonl = all(&*open("chat", "chat.jsonl", json!({})));
    let chat = all(&*open("chat", "chat.parquet", json!({})));
    assert_eq!(chat.len(), 40);
    assert_eq!(chat, chat_jsonl);
    let Prompt::Chat(conversation) = &chat[0].prompt else { panic!("a conversation") };
    assert_eq!((conversation.messages.len(), conversation.prompt().len()), (5, 4));
    assert_eq!(chat[0].answer, "17 - 5 = 12\n#### 12");
    assert_eq!(chat[1].answer, "18 + 8 = 26\n#### 26");
    assert_eq!(chat[1].columns["source"], "synthetic-1");
}

#[test]
fn a_host_reads_only_the_row_groups_of_its_rows() {
    let (dir, report) = written();
    let path = dir.path().join("gsm8k.parquet");
    let config = config("gsm8k", &path, json!({}));
    let source = open_examples(&config, &path.display().to_string(), &LocalFiles).expect("opens");
    let groups = report["row_groups"]["gsm8k.parquet"].as_u64().expect("a count");
    assert_eq!(groups, 9, "144 rows in groups of 16");
    // Rows 0, 5 and 40 lie in groups 0 and 2.
    let read = source.prefetch(&[0, 5, 40]).expect("prefetch");
    assert_eq!((read.examples, read.parts, read.parts_total), (3, 2, 9));
    assert!(read.bytes > 0 && read.bytes < read.bytes_total / 3, "{read:?}");
}

#[test]
fn missing_columns_and_bad_rows_name_the_file_the_row_and_the_column() {
    let (dir, _) = written();
    let path = dir.path().join("no_answer.parquet");
    let error = open_examples(&config("gsm8k", &path, json!({})), &path.display().to_string(), &LocalFiles)
        .err()
        .expect("no answer column")
        .to_string();
    assert!(
        error.contains("no_answer.parquet")
            && error.contains("has no column `answer`")
            && error.contains("question"),
        "{error}"
    );
    // GSM8K rows read as prompt/answer rows whose prompt column is missing.
    let path = dir.path().join("gsm8k.parquet");
    let error = open_examples(&config("jsonl", &path, json!({})), &path.display().to_string(), &LocalFiles)
        .err()
        .expect("no prompt column")
        .to_string();
    assert!(error.contains("has no column `prompt`") && error.contains("data.columns"), "{error}");
    // A conversation column that is text.
    let error = open_examples(
        &config("chat", &path, json!({"columns": {"messages": "question"}})),
        &path.display().to_string(),
        &LocalFiles,
    )
    .err()
    .expect("text is not a conversation")
    .to_string();
    assert!(error.contains("column `question` must be a list of {role, content} records"), "{error}");
    // A row whose answer has no final answer, found when its row is read: file, row, field.
    let path = dir.path().join("renamed.parquet");
    let source = open_examples(
        &config("gsm8k", &path, json!({"columns": {"prompt": "problem", "answer": "problem"}})),
        &path.display().to_string(),
        &LocalFiles,
    )
    .expect("the schema has the columns");
    let error = source.example(7).expect_err("a question is no answer").to_string();
    assert!(
        error.contains("renamed.parquet row 7") && error.contains("field `problem` has no `#### <number>`"),
        "{error}"
    );
    // Not Parquet at all.
    let path = dir.path().join("gsm8k.jsonl");
    let error = open_examples(
        &config("gsm8k", &path, json!({"format": "parquet"})),
        &path.display().to_string(),
        &LocalFiles,
    )
    .err()
    .expect("JSONL is not Parquet")
    .to_string();
    assert!(error.contains("gsm8k.jsonl") && error.contains("not a Parquet file"), "{error}");
}

#[test]
fn a_role_the_chat_template_does_not_know_names_the_file_the_row_and_the_turn() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("chat.jsonl");
    let turn = |role: &str, content: &str| json!({"role": role, "content": content});
    let rows = [
        json!({"messages": [turn("user", "What is 2 + 2?"), turn("assistant", "#### 4")]}),
        json!({"messages": [turn("user", "What is 3 + 3?"), turn("bot", "#### 6")]}),
    ];
    std::fs::write(&path, rows.iter().map(|row| format!("{row}\n")).collect::<String>()).expect("write");
    let model = root().join("tests/fixtures/hf-gsm8k/model");
    let config: DataConfig = serde_json::from_value(json!({
        "kind": "chat", "path": path, "tokenizer": {"kind": "hf", "path": model},
        "chat": {"template": root().join("examples/chat_templates/qwen3_sft.jinja")},
    }))
    .expect("a data config");
    let loader = podctl_data::Loader::from_config(
        &config,
        podctl_data::BatchSpec::new(1, 1, 128).expect("valid"),
        0,
        &LocalFiles,
    )
    .expect("opens");
    // The row with the unknown role, wherever the seeded order puts it.
    let errors: Vec<String> =
        (0..2).filter_map(|step| loader.micro_batch(step, 0).err()).map(|error| error.to_string()).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = &errors[0];
    assert!(
        error.contains("chat.jsonl:2:")
            && error.contains("messages[1].role")
            && error.contains("\"bot\" is a role the chat template"),
        "{error}"
    );
}

/// A fixture of crates/data/tests/fixtures/damaged/ (an input the fuzzer found), opened as chat rows.
fn open_damaged(name: &str) -> podctl_data::Result<ParquetSource> {
    let path = root().join("crates/data/tests/fixtures/damaged").join(name);
    let bytes = std::fs::read(&path).expect("the damaged fixture");
    ParquetSource::open(vec![Arc::new(LocalFile::from_bytes(name, bytes))], RowFormat::chat())
}

/// Found by the fuzzer: a footer whose column chunk starts at a negative offset. The `parquet`
/// crate panics on such a chunk when it is read; the file must be refused when opened, by name.
#[test]
fn a_footer_with_a_chunk_outside_the_file_is_refused_when_opened() {
    let message = open_damaged("negative-chunk-offset.parquet").expect_err("a damaged file").to_string();
    assert!(message.contains("negative-chunk-offset.parquet"), "{message}");
    assert!(message.contains("is damaged: row group 4, column 0"), "{message}");
    assert!(message.contains("outside the file's 4991 bytes"), "{message}");
}

/// Found by the fuzzer: a page the `parquet` crate's decoder asserts on ("Decoder for dict should
/// have been set"). Reading the row is an error naming the file and the row group, not a panic.
#[test]
fn a_page_the_decoder_panics_on_is_an_error_naming_the_file() {
    let source = open_damaged("dictionary-page-missing.parquet").expect("its footer is sound");
    let errors: Vec<String> =
        (0..source.len()).filter_map(|row| source.example(row).err()).map(|e| e.to_string()).collect();
    assert!(!errors.is_empty(), "every row decoded");
    // Its damaged page now fails the dictionary check's read (snappy) before the decoder sees it.
    assert!(errors.iter().any(|e| e.contains("row group 0")), "{errors:?}");
    assert!(errors.iter().all(|e| e.contains("dictionary-page-missing.parquet")), "{errors:?}");
}

/// Found by the fuzzer: a dictionary page claiming some 2.7 billion strings in a few hundred
/// bytes. The `parquet` crate allocates for the claim before reading (65 GB: the allocation fails
/// and ends the process); the claim is checked against the page first and refused by name.
#[test]
fn a_dictionary_page_claiming_more_values_than_its_bytes_hold_is_refused() {
    let source = open_damaged("dictionary-claims-billions.parquet").expect("its footer is sound");
    let errors: Vec<String> =
        (0..source.len()).filter_map(|row| source.example(row).err()).map(|e| e.to_string()).collect();
    assert!(
        errors.iter().any(|e| e.contains("has a dictionary page that claims") && e.contains("values in")),
        "{errors:?}"
    );
    assert!(errors.iter().all(|e| e.contains("dictionary-claims-billions.parquet")), "{errors:?}");
}

/// Found by the fuzzer: a footer whose first row group claims 155 billion rows in 758 bytes.
/// Decoding allocated room for the claim (3.7 TB: the process ended); the claim is refused when
/// the file is opened, by name, and so is a row group too large to decode whole.
#[test]
fn a_row_group_claiming_more_rows_than_podctl_decodes_at_once_is_refused_when_opened() {
    let message = open_damaged("rows-claimed-in-the-billions.parquet").expect_err("refused").to_string();
    assert!(message.contains("rows-claimed-in-the-billions.parquet"), "{message}");
    assert!(message.contains("row group 0 holds 155266774649 rows, more than the 16777216"), "{message}");
    assert!(message.contains("row_group_size="), "{message}");
}
