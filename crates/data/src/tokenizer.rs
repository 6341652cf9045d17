//! Text to token ids and back: a character tokenizer for the synthetic task and tiny models,
//! and Hugging Face model directories (`tokenizer.json` and the configs beside it) for real ones.

use crate::chat::ChatTemplate;
use crate::files::DataFiles;
use crate::hf_files::TokenizerFiles;
use crate::{DataError, Result};
use std::path::{Path, PathBuf};

/// A token's `(start, end)` character offsets in the text it came from.
pub type CharSpan = (usize, usize);

/// A tokenizer and the special ids a [`crate::Loader`] and a rollout need.
///
/// `encode` never adds special tokens (a [`crate::Prompter`] adds what the tokenizer says, so
/// prompt and answer can be encoded separately and their boundary is exact), but it does
/// recognize special tokens written in the text (`<|im_start|>`), as transformers does; `decode`
/// drops special tokens.
pub trait Tokenizer: Send + Sync {
    /// The ids of `text`, without added special tokens.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// The ids of `text` (as `encode`) and the characters of `text` each id covers, as
    /// `(start, end)` character (not byte) offsets, which is how transformers sees them.
    fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<CharSpan>)>;
    /// The text of `ids`, with special tokens left out.
    fn decode(&self, ids: &[u32]) -> Result<String>;
    /// Number of ids (every id is below this).
    fn vocab_size(&self) -> u32;
    /// Padding.
    fn pad_id(&self) -> u32;
    /// The id put before a text that is not chat-templated, when the tokenizer adds one (Qwen's
    /// adds none; a chat template writes its own).
    fn bos_id(&self) -> Option<u32>;
    /// End of sequence: what ends an answer the model is trained on.
    fn eos_id(&self) -> u32;
    /// Every id generation stops at, `eos_id` first (a chat model stops at the end of its turn
    /// and at the end of text).
    fn stop_ids(&self) -> &[u32];
    /// The chat template that comes with the tokenizer.
    fn chat_template(&self) -> Option<&ChatTemplate> {
        None
    }
}

/// One id per character: `\n` is 10, printable ASCII (32..=126) is its own code, PAD = 0,
/// BOS = 1, EOS = 2; vocabulary 128. Anything else is refused rather than mapped to an unknown
/// token, so a dataset that does not fit is caught when it is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CharTokenizer;

impl CharTokenizer {
    /// Padding id.
    pub const PAD: u32 = 0;
    /// Beginning-of-sequence id.
    pub const BOS: u32 = 1;
    /// End-of-sequence id.
    pub const EOS: u32 = 2;
    /// Vocabulary size.
    pub const VOCAB_SIZE: u32 = 128;

    fn has_text(id: u32) -> bool {
        id == u32::from(b'\n') || (32..=126).contains(&id)
    }
}

impl Tokenizer for CharTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        text.chars()
            .enumerate()
            .map(|(position, ch)| {
                let id = u32::from(ch);
                if Self::has_text(id) { Ok(id) } else { Err(DataError::UnencodableChar { ch, position }) }
            })
            .collect()
    }

    fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<(usize, usize)>)> {
        let ids = self.encode(text)?;
        let offsets = (0..ids.len()).map(|i| (i, i + 1)).collect();
        Ok((ids, offsets))
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut text = String::with_capacity(ids.len());
        for (position, &id) in ids.iter().enumerate() {
            match id {
                Self::PAD | Self::BOS | Self::EOS => {}
                // `has_text` ids are ASCII, so the cast is exact.
                id if Self::has_text(id) => text.push(char::from(id as u8)),
                id => return Err(DataError::UndecodableId { id, position, vocab_size: Self::VOCAB_SIZE }),
            }
        }
        Ok(text)
    }

    fn vocab_size(&self) -> u32 {
        Self::VOCAB_SIZE
    }

    fn pad_id(&self) -> u32 {
        Self::PAD
    }

    fn bos_id(&self) -> Option<u32> {
        Some(Self::BOS)
    }

    fn eos_id(&self) -> u32 {
        Self::EOS
    }

    fn stop_ids(&self) -> &[u32] {
        &[Self::EOS]
    }
}

