//! The data section of a job spec, e.g.
//!
//! ```yaml
//! data: { kind: arithmetic, digits: [2, 3], ops: [add, sub, mul] }
//! data: { kind: jsonl, path: train.jsonl, tokenizer: { kind: char } }
//! data: { kind: tokens, path: corpus.bin, dtype: u16 }
//! ```
//!
//! Unknown fields are refused (a typo must not silently fall back to a default), and
//! [`DataConfig::validate`] checks ranges with messages that name the field and the fix.

use crate::arithmetic::{Op, Split};
use crate::token_file::TokenDtype;
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// A JSONL file of `{"prompt": ..., "answer": ...}` objects.
    Jsonl(JsonlConfig),
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
}

impl Default for ArithmeticConfig {
    fn default() -> Self {
        Self {
            digits: [2, 3],
            ops: vec![Op::Add, Op::Sub, Op::Mul],
            max_multiplier: 9,
            split: Split::Train,
            tokenizer: TokenizerConfig::Char {},
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
        self.tokenizer.validate()
    }
}

/// A JSONL file of examples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlConfig {
    /// The file, one `{"prompt": string, "answer": string}` object per line.
    pub path: PathBuf,
    /// How text becomes tokens.
    pub tokenizer: TokenizerConfig,
}

/// A pre-tokenized file of little-endian token ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFileConfig {
    /// The `.bin` file.
    pub path: PathBuf,
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
    /// [`crate::HfTokenizer`]: a Hugging Face `tokenizer.json`.
    Hf(HfTokenizerConfig),
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        TokenizerConfig::Char {}
    }
}

impl TokenizerConfig {
    fn validate(&self) -> Result<()> {
        match self {
            TokenizerConfig::Char {} => Ok(()),
            TokenizerConfig::Hf(hf) => {
                if hf.path.as_os_str().is_empty() {
                    return Err(invalid(
                        "data.tokenizer.path",
                        "is empty; give the path of a tokenizer.json".into(),
                    ));
                }
                for (field, token) in [
                    ("data.tokenizer.pad", &hf.pad),
                    ("data.tokenizer.bos", &hf.bos),
                    ("data.tokenizer.eos", &hf.eos),
                ] {
                    if token.is_empty() {
                        return Err(invalid(
                            field,
                            "is empty; give the token's text, e.g. \"<|endoftext|>\"".into(),
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}

/// A Hugging Face tokenizer and the texts of its special tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfTokenizerConfig {
    /// The `tokenizer.json`.
    pub path: PathBuf,
    /// Padding token text.
    pub pad: String,
    /// Beginning-of-sequence token text.
    pub bos: String,
    /// End-of-sequence token text.
    pub eos: String,
}

impl DataConfig {
    /// Checks every field; the error names the field and the fix.
    pub fn validate(&self) -> Result<()> {
        let empty_path = || invalid("data.path", "is empty; give the data file's path".into());
        match self {
            DataConfig::Arithmetic(config) => config.validate(),
            DataConfig::Jsonl(config) if config.path.as_os_str().is_empty() => Err(empty_path()),
            DataConfig::Jsonl(config) => config.tokenizer.validate(),
            DataConfig::Tokens(config) if config.path.as_os_str().is_empty() => Err(empty_path()),
            DataConfig::Tokens(_) => Ok(()),
        }
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
        let DataConfig::Jsonl(JsonlConfig { path, tokenizer: TokenizerConfig::Hf(hf) }) = &jsonl else {
            panic!("{jsonl:?}")
        };
        assert_eq!((path.to_str(), hf.eos.as_str()), (Some("a.jsonl"), "</s>"));
        jsonl.validate().expect("valid");
        let tokens = parse("{ kind: tokens, path: c.bin, dtype: u32 }").expect("parses");
        assert_eq!(
            tokens,
            DataConfig::Tokens(TokenFileConfig { path: "c.bin".into(), dtype: TokenDtype::U32 })
        );
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
        let hf = HfTokenizerConfig {
            path: "t.json".into(),
            pad: String::new(),
            bos: "<s>".into(),
            eos: "</s>".into(),
        };
        let config =
            DataConfig::Jsonl(JsonlConfig { path: "a.jsonl".into(), tokenizer: TokenizerConfig::Hf(hf) });
        let message = config.validate().expect_err("empty pad").to_string();
        assert!(message.starts_with("data.tokenizer.pad:"), "{message}");
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
