//! Deterministic training data: a synthetic arithmetic task, JSONL files (GSM8K's format among
//! them) and token files, tokenizers and chat templates, held-out problems and rewards.
//!
//! The batch for `(seed, step, micro_batch)` is a pure function of those three numbers and the
//! dataset. A [`Loader`] keeps no cursor, so a job resumed at step `k` sees exactly the batches
//! it would have seen, and slices that split a global step into disjoint micro-batch indices see
//! together the same global batch whether there is one slice or sixteen.
//!
//! # Layout
//! - [`tokenizer`]: the [`Tokenizer`] trait, [`CharTokenizer`] (printable ASCII) and
//!   [`HfTokenizer`] (a Hugging Face model directory: ids, BOS, EOS, stop ids, pad, chat
//!   template), whose files [`hf_files`] finds and parses.
//! - [`chat`]: [`ChatTemplate`], a tokenizer's Jinja chat template rendered as transformers'
//!   `apply_chat_template` renders it (minijinja).
//! - [`prompt`]: [`Prompter`], what a prompt, an answer and a completion are in ids and text,
//!   for SFT rows, rollouts and evaluation alike.
//! - [`files`]: [`DataFile`] and [`DataFiles`], where a data file's bytes come from (local
//!   files here; the worker adds buckets), read by the range.
//! - [`source`]: [`Example`] (a text prompt or a [`Conversation`], its answer and its other
//!   columns) and the [`ExampleSource`] trait, addressed by a `u64` index.
//! - [`rows`]: [`RowFormat`], a row's columns as an example, the same for JSONL and Parquet.
//! - [`arithmetic`]: [`Arithmetic`], an endless stream of word problems with disjoint train and
//!   held-out problems, generated from `(seed, index)` by a counter-based RNG.
//! - [`jsonl`]: [`JsonlSource`], JSONL rows with O(1) random access.
//! - [`parquet`]: [`ParquetSource`], Parquet files or directories of shards, read a row group at
//!   a time.
//! - [`held_out`]: the problems an evaluation scores (a held-out split or a test file).
//! - [`token_file`]: [`TokenFile`], pre-tokenized `.bin` files read as windows of `seq_len + 1`.
//! - [`reward`]: the verifiable reward for GSM8K-style answers (`#### 132`).
//! - [`reward_fns`]: the other built-in rewards, a completion's format and its length.
//! - [`permutation`]: [`EpochPermutation`], the seeded bijection that orders each epoch.
//! - [`batch`]: [`BatchSpec`], [`Batch`] and the stateless [`Loader`].
//! - [`config`]: the serde types of a job spec's data section.
//!
//! **Architecture Invariant:** this crate reads the data files it is pointed at, through
//! [`DataFiles`], and does no other I/O: no network, no async, no global RNG, no clock (a remote
//! file is the caller's [`DataFile`]). Every random choice is a hash of the seed and an index
//! (see `rng`).

#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod arithmetic;
pub mod batch;
pub mod chat;
pub mod config;
mod error;
pub mod files;
pub mod held_out;
pub mod hf_files;
pub mod jsonl;
mod mapped;
pub mod parquet;
pub mod permutation;
pub mod prompt;
pub mod reward;
pub mod reward_fns;
mod rng;
pub mod rows;
pub mod source;
pub mod token_file;
pub mod tokenizer;

pub use arithmetic::{Arithmetic, Op, Problem, Split};
pub use batch::{Batch, BatchSpec, Loader, build_prompter, open_examples};
pub use chat::{ChatTemplate, Message, RenderOptions};
pub use config::{
    ArithmeticConfig, ChatConfig, ColumnNames, DataConfig, FileConfig, FileFormat, HfTokenizerConfig,
    TokenFileConfig, TokenizerConfig,
};
pub use error::DataError;
pub use files::{DataFile, DataFiles, LocalFile, LocalFiles};
pub use held_out::held_out_examples;
pub use hf_files::TokenizerFiles;
pub use jsonl::JsonlSource;
pub use parquet::ParquetSource;
pub use permutation::EpochPermutation;
pub use prompt::Prompter;
pub use reward::{Reward, RewardWeights, digit_credit, exact_match, extract_final_answer, leading_number};
pub use reward_fns::{FormatReward, LengthReward, LengthUnit};
pub use rows::RowFormat;
pub use source::{Columns, Conversation, Example, ExampleSource, Prefetched, Prompt};
pub use token_file::{TokenDtype, TokenFile};
pub use tokenizer::{CharTokenizer, HfTokenizer, SpecialTokens, Tokenizer};

/// A well-mixed hash of `words`, order-sensitive (SplitMix64's finalizer over the sequence; the
/// first word is conventionally a domain tag): how other crates derive randomness from
/// `(seed, step, index)` the way this one does, with no generator state.
pub fn hash_words(words: &[u64]) -> u64 {
    rng::hash_words(words)
}

/// The result type of this crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
