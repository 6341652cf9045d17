//! A PJRT client (one per process and plugin in practice) and its devices.

use crate::buffer::Buffer;
use crate::compile_options::CompileOptions;
use crate::element_type::ElementType;
use crate::error::{Error, Result};
use crate::executable::LoadedExecutable;
use crate::ffi;
use crate::host::HostBuffer;
use crate::named_value::{NamedValue, RawNamedValues};
use crate::plugin::{Plugin, slice_from, string_from};
use std::sync::Arc;

/// The client handle shared by everything created from it, so it is destroyed last.
pub(crate) struct ClientInner {
    pub(crate) plugin: &'static Plugin,
    pub(crate) raw: *mut ffi::PJRT_Client,
}

// SAFETY: a PJRT client is thread-safe (the C API wraps `xla::PjRtClient`, whose methods may be
// called concurrently).
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = new_args!(PJRT_Client_Destroy_Args);
        args.client = self.raw;
        // SAFETY: every buffer, executable and device holds an `Arc` to this, so nothing uses the
        // client any more.
        let result = function!(self.plugin, PJRT_Client_Destroy)
            .and_then(|destroy| self.plugin.check(unsafe { destroy(&mut args) }, "PJRT_Client_Destroy"));
        if let Err(error) = result {
            tracing::warn!(%error, "destroying a PJRT client failed");
        }
    }
}

