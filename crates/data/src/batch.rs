//! Batches as pure functions of `(seed, step, micro-batch)`.
//!
//! A step's global batch is `global_batch` consecutive *positions*, `step * global_batch ..`;
//! micro-batch `m` holds positions `m * micro_batch ..` of it. A position becomes an example
//! index through the epoch's [`EpochPermutation`] for finite sources, and is the index itself
//! for the endless synthetic stream. So concatenating a step's micro-batches in order gives the
//! same rows whatever the micro-batch size, and slices that take disjoint micro-batch indices of
//! a step see together exactly the global batch a single slice would.
//!
//! Row layout for examples (SFT): the row is the first `seq_len + 1` tokens of
//! `prompt answer EOS PAD...`, the prompt as the [`Prompter`] encodes it (`BOS text` for plain
//! prompts when the tokenizer adds a BOS, the rendered chat prompt with `data.chat`); `tokens` is
//! its first `seq_len`, `targets` its last `seq_len` (tokens shifted left by one), and
//! `loss_mask` is 1 exactly where the target is an answer token or the EOS. A conversation's row
//! is its whole rendering, `loss_mask` 1 where the target is assistant output
//! ([`Prompter::conversation_ids`]). Longer examples keep their beginning and are counted in
//! [`Batch::truncated_rows`]. Token windows use every target.

use crate::arithmetic::Arithmetic;
use crate::config::{ChatConfig, DataConfig, FileFormat, TokenizerConfig};
use crate::files::{DataFiles, open_required};
use crate::jsonl::JsonlSource;
use crate::parquet::ParquetSource;
use crate::permutation::EpochPermutation;
use crate::prompt::Prompter;
use crate::source::{Example, ExampleSource, Prefetched, Prompt};
use crate::token_file::TokenFile;
use crate::tokenizer::{CharTokenizer, HfTokenizer, SpecialTokens, Tokenizer};
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};

/// The shape of a step: `global_batch` rows per optimizer step, fed `micro_batch` rows at a
/// time, each `seq_len` tokens long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Rows per optimizer step, across all slices.
    pub global_batch: usize,
    /// Rows per `grad_step` call (the bundle's `train.micro_batch`).
    pub micro_batch: usize,
    /// Tokens per row (the bundle's `train.seq_len`).
    pub seq_len: usize,
}

impl BatchSpec {
    /// A checked spec: all sizes positive and `global_batch` a multiple of `micro_batch`.
    pub fn new(global_batch: usize, micro_batch: usize, seq_len: usize) -> Result<Self> {
        let spec = Self { global_batch, micro_batch, seq_len };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks the spec; the error names the fields and the fix.
    pub fn validate(&self) -> Result<()> {
        let error = |message: String| Err(DataError::InvalidBatchSpec { message });
        if self.micro_batch == 0 {
            return error("micro_batch is 0; set it to at least 1".into());
        }
        if self.global_batch == 0 {
            return error("global_batch is 0; set it to a positive multiple of micro_batch".into());
        }
        if self.seq_len == 0 {
            return error("seq_len is 0; set it to the bundle's train.seq_len".into());
        }
        let leftover_rows = self.global_batch % self.micro_batch;
        if leftover_rows != 0 {
            let below = self.global_batch / self.micro_batch * self.micro_batch;
            let above = below + self.micro_batch;
            let suggestion = if below == 0 { format!("{above}") } else { format!("{below} or {above}") };
            return error(format!(
                "global_batch {} is not divisible by micro_batch {}; make global_batch a multiple of \
                 micro_batch (e.g. {suggestion})",
                self.global_batch, self.micro_batch
            ));
        }
        Ok(())
    }

    /// Micro-batches in one step.
    pub fn micro_batches_per_step(&self) -> u64 {
        (self.global_batch / self.micro_batch) as u64
    }
}

/// One micro-batch, row-major `[rows, seq_len]`, in the bundle's `batch/*` layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Rows (the micro-batch size).
    pub rows: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// Input ids (`batch/tokens`).
    pub tokens: Vec<i32>,
    /// The next token at each position (`batch/targets`); PAD past the end of a row.
    pub targets: Vec<i32>,
    /// 1.0 where the target counts towards the loss, else 0.0 (`batch/loss_mask`).
    pub loss_mask: Vec<f32>,
    /// The example (or window) index of each row, for logs and reproducibility checks.
    pub example_indices: Vec<u64>,
    /// Rows whose example did not fit in `seq_len + 1` tokens and lost its end.
    pub truncated_rows: usize,
}

