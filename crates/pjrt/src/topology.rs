//! A device topology without a client: compile for devices this machine does not have.

use crate::client::mlir_program;
use crate::compile_options::CompileOptions;
use crate::error::{Error, Result};
use crate::executable::Executable;
use crate::ffi;
use crate::plugin::{Plugin, string_from};

/// The environment libtpu needs to compile ahead of time on a machine without TPUs, set on the
/// process before [`Plugin::load`]: `TPU_SKIP_MDS_QUERY` keeps it from querying the cloud
/// metadata server (what JAX sets); the others only silence warnings about the missing host.
pub const LIBTPU_AOT_ENV: [(&str, &str); 4] = [
    ("TPU_SKIP_MDS_QUERY", "1"),
    ("TPU_ACCELERATOR_TYPE", "v6e-8"),
    ("TPU_WORKER_HOSTNAMES", "localhost"),
    ("TPU_WORKER_ID", "0"),
];

/// A description of devices, e.g. libtpu's `"v6e:2x4"` (eight v6e chips), made with
/// [`Plugin::topology`].
pub struct Topology {
    plugin: &'static Plugin,
    raw: *mut ffi::PJRT_TopologyDescription,
}

// SAFETY: a topology description is immutable after creation.
unsafe impl Send for Topology {}
// SAFETY: as above.
unsafe impl Sync for Topology {}

impl Topology {
    pub(crate) fn from_raw(plugin: &'static Plugin, raw: *mut ffi::PJRT_TopologyDescription) -> Topology {
        Topology { plugin, raw }
    }

    /// The platform, e.g. `"tpu"`.
    pub fn platform_name(&self) -> Result<String> {
        let plugin = self.plugin;
        let mut args = new_args!(PJRT_TopologyDescription_PlatformName_Args);
        args.topology = self.raw;
        // SAFETY: the topology is live; the name lives as long as it.
        plugin.check(
            unsafe { call!(plugin, PJRT_TopologyDescription_PlatformName)(&mut args) },
            "PJRT_TopologyDescription_PlatformName",
        )?;
        // SAFETY: (pointer, size) from the plugin.
        Ok(unsafe { string_from(args.platform_name, args.platform_name_size) })
    }

    /// The number of devices in the topology.
    pub fn num_devices(&self) -> Result<usize> {
        let plugin = self.plugin;
        let mut args = new_args!(PJRT_TopologyDescription_GetDeviceDescriptions_Args);
        args.topology = self.raw;
        // SAFETY: the topology is live.
        plugin.check(
            unsafe { call!(plugin, PJRT_TopologyDescription_GetDeviceDescriptions)(&mut args) },
            "PJRT_TopologyDescription_GetDeviceDescriptions",
        )?;
        Ok(args.num_descriptions)
    }

    /// Compiles a StableHLO module (MLIR text or bytecode) for this topology, without a client.
    pub fn compile(&self, mlir: &[u8], options: &CompileOptions) -> Result<Executable> {
        let encoded = options.encode()?;
        let devices = self.num_devices()?;
        if options.num_devices() > devices as u64 {
            return Err(Error::InvalidCompileOptions {
                field: "num_partitions",
                reason: format!(
                    "{} replicas x {} partitions need {} devices but the topology has {devices}; compile for fewer or use a larger topology",
                    options.num_replicas,
                    options.num_partitions,
                    options.num_devices()
                ),
            });
        }
        let plugin = self.plugin;
        let program = mlir_program(mlir);
        let mut args = new_args!(PJRT_Compile_Args);
        args.topology = self.raw;
        args.program = &program;
        args.compile_options = encoded.as_ptr().cast();
        args.compile_options_size = encoded.len();
        // SAFETY: program bytes, format and options outlive the call; no client is given.
        plugin.check(unsafe { call!(plugin, PJRT_Compile)(&mut args) }, "PJRT_Compile")?;
        Ok(Executable::from_raw(plugin, args.executable))
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let plugin = self.plugin;
        let mut args = new_args!(PJRT_TopologyDescription_Destroy_Args);
        args.topology = self.raw;
        // SAFETY: this handle is the topology's only owner; executables compiled from it do not
        // reference it.
        let result = function!(plugin, PJRT_TopologyDescription_Destroy).and_then(|destroy| {
            plugin.check(unsafe { destroy(&mut args) }, "PJRT_TopologyDescription_Destroy")
        });
        if let Err(error) = result {
            tracing::warn!(%error, "destroying a PJRT topology failed");
        }
    }
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology").field("platform", &self.platform_name().ok()).finish()
    }
}
