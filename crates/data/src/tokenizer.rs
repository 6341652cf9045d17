//! Text to token ids and back: a character tokenizer for the synthetic task and tiny models,
//! and Hugging Face `tokenizer.json` files for real ones.

use crate::{DataError, Result};
use std::path::{Path, PathBuf};

/// A tokenizer with the three special tokens a [`crate::Loader`] lays batches out with.
///
/// `encode` never adds special tokens (the loader adds BOS and EOS itself, so prompt and answer
/// can be encoded separately and their boundary is exact); `decode` drops special tokens.
pub trait Tokenizer: Send + Sync {
    /// The ids of `text`, without special tokens.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// The text of `ids`, with special tokens left out.
    fn decode(&self, ids: &[u32]) -> Result<String>;
    /// Number of ids (every id is below this).
    fn vocab_size(&self) -> u32;
    /// Padding.
    fn pad_id(&self) -> u32;
    /// Beginning of sequence.
    fn bos_id(&self) -> u32;
    /// End of sequence: generation stops here.
    fn eos_id(&self) -> u32;
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

    fn bos_id(&self) -> u32 {
        Self::BOS
    }

    fn eos_id(&self) -> u32 {
        Self::EOS
    }
}

/// The texts of the special tokens in a `tokenizer.json`, looked up by [`HfTokenizer::from_file`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Padding token, e.g. `<pad>` or Qwen's `<|endoftext|>`.
    pub pad: String,
    /// Beginning-of-sequence token.
    pub bos: String,
    /// End-of-sequence token, e.g. Qwen's `<|im_end|>`.
    pub eos: String,
}

/// A Hugging Face `tokenizer.json` (BPE, WordPiece, Unigram, ...) loaded with the `tokenizers`
/// crate, so ids match what the Python `tokenizers` library produces for the same file.
pub struct HfTokenizer {
    path: PathBuf,
    inner: tokenizers::Tokenizer,
    vocab_size: u32,
    pad: u32,
    bos: u32,
    eos: u32,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size)
            .field("pad", &self.pad)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl HfTokenizer {
    /// Loads `path` and resolves the special tokens' ids.
    pub fn from_file(path: &Path, special: &SpecialTokens) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|error| DataError::Tokenizer {
            path: path.to_path_buf(),
            message: format!(
                "cannot load: {error}; it must be a tokenizer.json written by the tokenizers library"
            ),
        })?;
        let lookup = |role: &'static str, token: &str| {
            inner.token_to_id(token).ok_or_else(|| DataError::MissingSpecialToken {
                path: path.to_path_buf(),
                role,
                token: token.to_owned(),
            })
        };
        let (pad, bos, eos) =
            (lookup("pad", &special.pad)?, lookup("bos", &special.bos)?, lookup("eos", &special.eos)?);
        // Ids can be sparse (added tokens placed past the model's vocabulary), so the size is the
        // largest id + 1, not the number of entries.
        let largest_id = inner.get_vocab(true).into_values().max().unwrap_or(0);
        let vocab_size = largest_id.checked_add(1).ok_or_else(|| DataError::Tokenizer {
            path: path.to_path_buf(),
            message: format!("token id {largest_id} is too large"),
        })?;
        Ok(Self { path: path.to_path_buf(), inner, vocab_size, pad, bos, eos })
    }

    fn library_error(&self, action: &str, error: tokenizers::Error) -> DataError {
        DataError::Tokenizer { path: self.path.clone(), message: format!("{action} failed: {error}") }
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, false).map_err(|error| self.library_error("encode", error))?;
        Ok(encoding.get_ids().to_vec())
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

    fn bos_id(&self) -> u32 {
        self.bos
    }

    fn eos_id(&self) -> u32 {
        self.eos
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
        let special = SpecialTokens { pad: "<pad>".into(), bos: "<s>".into(), eos: "</s>".into() };
        let error =
            HfTokenizer::from_file(Path::new("/nonexistent/tokenizer.json"), &special).expect_err("missing");
        assert!(error.to_string().contains("/nonexistent/tokenizer.json"), "{error}");
    }
}
