//! Host memory made to become device memory: see [`HostBuffer`].

use crate::error::{Error, Result};
use std::ops::{Deref, DerefMut};

/// Zeroed host memory for one array that a device buffer can take over
/// ([`Client::buffer_from_host_buffer`](crate::Client::buffer_from_host_buffer)). It is a
/// private anonymous mapping: page-aligned, so the CPU plugin aliases it instead of copying it.
/// Its pages are the kernel's zero page until written.
///
/// It is not advised for transparent huge pages: where a hypervisor takes back free memory
/// (virtio-balloon free page reporting, as on this project's Firecracker VMs), huge pages come
/// from the blocks it took, and filling 3.44 GB of them measured 1.4-4.1 s against 0.9-1.4 s
/// in small pages (docs/MODELS.md, "Loading speed").
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
        Ok(HostBuffer { map: Some(map) })
    }

    /// A copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> Result<HostBuffer> {
        let mut buffer = HostBuffer::zeroed(bytes.len())?;
        buffer.copy_from_slice(bytes);
        Ok(buffer)
    }
}

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
