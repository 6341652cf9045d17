//! One slice's devices, the programs compiled for them, and global arrays held on them.

use crate::compile_cache::{CacheKey, CompileCache};
use crate::error::{Part, PjrtContext, WorkerError};
use bundle::{Bundle, ProgramSpec, TensorSpec};
use mesh::{DType, IciMesh, Region, copy_region};
use pjrt::{
    Client, CompileOptions, Device, ElementType, ExecuteArg, HostBuffer, LoadedExecutable, NamedValue, Plugin,
};

/// A PJRT client over the devices of one slice, in mesh order: device `d` of the mesh is
/// `devices[d]` and runs partition `d` of every program.
pub struct Slice {
    client: Client,
    platform: String,
    devices: Vec<Device>,
    mesh: IciMesh,
    cache: Option<CompileCache>,
}

impl Slice {
    /// Opens the plugin's client for `mesh`. On the CPU plugin the client is created with exactly
    /// as many devices as the mesh has; elsewhere the mesh must fit the devices the host has.
    pub fn open(plugin: &'static Plugin, platform: &str, mesh: &IciMesh) -> Result<Self, WorkerError> {
        let n = mesh.num_devices();
        let options: Vec<(&str, NamedValue)> =
            if platform == "cpu" { vec![("cpu_device_count", NamedValue::Int64(n as i64))] } else { vec![] };
        let client = plugin
            .create_client(&options)
            .context(|| format!("creating a PJRT client from {}", plugin.path().display()))?;
        let found = client.platform_name().context(|| "reading the client's platform".into())?;
        let same = found.eq_ignore_ascii_case(platform) || (platform == "tpu" && found.contains("tpu"));
        if !same {
            return Err(WorkerError::incompatible(
                Part::Plugin,
                format!(
                    "the bundle was lowered for platform '{platform}' but plugin {} is '{found}'; \
                 use the {platform} plugin or export the bundle for {found}",
                    plugin.path().display()
                ),
            ));
        }
        let mut devices = client.devices().context(|| "listing devices".into())?;
        if devices.len() < n {
            return Err(WorkerError::incompatible(
                Part::Plugin,
                format!("mesh {mesh} needs {n} devices but the {found} client has {}", devices.len()),
            ));
        }
        devices.truncate(n);
        Ok(Self { client, platform: found, devices, mesh: mesh.clone(), cache: None })
    }