impl Batch {
    /// Number of targets that count towards the loss (what `grad_step` reports as
    /// `token_count`).
    pub fn token_count(&self) -> u64 {
        self.loss_mask.iter().filter(|&&weight| weight != 0.0).count() as u64
    }
}

/// What a loader reads.
enum Source {
    /// Prompt/answer pairs, tokenized on the fly.
    Examples { examples: Box<dyn ExampleSource>, prompter: Prompter },
    /// Pre-tokenized windows of `seq_len + 1` tokens.
    Windows(TokenFile),
}

/// The stateless batch maker. Every method is a pure function of its arguments, the seed and
/// the data, so loaders built alike on different hosts, or after a restart, agree on every batch.
pub struct Loader {
    spec: BatchSpec,
    seed: u64,
    source: Source,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            Source::Examples { examples, .. } => format!("examples ({:?})", examples.num_examples()),
            Source::Windows(file) => format!("{file:?}"),
        };
        f.debug_struct("Loader")
            .field("spec", &self.spec)
            .field("seed", &self.seed)
            .field("source", &source)
            .finish()
    }
}

impl Loader {
    /// A loader over prompt/answer examples (SFT, GRPO prompts).
    pub fn from_examples(
        examples: Box<dyn ExampleSource>,
        prompter: Prompter,
        spec: BatchSpec,
        seed: u64,
    ) -> Result<Self> {
        spec.validate()?;
        if examples.num_examples() == Some(0) {
            return Err(DataError::InvalidConfig {
                field: "data",
                message: "the source has no examples".into(),
            });
        }
        let tokenizer = prompter.tokenizer();
        let vocab_size = tokenizer.vocab_size();
        // Token ids become int32 batch entries.
        if vocab_size == 0 || vocab_size > i32::MAX as u32 {
            return Err(DataError::InvalidConfig {
                field: "data.tokenizer",
                message: format!("vocabulary size {vocab_size} does not fit int32 token ids"),
            });
        }
        let special = [tokenizer.pad_id(), tokenizer.eos_id()].into_iter().chain(tokenizer.bos_id());
        for id in special.chain(tokenizer.stop_ids().iter().copied()) {
            if id >= vocab_size {
                return Err(DataError::TokenIdOutOfRange { id, vocab_size });
            }
        }
        Ok(Self { spec, seed, source: Source::Examples { examples, prompter } })
    }

    /// A loader over windows of a token file (pretraining).
    pub fn from_token_file(file: TokenFile, spec: BatchSpec, seed: u64) -> Result<Self> {
        spec.validate()?;
        file.check_fits(spec.seq_len)?;
        Ok(Self { spec, seed, source: Source::Windows(file) })
    }

