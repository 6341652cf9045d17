//! Device buffers: an array on one device, owned by this handle and freed when it is dropped.

use crate::client::{ClientInner, Device};
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::ffi;
use crate::plugin::slice_from;
use std::sync::Arc;

/// An array in one device's memory.
pub struct Buffer {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Buffer,
}

// SAFETY: PJRT buffers may be read and destroyed from any thread; the plugin orders device work.
unsafe impl Send for Buffer {}
// SAFETY: every `&self` method only reads (metadata, copies to host).
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn from_raw(client: Arc<ClientInner>, raw: *mut ffi::PJRT_Buffer) -> Buffer {
        Buffer { client, raw }
    }

    /// The element type.
    pub fn element_type(&self) -> Result<ElementType> {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Buffer_ElementType_Args);
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        plugin
            .check(unsafe { call!(plugin, PJRT_Buffer_ElementType)(&mut args) }, "PJRT_Buffer_ElementType")?;
        ElementType::from_raw(args.type_)
    }

    /// The dimensions, major first.
    pub fn dims(&self) -> Result<Vec<i64>> {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Buffer_Dimensions_Args);
        args.buffer = self.raw;
        // SAFETY: the buffer is live; the dims live as long as it.
        plugin
            .check(unsafe { call!(plugin, PJRT_Buffer_Dimensions)(&mut args) }, "PJRT_Buffer_Dimensions")?;
        // SAFETY: (pointer, count) from the plugin.
        Ok(unsafe { slice_from(args.dims, args.num_dims) }.to_vec())
    }

    /// Bytes the buffer takes on the device (may exceed the dense size: padding, tiling).
    pub fn on_device_size(&self) -> Result<usize> {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Buffer_OnDeviceSizeInBytes_Args);
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        plugin.check(
            unsafe { call!(plugin, PJRT_Buffer_OnDeviceSizeInBytes)(&mut args) },
            "PJRT_Buffer_OnDeviceSizeInBytes",
        )?;
        Ok(args.on_device_size_in_bytes)
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Result<Device> {
        Device::from_raw(&self.client, self.raw_device()?)
    }

    /// The device handle alone: one call, for the per-argument check in `execute`.
    pub(crate) fn raw_device(&self) -> Result<*mut ffi::PJRT_Device> {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Buffer_Device_Args);
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        plugin.check(unsafe { call!(plugin, PJRT_Buffer_Device)(&mut args) }, "PJRT_Buffer_Device")?;
        Ok(args.device)
    }

    /// The address of the buffer's memory as the plugin reports it. Only good for comparing
    /// identities, e.g. that a donated input's memory was reused for an output.
    pub fn device_address(&self) -> Result<usize> {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Buffer_UnsafePointer_Args);
        args.buffer = self.raw;
        // SAFETY: the buffer is live; the address is only returned, never dereferenced.
        plugin.check(
            unsafe { call!(plugin, PJRT_Buffer_UnsafePointer)(&mut args) },
            "PJRT_Buffer_UnsafePointer",
        )?;
        Ok(args.buffer_pointer)
    }

    /// The buffer's own memory as dense row-major bytes, when the device's memory is the host's
    /// (the CPU plugin) and laid out row-major without tiling; `None` otherwise (copy it with
    /// [`Buffer::to_host`]). Waits for the buffer to be ready first. A peer sends its state
    /// from here with no copy.
    pub fn host_view(&self) -> Result<Option<&[u8]>> {
        let plugin = self.client.plugin;
        let client = crate::client::Client { inner: self.client.clone() };
        if !client.platform_name()?.eq_ignore_ascii_case("cpu") || !self.is_row_major()? {
            return Ok(None);
        }
        let mut ready = new_args!(PJRT_Buffer_ReadyEvent_Args);
        ready.buffer = self.raw;
        // SAFETY: the buffer is live; the event is awaited and destroyed below.
        plugin
            .check(unsafe { call!(plugin, PJRT_Buffer_ReadyEvent)(&mut ready) }, "PJRT_Buffer_ReadyEvent")?;
        plugin.await_event(ready.event, "PJRT_Buffer_ReadyEvent")?;
        let size = self.host_size()?;
        if self.on_device_size()? != size {
            return Ok(None);
        }
        let address = self.device_address()?;
        if size == 0 || address == 0 {
            return Ok(None);
        }
        // SAFETY: on the CPU platform the buffer's memory is host memory of `size` bytes at
        // `address` (dense, row-major: checked above), written completely (ready). It stays
        // allocated and unchanged while `self` is borrowed: only a donation (which takes the
        // `Buffer` by value) or a drop could reuse or free it.
        Ok(Some(unsafe { std::slice::from_raw_parts(address as *const u8, size) }))
    }

    /// Whether the plugin lays the buffer out row-major (major to minor) without tiles; false
    /// when it cannot say.
    fn is_row_major(&self) -> Result<bool> {
        let plugin = self.client.plugin;
        let Ok(get) = function!(plugin, PJRT_Buffer_GetMemoryLayout) else { return Ok(false) };
        let mut args = new_args!(PJRT_Buffer_GetMemoryLayout_Args);
        args.buffer = self.raw;
        // SAFETY: the buffer is live; the layout's arrays live as long as it.
        plugin.check(unsafe { get(&mut args) }, "PJRT_Buffer_GetMemoryLayout")?;
        if args.layout.type_ != ffi::PJRT_Buffer_MemoryLayout_Type_Tiled {
            return Ok(false);
        }
        // SAFETY: the union's `tiled` member is the one `type_` names.
        let tiled = unsafe { args.layout.__bindgen_anon_1.tiled };
        // SAFETY: (pointer, count) from the plugin.
        let minor_to_major = unsafe { slice_from(tiled.minor_to_major, tiled.minor_to_major_size) };
        let rank = minor_to_major.len() as i64;
        Ok(tiled.num_tiles == 0 && minor_to_major.iter().copied().eq((0..rank).rev()))
    }

    /// Copies the buffer to a new host vector: dense, row-major.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut host = vec![0u8; self.host_size()?];
        self.copy_to_host(&mut host)?;
        Ok(host)
    }

    /// Copies the buffer into `dst`, which must have exactly the dense size of the array.
    pub fn to_host_into(&self, dst: &mut [u8]) -> Result<()> {
        let size = self.host_size()?;
        if dst.len() != size {
            return Err(Error::InvalidArgument {
                what: "host destination",
                reason: format!(
                    "the buffer holds {size} bytes but the destination has {}; pass a slice of exactly that size",
                    dst.len()
                ),
            });
        }
        self.copy_to_host(dst)
    }

    /// The dense host size, checked against what the plugin says it will write.
    fn host_size(&self) -> Result<usize> {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Buffer_ToHostBuffer_Args);
        args.src = self.raw;
        // A null destination asks for the size only.
        // SAFETY: the buffer is live.
        plugin.check(
            unsafe { call!(plugin, PJRT_Buffer_ToHostBuffer)(&mut args) },
            "PJRT_Buffer_ToHostBuffer",
        )?;
        plugin.await_event(args.event, "PJRT_Buffer_ToHostBuffer")?;
        Ok(args.dst_size)
    }

    fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Buffer_ToHostBuffer_Args);
        args.src = self.raw;
        args.dst = dst.as_mut_ptr().cast();
        args.dst_size = dst.len();
        // SAFETY: `dst` is writable for `dst_size` bytes and stays borrowed until the copy's
        // event has been awaited below.
        plugin.check(
            unsafe { call!(plugin, PJRT_Buffer_ToHostBuffer)(&mut args) },
            "PJRT_Buffer_ToHostBuffer",
        )?;
        plugin.await_event(args.event, "PJRT_Buffer_ToHostBuffer")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Buffer_Destroy_Args);
        args.buffer = self.raw;
        // SAFETY: this handle is the buffer's only owner; the plugin keeps the memory alive until
        // device work that uses it completes.
        let result = function!(plugin, PJRT_Buffer_Destroy)
            .and_then(|destroy| plugin.check(unsafe { destroy(&mut args) }, "PJRT_Buffer_Destroy"));
        if let Err(error) = result {
            tracing::warn!(%error, "destroying a PJRT buffer failed");
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("element_type", &self.element_type().ok())
            .field("dims", &self.dims().ok())
            .finish()
    }
}