    /// Keeps compiled programs in `cache` and loads them from it instead of compiling again.
    pub fn with_compile_cache(mut self, cache: CompileCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The slice's mesh.
    pub fn mesh(&self) -> &IciMesh {
        &self.mesh
    }

    /// Compiles one of the bundle's programs for this slice's devices.
    pub fn compile(&self, bundle: &Bundle, name: &str) -> Result<Program, WorkerError> {
        bundle.check_mesh(&self.mesh)?;
        let spec = bundle.program(name)?.clone();
        let mlir = bundle.program_bytes(name)?;
        let ids: Vec<i64> = self.devices.iter().map(Device::id).collect();
        let options = CompileOptions {
            device_assignment: Some(vec![ids.clone()]),
            ..CompileOptions::spmd(self.devices.len() as u32)
        };
        let exe = self.compile_or_load(&mlir, &options, &ids, name)?;
        let order: Vec<i64> =
            exe.devices().context(|| format!("devices of '{name}'"))?.iter().map(Device::id).collect();
        if order != ids {
            return Err(WorkerError::broken(format!(
                "program '{name}' was placed on devices {order:?}, not the requested {ids:?}"
            )));
        }
        let outputs = exe.num_outputs().context(|| format!("outputs of '{name}'"))?;
        if outputs != spec.outputs.len() {
            return Err(WorkerError::incompatible(
                Part::Bundle,
                format!(
                    "program '{name}' has {outputs} outputs but the manifest lists {}; the bundle is inconsistent, export it again",
                    spec.outputs.len()
                ),
            ));
        }
        Ok(Program { name: name.to_string(), exe, spec, devices: ids.len() })
    }

    /// Loads the program from the compile cache when it holds it, else compiles (and keeps it).
    fn compile_or_load(
        &self,
        mlir: &[u8],
        options: &CompileOptions,
        ids: &[i64],
        name: &str,
    ) -> Result<LoadedExecutable, WorkerError> {
        let compile = || self.client.compile(mlir, options).context(|| format!("compiling program '{name}'"));
        let Some(cache) = &self.cache else { return compile() };
        let encoded = options.encode().context(|| format!("compile options of '{name}'"))?;
        let entry = cache.entry(&CacheKey {
            plugin: self.client.plugin(),
            platform: &self.platform,
            program: mlir,
            options: &encoded,
            devices: ids,
        });
        if let Some(bytes) = entry.get() {
            match self.client.deserialize_and_load(&bytes) {
                Ok(exe) => return Ok(exe),
                Err(e) => {
                    tracing::warn!("program '{name}' from the compile cache did not load ({e}); compiling")
                }
            }
        }
        let exe = compile()?;
        match exe.serialize() {
            Ok(bytes) => entry.put(&bytes),
            Err(e) => tracing::debug!("program '{name}' cannot be kept in the compile cache: {e}"),
        }
        Ok(exe)
    }

    /// Places a global array on the slice: each device gets its shard.
    pub fn upload(&self, spec: &TensorSpec, host: &[u8]) -> Result<DeviceArray, WorkerError> {
        let elem = spec.dtype.size();
        let full = Region::full(&spec.shape);
        if host.len() as u64 != full.num_elements() * elem as u64 {
            return Err(WorkerError::broken(format!(
                "'{}' {} {:?} needs {} bytes, got {}",
                spec.name,
                spec.dtype,
                spec.shape,
                full.num_elements() * elem as u64,
                host.len()
            )));
        }
        let ty = element_type(spec.dtype);
        let mut shards = Vec::with_capacity(self.devices.len());
        let mut last: Option<(Region, Vec<u8>)> = None;
        for (d, device) in self.devices.iter().enumerate() {
            let region = spec.sharding.shard_region(&spec.shape, &self.mesh, d);
            let dims: Vec<i64> = region.shape().iter().map(|&s| s as i64).collect();
            let buffer = if region == full {
                self.client.buffer_from_host(host, ty, &dims, device)
            } else {
                // Replicas of a shard are neighbours in mesh order often enough to reuse the copy.
                if last.as_ref().is_none_or(|(r, _)| *r != region) {
                    let mut piece = vec![0u8; region.num_elements() as usize * elem];
                    copy_region(host, &full, &mut piece, &region, &region, elem);
                    last = Some((region, piece));
                }
                let piece = &last.as_ref().expect("just filled").1;
                self.client.buffer_from_host(piece, ty, &dims, device)
            };
            shards.push(buffer.context(|| format!("uploading '{}' to device {d}", spec.name))?);
        }
        Ok(DeviceArray { shards })
    }

    /// Reads a global array back from the slice, assembling it from one copy of each shard.
    pub fn download(&self, spec: &TensorSpec, array: &DeviceArray) -> Result<Vec<u8>, WorkerError> {
        let elem = spec.dtype.size();
        let full = Region::full(&spec.shape);
        let mut host = vec![0u8; full.num_elements() as usize * elem];
        for (d, buffer) in array.shards.iter().enumerate() {
            if spec.sharding.replica_index(&self.mesh, d) != 0 {
                continue;
            }
            let region = spec.sharding.shard_region(&spec.shape, &self.mesh, d);
            if region == full {
                buffer.to_host_into(&mut host).context(|| format!("downloading '{}'", spec.name))?;
                break;
            }
            let piece =
                buffer.to_host().context(|| format!("downloading '{}' from device {d}", spec.name))?;
            if piece.len() as u64 != region.num_elements() * elem as u64 {
                return Err(WorkerError::broken(format!(
                    "device {d} holds {} bytes of '{}', expected {}",
                    piece.len(),
                    spec.name,
                    region.num_elements() * elem as u64
                )));
            }
            copy_region(&piece, &region, &mut host, &full, &region, elem);
        }
        Ok(host)
    }

    /// Reads device `device`'s shard of a global array, row-major: what a checkpoint writes,
    /// without assembling the whole array on the host.
    pub fn download_shard(
        &self,
        spec: &TensorSpec,
        array: &DeviceArray,
        device: usize,
    ) -> Result<Vec<u8>, WorkerError> {
        let region = spec.sharding.shard_region(&spec.shape, &self.mesh, device);
        let want = region.num_elements() * spec.dtype.size() as u64;
        let buffer = array.shards.get(device).ok_or_else(|| {
            WorkerError::broken(format!("device {device} is not on this slice of {}", self.devices.len()))
        })?;
        let piece =
            buffer.to_host().context(|| format!("downloading '{}' from device {device}", spec.name))?;
        if piece.len() as u64 != want {
            return Err(WorkerError::broken(format!(
                "device {device} holds {} bytes of '{}', expected {want}",
                piece.len(),
                spec.name
            )));
        }
        Ok(piece)
    }

    /// Places a global array from its shards: `shards[d]` is device `d`'s region under the spec's
    /// sharding, row-major (a restore reads exactly these regions, never the whole array).
    pub fn upload_shards(&self, spec: &TensorSpec, shards: &[&[u8]]) -> Result<DeviceArray, WorkerError> {
        if shards.len() != self.devices.len() {
            return Err(WorkerError::broken(format!(
                "'{}' needs one shard per device of {}, got {}",
                spec.name,
                self.mesh,
                shards.len()
            )));
        }
        let ty = element_type(spec.dtype);
        let mut buffers = Vec::with_capacity(shards.len());
        for (d, (device, piece)) in self.devices.iter().zip(shards).enumerate() {
            let region = spec.sharding.shard_region(&spec.shape, &self.mesh, d);
            check_shard(spec, d, &region, piece)?;
            let dims: Vec<i64> = region.shape().iter().map(|&s| s as i64).collect();
            let buffer = self.client.buffer_from_host(piece, ty, &dims, device);
            buffers.push(buffer.context(|| format!("uploading '{}' to device {d}", spec.name))?);
        }
        Ok(DeviceArray { shards: buffers })
    }

    /// Places a global array one device at a time: `shard(device, region)` gives the device's
    /// region of the array (row-major, under the spec's sharding) in host memory the device
    /// takes over (aliased by the CPU plugin, no copy), and each is placed before the next is
    /// asked for. A replica whose region repeats the previous device's is copied from it.
    pub fn upload_each(
        &self,
        spec: &TensorSpec,
        mut shard: impl FnMut(usize, &Region) -> Result<HostBuffer, WorkerError>,
    ) -> Result<DeviceArray, WorkerError> {
        let ty = element_type(spec.dtype);
        let mut buffers: Vec<pjrt::Buffer> = Vec::with_capacity(self.devices.len());
        let mut last: Option<Region> = None;
        for (d, device) in self.devices.iter().enumerate() {
            let region = spec.sharding.shard_region(&spec.shape, &self.mesh, d);
            let piece = match (&last, buffers.last()) {
                (Some(previous), Some(buffer)) if *previous == region => {
                    let bytes = region.num_elements() as usize * spec.dtype.size();
                    let mut piece = HostBuffer::zeroed(bytes)
                        .context(|| format!("placing '{}' on device {d}", spec.name))?;
                    buffer
                        .to_host_into(&mut piece)
                        .context(|| format!("copying a replica of '{}'", spec.name))?;
                    piece
                }
                _ => shard(d, &region)?,
            };
            check_shard(spec, d, &region, &piece)?;
            let dims: Vec<i64> = region.shape().iter().map(|&s| s as i64).collect();
            let buffer = self.client.buffer_from_host_buffer(piece, ty, &dims, device);
            buffers.push(buffer.context(|| format!("uploading '{}' to device {d}", spec.name))?);
            last = Some(region);
        }
        Ok(DeviceArray { shards: buffers })
    }

    /// Reads a replicated scalar `float32[]` result.
    pub fn read_f32(&self, array: &DeviceArray) -> Result<f32, WorkerError> {
        let mut bytes = [0u8; 4];
        array.shards[0].to_host_into(&mut bytes).context(|| "reading a scalar result".into())?;
        Ok(f32::from_le_bytes(bytes))
    }

    /// Uploads a scalar to every device.
    pub fn scalar(&self, spec: &TensorSpec, bytes: [u8; 4]) -> Result<DeviceArray, WorkerError> {
        self.upload(spec, &bytes)
    }
}

/// A global array on a slice: one buffer per device, in mesh order, each holding that device's
/// shard.
pub struct DeviceArray {
    shards: Vec<pjrt::Buffer>,
}

impl DeviceArray {
    /// Device `device`'s shard.
    pub fn shard(&self, device: usize) -> Option<&pjrt::Buffer> {
        self.shards.get(device)
    }
}

/// How a program takes one argument.
pub enum Arg<'a> {
    /// The caller keeps the array.
    Borrow(&'a DeviceArray),
    /// The program consumes the array and may reuse its memory for an output.
    Donate(DeviceArray),
}

/// A program compiled for a slice.
pub struct Program {
    name: String,
    exe: LoadedExecutable,
    spec: ProgramSpec,
    devices: usize,
}

impl Program {
    /// The program's signature from the manifest.
    pub fn spec(&self) -> &ProgramSpec {
        &self.spec
    }

