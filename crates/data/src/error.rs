//! The one error type of the crate. Every message names the file, field or value at fault and,
//! where there is one, the fix.

use std::path::PathBuf;

/// What can go wrong while reading data, tokenizing it or laying it out in batches.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A data file could not be opened, measured or mapped.
    #[error("cannot read data file {path}: {source}; check that the path exists and is readable")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },

    /// A JSONL line is not an example of the file's format (missing or mistyped field, a GSM8K
    /// answer without its `####` final answer).
    #[error("{path}:{line}: {message}")]
    JsonlLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong, naming the field.
        message: String,
    },

    /// A Parquet file that cannot be read as the data's kind: not Parquet, a missing or mistyped
    /// column, a codec this build does not read.
    #[error("{path}: {message}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the column and the fix.
        message: String,
    },

    /// A field of one example is wrong (wrapped in [`DataError::Example`] with where it is).
    #[error("field `{field}`: {message}")]
    Field {
        /// The field, as a path in the row (`messages[3].role`).
        field: String,
        /// What is wrong and the fix.
        message: String,
    },

    /// An example cannot be used; `at` says where it is (`train.parquet row 12`).
    #[error("{at}: {source}")]
    Example {
        /// The file and row.
        at: String,
        /// What is wrong.
        source: Box<DataError>,
    },

    /// A file that is not local could not be reached or read (the caller's [`crate::DataFile`]:
    /// an object store, after its own retries).
    #[error("cannot read {uri}: {source}")]
    Remote {
        /// The file.
        uri: String,
        /// What the store said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A data file holds nothing usable.
    #[error("{path} is empty: {what}")]
    EmptyFile {
        /// The file.
        path: PathBuf,
        /// What was expected in it.
        what: String,
    },

    /// A token file's size is not a whole number of tokens.
    #[error(
        "{path} is {bytes} bytes, not a multiple of {token_bytes} (one {dtype} token); \
         check `dtype` in the data config"
    )]
    TokenFileSize {
        /// The file.
        path: PathBuf,
        /// File size.
        bytes: u64,
        /// Bytes per token for the configured dtype.
        token_bytes: u64,
        /// The configured dtype.
        dtype: &'static str,
    },

    /// A token file is shorter than one window.
    #[error(
        "{path} holds {tokens} tokens, fewer than one window of seq_len + 1 = {needed}; \
         use a longer file or a shorter seq_len"
    )]
    TokenFileTooShort {
        /// The file.
        path: PathBuf,
        /// Tokens in the file.
        tokens: u64,
        /// Tokens one window needs.
        needed: u64,
    },

    /// A token id does not fit the model's `int32` token inputs.
    #[error("{path}: token {token} at position {position} does not fit in int32; check `dtype`")]
    TokenOutOfRange {
        /// The file.
        path: PathBuf,
        /// Token offset in the file.
        position: u64,
        /// The token id.
        token: u32,
    },

    /// A window index past the end of a token file.
    #[error("window {index} is past the end of {path}, which has {windows} windows of {seq_len} tokens")]
    WindowOutOfRange {
        /// The file.
        path: PathBuf,
        /// Requested window.
        index: u64,
        /// Windows in the file.
        windows: u64,
        /// Tokens per window (targets excluded).
        seq_len: usize,
    },

    /// An example index past the end of a finite source.
    #[error("example {index} is past the end of {source_name}, which has {len} examples")]
    ExampleOutOfRange {
        /// The source (usually its path).
        source_name: String,
        /// Requested index.
        index: u64,
        /// Examples in the source.
        len: u64,
    },

    /// The character tokenizer met a character outside its vocabulary.
    #[error(
        "character {ch:?} at position {position} is not in the char tokenizer's vocabulary \
         (printable ASCII and '\\n'); clean the text or use an hf tokenizer"
    )]
    UnencodableChar {
        /// The character.
        ch: char,
        /// 0-based character position in the text.
        position: usize,
    },

    /// A token id with no text in the tokenizer's vocabulary.
    #[error("token id {id} at position {position} has no text in a vocabulary of {vocab_size}")]
    UndecodableId {
        /// The id.
        id: u32,
        /// 0-based position in the id sequence.
        position: usize,
        /// The tokenizer's vocabulary size.
        vocab_size: u32,
    },

    /// A Hugging Face tokenizer's files failed to load, parse, encode or decode.
    #[error("tokenizer file {path}: {message}")]
    Tokenizer {
        /// The file at fault (`tokenizer.json`, `tokenizer_config.json`, ...).
        path: PathBuf,
        /// What is wrong, naming the field.
        message: String,
    },

    /// A chat template that does not compile or render.
    #[error("chat template in {path}: {message}")]
    ChatTemplate {
        /// The file the template came from.
        path: PathBuf,
        /// What is wrong, with the template's line.
        message: String,
    },

    /// A special token's text is not in the tokenizer's vocabulary.
    #[error(
        "{path} names {token:?} as the `{role}` token, but the tokenizer has no such token; set \
         data.tokenizer.{role} to a token it has"
    )]
    MissingSpecialToken {
        /// The file that named it (or the tokenizer.json, for a job's override).
        path: PathBuf,
        /// Which special token (`pad`, `bos`, `eos`).
        role: &'static str,
        /// The token text that was looked up.
        token: String,
    },

    /// A tokenizer produced an id outside its own vocabulary.
    #[error(
        "the tokenizer produced id {id}, outside its vocabulary of {vocab_size}; the tokenizer file is inconsistent"
    )]
    TokenIdOutOfRange {
        /// The id.
        id: u32,
        /// The tokenizer's vocabulary size.
        vocab_size: u32,
    },

    /// A configuration value is out of range or inconsistent.
    #[error("{field}: {message}")]
    InvalidConfig {
        /// The field, as a path in the job spec (`data.digits`).
        field: &'static str,
        /// What is wrong and how to fix it.
        message: String,
    },

    /// A batch shape is inconsistent.
    #[error("batch: {message}")]
    InvalidBatchSpec {
        /// What is wrong, naming the fields, and how to fix it.
        message: String,
    },

    /// A micro-batch index outside the step.
    #[error(
        "micro-batch {micro} is out of range: a step has {per_step} micro-batches (global_batch / micro_batch)"
    )]
    MicroOutOfRange {
        /// Requested micro-batch.
        micro: u64,
        /// Micro-batches per step.
        per_step: u64,
    },

    /// A step so large that its example positions overflow `u64`.
    #[error("step {step} is too large: its example positions overflow u64")]
    StepOverflow {
        /// The step.
        step: u64,
    },

    /// The arithmetic generator found no problem of the requested split.
    #[error(
        "no {split} arithmetic problem found in {draws} draws for index {index}; the configured \
         digits/ops allow too few distinct problems: widen `digits` or add `ops`"
    )]
    ProblemSpaceExhausted {
        /// `train` or `held_out`.
        split: &'static str,
        /// The index being generated.
        index: u64,
        /// Draws tried.
        draws: u32,
    },

    /// An operation that needs prompt/answer examples was asked of a token-window loader.
    #[error("{operation} needs an example source (arithmetic or jsonl), but this loader reads token windows")]
    NotAnExampleSource {
        /// The operation.
        operation: &'static str,
    },
}

impl fault::Classify for DataError {
    /// The data, its files and its configuration are the input's; an index a caller should
    /// never ask for is a failure of podctl's own.
    fn fault(&self) -> fault::Fault {
        match self {
            DataError::MicroOutOfRange { .. }
            | DataError::WindowOutOfRange { .. }
            | DataError::ExampleOutOfRange { .. }
            | DataError::NotAnExampleSource { .. } => fault::Fault::Failed,
            _ => fault::Fault::Input,
        }
    }
}