/// Texts of special tokens that override what the tokenizer's files say (all optional; a bare
/// `tokenizer.json` has no `tokenizer_config.json` to say it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Padding token, e.g. `<pad>` or Qwen's `<|endoftext|>`.
    pub pad: Option<String>,
    /// Beginning-of-sequence token, put before texts that are not chat-templated.
    pub bos: Option<String>,
    /// End-of-sequence token, e.g. Qwen's `<|im_end|>`.
    pub eos: Option<String>,
}

/// A Hugging Face tokenizer: `tokenizer.json` (BPE, WordPiece, Unigram, ...) loaded with the
/// `tokenizers` crate, so ids match what transformers' `AutoTokenizer` produces, and the special
/// tokens, stop ids and chat template of the files beside it ([`TokenizerFiles`]).
///
/// Special ids, each from the first source that has it:
/// - EOS: `eos` given, `tokenizer_config.json`'s `eos_token`, the first of
///   `generation_config.json`'s `eos_token_id`;
/// - stop ids: EOS, then `generation_config.json`'s `eos_token_id` (Qwen3: `<|im_end|>`,
///   `<|endoftext|>`);
/// - PAD: `pad` given, `pad_token`, `generation_config.json`'s `pad_token_id`, else EOS (as
///   transformers' `generate` pads; padded positions are masked anyway);
/// - BOS: `bos` given, else the token `tokenizer.json`'s post-processor puts before a text, if
///   any (Qwen's puts none). transformers (5.x) follows the same rule: with a `tokenizer.json`,
///   it ignores `tokenizer_config.json`'s `add_bos_token`.
pub struct HfTokenizer {
    path: PathBuf,
    files: TokenizerFiles,
    inner: tokenizers::Tokenizer,
    vocab_size: u32,
    pad: u32,
    bos: Option<u32>,
    eos: u32,
    stop: Vec<u32>,
    /// `bos_token`, `eos_token`, ... and their texts, as a chat template sees them.
    special_texts: Vec<(String, String)>,
    chat_template: Option<ChatTemplate>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size)
            .field("pad", &self.pad)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl HfTokenizer {
    /// Loads the tokenizer at `path` (a model directory, or a `tokenizer.json` with its
    /// companions beside it) and resolves its special ids; `special` overrides the files.
    /// `date` is what the chat template's `strftime_now` formats.
    pub fn load(
        files: &dyn DataFiles,
        uri: &str,
        special: &SpecialTokens,
        date: Option<chrono::NaiveDate>,
    ) -> Result<Self> {
        let (files, json_bytes) = TokenizerFiles::find(files, uri)?;
        let json = &files.tokenizer_json;
        let inner = tokenizers::Tokenizer::from_bytes(&json_bytes).map_err(|error| DataError::Tokenizer {
            path: json.clone(),
            message: format!(
                "cannot load: {error}; it must be a tokenizer.json written by the tokenizers library"
            ),
        })?;
        let config = files.config.as_ref().map(|(_, config)| config.clone()).unwrap_or_default();
        let generation =
            files.generation.as_ref().map(|(_, generation)| generation.clone()).unwrap_or_default();
        // Where each special token's text came from, for the error that names it.
        let config_path = files.config.as_ref().map_or_else(|| json.clone(), |(path, _)| path.clone());
        let lookup = |role: &'static str, token: &str, from: &Path| {
            inner.token_to_id(token).ok_or_else(|| DataError::MissingSpecialToken {
                path: from.to_path_buf(),
                role,
                token: token.to_owned(),
            })
        };
        // Ids can be sparse (added tokens placed past the model's vocabulary), so the size is the
        // largest id + 1, not the number of entries.
        let largest_id = inner.get_vocab(true).into_values().max().unwrap_or(0);
        let vocab_size =
            largest_id.checked_add(1).filter(|&size| size <= i32::MAX as u32).ok_or_else(|| {
                DataError::Tokenizer {
                    path: json.clone(),
                    message: format!("token id {largest_id} does not fit int32"),
                }
            })?;
        let generation_path = files.generation.as_ref().map(|(path, _)| path.clone());
        let check_id = |field: &'static str, id: u32| {
            if id < vocab_size {
                Ok(id)
            } else {
                Err(DataError::Tokenizer {
                    path: generation_path.clone().unwrap_or_else(|| json.clone()),
                    message: format!(
                        "`{field}` {id} is not an id of the tokenizer (its vocabulary is {vocab_size})"
                    ),
                })
            }
        };

        let eos = match (&special.eos, &config.eos_token, generation.eos_token_ids.first()) {
            (Some(token), _, _) => lookup("eos", token, json)?,
            (None, Some(token), _) => lookup("eos", token, &config_path)?,
            (None, None, Some(&id)) => check_id("eos_token_id", id)?,
            (None, None, None) => {
                return Err(DataError::Tokenizer {
                    path: json.clone(),
                    message: "no end-of-sequence token: neither tokenizer_config.json's `eos_token` nor \
                              generation_config.json's `eos_token_id` is there; set data.tokenizer.eos"
                        .into(),
                });
            }
        };
        let mut stop = vec![eos];
        for &id in &generation.eos_token_ids {
            if !stop.contains(&check_id("eos_token_id", id)?) {
                stop.push(id);
            }
        }
        let pad = match (&special.pad, &config.pad_token, generation.pad_token_id) {
            (Some(token), _, _) => lookup("pad", token, json)?,
            (None, Some(token), _) => lookup("pad", token, &config_path)?,
            (None, None, Some(id)) => check_id("pad_token_id", id)?,
            (None, None, None) => eos,
        };
        let bos = match &special.bos {
            Some(token) => Some(lookup("bos", token, json)?),
            None => post_processor_prefix(&inner, json)?,
        };

        let mut special_texts = Vec::new();
        for (name, text) in [
            ("bos_token", &config.bos_token),
            ("eos_token", &config.eos_token),
            ("unk_token", &config.unk_token),
            ("pad_token", &config.pad_token),
        ] {
            if let Some(text) = text {
                special_texts.push((name.to_owned(), text.clone()));
            }
        }
        let chat_template = match &files.chat_template {
            Some((path, source)) => Some(ChatTemplate::new(source, path, special_texts.clone(), date)?),
            None => None,
        };
        Ok(Self {
            path: json.clone(),
            files,
            inner,
            vocab_size,
            pad,
            bos,
            eos,
            stop,
            special_texts,
            chat_template,
        })
    }

    /// The files this tokenizer was read from (what a model export copies).
    pub fn files(&self) -> &TokenizerFiles {
        &self.files
    }

    /// The special tokens' names and texts (`eos_token` -> `<|im_end|>`), as
    /// `tokenizer_config.json` gives them.
    pub fn special_texts(&self) -> &[(String, String)] {
        &self.special_texts
    }

    /// Renders chats with `source` (read from `path`) instead of the files' template, as
    /// transformers does when `apply_chat_template` is given `chat_template=`.
    pub fn set_chat_template(
        &mut self,
        source: &str,
        path: &Path,
        date: Option<chrono::NaiveDate>,
    ) -> Result<()> {
        self.chat_template = Some(ChatTemplate::new(source, path, self.special_texts.clone(), date)?);
        Ok(())
    }

    fn library_error(&self, action: &str, error: tokenizers::Error) -> DataError {
        DataError::Tokenizer { path: self.path.clone(), message: format!("{action} failed: {error}") }
    }
}

