//! Compiled programs: [`LoadedExecutable`] (on a client's devices, runnable) and [`Executable`]
//! (compiled for a topology, for inspection only).

use crate::buffer::Buffer;
use crate::client::{ClientInner, Device};
use crate::error::{Error, Result};
use crate::ffi;
use crate::plugin::{Plugin, slice_from};
use std::sync::Arc;

/// Per-device memory a compiled program needs, as the compiler computed it
/// (`xla::CompiledMemoryStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes of the arguments on one device.
    pub argument_bytes: i64,
    /// Bytes of the outputs on one device.
    pub output_bytes: i64,
    /// Bytes of outputs that reuse (donated) argument memory.
    pub alias_bytes: i64,
    /// Bytes of scratch memory during execution.
    pub temp_bytes: i64,
    /// Bytes of generated code.
    pub generated_code_bytes: i64,
    /// Host-memory counterpart of `argument_bytes` (host offloading).
    pub host_argument_bytes: i64,
    /// Host-memory counterpart of `output_bytes`.
    pub host_output_bytes: i64,
    /// Host-memory counterpart of `alias_bytes`.
    pub host_alias_bytes: i64,
    /// Host-memory counterpart of `temp_bytes`.
    pub host_temp_bytes: i64,
    /// Host-memory counterpart of `generated_code_bytes`.
    pub host_generated_code_bytes: i64,
    /// Peak device memory, where the plugin reports it (0 otherwise).
    pub peak_bytes: i64,
}

/// A compiled program that is not loaded on devices: compiled for a [`crate::Topology`].
pub struct Executable {
    plugin: &'static Plugin,
    raw: *mut ffi::PJRT_Executable,
}

// SAFETY: a compiled executable is immutable; the C API allows using it from any thread.
unsafe impl Send for Executable {}
// SAFETY: as above.
unsafe impl Sync for Executable {}

impl Executable {
    pub(crate) fn from_raw(plugin: &'static Plugin, raw: *mut ffi::PJRT_Executable) -> Executable {
        Executable { plugin, raw }
    }

    /// Per-device memory the program needs.
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        let plugin = self.plugin;
        let mut args = new_args!(PJRT_Executable_GetCompiledMemoryStats_Args);
        args.executable = self.raw;
        // SAFETY: the executable is live.
        plugin.check(
            unsafe { call!(plugin, PJRT_Executable_GetCompiledMemoryStats)(&mut args) },
            "PJRT_Executable_GetCompiledMemoryStats",
        )?;
        Ok(MemoryStats {
            argument_bytes: args.argument_size_in_bytes,
            output_bytes: args.output_size_in_bytes,
            alias_bytes: args.alias_size_in_bytes,
            temp_bytes: args.temp_size_in_bytes,
            generated_code_bytes: args.generated_code_size_in_bytes,
            host_argument_bytes: args.host_argument_size_in_bytes,
            host_output_bytes: args.host_output_size_in_bytes,
            host_alias_bytes: args.host_alias_size_in_bytes,
            host_temp_bytes: args.host_temp_size_in_bytes,
            host_generated_code_bytes: args.host_generated_code_size_in_bytes,
            peak_bytes: args.peak_memory_in_bytes,
        })
    }

    /// The number of outputs per device.
    pub fn num_outputs(&self) -> Result<usize> {
        let plugin = self.plugin;
        let mut args = new_args!(PJRT_Executable_NumOutputs_Args);
        args.executable = self.raw;
        // SAFETY: the executable is live.
        plugin.check(
            unsafe { call!(plugin, PJRT_Executable_NumOutputs)(&mut args) },
            "PJRT_Executable_NumOutputs",
        )?;
        Ok(args.num_outputs)
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let plugin = self.plugin;
        let mut args = new_args!(PJRT_Executable_Destroy_Args);
        args.executable = self.raw;
        // SAFETY: this handle is the executable's only owner.
        let result = function!(plugin, PJRT_Executable_Destroy)
            .and_then(|destroy| plugin.check(unsafe { destroy(&mut args) }, "PJRT_Executable_Destroy"));
        if let Err(error) = result {
            tracing::warn!(%error, "destroying a PJRT executable failed");
        }
    }
}

/// One argument of one device's execution.
///
/// A donated buffer moves into the call, so using it afterwards is a compile error:
/// ```compile_fail,E0382
/// # fn run(executable: &pjrt::LoadedExecutable, state: pjrt::Buffer) -> pjrt::Result<()> {
/// executable.execute(vec![vec![pjrt::ExecuteArg::Donate(state)]])?;
/// state.to_host()?;
/// # Ok(()) }
/// ```
pub enum ExecuteArg<'a> {
    /// The buffer stays the caller's; it is never donated, even where the program allows it.
    Borrow(&'a Buffer),
    /// The buffer is consumed: where the program aliases this input to an output
    /// (`tf.aliasing_output`), the output reuses its memory. The handle is gone either way.
    Donate(Buffer),
}

