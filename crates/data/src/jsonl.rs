//! JSONL example files, one object per line; example `i` is line `i + 1`. What a line holds is
//! the data's [`RowFormat`]: `{"prompt", "answer"}` (`kind: jsonl`), GSM8K's
//! `{"question", "answer": "... #### 72"}` (`kind: gsm8k`, the question becoming the prompt, every
//! answer ending in a `####` final answer that is a number: what the reward scores against), or
//! `{"messages": [...]}` (`kind: chat`). Other fields stay with the example, for rewards.
//!
//! The file is read whole (a line index needs every byte; a remote file comes through the
//! worker's cache) and every line is checked once when it is opened, so a bad line stops a job
//! before its first step rather than at step 40,000; what is kept besides the bytes is only the
//! offset of each line, so random access is O(1) and the index costs 8 bytes per example.

use crate::files::DataFile;
use crate::rows::RowFormat;
use crate::source::{Example, ExampleSource, Prefetched};
use crate::{DataError, Result};
use bytes::Bytes;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

/// A JSONL example file. See the module docs.
pub struct JsonlSource {
    path: PathBuf,
    format: RowFormat,
    bytes: Bytes,
    /// Byte offset where each line starts, plus one past the end of the last line's newline, so
    /// line `i` is `line_starts[i]..line_starts[i + 1]`.
    line_starts: Vec<u64>,
}

impl std::fmt::Debug for JsonlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonlSource").field("path", &self.path).field("examples", &self.len()).finish()
    }
}

impl JsonlSource {
    /// Reads `file`, indexes its lines and checks every one of them.
    pub fn open(file: &Arc<dyn DataFile>, format: RowFormat) -> Result<Self> {
        let path = PathBuf::from(file.name());
        if file.is_empty() {
            return Err(DataError::EmptyFile {
                path,
                what: format!("expected one {} object per line", format.example_row()),
            });
        }
        let bytes = file.read(0..file.len())?;
        let mut line_starts = vec![0];
        line_starts.extend(
            bytes.iter().enumerate().filter(|&(_, &byte)| byte == b'\n').map(|(offset, _)| offset as u64 + 1),
        );
        // A final line without a newline still counts; a final newline does not start a line.
        if *line_starts.last().unwrap_or(&0) != bytes.len() as u64 {
            line_starts.push(bytes.len() as u64);
        }
        let source = Self { path, format, bytes, line_starts };
        for index in 0..source.len() {
            source.example(index)?;
        }
        Ok(source)
    }

    /// Number of examples (lines).
    pub fn len(&self) -> u64 {
        self.line_starts.len() as u64 - 1
    }

    /// Whether the file has no examples (never true for an opened file).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn line_error(&self, index: u64, message: String) -> DataError {
        DataError::JsonlLine { path: self.path.clone(), line: index + 1, message }
    }
}

impl ExampleSource for JsonlSource {
    fn num_examples(&self) -> Option<u64> {
        Some(self.len())
    }

    fn example(&self, index: u64) -> Result<Example> {
        if index >= self.len() {
            return Err(DataError::ExampleOutOfRange {
                source_name: self.path.display().to_string(),
                index,
                len: self.len(),
            });
        }
        let (start, end) =
            (self.line_starts[index as usize] as usize, self.line_starts[index as usize + 1] as usize);
        let line = self.bytes[start..end].strip_suffix(b"\n").unwrap_or(&self.bytes[start..end]);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        parse_line(&self.format, line).map_err(|message| self.line_error(index, message))
    }

    fn locate(&self, index: u64) -> String {
        format!("{}:{}", self.path.display(), index + 1)
    }

    fn prefetch(&self, indices: &[u64]) -> Result<Prefetched> {
        let total = self.bytes.len() as u64;
        Ok(Prefetched {
            examples: indices.len() as u64,
            parts: 1,
            parts_total: 1,
            bytes: total,
            bytes_total: total,
        })
    }
}

/// The example on one line (without its line break); the error names the field at fault.
pub fn parse_line(format: &RowFormat, line: &[u8]) -> std::result::Result<Example, String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err("blank line; remove it (every line must be one example)".into());
    }
    let value: Box<serde_json::value::RawValue> = serde_json::from_slice(line)
        .map_err(|error| format!("not valid JSON ({error}); write one object per line"))?;
    let Ok(row) = serde_json::from_str::<crate::rows::Row>(value.get()) else {
        let value: Value = serde_json::from_str(value.get()).unwrap_or(Value::Null);
        return Err(format!("expected an object, found {}", kind_of(&value)));
    };
    format.example(row)
}

