//! JSONL example files, one object per line; example `i` is line `i + 1`. Two formats:
//!
//! - [`JsonlFormat::PromptAnswer`] (`kind: jsonl`): `{"prompt": ..., "answer": ...}`;
//! - [`JsonlFormat::Gsm8k`] (`kind: gsm8k`): GSM8K's `{"question": ..., "answer": "... #### 72"}`,
//!   the question becoming the prompt; every answer must end in a `####` final answer that is a
//!   number (what the reward scores against).
//!
//! The file is memory-mapped and every line is checked once when it is opened, so a bad line
//! stops a job before its first step rather than at step 40,000; what is kept is only the
//! offset of each line, so random access is O(1) and the index costs 8 bytes per example.
//! Other fields on a line (ids, metadata) are ignored.

use crate::mapped::map_readonly;
use crate::source::{Example, ExampleSource};
use crate::{DataError, Result};
use memmap2::Mmap;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The fields of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JsonlFormat {
    /// `{"prompt": string, "answer": string}`.
    PromptAnswer,
    /// `{"question": string, "answer": "... #### <number>"}` (GSM8K).
    Gsm8k,
}

impl JsonlFormat {
    /// The field that holds the prompt.
    fn prompt_field(self) -> &'static str {
        match self {
            JsonlFormat::PromptAnswer => "prompt",
            JsonlFormat::Gsm8k => "question",
        }
    }

    /// What a line looks like, for messages.
    fn example_line(self) -> &'static str {
        match self {
            JsonlFormat::PromptAnswer => "{\"prompt\": ..., \"answer\": ...}",
            JsonlFormat::Gsm8k => "{\"question\": ..., \"answer\": \"... #### 72\"}",
        }
    }
}

/// A JSONL example file. See the module docs.
pub struct JsonlSource {
    path: PathBuf,
    format: JsonlFormat,
    map: Mmap,
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
    /// Opens `path`, indexes its lines and checks every one of them.
    pub fn open(path: &Path, format: JsonlFormat) -> Result<Self> {
        let map = map_readonly(path)?.ok_or_else(|| DataError::EmptyFile {
            path: path.to_path_buf(),
            what: format!("expected one {} object per line", format.example_line()),
        })?;
        let mut line_starts = vec![0];
        line_starts.extend(
            map.iter().enumerate().filter(|&(_, &byte)| byte == b'\n').map(|(offset, _)| offset as u64 + 1),
        );
        // A final line without a newline still counts; a final newline does not start a line.
        if *line_starts.last().unwrap_or(&0) != map.len() as u64 {
            line_starts.push(map.len() as u64);
        }
        let source = Self { path: path.to_path_buf(), format, map, line_starts };
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

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
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
        let line = self.map[start..end].strip_suffix(b"\n").unwrap_or(&self.map[start..end]);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        self.format.parse_line(line).map_err(|message| self.line_error(index, message))
    }
}

impl JsonlFormat {
    /// The example on one line (without its line break); the error names the field at fault.
    pub fn parse_line(self, line: &[u8]) -> std::result::Result<Example, String> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Err("blank line; remove it (every line must be one example)".into());
        }
        let value: Value = serde_json::from_slice(line)
            .map_err(|error| format!("not valid JSON ({error}); write one object per line"))?;
        let Value::Object(mut object) = value else {
            return Err(format!("expected an object, found {}", kind_of(&value)));
        };
        let prompt_field = self.prompt_field();
        let mut field = |name: &str| match object.remove(name) {
            Some(Value::String(text)) => Ok(text),
            Some(other) => Err(format!("field `{name}` must be a string, found {}", kind_of(&other))),
            None => Err(format!("missing field `{name}`; every line needs `{prompt_field}` and `answer`")),
        };
        let example = Example { prompt: field(prompt_field)?, answer: field("answer")? };
        if self == JsonlFormat::Gsm8k {
            check_final_answer(&example.answer)?;
        }
        Ok(example)
    }
}