impl ExecuteArg<'_> {
    fn buffer(&self) -> &Buffer {
        match self {
            ExecuteArg::Borrow(buffer) => buffer,
            ExecuteArg::Donate(buffer) => buffer,
        }
    }
}

/// A program compiled for and loaded on a client's devices.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: *mut ffi::PJRT_LoadedExecutable,
    /// The devices in execution order, read once: they never change.
    devices: Vec<Device>,
    num_outputs: usize,
}

// SAFETY: PJRT executables may be executed concurrently from several threads.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl LoadedExecutable {
    pub(crate) fn from_raw(client: Arc<ClientInner>, raw: *mut ffi::PJRT_LoadedExecutable) -> Result<Self> {
        // Owned before anything else can fail, so an error below still destroys it.
        let mut executable = LoadedExecutable { client, raw, devices: Vec::new(), num_outputs: 0 };
        let plugin = executable.client.plugin;
        let mut args = new_args!(PJRT_LoadedExecutable_AddressableDevices_Args);
        args.executable = raw;
        // SAFETY: the executable is live; the array lives as long as it.
        plugin.check(
            unsafe { call!(plugin, PJRT_LoadedExecutable_AddressableDevices)(&mut args) },
            "PJRT_LoadedExecutable_AddressableDevices",
        )?;
        // SAFETY: (pointer, count) from the plugin.
        let raw_devices = unsafe { slice_from(args.addressable_devices, args.num_addressable_devices) };
        executable.devices = raw_devices
            .iter()
            .map(|&device| Device::from_raw(&executable.client, device))
            .collect::<Result<_>>()?;
        executable.num_outputs = executable.executable()?.num_outputs()?;
        Ok(executable)
    }

    /// The compiled (unloaded) view of this executable, for metadata queries.
    fn executable(&self) -> Result<Executable> {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_LoadedExecutable_GetExecutable_Args);
        args.loaded_executable = self.raw;
        // SAFETY: the executable is live; the returned handle is owned by the `Executable`.
        plugin.check(
            unsafe { call!(plugin, PJRT_LoadedExecutable_GetExecutable)(&mut args) },
            "PJRT_LoadedExecutable_GetExecutable",
        )?;
        Ok(Executable::from_raw(plugin, args.executable))
    }

    /// The compiled program as bytes the same plugin can load again
    /// ([`crate::Client::deserialize_and_load`]) without compiling: a compile cache.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let executable = self.executable()?;
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_Executable_Serialize_Args);
        args.executable = executable.raw;
        // SAFETY: the executable is live; the bytes are owned by `serialized_executable` until its
        // deleter runs, which happens after they are copied.
        plugin.check(
            unsafe { call!(plugin, PJRT_Executable_Serialize)(&mut args) },
            "PJRT_Executable_Serialize",
        )?;
        // SAFETY: (pointer, count) from the plugin, alive until the deleter runs below.
        let bytes =
            unsafe { slice_from(args.serialized_bytes.cast::<u8>(), args.serialized_bytes_size) }.to_vec();
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: the plugin's own deleter for the object it returned, called once.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }

    /// The devices the program runs on, in execution order (replica-major, then partition):
    /// [`LoadedExecutable::execute`] takes and returns one list per device in this order.
    pub fn devices(&self) -> Result<Vec<Device>> {
        Ok(self.devices.clone())
    }

    /// The number of outputs per device.
    pub fn num_outputs(&self) -> Result<usize> {
        Ok(self.num_outputs)
    }

    /// Per-device memory the program needs.
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        self.executable()?.memory_stats()
    }

    /// Runs the program on every device and waits until all have finished.
    ///
    /// `args[d]` are the arguments of device `d` of [`LoadedExecutable::devices`], each buffer on
    /// that device; the result is, for each device in the same order, its `num_outputs` buffers.
    /// An argument position is donated only if every device passes [`ExecuteArg::Donate`] for
    /// it; donated handles are consumed whether or not the program aliased them.
    pub fn execute(&self, args: Vec<Vec<ExecuteArg<'_>>>) -> Result<Vec<Vec<Buffer>>> {
        let num_args = self.check_arguments(&args)?;
        let plugin = self.client.plugin;
        let raw_args: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            args.iter().map(|list| list.iter().map(|arg| arg.buffer().raw).collect()).collect();
        let arg_lists: Vec<*const *mut ffi::PJRT_Buffer> =
            raw_args.iter().map(|list| list.as_ptr()).collect();
        let non_donatable: Vec<i64> = (0..num_args)
            .filter(|&i| args.iter().any(|list| matches!(list[i], ExecuteArg::Borrow(_))))
            .map(|i| i as i64)
            .collect();
        // One output array per device, never shared: the plugin writes each device's outputs
        // into its own array.
        let mut outputs: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            (0..self.devices.len()).map(|_| vec![std::ptr::null_mut(); self.num_outputs]).collect();
        let output_lists: Vec<*mut *mut ffi::PJRT_Buffer> =
            outputs.iter_mut().map(|list| list.as_mut_ptr()).collect();
        let mut events: Vec<*mut ffi::PJRT_Event> = vec![std::ptr::null_mut(); self.devices.len()];

        let mut options = new_args!(PJRT_ExecuteOptions);
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();
        let mut execute = new_args!(PJRT_LoadedExecutable_Execute_Args);
        execute.executable = self.raw;
        execute.options = &mut options;
        execute.argument_lists = arg_lists.as_ptr();
        execute.num_devices = self.devices.len();
        execute.num_args = num_args;
        execute.output_lists = output_lists.as_ptr();
        execute.device_complete_events = events.as_mut_ptr();
        // SAFETY: argument and output arrays have the sizes given, are distinct per device, and
        // outlive the call; every buffer belongs to this client and device (checked above).
        let launched = plugin.check(
            unsafe { call!(plugin, PJRT_LoadedExecutable_Execute)(&mut execute) },
            "PJRT_LoadedExecutable_Execute",
        );
        // Own whatever outputs exist before anything can return early, so they are destroyed.
        let results: Vec<Vec<Buffer>> = outputs
            .iter()
            .map(|list| {
                list.iter()
                    .filter(|raw| !raw.is_null())
                    .map(|&raw| Buffer::from_raw(self.client.clone(), raw))
                    .collect()
            })
            .collect();
        launched?;
        let mut completed = Ok(());
        for event in events {
            let awaited = plugin.await_event(event, "PJRT_LoadedExecutable_Execute");
            completed = completed.and(awaited);
        }
        completed?;
        // Donated handles die here, after the devices are done with them.
        drop(args);
        if results.iter().any(|list| list.len() != self.num_outputs) {
            return Err(Error::InvalidArgument {
                what: "execution outputs",
                reason: format!("the plugin returned fewer than {} outputs for a device", self.num_outputs),
            });
        }
        Ok(results)
    }

    /// Refuses argument lists the plugin would misread; returns the number of arguments.
    fn check_arguments(&self, args: &[Vec<ExecuteArg<'_>>]) -> Result<usize> {
        let invalid = |reason: String| Err(Error::InvalidArgument { what: "execute arguments", reason });
        if args.len() != self.devices.len() {
            return invalid(format!(
                "{} argument lists for an executable on {} devices; pass one list per device of devices()",
                args.len(),
                self.devices.len()
            ));
        }
        let num_args = args.first().map_or(0, Vec::len);
        for (index, (list, device)) in args.iter().zip(&self.devices).enumerate() {
            if list.len() != num_args {
                return invalid(format!(
                    "device list {index} has {} arguments but list 0 has {num_args}; every device takes the same arguments",
                    list.len()
                ));
            }
            for (position, arg) in list.iter().enumerate() {
                let buffer = arg.buffer();
                if !Arc::ptr_eq(&buffer.client, &self.client) {
                    return invalid(format!(
                        "argument {position} of device list {index} belongs to another client; copy it to this client first"
                    ));
                }
                if buffer.raw_device()? != device.raw {
                    let on = buffer.device()?;
                    return invalid(format!(
                        "argument {position} of device list {index} is on device {} but list {index} runs on device {}; put each list's buffers on its device",
                        on.id(),
                        device.id()
                    ));
                }
            }
        }
        Ok(num_args)
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let plugin = self.client.plugin;
        let mut args = new_args!(PJRT_LoadedExecutable_Destroy_Args);
        args.executable = self.raw;
        // SAFETY: this handle is the executable's only owner; `execute` waits for completion, so
        // no execution is in flight.
        let result = function!(plugin, PJRT_LoadedExecutable_Destroy)
            .and_then(|destroy| plugin.check(unsafe { destroy(&mut args) }, "PJRT_LoadedExecutable_Destroy"));
        if let Err(error) = result {
            tracing::warn!(%error, "destroying a PJRT loaded executable failed");
        }
    }
}