/// A PJRT client: compiles programs and owns device memory.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl Client {
    pub(crate) fn create(plugin: &'static Plugin, options: &[(&str, NamedValue)]) -> Result<Client> {
        let raw_options = RawNamedValues::new(options);
        let mut args = new_args!(PJRT_Client_Create_Args);
        args.create_options = raw_options.as_ptr();
        args.num_options = raw_options.len();
        // SAFETY: the options outlive the call; no key-value callbacks are given (single process).
        plugin.check(unsafe { call!(plugin, PJRT_Client_Create)(&mut args) }, "PJRT_Client_Create")?;
        Ok(Client { inner: Arc::new(ClientInner { plugin, raw: args.client }) })
    }

    /// The plugin this client came from.
    pub fn plugin(&self) -> &'static Plugin {
        self.inner.plugin
    }

    /// The platform, e.g. `"cpu"` or `"tpu"`.
    pub fn platform_name(&self) -> Result<String> {
        let plugin = self.inner.plugin;
        let mut args = new_args!(PJRT_Client_PlatformName_Args);
        args.client = self.inner.raw;
        // SAFETY: the client is live; the name it returns lives as long as the client.
        plugin.check(
            unsafe { call!(plugin, PJRT_Client_PlatformName)(&mut args) },
            "PJRT_Client_PlatformName",
        )?;
        // SAFETY: (pointer, size) from the plugin.
        Ok(unsafe { string_from(args.platform_name, args.platform_name_size) })
    }

    /// The devices this process can use, in the plugin's order.
    pub fn devices(&self) -> Result<Vec<Device>> {
        let plugin = self.inner.plugin;
        let mut args = new_args!(PJRT_Client_AddressableDevices_Args);
        args.client = self.inner.raw;
        // SAFETY: the client is live; the array lives as long as the client.
        plugin.check(
            unsafe { call!(plugin, PJRT_Client_AddressableDevices)(&mut args) },
            "PJRT_Client_AddressableDevices",
        )?;
        // SAFETY: (pointer, count) from the plugin.
        let raw = unsafe { slice_from(args.addressable_devices, args.num_addressable_devices) };
        raw.iter().map(|&device| Device::from_raw(&self.inner, device)).collect()
    }

    /// The ids of every device in the system, addressable or not (other hosts' devices too).
    fn all_device_ids(&self) -> Result<Vec<i64>> {
        let plugin = self.inner.plugin;
        let mut args = new_args!(PJRT_Client_Devices_Args);
        args.client = self.inner.raw;
        // SAFETY: the client is live; the array lives as long as the client.
        plugin.check(unsafe { call!(plugin, PJRT_Client_Devices)(&mut args) }, "PJRT_Client_Devices")?;
        // SAFETY: (pointer, count) from the plugin.
        let raw = unsafe { slice_from(args.devices, args.num_devices) };
        raw.iter().map(|&device| Ok(Device::from_raw(&self.inner, device)?.id)).collect()
    }

    /// Compiles a StableHLO module (MLIR text or bytecode) for this client's devices.
    pub fn compile(&self, mlir: &[u8], options: &CompileOptions) -> Result<LoadedExecutable> {
        let encoded = options.encode()?;
        // What the plugin would abort on rather than report: more devices than exist, or an
        // assignment naming devices it does not have.
        let ids = self.all_device_ids()?;
        if options.num_devices() > ids.len() as u64 {
            return Err(Error::InvalidCompileOptions {
                field: "num_partitions",
                reason: format!(
                    "{} replicas x {} partitions need {} devices but the client has {}; create the client with more devices (cpu_device_count) or compile for fewer",
                    options.num_replicas,
                    options.num_partitions,
                    options.num_devices(),
                    ids.len()
                ),
            });
        }
        let assigned = options.device_assignment.iter().flatten().flatten();
        if let Some(unknown) = assigned.into_iter().find(|id| !ids.contains(id)) {
            return Err(Error::InvalidCompileOptions {
                field: "device_assignment",
                reason: format!("names device {unknown}, which the client does not have (its ids: {ids:?})"),
            });
        }
        let plugin = self.inner.plugin;
        let program = mlir_program(mlir);
        let mut args = new_args!(PJRT_Client_Compile_Args);
        args.client = self.inner.raw;
        args.program = &program;
        args.compile_options = encoded.as_ptr().cast();
        args.compile_options_size = encoded.len();
        // SAFETY: program bytes, format and options outlive the call; the plugin does not write
        // through `program.code` when compiling.
        plugin.check(unsafe { call!(plugin, PJRT_Client_Compile)(&mut args) }, "PJRT_Client_Compile")?;
        LoadedExecutable::from_raw(self.inner.clone(), args.executable)
    }

    /// Loads a program [`LoadedExecutable::serialize`] wrote, compiled by the same plugin for
    /// the same devices, without compiling it again.
    pub fn deserialize_and_load(&self, serialized: &[u8]) -> Result<LoadedExecutable> {
        let plugin = self.inner.plugin;
        let mut args = new_args!(PJRT_Executable_DeserializeAndLoad_Args);
        args.client = self.inner.raw;
        args.serialized_executable = serialized.as_ptr().cast();
        args.serialized_executable_size = serialized.len();
        // SAFETY: the bytes outlive the call; the plugin copies what it keeps.
        plugin.check(
            unsafe { call!(plugin, PJRT_Executable_DeserializeAndLoad)(&mut args) },
            "PJRT_Executable_DeserializeAndLoad",
        )?;
        LoadedExecutable::from_raw(self.inner.clone(), args.loaded_executable)
    }

    /// Copies a dense row-major host array to `device`. The copy is complete when this returns,
    /// so `data` may be reused at once.
    pub fn buffer_from_host(
        &self,
        data: &[u8],
        ty: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        // SAFETY: the plugin copies `data` during the call, and `data` outlives it.
        let (buffer, done) = unsafe {
            self.start_upload(data, ty, dims, device, ffi::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall)
        }?;
        self.inner.plugin.await_event(done, "PJRT_Client_BufferFromHostBuffer")?;
        Ok(buffer)
    }

    /// Hands `data`, a dense row-major array, to `device`. A plugin that can alias host memory
    /// (the CPU plugin: [`HostBuffer`]s are page-aligned) makes it the device buffer's memory
    /// with no copy and frees it when the buffer is gone; any other copies it and frees it then.
    ///
    /// The plugin never writes to aliased memory: a program that takes such a buffer as a
    /// donated argument copies it first (once, on the first donation), where a buffer from
    /// [`Client::buffer_from_host`] would be reused in place.
    pub fn buffer_from_host_buffer(
        &self,
        data: HostBuffer,
        ty: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        let plugin = self.inner.plugin;
        // Without OnReady the memory's release could not be awaited without blocking until the
        // buffer is destroyed; and an empty mapping has no address to alias.
        if data.is_empty() || function!(plugin, PJRT_Event_OnReady).is_err() {
            return self.buffer_from_host(&data, ty, dims, device);
        }
        // SAFETY: `data`'s mapping stays where it is until `release_when_done` frees it after the
        // plugin's done event, and nothing writes to it meanwhile (this function owns it).
        let (buffer, done) = unsafe {
            self.start_upload(&data, ty, dims, device, ffi::PJRT_HostBufferSemantics_kImmutableZeroCopy)
        }?;
        plugin.release_when_done(done, data)?;
        Ok(buffer)
    }

    /// One `PJRT_Client_BufferFromHostBuffer` of `data` (checked first) under `semantics`: the
    /// buffer, and the event after which the plugin no longer needs `data` (to await, or to
    /// free `data` on).
    ///
    /// # Safety
    /// Under a zero-copy `semantics`, `data` must stay allocated and unwritten until that event
    /// fires; under `kImmutableOnlyDuringCall` it need only outlive the call.
    unsafe fn start_upload(
        &self,
        data: &[u8],
        ty: ElementType,
        dims: &[i64],
        device: &Device,
        semantics: ffi::PJRT_HostBufferSemantics,
    ) -> Result<(Buffer, *mut ffi::PJRT_Event)> {
        self.check_upload(data, ty, dims, device)?;
        let plugin = self.inner.plugin;
        let mut args = new_args!(PJRT_Client_BufferFromHostBuffer_Args);
        args.client = self.inner.raw;
        args.data = data.as_ptr().cast();
        args.type_ = ty.to_raw();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = semantics;
        args.device = device.raw;
        // SAFETY: `data` holds exactly the bytes the dims and type describe (checked above) and
        // lives as long as the caller promised for `semantics`.
        plugin.check(
            unsafe { call!(plugin, PJRT_Client_BufferFromHostBuffer)(&mut args) },
            "PJRT_Client_BufferFromHostBuffer",
        )?;
        Ok((Buffer::from_raw(self.inner.clone(), args.buffer), args.done_with_host_buffer))
    }

    /// Refuses an upload of `data` as `ty[dims]` to `device` that the plugin could not take.
    fn check_upload(&self, data: &[u8], ty: ElementType, dims: &[i64], device: &Device) -> Result<()> {
        if !Arc::ptr_eq(&device.client, &self.inner) {
            return Err(Error::InvalidArgument {
                what: "device",
                reason: format!(
                    "device {} belongs to another client; use one of this client's devices",
                    device.id
                ),
            });
        }
        let expected = dense_size(ty, dims)?;
        if data.len() != expected {
            return Err(Error::InvalidArgument {
                what: "host buffer",
                reason: format!(
                    "{ty:?}{dims:?} needs {expected} bytes but {} were given; pass exactly one dense row-major array",
                    data.len()
                ),
            });
        }
        Ok(())
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("plugin", &self.inner.plugin.path()).finish()
    }
}