    /// The loader a job spec's data section describes; files are found through `files`, opened
    /// and checked now.
    pub fn from_config(
        config: &DataConfig,
        spec: BatchSpec,
        seed: u64,
        files: &dyn DataFiles,
    ) -> Result<Self> {
        config.validate()?;
        match config {
            DataConfig::Arithmetic(arithmetic) => Self::from_examples(
                Box::new(Arithmetic::new(arithmetic, seed)?),
                build_prompter(&arithmetic.tokenizer, arithmetic.chat.as_ref(), files)?,
                spec,
                seed,
            ),
            DataConfig::Jsonl(file) | DataConfig::Gsm8k(file) | DataConfig::Chat(file) => {
                Self::from_examples(
                    open_examples(config, &file.path, files)?,
                    build_prompter(&file.tokenizer, config.chat().as_ref(), files)?,
                    spec,
                    seed,
                )
            }
            DataConfig::Tokens(tokens) => Self::from_token_file(
                TokenFile::open(open_required(files, &tokens.path, "data.path")?, tokens.dtype)?,
                spec,
                seed,
            ),
        }
    }

    /// Checks that every id the tokenizer can produce fits a model whose embedding has
    /// `model_vocab_size` rows: an id past it would be clamped by the lookup and train garbage,
    /// silently. (Token files are not scanned for it: a corpus can be terabytes.)
    pub fn check_model_vocab(&self, model_vocab_size: u64, model: &str) -> Result<()> {
        let Source::Examples { prompter, .. } = &self.source else { return Ok(()) };
        let ids = u64::from(prompter.tokenizer().vocab_size());
        if ids > model_vocab_size {
            return Err(DataError::InvalidConfig {
                field: "data.tokenizer",
                message: format!(
                    "the tokenizer's ids need {ids} embedding rows, but model {model} has {model_vocab_size}; \
                     use the model's own tokenizer, or a model whose vocabulary holds every id"
                ),
            });
        }
        Ok(())
    }

    /// The batch shape.
    pub fn spec(&self) -> BatchSpec {
        self.spec
    }

    /// The data seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How prompts become ids and completions text, for an example source (GRPO and
    /// evaluation encode prompts and decode completions with it).
    pub fn prompter(&self) -> Option<&Prompter> {
        match &self.source {
            Source::Examples { prompter, .. } => Some(prompter),
            Source::Windows(_) => None,
        }
    }

    /// The tokenizer, for an example source.
    pub fn tokenizer(&self) -> Option<&dyn Tokenizer> {
        self.prompter().map(Prompter::tokenizer)
    }

    /// Examples (or windows) per epoch, or `None` for an endless stream.
    pub fn epoch_len(&self) -> Option<u64> {
        match &self.source {
            Source::Examples { examples, .. } => examples.num_examples(),
            Source::Windows(file) => Some(file.num_windows(self.spec.seq_len)),
        }
    }

    /// The example (or window) index at `row` of micro-batch `micro` of `step`.
    pub fn example_index(&self, step: u64, micro: u64, row: usize) -> Result<u64> {
        let per_step = self.spec.micro_batches_per_step();
        if micro >= per_step {
            return Err(DataError::MicroOutOfRange { micro, per_step });
        }
        if row >= self.spec.micro_batch {
            return Err(DataError::InvalidBatchSpec {
                message: format!("row {row} is out of range: micro_batch is {}", self.spec.micro_batch),
            });
        }
        let position = step
            .checked_mul(self.spec.global_batch as u64)
            .and_then(|start| start.checked_add(micro * self.spec.micro_batch as u64 + row as u64))
            .ok_or(DataError::StepOverflow { step })?;
        Ok(match self.epoch_len() {
            None => position,
            Some(len) => {
                let permutation = EpochPermutation::new(self.seed, position / len, len);
                // `position % len < len`, so the permutation always has an image.
                permutation.apply(position % len).unwrap_or(position % len)
            }
        })
    }

    fn example_indices(&self, step: u64, micro: u64) -> Result<Vec<u64>> {
        (0..self.spec.micro_batch).map(|row| self.example_index(step, micro, row)).collect()
    }

