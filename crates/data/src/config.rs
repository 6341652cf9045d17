//! The data section of a job spec, e.g.
//!
//! ```yaml
//! data: { kind: arithmetic, digits: [2, 3], ops: [add, sub, mul] }
//! data: { kind: jsonl, path: train.jsonl, tokenizer: { kind: char } }
//! data:
//!   kind: gsm8k                                  # {"question": ..., "answer": "... #### 72"} lines
//!   path: gsm8k/train.jsonl
//!   test: gsm8k/test.jsonl                       # held-out problems, for `eval:`
//!   tokenizer: { kind: hf, path: Qwen3-1.7B }    # a model directory, or a tokenizer.json
//!   chat: { enable_thinking: false }             # prompts through the tokenizer's chat template
//! data: { kind: tokens, path: corpus.bin, dtype: u16 }
//! data:
//!   kind: gsm8k                                  # straight from the hub's Parquet files
//!   path: gs://my-bucket/gsm8k/main/train-00000-of-00001.parquet
//!   test: gs://my-bucket/gsm8k/main/test-00000-of-00001.parquet
//!   tokenizer: { kind: hf, path: gs://my-bucket/models/Qwen3-1.7B }
//!   chat: {}
//! data:
//!   kind: chat                                   # {"messages": [{"role": ..., "content": ...}, ...]}
//!   path: s3://my-bucket/sft/                    # a directory of Parquet shards
//!   columns: { messages: conversation }          # where the file's column names differ
//!   tokenizer: { kind: hf, path: Qwen3-1.7B }
//!   chat: { template: qwen3_training.jinja }     # marks the assistant's turns for the loss
//! ```
//!
//! Every file may be a local path, `file://`, `s3://` or `gs://` (the worker reads buckets through
//! the checkpoint crate's object-store clients). Example files are JSONL or Parquet: by `format`,
//! else by extension (`.parquet`, or a directory of `.parquet` shards, is Parquet).
//!
//! Unknown fields are refused (a typo must not silently fall back to a default), and
//! [`DataConfig::validate`] checks ranges with messages that name the field and the fix.

use crate::arithmetic::{Op, Split};
use crate::rows::RowFormat;
use crate::token_file::TokenDtype;
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Largest operand digit count: keeps every result, even times the largest multiplier, in u64.
pub const MAX_DIGITS: u32 = 15;
/// Largest multiplier of `mul` problems ("multiplication by a small number").
pub const MAX_MULTIPLIER: u32 = 99;

/// Where training examples come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DataConfig {
    /// Synthetic arithmetic word problems (endless).
    Arithmetic(ArithmeticConfig),
    /// Rows of `{"prompt": ..., "answer": ...}` (JSONL lines or Parquet rows).
    Jsonl(FileConfig),
    /// Rows in GSM8K's format: `{"question": ..., "answer": "... #### 72"}`.
    Gsm8k(FileConfig),
    /// Conversations: rows of `{"messages": [{"role": ..., "content": ...}, ...]}`, rendered by
    /// the tokenizer's chat template.
    Chat(FileConfig),
    /// A pre-tokenized `.bin` file, read as windows of `seq_len + 1` tokens.
    Tokens(TokenFileConfig),
}

/// Synthetic arithmetic: difficulty is the operand digit range, the operations and the
/// multiplier bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArithmeticConfig {
    /// `[min, max]` digits of each operand (each operand draws its digit count uniformly).
    pub digits: [u32; 2],
    /// Operations to draw from, uniformly.
    pub ops: Vec<Op>,
    /// `mul` problems multiply by `2..=max_multiplier`.
    pub max_multiplier: u32,
    /// Train problems, or the disjoint held-out ones for evaluation.
    pub split: Split,
    /// How text becomes tokens; the character tokenizer unless set.
    pub tokenizer: TokenizerConfig,
    /// Prompts through the tokenizer's chat template; plain text when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat: Option<ChatConfig>,
}