/// How a JSON value is named in messages (`a number`, `null`, ...).
pub(crate) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{DataFiles, LocalFile, LocalFiles};
    use crate::source::Prompt;
    use std::io::Write;

    fn file_with(contents: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(contents.as_bytes()).expect("write");
        file
    }

    fn open(path: &std::path::Path, format: RowFormat) -> Result<JsonlSource> {
        let file: Arc<dyn DataFile> = Arc::new(LocalFile::open(path)?);
        JsonlSource::open(&file, format)
    }

    #[test]
    fn reads_examples_by_line_in_any_order() {
        let file = file_with(
            "{\"prompt\": \"1+1?\\n\", \"answer\": \"#### 2\", \"id\": 7}\n\
             {\"answer\": \"#### 4\", \"prompt\": \"2+2?\\n\"}\r\n\
             {\"prompt\": \"caf\u{e9}\", \"answer\": \"\"}",
        );
        let source = open(file.path(), RowFormat::prompt_answer()).expect("valid");
        assert_eq!(source.num_examples(), Some(3));
        let third = source.example(2).expect("third");
        assert_eq!((third.prompt.display(), third.answer.as_str()), ("caf\u{e9}".to_string(), ""));
        // The other fields stay, the answer among them (TRL hands reward functions every column but
        // the prompt).
        assert_eq!(third.columns.keys().collect::<Vec<_>>(), ["answer"]);
        assert_eq!(source.example(0).expect("first").columns["id"], 7);
        assert_eq!(source.example(1).expect("second").answer, "#### 4");
        assert_eq!(source.example(0).expect("first").prompt, Prompt::Text("1+1?\n".into()));
        let error = source.example(3).expect_err("past the end");
        assert!(matches!(error, DataError::ExampleOutOfRange { index: 3, len: 3, .. }), "{error:?}");
    }

    #[test]
    fn a_final_newline_does_not_add_an_example() {
        let file = file_with("{\"prompt\": \"a\", \"answer\": \"b\"}\n");
        assert_eq!(open(file.path(), RowFormat::prompt_answer()).expect("valid").len(), 1);
    }

    fn open_error(contents: &str) -> String {
        let file = file_with(contents);
        let error = open(file.path(), RowFormat::prompt_answer()).expect_err("invalid");
        let message = error.to_string();
        assert!(message.starts_with(&format!("{}:", file.path().display())), "names the file: {message}");
        message
    }

    #[test]
    fn bad_lines_are_errors_naming_file_line_and_field() {
        let good = "{\"prompt\": \"p\", \"answer\": \"a\"}\n";
        let message = open_error(&format!("{good}{good}{{\"prompt\": \"p\"}}\n"));
        assert!(message.contains(":3: missing field `answer`"), "{message}");
        let message = open_error(&format!("{good}{{\"prompt\": 5, \"answer\": \"a\"}}\n"));
        assert!(message.contains(":2: field `prompt` must be a string, found a number"), "{message}");
        let message = open_error(&format!("{good}{{\"prompt\": \"p\", \"answer\": null}}\n"));
        assert!(message.contains(":2: field `answer` must be a string, found null"), "{message}");
        let message = open_error(&format!("{good}{good}{good}{{\"prompt\": \"p\", \n"));
        assert!(message.contains(":4: not valid JSON"), "{message}");
        let message = open_error(&format!("{good}[1, 2]\n"));
        assert!(message.contains(":2: expected an object, found an array"), "{message}");
        let message = open_error(&format!("{good}\n{good}"));
        assert!(message.contains(":2: blank line"), "{message}");
    }

    #[test]
    fn gsm8k_lines_take_the_question_and_need_a_numeric_final_answer() {
        let good = r#"{"question": "Natalia sold 48/2 = 24 clips... how many?", "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"}"#;
        let file = file_with(&format!("{good}\n"));
        let source = open(file.path(), RowFormat::gsm8k()).expect("valid");
        let example = source.example(0).expect("example");
        assert!(
            example.prompt.display().starts_with("Natalia sold") && example.answer.ends_with("#### 72"),
            "{example:?}"
        );

        let gsm8k_error = |contents: String| {
            let file = file_with(&contents);
            let message = open(file.path(), RowFormat::gsm8k()).expect_err("invalid").to_string();
            assert!(message.starts_with(&format!("{}:", file.path().display())), "names the file: {message}");
            message
        };
        let message = gsm8k_error(format!("{good}\n{{\"prompt\": \"q\", \"answer\": \"#### 1\"}}\n"));
        assert!(message.contains(":2: missing field `question` (the row has answer, prompt)"), "{message}");
        let message = gsm8k_error(format!("{good}\n{good}\n{{\"question\": \"q\"}}\n"));
        assert!(message.contains(":3: missing field `answer`"), "{message}");
        let message = gsm8k_error("{\"question\": \"q\", \"answer\": \"so the answer is 72\"}\n".to_string());
        assert!(message.contains(":1: field `answer` has no `#### <number>` final answer"), "{message}");
        assert!(message.contains("72"), "shows the end of the answer: {message}");
        let message = gsm8k_error(format!("{good}\n{{\"question\": \"q\", \"answer\": \"#### seventy\"}}"));
        assert!(
            message.contains(":2: field `answer`'s final answer \"seventy\" is not a number"),
            "{message}"
        );
        // The plain format does not ask for a marker.
        let file = file_with("{\"prompt\": \"q\", \"answer\": \"seventy\"}");
        open(file.path(), RowFormat::prompt_answer()).expect("no marker needed");
    }

    #[test]
    fn empty_and_missing_files_are_errors() {
        let file = file_with("");
        let error = open(file.path(), RowFormat::prompt_answer()).expect_err("empty");
        assert!(matches!(error, DataError::EmptyFile { .. }), "{error:?}");
        let error = LocalFiles.open("/nonexistent/train.jsonl").expect("no error");
        assert!(error.is_none());
        let error = open(std::path::Path::new("/nonexistent/train.jsonl"), RowFormat::prompt_answer())
            .expect_err("missing");
        assert!(error.to_string().contains("/nonexistent/train.jsonl"), "{error}");
    }
}