/// A GSM8K answer must end in `#### <number>`: the reward compares against that number.
fn check_final_answer(answer: &str) -> std::result::Result<(), String> {
    let shown = || {
        let tail: String = answer.chars().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        if tail.len() < answer.len() { format!("...{tail:?}") } else { format!("{tail:?}") }
    };
    match crate::reward::extract_final_answer(answer) {
        None => Err(format!(
            "field `answer` has no `#### <number>` final answer (it ends {}); GSM8K answers end in a line \
             like `#### 72`",
            shown()
        )),
        Some(final_answer) if crate::reward::leading_number(&final_answer).is_none() => Err(format!(
            "field `answer`'s final answer {final_answer:?} is not a number; GSM8K answers end in a line like `#### 72`"
        )),
        Some(_) => Ok(()),
    }
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
    use std::io::Write;

    fn file_with(contents: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(contents.as_bytes()).expect("write");
        file
    }

    #[test]
    fn reads_examples_by_line_in_any_order() {
        let file = file_with(
            "{\"prompt\": \"1+1?\\n\", \"answer\": \"#### 2\", \"id\": 7}\n\
             {\"answer\": \"#### 4\", \"prompt\": \"2+2?\\n\"}\r\n\
             {\"prompt\": \"caf\u{e9}\", \"answer\": \"\"}",
        );
        let source = JsonlSource::open(file.path(), JsonlFormat::PromptAnswer).expect("valid");
        assert_eq!(source.num_examples(), Some(3));
        let third = source.example(2).expect("third");
        assert_eq!(third, Example { prompt: "caf\u{e9}".into(), answer: String::new() });
        assert_eq!(source.example(1).expect("second").answer, "#### 4");
        assert_eq!(source.example(0).expect("first").prompt, "1+1?\n");
        let error = source.example(3).expect_err("past the end");
        assert!(matches!(error, DataError::ExampleOutOfRange { index: 3, len: 3, .. }), "{error:?}");
    }

    #[test]
    fn a_final_newline_does_not_add_an_example() {
        let file = file_with("{\"prompt\": \"a\", \"answer\": \"b\"}\n");
        assert_eq!(JsonlSource::open(file.path(), JsonlFormat::PromptAnswer).expect("valid").len(), 1);
    }

    fn open_error(contents: &str) -> String {
        let file = file_with(contents);
        let error = JsonlSource::open(file.path(), JsonlFormat::PromptAnswer).expect_err("invalid");
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
        let source = JsonlSource::open(file.path(), JsonlFormat::Gsm8k).expect("valid");
        let example = source.example(0).expect("example");
        assert!(
            example.prompt.starts_with("Natalia sold") && example.answer.ends_with("#### 72"),
            "{example:?}"
        );

        let gsm8k_error = |contents: String| {
            let file = file_with(&contents);
            let message =
                JsonlSource::open(file.path(), JsonlFormat::Gsm8k).expect_err("invalid").to_string();
            assert!(message.starts_with(&format!("{}:", file.path().display())), "names the file: {message}");
            message
        };
        let message = gsm8k_error(format!("{good}\n{{\"prompt\": \"q\", \"answer\": \"#### 1\"}}\n"));
        assert!(
            message.contains(":2: missing field `question`; every line needs `question` and `answer`"),
            "{message}"
        );
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
        JsonlSource::open(file.path(), JsonlFormat::PromptAnswer).expect("no marker needed");
    }

    #[test]
    fn empty_and_missing_files_are_errors() {
        let file = file_with("");
        let error = JsonlSource::open(file.path(), JsonlFormat::PromptAnswer).expect_err("empty");
        assert!(matches!(error, DataError::EmptyFile { .. }), "{error:?}");
        let error = JsonlSource::open(Path::new("/nonexistent/train.jsonl"), JsonlFormat::PromptAnswer)
            .expect_err("missing");
        assert!(error.to_string().contains("/nonexistent/train.jsonl"), "{error}");
    }
}
