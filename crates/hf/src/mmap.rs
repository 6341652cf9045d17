//! Read-only memory maps of byte ranges of local safetensors files (with `convert.rs`'s SSE2
//! transposes, the crate's `unsafe`).
//!
//! A range is mapped for as long as one copy needs it and unmapped right after, so the pages a
//! load touches leave the process's resident set again (the page cache keeps them) and a load's
//! footprint stays at the shards it builds, whatever the model's size.

use crate::{HfError, Result};
use memmap2::{Mmap, MmapOptions};
use std::fs::File;
use std::ops::Range;
use std::path::Path;

/// Maps bytes `range` of `file` (at `path`, for messages) read-only. The file's size was checked
/// against its header when the model was opened.
pub(crate) fn map_range(file: &File, range: Range<u64>, path: &Path) -> Result<Mapped> {
    if range.is_empty() {
        return Ok(Mapped(None));
    }
    let mut options = MmapOptions::new();
    options.offset(range.start).len((range.end - range.start) as usize).populate();
    // SAFETY: the map is read-only and private to this process, and this crate never writes the
    // file. Model directories are inputs that must not change while a load reads them (a file
    // truncated under a map turns reads into SIGBUS): the same contract as every mmap-based
    // loader, transformers' safetensors path included.
    #[allow(unsafe_code)]
    let map = unsafe { options.map(file) }.map_err(|e| HfError::io(path.display(), e))?;
    Ok(Mapped(Some(map)))
}

/// A mapped range; unmapped when dropped.
pub(crate) struct Mapped(Option<Mmap>);

impl std::ops::Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}