/// The id the tokenizer's post-processor puts before a text (`<s> $A`), if any.
fn post_processor_prefix(inner: &tokenizers::Tokenizer, path: &Path) -> Result<Option<u32>> {
    let error = |error: tokenizers::Error| DataError::Tokenizer {
        path: path.to_path_buf(),
        message: format!("cannot run its post-processor: {error}"),
    };
    let probe = "a";
    let plain = inner.encode(probe, false).map_err(error)?;
    let with_special = inner.encode(probe, true).map_err(error)?;
    let added: Vec<u32> = with_special
        .get_ids()
        .iter()
        .copied()
        .take_while(|&id| Some(&id) != plain.get_ids().first())
        .collect();
    match added.as_slice() {
        [] => Ok(None),
        [bos] => Ok(Some(*bos)),
        many => Err(DataError::Tokenizer {
            path: path.to_path_buf(),
            message: format!(
                "its post-processor puts {} tokens before a text; podctl adds at most one (a BOS): set data.tokenizer.bos",
                many.len()
            ),
        }),
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, false).map_err(|error| self.library_error("encode", error))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<(usize, usize)>)> {
        let encoding = self
            .inner
            .encode_char_offsets(text, false)
            .map_err(|error| self.library_error("encode", error))?;
        Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some((position, &id)) = ids.iter().enumerate().find(|&(_, &id)| id >= self.vocab_size) {
            return Err(DataError::UndecodableId { id, position, vocab_size: self.vocab_size });
        }
        self.inner.decode(ids, true).map_err(|error| self.library_error("decode", error))
    }

    fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    fn pad_id(&self) -> u32 {
        self.pad
    }

    fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    fn eos_id(&self) -> u32 {
        self.eos
    }

    fn stop_ids(&self) -> &[u32] {
        &self.stop
    }

    fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_ids_are_ascii_codes() {
        let ids = CharTokenizer.encode("Ann has 47.\n#### 47").expect("ascii");
        assert_eq!(&ids[..4], &[65, 110, 110, 32]);
        assert_eq!(ids[11], 10);
        assert_eq!(CharTokenizer.decode(&ids).expect("decodes"), "Ann has 47.\n#### 47");
    }

    #[test]
    fn char_round_trips_every_printable_character() {
        let text: String = (32u8..=126).map(char::from).chain(['\n']).collect();
        let ids = CharTokenizer.encode(&text).expect("printable");
        assert!(ids.iter().all(|&id| id < CharTokenizer.vocab_size()));
        assert_eq!(CharTokenizer.decode(&ids).expect("decodes"), text);
    }

    #[test]
    fn char_refuses_other_characters_naming_them() {
        let error = CharTokenizer.encode("caf\u{e9} ok").expect_err("non-ascii");
        assert!(matches!(error, DataError::UnencodableChar { ch: '\u{e9}', position: 3 }), "{error:?}");
        assert!(error.to_string().contains("position 3"), "{error}");
        let error = CharTokenizer.encode("a\tb").expect_err("tab");
        assert!(matches!(error, DataError::UnencodableChar { ch: '\t', position: 1 }), "{error:?}");
        let error = CharTokenizer.encode("\r\n").expect_err("carriage return");
        assert!(matches!(error, DataError::UnencodableChar { ch: '\r', position: 0 }), "{error:?}");
    }

    #[test]
    fn char_decode_skips_specials_and_refuses_ids_without_text() {
        let ids = [CharTokenizer::BOS, 72, 105, CharTokenizer::EOS, CharTokenizer::PAD];
        assert_eq!(CharTokenizer.decode(&ids).expect("decodes"), "Hi");
        for bad in [3, 9, 11, 31, 127, 128, u32::MAX] {
            let error = CharTokenizer.decode(&[72, bad]).expect_err("no text");
            assert!(
                matches!(error, DataError::UndecodableId { id, position: 1, .. } if id == bad),
                "{error:?}"
            );
        }
    }

    #[test]
    fn hf_missing_file_names_the_path() {
        let error = HfTokenizer::load(
            &crate::files::LocalFiles,
            "/nonexistent/tokenizer.json",
            &SpecialTokens::default(),
            None,
        )
        .expect_err("missing");
        assert!(error.to_string().contains("/nonexistent/tokenizer.json"), "{error}");
    }
}