    /// Reads ahead, all at once, what micro-batches `micro_batches` (`(step, micro)` pairs) will
    /// read: the rows (or windows) of a run's remaining steps on this host. The examples are
    /// checked on the way, so a bad row among them stops the run now.
    pub fn prefetch(&self, micro_batches: impl IntoIterator<Item = (u64, u64)>) -> Result<Prefetched> {
        let mut indices = Vec::new();
        for (step, micro) in micro_batches {
            indices.extend(self.example_indices(step, micro)?);
        }
        indices.sort_unstable();
        indices.dedup();
        match &self.source {
            Source::Examples { examples, .. } => examples.prefetch(&indices),
            Source::Windows(file) => file.prefetch(self.spec.seq_len, &indices),
        }
    }

    /// Where example `index` comes from (`train.parquet row 12`), for messages.
    pub fn locate(&self, index: u64) -> String {
        match &self.source {
            Source::Examples { examples, .. } => examples.locate(index),
            Source::Windows(file) => format!("{} window {index}", file.path().display()),
        }
    }

    /// Micro-batch `micro` (`0..micro_batches_per_step`) of `step`.
    pub fn micro_batch(&self, step: u64, micro: u64) -> Result<Batch> {
        let (rows, seq_len) = (self.spec.micro_batch, self.spec.seq_len);
        let example_indices = self.example_indices(step, micro)?;
        let mut batch = Batch {
            rows,
            seq_len,
            tokens: vec![0; rows * seq_len],
            targets: vec![0; rows * seq_len],
            loss_mask: vec![0.0; rows * seq_len],
            example_indices,
            truncated_rows: 0,
        };
        // One row of seq_len + 1 tokens, reused.
        let mut window = vec![0i32; seq_len + 1];
        for row in 0..rows {
            let span = row * seq_len..(row + 1) * seq_len;
            let mask = &mut batch.loss_mask[span.clone()];
            match &self.source {
                Source::Windows(file) => {
                    file.read_window(seq_len, batch.example_indices[row], &mut window)?;
                    mask.fill(1.0);
                }
                Source::Examples { examples, prompter } => {
                    let index = batch.example_indices[row];
                    let example = examples.example(index)?;
                    let truncated =
                        lay_out_example(prompter, &example, &mut window, mask).map_err(|error| {
                            DataError::Example { at: examples.locate(index), source: Box::new(error) }
                        })?;
                    batch.truncated_rows += usize::from(truncated);
                }
            }
            batch.tokens[span.clone()].copy_from_slice(&window[..seq_len]);
            batch.targets[span].copy_from_slice(&window[1..]);
        }
        Ok(batch)
    }

    /// The examples of micro-batch `micro` of `step`, untokenized, in row order: GRPO's prompts
    /// (and the reference answers its rewards check against), with the same determinism as
    /// [`Loader::micro_batch`].
    pub fn prompts(&self, step: u64, micro: u64) -> Result<Vec<Example>> {
        let Source::Examples { examples, .. } = &self.source else {
            return Err(DataError::NotAnExampleSource { operation: "prompts" });
        };
        self.example_indices(step, micro)?.into_iter().map(|index| examples.example(index)).collect()
    }

    /// Targets that count towards the loss in the whole global batch of `step`: the host passes
    /// `1 / step_token_count` as `grad_scale`, and every slice can compute it alone.
    pub fn step_token_count(&self, step: u64) -> Result<u64> {
        if let Source::Windows(_) = self.source {
            return Ok((self.spec.global_batch * self.spec.seq_len) as u64);
        }
        (0..self.spec.micro_batches_per_step())
            .map(|micro| self.micro_batch(step, micro).map(|batch| batch.token_count()))
            .sum()
    }
}

