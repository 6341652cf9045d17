//! Host memory made to become device memory: see [`HostBuffer`].

use crate::error::{Error, Result};
use std::ops::{Deref, DerefMut};

/// Zeroed host memory for one array that a device buffer can take over
/// ([`Client::buffer_from_host_buffer`](crate::Client::buffer_from_host_buffer)). It is a
/// private anonymous mapping: page-aligned, so the CPU plugin aliases it instead of copying it,
/// and advised for transparent huge pages, so filling a large one costs a page fault per 2 MiB
/// rather than per 4 KiB. Its pages are the kernel's zero page until written.
pub struct HostBuffer {
    /// `None` for zero bytes, which cannot be mapped.
    map: Option<memmap2::MmapMut>,
}

impl HostBuffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Result<HostBuffer> {
        if len == 0 {
            return Ok(HostBuffer { map: None });
        }
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(|source| Error::HostMemory { bytes: len, source })?;
        #[cfg(target_os = "linux")]
        if len >= HUGE_PAGE {
            // Only advice: where the kernel has no huge pages to give, small ones serve.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Ok(HostBuffer { map: Some(map) })
    }

    /// A copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> Result<HostBuffer> {
        let mut buffer = HostBuffer::zeroed(bytes.len())?;
        buffer.copy_from_slice(bytes);
        Ok(buffer)
    }
}

/// A transparent huge page on x86-64 and most arm64 kernels.
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

impl Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer").field("len", &self.len()).finish()
    }
}