/// The bytes of a dense array of `dims` elements of `ty`, refusing negative or overflowing dims.
pub(crate) fn dense_size(ty: ElementType, dims: &[i64]) -> Result<usize> {
    dims.iter()
        .try_fold(ty.size_in_bytes(), |size, &dim| {
            usize::try_from(dim).ok().and_then(|d| size.checked_mul(d))
        })
        .ok_or_else(|| Error::InvalidArgument {
            what: "dimensions",
            reason: format!("{dims:?} has a negative dimension or overflows; use non-negative sizes"),
        })
}

/// A `PJRT_Program` of format `"mlir"` over `code`; valid while `code` is.
pub(crate) fn mlir_program(code: &[u8]) -> ffi::PJRT_Program {
    const FORMAT: &str = "mlir";
    let mut program = new_args!(PJRT_Program);
    // The C field is `char*` because other calls write through it; compiling only reads it.
    program.code = code.as_ptr().cast_mut().cast();
    program.code_size = code.len();
    program.format = FORMAT.as_ptr().cast();
    program.format_size = FORMAT.len();
    program
}

/// One device of a client. Holds the client alive.
#[derive(Clone)]
pub struct Device {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Device,
    id: i64,
    kind: String,
    local_hardware_id: i64,
}

// SAFETY: a device handle is an immutable description owned by the (thread-safe) client.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    pub(crate) fn from_raw(client: &Arc<ClientInner>, raw: *mut ffi::PJRT_Device) -> Result<Device> {
        let plugin = client.plugin;
        let mut description = new_args!(PJRT_Device_GetDescription_Args);
        description.device = raw;
        // SAFETY: `raw` is a device of the live client.
        plugin.check(
            unsafe { call!(plugin, PJRT_Device_GetDescription)(&mut description) },
            "PJRT_Device_GetDescription",
        )?;
        let mut id = new_args!(PJRT_DeviceDescription_Id_Args);
        id.device_description = description.device_description;
        // SAFETY: the description lives as long as the device.
        plugin.check(
            unsafe { call!(plugin, PJRT_DeviceDescription_Id)(&mut id) },
            "PJRT_DeviceDescription_Id",
        )?;
        let mut kind = new_args!(PJRT_DeviceDescription_Kind_Args);
        kind.device_description = description.device_description;
        // SAFETY: as above; the kind string lives as long as the device.
        plugin.check(
            unsafe { call!(plugin, PJRT_DeviceDescription_Kind)(&mut kind) },
            "PJRT_DeviceDescription_Kind",
        )?;
        let mut hardware = new_args!(PJRT_Device_LocalHardwareId_Args);
        hardware.device = raw;
        // SAFETY: `raw` is a device of the live client.
        plugin.check(
            unsafe { call!(plugin, PJRT_Device_LocalHardwareId)(&mut hardware) },
            "PJRT_Device_LocalHardwareId",
        )?;
        Ok(Device {
            client: client.clone(),
            raw,
            id: i64::from(id.id),
            // SAFETY: (pointer, size) from the plugin.
            kind: unsafe { string_from(kind.device_kind, kind.device_kind_size) },
            local_hardware_id: i64::from(hardware.local_hardware_id),
        })
    }

    /// The device id, unique across all hosts; what a device assignment names.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The vendor's name for the kind of device, e.g. `"cpu"` or `"TPU v6 lite"`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The hardware id on this host (e.g. the chip number), or -1 if the plugin has none.
    pub fn local_hardware_id(&self) -> i64 {
        self.local_hardware_id
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("id", &self.id).field("kind", &self.kind).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_sizes() {
        assert_eq!(dense_size(ElementType::F32, &[2, 3]).unwrap(), 24);
        assert_eq!(dense_size(ElementType::BF16, &[]).unwrap(), 2);
        assert_eq!(dense_size(ElementType::S8, &[0, 5]).unwrap(), 0);
        assert!(dense_size(ElementType::F32, &[-1]).is_err());
        assert!(dense_size(ElementType::F64, &[i64::MAX, 4]).is_err());
    }

    #[test]
    fn programs_point_at_the_code() {
        let code = b"module {}";
        let program = mlir_program(code);
        assert_eq!(program.code_size, code.len());
        assert_eq!(program.format_size, 4);
        assert_eq!(program.struct_size, ffi::PJRT_Program_STRUCT_SIZE as usize);
    }
}
