//! Pre-tokenized corpora: a flat file of little-endian token ids, read as windows of
//! `seq_len + 1` tokens for next-token prediction (a local file through a memory map, a remote
//! one window's bytes at a time: a host reads only its windows).
//!
//! Window `i` starts at token `i * seq_len`, so consecutive windows overlap by one token and every
//! token after the first is a target exactly once per epoch; a tail shorter than a window is left
//! out.

use crate::files::DataFile;
use crate::source::Prefetched;
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Width of each token id in a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// 2 bytes, little-endian: vocabularies up to 65,536.
    U16,
    /// 4 bytes, little-endian.
    U32,
}

impl TokenDtype {
    /// Bytes per token.
    pub fn size(self) -> u64 {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }

    /// The name used in configs.
    pub fn name(self) -> &'static str {
        match self {
            TokenDtype::U16 => "u16",
            TokenDtype::U32 => "u32",
        }
    }
}

/// A token file. See the module docs.
pub struct TokenFile {
    path: PathBuf,
    file: Arc<dyn DataFile>,
    dtype: TokenDtype,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .field("dtype", &self.dtype)
            .field("tokens", &self.num_tokens())
            .finish()
    }
}

impl TokenFile {
    /// The tokens of `file`, whose size must be a whole number of `dtype` tokens.
    pub fn open(file: Arc<dyn DataFile>, dtype: TokenDtype) -> Result<Self> {
        let path = PathBuf::from(file.name());
        if file.is_empty() {
            return Err(DataError::EmptyFile {
                path,
                what: format!("expected little-endian {} token ids", dtype.name()),
            });
        }
        let bytes = file.len();
        let partial_token_bytes = bytes % dtype.size();
        if partial_token_bytes != 0 {
            return Err(DataError::TokenFileSize {
                path,
                bytes,
                token_bytes: dtype.size(),
                dtype: dtype.name(),
            });
        }
        Ok(Self { path, file, dtype })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tokens in the file.
    pub fn num_tokens(&self) -> u64 {
        self.file.len() / self.dtype.size()
    }

    /// Number of whole windows of `seq_len + 1` tokens (`seq_len > 0`).
    pub fn num_windows(&self, seq_len: usize) -> u64 {
        self.num_tokens().saturating_sub(1) / seq_len.max(1) as u64
    }

    /// The bytes of window `index`.
    fn byte_range(&self, seq_len: usize, index: u64) -> std::ops::Range<u64> {
        let first = index * seq_len as u64 * self.dtype.size();
        first..first + (seq_len as u64 + 1) * self.dtype.size()
    }

    /// Reads windows `indices` (sorted) ahead, all at once.
    pub fn prefetch(&self, seq_len: usize, indices: &[u64]) -> Result<Prefetched> {
        let windows = self.num_windows(seq_len);
        let ranges: Vec<_> = indices
            .iter()
            .filter(|&&index| index < windows)
            .map(|&index| self.byte_range(seq_len, index))
            .collect();
        self.file.prefetch(&ranges)?;
        Ok(Prefetched {
            examples: indices.len() as u64,
            parts: ranges.len() as u64,
            parts_total: windows,
            bytes: ranges.iter().map(|range| range.end - range.start).sum(),
            bytes_total: self.file.len(),
        })
    }

    /// Checks that the file holds at least one window of `seq_len + 1` tokens.
    pub fn check_fits(&self, seq_len: usize) -> Result<()> {
        if self.num_windows(seq_len) == 0 {
            return Err(DataError::TokenFileTooShort {
                path: self.path.clone(),
                tokens: self.num_tokens(),
                needed: seq_len as u64 + 1,
            });
        }
        Ok(())
    }

    /// Writes window `index` (its `seq_len + 1` tokens, which must fit `int32`) into `out`.
    pub fn read_window(&self, seq_len: usize, index: u64, out: &mut [i32]) -> Result<()> {
        let windows = self.num_windows(seq_len);
        if index >= windows || out.len() != seq_len + 1 {
            return Err(DataError::WindowOutOfRange { path: self.path.clone(), index, windows, seq_len });
        }
        let first = index * seq_len as u64;
        let width = self.dtype.size() as usize;
        let bytes = self.file.read(self.byte_range(seq_len, index))?;
        for (offset, (slot, chunk)) in out.iter_mut().zip(bytes.chunks_exact(width)).enumerate() {
            let token = match self.dtype {
                TokenDtype::U16 => u32::from(u16::from_le_bytes([chunk[0], chunk[1]])),
                TokenDtype::U32 => u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]),
            };
            *slot = i32::try_from(token).map_err(|_| DataError::TokenOutOfRange {
                path: self.path.clone(),
                position: first + offset as u64,
                token,
            })?;
        }
        Ok(())
    }

    /// Window `index` as a new vector of `seq_len + 1` tokens.
    pub fn window(&self, seq_len: usize, index: u64) -> Result<Vec<i32>> {
        let mut out = vec![0; seq_len + 1];
        self.read_window(seq_len, index, &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(bytes).expect("write");
        file
    }

    fn open(path: &Path, dtype: TokenDtype) -> Result<TokenFile> {
        TokenFile::open(Arc::new(crate::files::LocalFile::open(path)?), dtype)
    }

    fn u16_file(tokens: impl IntoIterator<Item = u16>) -> tempfile::NamedTempFile {
        file_with(&tokens.into_iter().flat_map(u16::to_le_bytes).collect::<Vec<_>>())
    }

    #[test]
    fn windows_overlap_by_one_token_and_drop_the_tail() {
        // 11 tokens, seq_len 3: windows [0..4], [3..7], [6..10]; token 10 is the dropped tail.
        let file = u16_file(100..111);
        let tokens = open(file.path(), TokenDtype::U16).expect("valid");
        assert_eq!((tokens.num_tokens(), tokens.num_windows(3)), (11, 3));
        assert_eq!(tokens.window(3, 0).expect("w0"), [100, 101, 102, 103]);
        assert_eq!(tokens.window(3, 1).expect("w1"), [103, 104, 105, 106]);
        assert_eq!(tokens.window(3, 2).expect("w2"), [106, 107, 108, 109]);
        let error = tokens.window(3, 3).expect_err("past the end");
        assert!(matches!(error, DataError::WindowOutOfRange { index: 3, windows: 3, .. }), "{error:?}");
    }

    #[test]
    fn reads_little_endian_u16_and_u32() {
        let file = u16_file([0x1234, 0xFFFF, 7]);
        let tokens = open(file.path(), TokenDtype::U16).expect("valid");
        assert_eq!(tokens.window(2, 0).expect("window"), [0x1234, 0xFFFF, 7]);
        let words: Vec<u8> = [0x0102_0304u32, 151_935, 0].iter().flat_map(|t| t.to_le_bytes()).collect();
        let file = file_with(&words);
        let tokens = open(file.path(), TokenDtype::U32).expect("valid");
        assert_eq!(tokens.window(2, 0).expect("window"), [0x0102_0304, 151_935, 0]);
    }

    #[test]
    fn wrong_sizes_and_short_files_are_errors() {
        let file = file_with(&[1, 0, 2, 0, 3, 0]);
        let error = open(file.path(), TokenDtype::U32).expect_err("6 bytes is not u32s");
        assert!(error.to_string().contains("not a multiple of 4"), "{error}");
        let tokens = open(file.path(), TokenDtype::U16).expect("3 u16 tokens");
        tokens.check_fits(2).expect("3 tokens hold one window of 3");
        let error = tokens.check_fits(3).expect_err("needs 4");
        assert!(error.to_string().contains("fewer than one window of seq_len + 1 = 4"), "{error}");
        let empty = file_with(&[]);
        let error = open(empty.path(), TokenDtype::U16).expect_err("empty");
        assert!(matches!(error, DataError::EmptyFile { .. }), "{error:?}");
    }

    #[test]
    fn tokens_beyond_int32_are_errors_with_their_position() {
        let words: Vec<u8> = [5u32, 6, u32::MAX, 8].iter().flat_map(|t| t.to_le_bytes()).collect();
        let file = file_with(&words);
        let tokens = open(file.path(), TokenDtype::U32).expect("valid");
        let error = tokens.window(1, 1).expect_err("token 2 overflows");
        assert!(
            matches!(error, DataError::TokenOutOfRange { position: 2, token: u32::MAX, .. }),
            "{error:?}"
        );
    }
}
