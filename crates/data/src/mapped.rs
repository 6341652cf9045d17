//! Read-only memory maps of data files: the crate's only `unsafe`.

use crate::{DataError, Result};
use memmap2::Mmap;
use std::fs::File;
use std::path::Path;

/// Maps `path` read-only. Returns `None` for an empty file (which cannot be mapped portably).
///
/// Data files are treated as immutable inputs of a run: a file truncated while mapped would turn
/// reads into SIGBUS, which is the same contract every mmap-based data loader has.
pub(crate) fn map_readonly(path: &Path) -> Result<Option<Mmap>> {
    let io_error = |source| DataError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io_error)?;
    let len = file.metadata().map_err(io_error)?.len();
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: the map is read-only and private to this process; the file is not modified by
    // this crate, and data files are documented as immutable for the life of a run.
    #[allow(unsafe_code)]
    let map = unsafe { Mmap::map(&file) }.map_err(io_error)?;
    Ok(Some(map))
}
