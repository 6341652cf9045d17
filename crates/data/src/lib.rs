//! Deterministic training data: a synthetic arithmetic task, JSONL and token files, tokenizers.
//!
//! The batch for `(seed, step, micro_batch)` is a pure function of those three numbers and the
//! dataset. A [`Loader`] keeps no cursor, so a job resumed at step `k` sees exactly the batches
//! it would have seen, and slices that split a global step into disjoint micro-batch indices see
//! together the same global batch whether there is one slice or sixteen.
//!
//! # Layout
//! - [`tokenizer`]: the [`Tokenizer`] trait, [`CharTokenizer`] (printable ASCII) and
//!   [`HfTokenizer`] (a Hugging Face `tokenizer.json`).
//! - [`source`]: [`Example`] and the [`ExampleSource`] trait, addressed by a `u64` index.
//! - [`arithmetic`]: [`Arithmetic`], an endless stream of word problems with disjoint train and
//!   held-out problems, generated from `(seed, index)` by a counter-based RNG.
//! - [`jsonl`]: [`JsonlSource`], `{"prompt", "answer"}` lines with O(1) random access.
//! - [`token_file`]: [`TokenFile`], pre-tokenized `.bin` files read as windows of `seq_len + 1`.
//! - [`reward`]: the verifiable reward for GSM8K-style answers (`#### 132`).
//! - [`permutation`]: [`EpochPermutation`], the seeded bijection that orders each epoch.
//! - [`batch`]: [`BatchSpec`], [`Batch`] and the stateless [`Loader`].
//! - [`config`]: the serde types of a job spec's data section.
//!
//! **Architecture Invariant:** this crate reads the data files it is pointed at and does no other
//! I/O: no network, no async, no global RNG, no clock. Every random choice is a hash of the seed
//! and an index (see `rng`).

#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod arithmetic;
pub mod batch;
pub mod config;
mod error;
pub mod jsonl;
mod mapped;
pub mod permutation;
pub mod reward;
mod rng;
pub mod source;
pub mod token_file;
pub mod tokenizer;

pub use arithmetic::{Arithmetic, Op, Problem, Split};
pub use batch::{Batch, BatchSpec, Loader};
pub use config::{
    ArithmeticConfig, DataConfig, HfTokenizerConfig, JsonlConfig, TokenFileConfig, TokenizerConfig,
};
pub use error::DataError;
pub use jsonl::JsonlSource;
pub use permutation::EpochPermutation;
pub use reward::{Reward, RewardWeights, digit_credit, exact_match, extract_final_answer};
pub use source::{Example, ExampleSource};
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