    /// Exact per-device memory of the compiled program.
    pub fn memory_stats(&self) -> Result<pjrt::MemoryStats, WorkerError> {
        self.exe.memory_stats().context(|| format!("memory stats of '{}'", self.name))
    }

    /// Runs the program on every device of the slice; returns its outputs in manifest order.
    pub fn run(&self, args: Vec<Arg<'_>>) -> Result<Vec<DeviceArray>, WorkerError> {
        if args.len() != self.spec.inputs.len() {
            return Err(WorkerError::broken(format!(
                "program '{}' takes {} arguments, got {}",
                self.name,
                self.spec.inputs.len(),
                args.len()
            )));
        }
        let mut per_device: Vec<Vec<ExecuteArg<'_>>> =
            (0..self.devices).map(|_| Vec::with_capacity(args.len())).collect();
        for arg in args {
            match arg {
                Arg::Borrow(a) => {
                    for (d, b) in a.shards.iter().enumerate() {
                        per_device[d].push(ExecuteArg::Borrow(b));
                    }
                }
                Arg::Donate(a) => {
                    for (d, b) in a.shards.into_iter().enumerate() {
                        per_device[d].push(ExecuteArg::Donate(b));
                    }
                }
            }
        }
        let outputs = self.exe.execute(per_device).context(|| format!("running '{}'", self.name))?;
        let mut arrays: Vec<DeviceArray> = (0..self.spec.outputs.len())
            .map(|_| DeviceArray { shards: Vec::with_capacity(outputs.len()) })
            .collect();
        for device_outputs in outputs {
            for (i, buffer) in device_outputs.into_iter().enumerate() {
                arrays[i].shards.push(buffer);
            }
        }
        Ok(arrays)
    }
}

fn element_type(dtype: DType) -> ElementType {
    match dtype {
        DType::Float16 => ElementType::F16,
        DType::Bfloat16 => ElementType::BF16,
        DType::Float32 => ElementType::F32,
        DType::Float64 => ElementType::F64,
        DType::Int8 => ElementType::S8,
        DType::Int32 => ElementType::S32,
        DType::Int64 => ElementType::S64,
        DType::Uint8 => ElementType::U8,
        DType::Uint32 => ElementType::U32,
        DType::Bool => ElementType::Pred,
    }
}

/// Refuses a shard whose size is not that of device `d`'s region of `spec`.
fn check_shard(spec: &TensorSpec, d: usize, region: &Region, piece: &[u8]) -> Result<(), WorkerError> {
    let want = region.num_elements() * spec.dtype.size() as u64;
    if piece.len() as u64 != want {
        return Err(WorkerError::broken(format!(
            "shard of '{}' for device {d} has {} bytes, its region {:?} needs {want}",
            spec.name,
            piece.len(),
            region.ranges()
        )));
    }
    Ok(())
}