/// Lays `prompt answer EOS` (or a conversation) into `window` (`seq_len + 1` tokens,
/// PAD-filled past the end) and marks in `mask` (`seq_len` targets) the targets that are answer
/// tokens or the EOS (the conversation's assistant output). Returns whether the example had to be
/// truncated.
fn lay_out_example(
    prompter: &Prompter,
    example: &Example,
    window: &mut [i32],
    mask: &mut [f32],
) -> Result<bool> {
    let tokenizer = prompter.tokenizer();
    let vocab_size = tokenizer.vocab_size();
    let (ids, learned) = match &example.prompt {
        Prompt::Text(_) => {
            let prompt = prompter.prompt_ids(&example.prompt)?;
            let answer = prompter.answer_ids(&example.answer)?;
            let learned: Vec<bool> = std::iter::repeat_n(false, prompt.len())
                .chain(std::iter::repeat_n(true, answer.len()))
                .collect();
            (prompt.into_iter().chain(answer).collect::<Vec<u32>>(), learned)
        }
        Prompt::Chat(conversation) => {
            let (ids, learned) = prompter.conversation_ids(conversation)?;
            if !learned.contains(&true) {
                return Err(DataError::Field {
                    field: "messages".into(),
                    message: "the conversation has no assistant turn to learn from (the chat template marks none); \
                              SFT rows need one"
                        .into(),
                });
            }
            (ids, learned)
        }
    };
    window.fill(tokenizer.pad_id() as i32);
    for (slot, &id) in window.iter_mut().zip(&ids) {
        if id >= vocab_size {
            return Err(DataError::TokenIdOutOfRange { id, vocab_size });
        }
        // The loader checked vocab_size <= i32::MAX, so the id fits.
        *slot = id as i32;
    }
    // Target j is position j + 1.
    for (j, weight) in mask.iter_mut().enumerate() {
        *weight = if learned.get(j + 1).copied().unwrap_or(false) { 1.0 } else { 0.0 };
    }
    Ok(ids.len() > window.len())
}

/// The examples of `uri` (the training file or the test file of a file kind), JSONL or Parquet
/// by `data.format` or the file's name: one file, or a directory of Parquet shards.
pub fn open_examples(
    config: &DataConfig,
    uri: &str,
    files: &dyn DataFiles,
) -> Result<Box<dyn ExampleSource>> {
    let (Some(file_config), Some(format)) = (config.files(), config.row_format()) else {
        return Err(DataError::NotAnExampleSource { operation: "reading example files" });
    };
    let is_dir = files.is_dir(uri)?;
    match file_config.format.unwrap_or_else(|| FileFormat::of(uri, is_dir)) {
        FileFormat::Jsonl => {
            let file = open_required(files, uri, "data.path / data.test")?;
            Ok(Box::new(JsonlSource::open(&file, format)?))
        }
        FileFormat::Parquet => {
            let shards = if is_dir {
                let shards = files.list(uri, ".parquet")?;
                if shards.is_empty() {
                    return Err(DataError::EmptyFile {
                        path: uri.into(),
                        what: "expected .parquet files (shards, read in name order)".into(),
                    });
                }
                shards
            } else {
                vec![uri.to_owned()]
            };
            let shards = shards
                .iter()
                .map(|shard| open_required(files, shard, "a Parquet shard"))
                .collect::<Result<Vec<_>>>()?;
            Ok(Box::new(ParquetSource::open(shards, format)?))
        }
    }
}