impl Default for ArithmeticConfig {
    fn default() -> Self {
        Self {
            digits: [2, 3],
            ops: vec![Op::Add, Op::Sub, Op::Mul],
            max_multiplier: 9,
            split: Split::Train,
            tokenizer: TokenizerConfig::Char {},
            chat: None,
        }
    }
}

impl ArithmeticConfig {
    /// Checks ranges; the error names the field and the fix.
    pub fn validate(&self) -> Result<()> {
        let [min, max] = self.digits;
        if min == 0 || max > MAX_DIGITS || min > max {
            return Err(invalid(
                "data.digits",
                format!(
                    "[{min}, {max}] is not a digit range; write [min, max] with 1 <= min <= max <= {MAX_DIGITS}"
                ),
            ));
        }
        if self.ops.is_empty() {
            return Err(invalid("data.ops", "is empty; list at least one of add, sub, mul".into()));
        }
        if let Some((i, op)) = self.ops.iter().enumerate().find(|(i, op)| self.ops[..*i].contains(op)) {
            return Err(invalid(
                "data.ops",
                format!(
                    "lists {op:?} twice (entry {i}); list each operation once (they are drawn uniformly)"
                ),
            ));
        }
        if !(2..=MAX_MULTIPLIER).contains(&self.max_multiplier) {
            return Err(invalid(
                "data.max_multiplier",
                format!("{} is out of range; use 2..={MAX_MULTIPLIER}", self.max_multiplier),
            ));
        }
        self.tokenizer.validate(self.chat.as_ref())
    }
}

/// A file of examples (`kind: jsonl`, `gsm8k` or `chat`, which differ in their rows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The training examples: a JSONL file, a Parquet file or a directory of Parquet shards (read
    /// in name order); a path, `file://`, `s3://` or `gs://`.
    pub path: String,
    /// Held-out problems in the same format (GSM8K's test split), for evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<String>,
    /// How the files are written; by extension when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<FileFormat>,
    /// The names of the columns (fields) the kind reads, where the file's differ.
    #[serde(default, skip_serializing_if = "ColumnNames::is_empty")]
    pub columns: ColumnNames,
    /// How text becomes tokens.
    pub tokenizer: TokenizerConfig,
    /// Prompts through the tokenizer's chat template; plain text when absent (conversations
    /// always go through it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<ChatConfig>,
}

/// How example files are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// One JSON object per line.
    Jsonl,
    /// Apache Parquet (what the Hugging Face hub serves and `datasets.Dataset.to_parquet` writes).
    Parquet,
}

impl FileFormat {
    /// The format of `path` when the spec names none: Parquet for `.parquet` files and for
    /// directories (of shards), JSONL otherwise.
    pub fn of(path: &str, is_dir: bool) -> Self {
        if is_dir || path.ends_with(".parquet") || path.ends_with('/') {
            FileFormat::Parquet
        } else {
            FileFormat::Jsonl
        }
    }
}

/// Column (field) names that differ from the kind's: `prompt` (GSM8K's `question`, else
/// `prompt`), `answer`, `messages`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnNames {
    /// The column of the prompt text (`kind: jsonl` and `gsm8k`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The column of the answer (the reference a conversation's prompt-only rows carry, too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The column of a conversation's turns (`kind: chat`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<String>,
}

impl ColumnNames {
    fn is_empty(&self) -> bool {
        self == &ColumnNames::default()
    }
}

/// Prompts rendered by the tokenizer's chat template: the example's prompt (GSM8K's question)
/// as a user turn after an optional system turn, then the generation prompt. transformers'
/// `apply_chat_template(messages, add_generation_prompt=True, enable_thinking=..., **kwargs)`
/// renders the same text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChatConfig {
    /// A chat template file (Jinja) to use instead of the tokenizer's: one whose
    /// `{% generation %}` blocks mark the assistant's output, for SFT on conversations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// A system turn before every prompt (text prompts only: conversations carry their own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Passed to the template as `enable_thinking`: Qwen3's template renders an empty
    /// `<think></think>` block when it is false (the default), so the model answers directly.
    pub enable_thinking: bool,
    /// The date (`YYYY-MM-DD`) a template's `strftime_now` shows; fixed, so prompts are the same
    /// on every host and every day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    /// Other keyword arguments the template reads (e.g. Llama 3's `date_string`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub kwargs: BTreeMap<String, serde_json::Value>,
}