/// The tokenizer `config` names (read through `files`), with its chat template's date from
/// `chat` and `chat.template` in place of its own, and prompts formatted as `chat` says.
pub fn build_prompter(
    config: &TokenizerConfig,
    chat: Option<&ChatConfig>,
    files: &dyn DataFiles,
) -> Result<Prompter> {
    let tokenizer: std::sync::Arc<dyn Tokenizer> = match config {
        TokenizerConfig::Char {} => std::sync::Arc::new(CharTokenizer),
        TokenizerConfig::Hf(hf) => {
            let special = SpecialTokens { pad: hf.pad.clone(), bos: hf.bos.clone(), eos: hf.eos.clone() };
            let date = chat.map(ChatConfig::date).transpose()?.flatten();
            let mut tokenizer = HfTokenizer::load(files, &hf.path, &special, date)?;
            if let Some(uri) = chat.and_then(|chat| chat.template.as_deref()) {
                let file = open_required(files, uri, "data.chat.template")?;
                let bytes = file.read(0..file.len().min(crate::hf_files::MAX_CONFIG_BYTES))?;
                let source = std::str::from_utf8(&bytes).map_err(|_| DataError::InvalidConfig {
                    field: "data.chat.template",
                    message: format!("{uri} is not UTF-8 text; save the template as UTF-8"),
                })?;
                tokenizer.set_chat_template(source, std::path::Path::new(uri), date)?;
            }
            std::sync::Arc::new(tokenizer)
        }
    };
    match chat {
        Some(chat) => Prompter::chat(tokenizer, chat.clone()),
        None => Ok(Prompter::plain(tokenizer)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ArithmeticConfig;

    /// A finite in-memory source for exact layout checks.
    struct Fixed(Vec<Example>);

    impl ExampleSource for Fixed {
        fn num_examples(&self) -> Option<u64> {
            Some(self.0.len() as u64)
        }

        fn example(&self, index: u64) -> Result<Example> {
            Ok(self.0[index as usize].clone())
        }
    }

    fn example(prompt: &str, answer: &str) -> Example {
        Example::text(prompt, answer)
    }

    fn arithmetic_loader(spec: BatchSpec, seed: u64) -> Loader {
        let source = Arithmetic::new(&ArithmeticConfig::default(), seed).expect("valid");
        Loader::from_examples(
            Box::new(source),
            Prompter::plain(std::sync::Arc::new(CharTokenizer)),
            spec,
            seed,
        )
        .expect("loader")
    }

    #[test]
    fn a_model_vocabulary_smaller_than_the_tokenizers_is_refused() {
        let loader = arithmetic_loader(BatchSpec::new(2, 2, 64).expect("valid"), 0);
        loader.check_model_vocab(128, "tiny").expect("the char tokenizer fits tiny");
        let message = loader.check_model_vocab(100, "small").expect_err("128 ids").to_string();
        assert!(
            message.starts_with("data.tokenizer:") && message.contains("128") && message.contains("small"),
            "{message}"
        );
    }

    #[test]
    fn spec_errors_name_the_fields() {
        let error = BatchSpec::new(100, 32, 128).expect_err("not divisible").to_string();
        assert!(error.contains("global_batch 100 is not divisible by micro_batch 32"), "{error}");
        assert!(error.contains("96 or 128"), "{error}");
        assert!(BatchSpec::new(8, 0, 128).expect_err("zero").to_string().contains("micro_batch is 0"));
        assert!(BatchSpec::new(0, 4, 128).expect_err("zero").to_string().contains("global_batch is 0"));
        assert!(BatchSpec::new(8, 4, 0).expect_err("zero").to_string().contains("seq_len is 0"));
        assert!(BatchSpec::new(3, 4, 8).expect_err("small").to_string().contains("(e.g. 4)"));
        assert_eq!(BatchSpec::new(96, 32, 128).expect("valid").micro_batches_per_step(), 3);
    }

    #[test]
    fn row_layout_masks_exactly_the_answer_and_eos() {
        let spec = BatchSpec::new(1, 1, 12).expect("valid");
        let loader = Loader::from_examples(
            Box::new(Fixed(vec![example("ab", "cde")])),
            Prompter::plain(std::sync::Arc::new(CharTokenizer)),
            spec,
            0,
        )
        .expect("loader");
        let batch = loader.micro_batch(0, 0).expect("batch");
        // Sequence: BOS a b c d e EOS, then PAD.
        let (bos, eos, pad) = (1, 2, 0);
        let (a, b, c, d, e) = (97, 98, 99, 100, 101);
        assert_eq!(batch.tokens, [bos, a, b, c, d, e, eos, pad, pad, pad, pad, pad]);
        assert_eq!(batch.targets, [a, b, c, d, e, eos, pad, pad, pad, pad, pad, pad]);
        assert_eq!(batch.loss_mask, [0., 0., 1., 1., 1., 1., 0., 0., 0., 0., 0., 0.]);
        assert_eq!((batch.token_count(), batch.truncated_rows), (4, 0));
    }

    #[test]
    fn an_example_of_exactly_seq_len_plus_one_tokens_is_not_truncated() {
        // BOS a b c EOS is 5 tokens: seq_len 4 holds it, EOS as the last target.
        let source = Fixed(vec![example("a", "bc")]);
        let spec = BatchSpec::new(1, 1, 4).expect("valid");
        let loader = Loader::from_examples(
            Box::new(source),
            Prompter::plain(std::sync::Arc::new(CharTokenizer)),
            spec,
            0,
        )
        .expect("loader");
        let batch = loader.micro_batch(0, 0).expect("batch");
        assert_eq!(batch.targets, [97, 98, 99, 2]);
        assert_eq!(batch.loss_mask, [0., 1., 1., 1.]);
        assert_eq!(batch.truncated_rows, 0);
    }

    #[test]
    fn truncation_keeps_the_beginning_and_is_counted() {
        let source = Fixed(vec![example("abcdef", "ghij"), example("a", "b"), example("abcdefghij", "klm")]);
        let spec = BatchSpec::new(3, 3, 8).expect("valid");
        let loader = Loader::from_examples(
            Box::new(source),
            Prompter::plain(std::sync::Arc::new(CharTokenizer)),
            spec,
            4,
        )
        .expect("loader");
        let batch = loader.micro_batch(0, 0).expect("batch");
        assert_eq!(batch.truncated_rows, 2);
        for row in 0..3 {
            let span = row * 8..(row + 1) * 8;
            let targets = &batch.targets[span.clone()];
            let mask = &batch.loss_mask[span];
            match batch.example_indices[row] {
                // BOS a..f g h i j EOS: targets a..h; the answer's g h count, i j EOS are cut.
                0 => {
                    assert_eq!(targets, [97, 98, 99, 100, 101, 102, 103, 104]);
                    assert_eq!(mask, [0., 0., 0., 0., 0., 0., 1., 1.]);
                }
                1 => assert_eq!(mask, [0., 1., 1., 0., 0., 0., 0., 0.]),
                // The prompt alone overflows: nothing of the answer is left to learn from.
                2 => assert_eq!(mask, [0.; 8]),
                other => panic!("unexpected index {other}"),
            }
        }
    }

    #[test]
    fn batches_are_pure_functions_of_seed_step_and_micro() {
        let spec = BatchSpec::new(8, 2, 64).expect("valid");
        let (first, second) = (arithmetic_loader(spec, 7), arithmetic_loader(spec, 7));
        let forward: Vec<Batch> = (0..4).map(|m| first.micro_batch(3, m).expect("batch")).collect();
        // A different instance, asked in a different order, after unrelated calls.
        second.micro_batch(9, 1).expect("other step");
        let backward: Vec<Batch> = (0..4).rev().map(|m| second.micro_batch(3, m).expect("batch")).collect();
        assert!(forward.iter().eq(backward.iter().rev()));
        assert_ne!(forward[0], arithmetic_loader(spec, 8).micro_batch(3, 0).expect("other seed"));
        assert_ne!(forward[0], first.micro_batch(4, 0).expect("other step"));
    }

    #[test]
    fn the_global_batch_does_not_depend_on_the_micro_batch_size() {
        // One slice with micro_batch 8, or four slices with micro_batch 2 each taking one index.
        let whole =
            arithmetic_loader(BatchSpec::new(8, 8, 48).expect("valid"), 1).micro_batch(5, 0).expect("batch");
        let split = arithmetic_loader(BatchSpec::new(8, 2, 48).expect("valid"), 1);
        let parts: Vec<Batch> = (0..4).map(|m| split.micro_batch(5, m).expect("batch")).collect();
        let concat = |field: fn(&Batch) -> Vec<i32>| parts.iter().flat_map(field).collect::<Vec<_>>();
        assert_eq!(concat(|b| b.tokens.clone()), whole.tokens);
        assert_eq!(concat(|b| b.targets.clone()), whole.targets);
        let mask: Vec<f32> = parts.iter().flat_map(|b| b.loss_mask.clone()).collect();
        assert_eq!(mask, whole.loss_mask);
    }

    #[test]
    fn the_endless_stream_is_read_in_index_order() {
        let loader = arithmetic_loader(BatchSpec::new(6, 3, 96).expect("valid"), 2);
        assert_eq!(loader.epoch_len(), None);
        assert_eq!(loader.example_index(4, 1, 2).expect("index"), 4 * 6 + 3 + 2);
        let prompts = loader.prompts(4, 1).expect("prompts");
        let source = Arithmetic::new(&ArithmeticConfig::default(), 2).expect("valid");
        assert_eq!(prompts, (27..30).map(|i| source.example(i).expect("example")).collect::<Vec<_>>());
    }

    #[test]
    fn finite_sources_visit_every_example_once_per_epoch() {
        let examples: Vec<Example> = (0..10).map(|i| example(&format!("{i}"), "x")).collect();
        let spec = BatchSpec::new(4, 2, 8).expect("valid");
        let loader = Loader::from_examples(
            Box::new(Fixed(examples)),
            Prompter::plain(std::sync::Arc::new(CharTokenizer)),
            spec,
            3,
        )
        .expect("loader");
        // Positions 0..40 are four epochs of ten.
        let order: Vec<u64> = (0..10)
            .flat_map(|step| (0..2).flat_map(move |micro| (0..2).map(move |row| (step, micro, row))))
            .map(|(step, micro, row)| loader.example_index(step, micro, row).expect("index"))
            .collect();
        let epochs: Vec<Vec<u64>> = order.chunks(10).map(<[u64]>::to_vec).collect();
        for epoch in &epochs {
            let mut sorted = epoch.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        }
        assert_ne!(epochs[0], epochs[1], "each epoch has its own order");
    }

    #[test]
    fn step_token_count_sums_the_micro_batches() {
        let spec = BatchSpec::new(6, 2, 128).expect("valid");
        let loader = arithmetic_loader(spec, 5);
        let sum: u64 = (0..3).map(|m| loader.micro_batch(2, m).expect("batch").token_count()).sum();
        assert_eq!(loader.step_token_count(2).expect("count"), sum);
        assert!(sum > 0);
    }

    #[test]
    fn out_of_range_requests_are_errors() {
        let loader = arithmetic_loader(BatchSpec::new(4, 2, 16).expect("valid"), 0);
        let error = loader.micro_batch(0, 2).expect_err("micro 2 of 2");
        assert!(error.to_string().contains("a step has 2 micro-batches"), "{error}");
        let error = loader.micro_batch(u64::MAX, 0).expect_err("overflow");
        assert!(matches!(error, DataError::StepOverflow { .. }), "{error:?}");
    }

    #[test]
    fn unencodable_examples_fail_the_batch() {
        let source = Fixed(vec![example("na\u{ef}ve", "x")]);
        let loader = Loader::from_examples(
            Box::new(source),
            Prompter::plain(std::sync::Arc::new(CharTokenizer)),
            BatchSpec::new(1, 1, 8).expect("valid"),
            0,
        )
        .expect("loader");
        let error = loader.micro_batch(0, 0).expect_err("non-ascii");
        let DataError::Example { at, source } = &error else { panic!("{error:?}") };
        assert_eq!(at, "example 0", "the source says where the example is");
        assert!(matches!(**source, DataError::UnencodableChar { position: 2, .. }), "{error:?}");
    }
}