impl ChatConfig {
    /// Checks the fields; the error names the field and the fix.
    pub fn validate(&self) -> Result<()> {
        if self.template.as_deref().is_some_and(str::is_empty) {
            return Err(invalid(
                "data.chat.template",
                "is empty; name a chat template file (.jinja) or drop the field".into(),
            ));
        }
        if self.system.as_deref().is_some_and(str::is_empty) {
            return Err(invalid(
                "data.chat.system",
                "is empty; write the system prompt or drop the field".into(),
            ));
        }
        self.date()?;
        for name in self.kwargs.keys() {
            if RESERVED_TEMPLATE_NAMES.contains(&name.as_str()) {
                return Err(invalid(
                    "data.chat.kwargs",
                    format!(
                        "sets `{name}`, which podctl passes itself; {}",
                        if name == "enable_thinking" { "use data.chat.enable_thinking" } else { "drop it" }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The parsed `date`.
    pub fn date(&self) -> Result<Option<chrono::NaiveDate>> {
        self.date
            .as_deref()
            .map(|date| {
                chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").map_err(|error| {
                    invalid(
                        "data.chat.date",
                        format!("{date:?} is not a date ({error}); write YYYY-MM-DD, e.g. 2026-01-31"),
                    )
                })
            })
            .transpose()
    }

    /// The keyword arguments the template is rendered with: `enable_thinking`, then `kwargs`.
    pub fn template_kwargs(&self) -> Vec<(String, serde_json::Value)> {
        std::iter::once(("enable_thinking".to_owned(), serde_json::Value::Bool(self.enable_thinking)))
            .chain(self.kwargs.iter().map(|(name, value)| (name.clone(), value.clone())))
            .collect()
    }
}

/// Names the template's context gets from podctl, not from `data.chat.kwargs`.
const RESERVED_TEMPLATE_NAMES: [&str; 5] =
    ["messages", "tools", "documents", "add_generation_prompt", "enable_thinking"];

/// A pre-tokenized file of little-endian token ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFileConfig {
    /// The `.bin` file: a path, `file://`, `s3://` or `gs://`.
    pub path: String,
    /// Width of each token id.
    pub dtype: TokenDtype,
}

/// Which tokenizer turns text into ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TokenizerConfig {
    /// [`crate::CharTokenizer`]: printable ASCII, vocabulary 128. A struct variant with no
    /// fields (not a unit variant) so that serde refuses stray fields such as a `path`.
    Char {},
    /// [`crate::HfTokenizer`]: a Hugging Face model directory or `tokenizer.json`.
    Hf(HfTokenizerConfig),
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        TokenizerConfig::Char {}
    }
}

impl TokenizerConfig {
    fn validate(&self, chat: Option<&ChatConfig>) -> Result<()> {
        if let Some(chat) = chat {
            chat.validate()?;
        }
        match self {
            TokenizerConfig::Char {} if chat.is_some() => Err(invalid(
                "data.chat",
                "the char tokenizer has no chat template; use tokenizer: { kind: hf, path: <model directory> } \
                 or drop data.chat"
                    .into(),
            )),
            TokenizerConfig::Char {} => Ok(()),
            TokenizerConfig::Hf(hf) => {
                if hf.path.is_empty() {
                    return Err(invalid(
                        "data.tokenizer.path",
                        "is empty; give a model directory (with tokenizer.json) or a tokenizer.json".into(),
                    ));
                }
                for (field, token) in [
                    ("data.tokenizer.pad", &hf.pad),
                    ("data.tokenizer.bos", &hf.bos),
                    ("data.tokenizer.eos", &hf.eos),
                ] {
                    if token.as_deref().is_some_and(str::is_empty) {
                        return Err(invalid(
                            field,
                            "is empty; give the token's text, e.g. \"<|endoftext|>\", or drop the field".into(),
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}

/// A Hugging Face tokenizer: a model directory (`tokenizer.json`, and `tokenizer_config.json`,
/// `generation_config.json`, `chat_template.jinja` when there) or a `tokenizer.json` (its
/// directory is searched for the others). The special tokens come from those files; the fields
/// below override them (a bare `tokenizer.json` needs `eos` at least).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfTokenizerConfig {
    /// The model directory or `tokenizer.json`: a path, `file://`, `s3://` or `gs://`.
    pub path: String,
    /// Padding token text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad: Option<String>,
    /// Beginning-of-sequence token text, put before plain (not chat-templated) prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos: Option<String>,
    /// End-of-sequence token text: what ends an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos: Option<String>,
}

impl DataConfig {
    /// Checks every field; the error names the field and the fix.
    pub fn validate(&self) -> Result<()> {
        let empty_path = |field| invalid(field, "is empty; give the data file's path or URI".into());
        match self {
            DataConfig::Arithmetic(config) => config.validate(),
            DataConfig::Jsonl(config) | DataConfig::Gsm8k(config) | DataConfig::Chat(config) => {
                if config.path.is_empty() {
                    return Err(empty_path("data.path"));
                }
                if config.test.as_ref().is_some_and(String::is_empty) {
                    return Err(empty_path("data.test"));
                }
                let columns = [
                    ("data.columns.prompt", &config.columns.prompt),
                    ("data.columns.answer", &config.columns.answer),
                    ("data.columns.messages", &config.columns.messages),
                ];
                for (field, name) in columns {
                    if name.as_deref().is_some_and(str::is_empty) {
                        return Err(invalid(
                            field,
                            "is empty; name the file's column or drop the field".into(),
                        ));
                    }
                }
                let chat = matches!(self, DataConfig::Chat(_));
                if chat && config.columns.prompt.is_some() {
                    return Err(invalid(
                        "data.columns.prompt",
                        "conversations have no prompt column (their prompt is the turns through the last user \
                         turn); name the turns' column in data.columns.messages"
                            .into(),
                    ));
                }
                if !chat && config.columns.messages.is_some() {
                    return Err(invalid(
                        "data.columns.messages",
                        format!(
                            "kind {} reads a prompt and an answer; use kind: chat for conversations",
                            self.kind()
                        ),
                    ));
                }
                if chat {
                    if let TokenizerConfig::Char {} = config.tokenizer {
                        return Err(invalid(
                            "data.tokenizer",
                            "conversations are rendered by a chat template, which the char tokenizer lacks; use \
                             tokenizer: { kind: hf, path: <model directory> }"
                                .into(),
                        ));
                    }
                    if config.chat.as_ref().is_some_and(|chat| chat.system.is_some()) {
                        return Err(invalid(
                            "data.chat.system",
                            "conversations carry their own system turns; drop data.chat.system".into(),
                        ));
                    }
                }
                config.tokenizer.validate(config.chat.as_ref())
            }
            DataConfig::Tokens(config) if config.path.is_empty() => Err(empty_path("data.path")),
            DataConfig::Tokens(_) => Ok(()),
        }
    }

    /// The kind's name in specs (`arithmetic`, `jsonl`, `gsm8k`, `chat`, `tokens`).
    pub fn kind(&self) -> &'static str {
        match self {
            DataConfig::Arithmetic(_) => "arithmetic",
            DataConfig::Jsonl(_) => "jsonl",
            DataConfig::Gsm8k(_) => "gsm8k",
            DataConfig::Chat(_) => "chat",
            DataConfig::Tokens(_) => "tokens",
        }
    }

    /// Whether examples have prompts and answers (everything but token files).
    pub fn has_examples(&self) -> bool {
        !matches!(self, DataConfig::Tokens(_))
    }

    /// Whether there are held-out problems to evaluate on: the arithmetic task's held-out split,
    /// or a file kind's `test` file.
    pub fn has_held_out(&self) -> bool {
        match self {
            DataConfig::Arithmetic(_) => true,
            DataConfig::Jsonl(config) | DataConfig::Gsm8k(config) | DataConfig::Chat(config) => {
                config.test.is_some()
            }
            DataConfig::Tokens(_) => false,
        }
    }

    /// The example files' settings, for the file kinds.
    pub fn files(&self) -> Option<&FileConfig> {
        match self {
            DataConfig::Jsonl(config) | DataConfig::Gsm8k(config) | DataConfig::Chat(config) => Some(config),
            DataConfig::Arithmetic(_) | DataConfig::Tokens(_) => None,
        }
    }

    /// The tokenizer, for kinds of examples.
    pub fn tokenizer(&self) -> Option<&TokenizerConfig> {
        match self {
            DataConfig::Arithmetic(config) => Some(&config.tokenizer),
            DataConfig::Jsonl(config) | DataConfig::Gsm8k(config) | DataConfig::Chat(config) => {
                Some(&config.tokenizer)
            }
            DataConfig::Tokens(_) => None,
        }
    }

    /// The chat settings, when prompts are chat-templated: conversations always are (with the
    /// defaults when the spec says nothing).
    pub fn chat(&self) -> Option<ChatConfig> {
        match self {
            DataConfig::Arithmetic(config) => config.chat.clone(),
            DataConfig::Jsonl(config) | DataConfig::Gsm8k(config) => config.chat.clone(),
            DataConfig::Chat(config) => Some(config.chat.clone().unwrap_or_default()),
            DataConfig::Tokens(_) => None,
        }
    }

    /// Every file the section names (training, test, tokens), for the worker to find.
    pub fn uris(&self) -> Vec<&str> {
        match self {
            DataConfig::Arithmetic(_) => Vec::new(),
            DataConfig::Jsonl(config) | DataConfig::Gsm8k(config) | DataConfig::Chat(config) => {
                std::iter::once(config.path.as_str()).chain(config.test.as_deref()).collect()
            }
            DataConfig::Tokens(config) => vec![config.path.as_str()],
        }
    }

    /// The row format of a file kind.
    pub(crate) fn row_format(&self) -> Option<RowFormat> {
        let config = self.files()?;
        let columns = &config.columns;
        let name =
            |given: &Option<String>, default: &str| given.clone().unwrap_or_else(|| default.to_owned());
        Some(match self {
            DataConfig::Jsonl(_) => RowFormat::PromptAnswer {
                prompt: name(&columns.prompt, "prompt"),
                answer: name(&columns.answer, "answer"),
                gsm8k: false,
            },
            DataConfig::Gsm8k(_) => RowFormat::PromptAnswer {
                prompt: name(&columns.prompt, "question"),
                answer: name(&columns.answer, "answer"),
                gsm8k: true,
            },
            DataConfig::Chat(_) => RowFormat::Chat {
                messages: name(&columns.messages, "messages"),
                answer: name(&columns.answer, "answer"),
            },
            DataConfig::Arithmetic(_) | DataConfig::Tokens(_) => return None,
        })
    }
}

fn invalid(field: &'static str, message: String) -> DataError {
    DataError::InvalidConfig { field, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> std::result::Result<DataConfig, String> {
        serde_saphyr::from_str(yaml).map_err(|error| error.to_string())
    }

    #[test]
    fn arithmetic_defaults_fill_missing_fields() {
        assert_eq!(
            parse("kind: arithmetic").expect("parses"),
            DataConfig::Arithmetic(ArithmeticConfig::default())
        );
        let config =
            parse("{ kind: arithmetic, digits: [1, 4], ops: [mul], max_multiplier: 12, split: held_out }")
                .expect("parses");
        let DataConfig::Arithmetic(config) = config else { panic!("{config:?}") };
        assert_eq!(
            (config.digits, config.ops.as_slice(), config.max_multiplier),
            ([1, 4], &[Op::Mul][..], 12)
        );
        assert_eq!(config.split, Split::HeldOut);
        config.validate().expect("valid");
    }

    #[test]
    fn jsonl_and_tokens_parse() {
        let jsonl = parse(
            "{ kind: jsonl, path: a.jsonl, tokenizer: { kind: hf, path: t.json, pad: '<pad>', bos: '<s>', eos: '</s>' } }",
        )
        .expect("parses");
        let DataConfig::Jsonl(FileConfig {
            path,
            tokenizer: TokenizerConfig::Hf(hf),
            test: None,
            chat: None,
            ..
        }) = &jsonl
        else {
            panic!("{jsonl:?}")
        };
        assert_eq!((path.as_str(), hf.eos.as_deref()), ("a.jsonl", Some("</s>")));
        jsonl.validate().expect("valid");
        let tokens = parse("{ kind: tokens, path: c.bin, dtype: u32 }").expect("parses");
        assert_eq!(
            tokens,
            DataConfig::Tokens(TokenFileConfig { path: "c.bin".into(), dtype: TokenDtype::U32 })
        );
    }

    #[test]
    fn gsm8k_with_a_model_directory_and_chat_parses() {
        let config = parse(
            "{ kind: gsm8k, path: train.jsonl, test: test.jsonl, tokenizer: { kind: hf, path: Qwen3-1.7B }, \
               chat: { system: 'Answer briefly.', date: '2026-01-31', kwargs: { date_string: '31 Jan 2026' } } }",
        )
        .expect("parses");
        config.validate().expect("valid");
        assert_eq!((config.kind(), config.has_held_out(), config.has_examples()), ("gsm8k", true, true));
        let chat = config.chat().expect("chat");
        assert!(!chat.enable_thinking, "thinking is off by default");
        assert_eq!(chat.date().expect("date"), chrono::NaiveDate::from_ymd_opt(2026, 1, 31));
        assert_eq!(
            chat.template_kwargs(),
            [
                ("enable_thinking".to_string(), serde_json::Value::Bool(false)),
                ("date_string".to_string(), serde_json::Value::from("31 Jan 2026"))
            ]
        );
        let json = serde_json::to_string(&config).expect("serializes");
        assert_eq!(serde_json::from_str::<DataConfig>(&json).expect("parses"), config);
        assert!(
            !parse("{ kind: gsm8k, path: t.jsonl, tokenizer: { kind: char } }")
                .expect("parses")
                .has_held_out()
        );
        let error =
            parse("{ kind: gsm8k, path: t.jsonl, tokenizer: { kind: char }, chat: { thinking: true } }")
                .expect_err("unknown chat field");
        assert!(error.contains("thinking"), "{error}");
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused_by_name() {
        let error = parse("{ kind: arithmetic, digit: [2, 3] }").expect_err("typo");
        assert!(error.contains("digit"), "{error}");
        let error = parse("{ kind: tokens, path: c.bin, dtype: u16, seq_len: 4 }").expect_err("unknown");
        assert!(error.contains("seq_len"), "{error}");
        let error = parse("{ kind: jsonl, path: a.jsonl, tokenizer: { kind: char }, shuffle: true }")
            .expect_err("unknown");
        assert!(error.contains("shuffle"), "{error}");
        let error = parse("{ kind: arithmetic, tokenizer: { kind: char, path: t.json } }")
            .expect_err("char has no path");
        assert!(error.contains("path"), "{error}");
        let error = parse("{ kind: parquet, path: a }").expect_err("kind");
        assert!(error.contains("parquet"), "{error}");
        let error = parse("{ kind: tokens, path: c.bin, dtype: u8 }").expect_err("dtype");
        assert!(error.contains("u8"), "{error}");
        let error = parse("{ kind: jsonl, path: a.jsonl }").expect_err("tokenizer is required");
        assert!(error.contains("tokenizer"), "{error}");
    }

    #[test]
    fn validation_names_the_field_and_the_fix() {
        let cases: [(ArithmeticConfig, &str, &str); 6] = [
            (ArithmeticConfig { digits: [3, 2], ..Default::default() }, "digits", "min <= max"),
            (ArithmeticConfig { digits: [0, 2], ..Default::default() }, "digits", "1 <= min"),
            (ArithmeticConfig { digits: [2, 16], ..Default::default() }, "digits", "<= 15"),
            (ArithmeticConfig { ops: vec![], ..Default::default() }, "ops", "at least one"),
            (ArithmeticConfig { ops: vec![Op::Add, Op::Add], ..Default::default() }, "ops", "once"),
            (ArithmeticConfig { max_multiplier: 1, ..Default::default() }, "max_multiplier", "2..=99"),
        ];
        for (config, field, fix) in cases {
            let error = DataConfig::Arithmetic(config).validate().expect_err("invalid");
            let message = error.to_string();
            assert!(message.starts_with(&format!("data.{field}:")), "{message}");
            assert!(message.contains(fix), "{message}");
        }
        let hf = HfTokenizerConfig { path: "t.json".into(), pad: Some(String::new()), bos: None, eos: None };
        let jsonl = FileConfig {
            path: "a.jsonl".into(),
            test: None,
            format: None,
            columns: ColumnNames::default(),
            tokenizer: TokenizerConfig::Hf(hf),
            chat: None,
        };
        let message = DataConfig::Jsonl(jsonl.clone()).validate().expect_err("empty pad").to_string();
        assert!(message.starts_with("data.tokenizer.pad:"), "{message}");
        let hf = HfTokenizerConfig { path: "Qwen3".into(), pad: None, bos: None, eos: None };
        let gsm8k = FileConfig { tokenizer: TokenizerConfig::Hf(hf), ..jsonl };
        let cases = [
            (FileConfig { test: Some("".into()), ..gsm8k.clone() }, "data.test:", "path"),
            (
                FileConfig {
                    chat: Some(ChatConfig { system: Some("".into()), ..Default::default() }),
                    ..gsm8k.clone()
                },
                "data.chat.system:",
                "system prompt",
            ),
            (
                FileConfig {
                    chat: Some(ChatConfig { date: Some("26 Jul 2024".into()), ..Default::default() }),
                    ..gsm8k.clone()
                },
                "data.chat.date:",
                "YYYY-MM-DD",
            ),
            (
                FileConfig {
                    chat: Some(ChatConfig {
                        kwargs: [("enable_thinking".to_string(), serde_json::Value::Bool(true))].into(),
                        ..Default::default()
                    }),
                    ..gsm8k.clone()
                },
                "data.chat.kwargs:",
                "data.chat.enable_thinking",
            ),
            (
                FileConfig {
                    tokenizer: TokenizerConfig::Char {},
                    chat: Some(ChatConfig::default()),
                    ..gsm8k.clone()
                },
                "data.chat:",
                "char tokenizer has no chat template",
            ),
        ];
        for (config, field, fix) in cases {
            let message = DataConfig::Gsm8k(config).validate().expect_err(field).to_string();
            assert!(message.starts_with(field) && message.contains(fix), "{message}");
        }
        DataConfig::Gsm8k(gsm8k).validate().expect("valid");
        let config = DataConfig::Tokens(TokenFileConfig { path: "".into(), dtype: TokenDtype::U16 });
        assert!(config.validate().expect_err("empty path").to_string().starts_with("data.path:"));
    }

    #[test]
    fn serializes_back_to_the_same_config() {
        let config = DataConfig::Arithmetic(ArithmeticConfig { digits: [3, 5], ..Default::default() });
        let json = serde_json::to_string(&config).expect("serializes");
        assert_eq!(serde_json::from_str::<DataConfig>(&json).expect("parses"), config);
    }
}
