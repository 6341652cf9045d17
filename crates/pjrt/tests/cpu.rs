//! Against the real CPU plugin (xla-cpu-pjrt, API 0.81) and JAX's own outputs.

mod common;

use common::*;
use mesh::{IciMesh, Region, Sharding, copy_region};
use pjrt::{
    Buffer, Client, CompileOptions, Device, ElementType, Error, ErrorCode, ExecuteArg, HostBuffer, Plugin,
};
use serde_json::Value;

#[test]
fn loading_twice_returns_the_same_plugin() {
    let first = cpu_plugin();
    // Another spelling of the same file: the registry keys on the canonical path.
    let path = cpu_plugin_path();
    let dotted = path.parent().unwrap().join(".").join(path.file_name().unwrap());
    let second = Plugin::load(&dotted).unwrap();
    assert!(std::ptr::eq(first, second));
    assert_eq!(first.path(), std::fs::canonicalize(&path).unwrap());
    assert_eq!(first.api_version(), (0, 81));
}

#[test]
fn a_client_has_the_requested_number_of_devices() {
    let client = cpu_client(4);
    assert_eq!(client.platform_name().unwrap(), "cpu");
    let devices = client.devices().unwrap();
    assert_eq!(devices.len(), 4);
    let ids: Vec<i64> = devices.iter().map(Device::id).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert!(devices.iter().all(|d| d.kind() == "cpu"), "{devices:?}");
    assert_eq!(cpu_client(1).devices().unwrap().len(), 1);
}

#[test]
fn host_buffers_round_trip() {
    let client = cpu_client(2);
    let device = &client.devices().unwrap()[1];
    let values: Vec<u8> = (0..24u8).collect();
    let buffer = client.buffer_from_host(&values, ElementType::S8, &[2, 3, 4], device).unwrap();
    assert_eq!(read(&buffer, ElementType::S8, &[2, 3, 4]), values);
    assert_eq!(buffer.device().unwrap(), *device);
    assert_eq!(buffer.on_device_size().unwrap(), 24);
    let mut into = vec![0u8; 24];
    buffer.to_host_into(&mut into).unwrap();
    assert_eq!(into, values);

    let error = buffer.to_host_into(&mut [0u8; 23]).unwrap_err();
    assert!(error.to_string().contains("holds 24 bytes but the destination has 23"), "{error}");
    let error = client.buffer_from_host(&values, ElementType::F32, &[2, 3, 4], device).unwrap_err();
    assert!(error.to_string().contains("needs 96 bytes but 24 were given"), "{error}");
    let other = cpu_client(1);
    let error = other.buffer_from_host(&values, ElementType::S8, &[24], device).unwrap_err();
    assert!(error.to_string().contains("belongs to another client"), "{error}");
}

/// Uploads the fixture inputs described in `inputs` to `device`.
fn upload(client: &Client, inputs: &Value, device: &Device) -> Vec<Buffer> {
    inputs
        .as_array()
        .unwrap()
        .iter()
        .map(|input| {
            let t = tensor(input);
            client.buffer_from_host(&t.bytes, t.ty, &t.dims, device).unwrap()
        })
        .collect()
}

fn run_single(client: &Client, module: &str) -> Vec<Vec<u8>> {
    let fixture = &manifest()["single"];
    let executable = client.compile(&fixture_bytes(module), &CompileOptions::default()).unwrap();
    let devices = executable.devices().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(executable.num_outputs().unwrap(), 3);
    let inputs = upload(client, &fixture["inputs"], &devices[0]);
    let mut outputs = executable.execute(vec![inputs.iter().map(ExecuteArg::Borrow).collect()]).unwrap();
    assert_eq!(outputs.len(), 1);
    let outputs = outputs.remove(0);
    fixture["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&outputs)
        .map(|(expected, buffer)| {
            let t = tensor(expected);
            read(buffer, t.ty, &t.dims)
        })
        .collect()
}

#[test]
fn a_single_device_program_matches_jax() {
    let client = cpu_client(1);
    let fixture = &manifest()["single"];
    let expected: Vec<Tensor> = fixture["outputs"].as_array().unwrap().iter().map(tensor).collect();
    let text = run_single(&client, "single.mlir");
    let bytecode = run_single(&client, "single.mlirbc");
    // Text and bytecode are the same module: bitwise the same results.
    assert_eq!(text, bytecode);
    assert_close(&text[0], &expected[0].bytes, 1e-6, "tanh(x @ y) + s");
    assert_close(&text[1], &expected[1].bytes, 1e-6, "sum(x, 1)");
    assert_eq!(text[2], expected[2].bytes, "max(s) * 3 (int32)");
    // The same inputs again: bitwise the same outputs.
    assert_eq!(run_single(&client, "single.mlirbc"), text);
}

/// Splits `global` into the shard each of the mesh's devices holds.
fn shards(global: &[u8], shape: &[u64], sharding: &Sharding, mesh: &IciMesh, elem: usize) -> Vec<Vec<u8>> {
    let whole = Region::full(shape);
    (0..mesh.num_devices())
        .map(|device| {
            let region = sharding.shard_region(shape, mesh, device);
            let mut shard = vec![0u8; region.num_elements() as usize * elem];
            copy_region(global, &whole, &mut shard, &region, &region, elem);
            shard
        })
        .collect()
}

/// Assembles a global array from every device's shard.
fn assemble(pieces: &[Vec<u8>], shape: &[u64], sharding: &Sharding, mesh: &IciMesh, elem: usize) -> Vec<u8> {
    let whole = Region::full(shape);
    let mut global = vec![0u8; whole.num_elements() as usize * elem];
    for (device, piece) in pieces.iter().enumerate() {
        let region = sharding.shard_region(shape, mesh, device);
        copy_region(piece, &region, &mut global, &whole, &region, elem);
    }
    global
}

fn sharding_of(description: &Value) -> Sharding {
    let dims = description["sharding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|axes| axes.as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect())
        .collect();
    Sharding::new(dims)
}

fn shape_of(description: &Value) -> Vec<u64> {
    description["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect()
}

/// Runs sharded.mlirbc on four devices; partition `p` runs on `executable.devices()[p]`.
fn run_sharded(client: &Client, options: &CompileOptions) -> (Vec<Vec<u8>>, Vec<i64>) {
    let fixture = &manifest()["sharded"];
    let mesh = IciMesh::new([("fsdp", 2), ("tp", 2)]).unwrap();
    let executable = client.compile(&fixture_bytes("sharded.mlirbc"), options).unwrap();
    let devices = executable.devices().unwrap();
    assert_eq!(devices.len(), 4);
    assert_eq!(executable.num_outputs().unwrap(), 2);

    let mut per_device: Vec<Vec<Buffer>> = devices.iter().map(|_| Vec::new()).collect();
    for input in fixture["inputs"].as_array().unwrap() {
        let t = tensor(input);
        let shape = shape_of(input);
        let sharding = sharding_of(input);
        let pieces = shards(&t.bytes, &shape, &sharding, &mesh, 4);
        let piece_dims: Vec<i64> = sharding.shard_shape(&shape, &mesh).iter().map(|&d| d as i64).collect();
        for (partition, piece) in pieces.iter().enumerate() {
            per_device[partition]
                .push(client.buffer_from_host(piece, t.ty, &piece_dims, &devices[partition]).unwrap());
        }
    }
    let args = per_device.iter().map(|list| list.iter().map(ExecuteArg::Borrow).collect()).collect();
    let outputs = executable.execute(args).unwrap();
    for (list, device) in outputs.iter().zip(&devices) {
        for buffer in list {
            assert_eq!(buffer.device().unwrap(), *device, "outputs come back in devices() order");
        }
    }
    let globals = fixture["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(index, expected)| {
            let shape = shape_of(expected);
            let sharding = sharding_of(expected);
            let pieces: Vec<Vec<u8>> = outputs.iter().map(|list| list[index].to_host().unwrap()).collect();
            assemble(&pieces, &shape, &sharding, &mesh, 4)
        })
        .collect();
    (globals, devices.iter().map(Device::id).collect())
}

#[test]
fn a_program_sharded_over_four_devices_matches_jax() {
    let client = cpu_client(4);
    let fixture = &manifest()["sharded"];
    let (outputs, order) = run_sharded(&client, &CompileOptions::spmd(4));
    assert_eq!(order, [0, 1, 2, 3]);
    let expected: Vec<Tensor> = fixture["outputs"].as_array().unwrap().iter().map(tensor).collect();
    assert_close(&outputs[0], &expected[0].bytes, 1e-6, "tanh(x @ w)");
    assert_close(&outputs[1], &expected[1].bytes, 1e-5, "sum(h * h)");
    let (again, _) = run_sharded(&client, &CompileOptions::spmd(4));
    assert_eq!(again, outputs, "same inputs, bitwise same outputs");
}

#[test]
fn a_device_assignment_sets_the_execution_order() {
    let client = cpu_client(4);
    let options =
        CompileOptions { device_assignment: Some(vec![vec![3, 1, 2, 0]]), ..CompileOptions::spmd(4) };
    let (outputs, order) = run_sharded(&client, &options);
    assert_eq!(order, [3, 1, 2, 0]);
    let (default_order, _) = run_sharded(&client, &CompileOptions::spmd(4));
    assert_eq!(outputs, default_order, "where a partition runs does not change the result");
}

/// acc + 2x, with `acc` marked donated (`tf.aliasing_output = 0`).
struct Accumulate {
    client: Client,
    executable: pjrt::LoadedExecutable,
    device: Device,
    acc0: Tensor,
    x: Buffer,
}

fn accumulate() -> Accumulate {
    let client = cpu_client(1);
    let fixture = &manifest()["accumulate"];
    let executable = client.compile(&fixture_bytes("accumulate.mlir"), &CompileOptions::default()).unwrap();
    let device = executable.devices().unwrap().remove(0);
    let acc0 = tensor(&fixture["inputs"][0]);
    let x = tensor(&fixture["inputs"][1]);
    let x = client.buffer_from_host(&x.bytes, x.ty, &x.dims, &device).unwrap();
    Accumulate { client, executable, device, acc0, x }
}

fn expected_one_step(acc: &Accumulate) -> Vec<u8> {
    let x = f32s(&acc.x.to_host().unwrap());
    let sum: Vec<f32> = f32s(&acc.acc0.bytes).iter().zip(&x).map(|(a, x)| a + x * 2.0).collect();
    f32_bytes(&sum)
}

#[test]
fn a_borrowed_input_stays_readable_and_a_donated_one_is_reused() {
    let acc = accumulate();
    let expected = expected_one_step(&acc);
    let upload =
        || acc.client.buffer_from_host(&acc.acc0.bytes, acc.acc0.ty, &acc.acc0.dims, &acc.device).unwrap();

    let borrowed = upload();
    let outputs = acc
        .executable
        .execute(vec![vec![ExecuteArg::Borrow(&borrowed), ExecuteArg::Borrow(&acc.x)]])
        .unwrap();
    assert_eq!(outputs[0][0].to_host().unwrap(), expected);
    assert_eq!(borrowed.to_host().unwrap(), acc.acc0.bytes, "a borrowed input keeps its value");
    assert_ne!(outputs[0][0].device_address().unwrap(), borrowed.device_address().unwrap());

    let donated = upload();
    let address = donated.device_address().unwrap();
    // `donated` moves into the call: using it afterwards does not compile (see the doc test on
    // `ExecuteArg`), so the only way to see it is through the output that reused its memory.
    let outputs =
        acc.executable.execute(vec![vec![ExecuteArg::Donate(donated), ExecuteArg::Borrow(&acc.x)]]).unwrap();
    assert_eq!(outputs[0][0].to_host().unwrap(), expected);
    assert_eq!(outputs[0][0].device_address().unwrap(), address, "the output reuses the donated memory");
    assert_eq!(acc.x.to_host().unwrap().len(), 64, "the borrowed argument is untouched");
}

#[test]
fn a_host_buffer_becomes_device_memory_without_a_copy() {
    let acc = accumulate();
    let expected = expected_one_step(&acc);
    let host = || HostBuffer::copy_of(&acc.acc0.bytes).unwrap();
    let give = |data: HostBuffer| {
        let address = data.as_ptr() as usize;
        let buffer =
            acc.client.buffer_from_host_buffer(data, acc.acc0.ty, &acc.acc0.dims, &acc.device).unwrap();
        (buffer, address)
    };

    let (borrowed, address) = give(host());
    assert_eq!(borrowed.device_address().unwrap(), address, "the CPU plugin aliases the host buffer");
    let outputs = acc
        .executable
        .execute(vec![vec![ExecuteArg::Borrow(&borrowed), ExecuteArg::Borrow(&acc.x)]])
        .unwrap();
    assert_eq!(outputs[0][0].to_host().unwrap(), expected);
    assert_eq!(borrowed.to_host().unwrap(), acc.acc0.bytes);

    // Donated, aliased memory is copied rather than written: the plugin never writes to it.
    let (donated, address) = give(host());
    let outputs =
        acc.executable.execute(vec![vec![ExecuteArg::Donate(donated), ExecuteArg::Borrow(&acc.x)]]).unwrap();
    assert_eq!(outputs[0][0].to_host().unwrap(), expected);
    assert_ne!(outputs[0][0].device_address().unwrap(), address);

    let error = acc.client.buffer_from_host_buffer(host(), ElementType::F32, &[3], &acc.device).unwrap_err();
    assert!(error.to_string().contains("needs 12 bytes but 64 were given"), "{error}");
    let empty = acc.client.buffer_from_host_buffer(
        HostBuffer::zeroed(0).unwrap(),
        ElementType::F32,
        &[0],
        &acc.device,
    );
    assert_eq!(empty.unwrap().to_host().unwrap(), Vec::<u8>::new());
}

#[test]
fn a_cpu_buffer_is_read_in_place_and_an_output_once_it_is_ready() {
    let acc = accumulate();
    let expected = expected_one_step(&acc);
    let input =
        acc.client.buffer_from_host(&acc.acc0.bytes, acc.acc0.ty, &acc.acc0.dims, &acc.device).unwrap();
    let view = input.host_view().unwrap().expect("CPU memory is host memory");
    assert_eq!(view, &acc.acc0.bytes[..]);
    assert_eq!(view.as_ptr() as usize, input.device_address().unwrap(), "no copy");
    // An output is read only once the execution that writes it is done.
    let outputs =
        acc.executable.execute(vec![vec![ExecuteArg::Borrow(&input), ExecuteArg::Borrow(&acc.x)]]).unwrap();
    assert_eq!(outputs[0][0].host_view().unwrap().unwrap(), &expected[..]);
    let scalar = acc.client.buffer_from_host(&[], ElementType::F32, &[0], &acc.device).unwrap();
    assert_eq!(scalar.host_view().unwrap(), None, "an empty buffer has no memory to show");
}

#[test]
fn a_host_buffer_is_freed_when_its_device_buffer_is() {
    let client = cpu_client(1);
    let device = &client.devices().unwrap()[0];
    const MIB: usize = 1 << 20;
    let before = resident_bytes();
    for round in 0..8u8 {
        let mut data = HostBuffer::zeroed(128 * MIB).unwrap();
        data.fill(round);
        let buffer =
            client.buffer_from_host_buffer(data, ElementType::U8, &[128 * MIB as i64], device).unwrap();
        if round == 0 {
            assert!(buffer.to_host().unwrap().iter().all(|&b| b == 0));
        }
        drop(buffer);
    }
    // Eight rounds of 128 MiB: kept, they would add 1 GiB; freed, at most the last one's.
    let grown = resident_bytes().saturating_sub(before);
    assert!(grown < 300 * MIB as u64, "resident memory grew by {} MiB", grown / MIB as u64);
}

/// The process's resident set, from /proc.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn chained_executions_keep_buffers_on_device() {
    let acc = accumulate();
    let fixture = &manifest()["accumulate"];
    let steps = fixture["steps"].as_u64().unwrap();
    let mut state =
        acc.client.buffer_from_host(&acc.acc0.bytes, acc.acc0.ty, &acc.acc0.dims, &acc.device).unwrap();
    for _ in 0..steps {
        let mut outputs = acc
            .executable
            .execute(vec![vec![ExecuteArg::Donate(state), ExecuteArg::Borrow(&acc.x)]])
            .unwrap();
        state = outputs.remove(0).remove(0);
    }
    let expected = tensor(&fixture["after_steps"]);
    assert_eq!(read(&state, ElementType::F32, &[16]), expected.bytes, "{steps} steps of acc + 2x, bitwise");
}

#[test]
fn cpu_memory_stats_match_jax() {
    let client = cpu_client(1);
    let jax = &manifest()["single"]["jax_memory"];
    let executable = client.compile(&fixture_bytes("single.mlirbc"), &CompileOptions::default()).unwrap();
    let stats = executable.memory_stats().unwrap();
    // x f32[4,8] + y f32[8,3] + s i32[3] = 128 + 96 + 12 bytes.
    assert_eq!(stats.argument_bytes, 236);
    assert_eq!(stats.argument_bytes, jax["argument_bytes"].as_i64().unwrap());
    assert_eq!(stats.output_bytes, jax["output_bytes"].as_i64().unwrap());
    assert_eq!(stats.alias_bytes, 0);

    let donating = client.compile(&fixture_bytes("accumulate.mlir"), &CompileOptions::default()).unwrap();
    assert_eq!(donating.memory_stats().unwrap().alias_bytes, 64, "acc f32[16] is aliased to the output");
}

#[test]
fn invalid_mlir_is_a_typed_error() {
    let client = cpu_client(1);
    let error = client.compile(b"this is not a module", &CompileOptions::default()).err().unwrap();
    match &error {
        Error::Pjrt { function, code, message } => {
            assert_eq!(*function, "PJRT_Client_Compile");
            // The CPU plugin reports parse failures as UNKNOWN; the message says what failed.
            assert_ne!(*code, ErrorCode::Other(0), "{message}");
            assert!(message.contains("error: custom op 'this' is unknown"), "{message}");
        }
        other => panic!("expected a plugin error, got {other}"),
    }
}

#[test]
fn invalid_compile_options_are_refused_before_the_plugin_sees_them() {
    let client = cpu_client(4);
    let module = fixture_bytes("sharded.mlirbc");
    let refused = |options: CompileOptions| match client.compile(&module, &options) {
        Err(Error::InvalidCompileOptions { field, reason }) => format!("{field}: {reason}"),
        Err(other) => panic!("expected InvalidCompileOptions, got {other}"),
        Ok(_) => panic!("compiled with {options:?}"),
    };
    assert!(refused(CompileOptions::spmd(0)).contains("num_partitions: is 0"));
    assert!(refused(CompileOptions { num_replicas: 0, ..CompileOptions::spmd(4) }).contains("num_replicas"));
    let shape =
        refused(CompileOptions { device_assignment: Some(vec![vec![0, 1]]), ..CompileOptions::spmd(4) });
    assert!(shape.contains("row 0 has 2 devices but num_partitions is 4"), "{shape}");
    let too_many = refused(CompileOptions::spmd(8));
    assert!(too_many.contains("need 8 devices but the client has 4"), "{too_many}");
    let unknown = refused(CompileOptions {
        device_assignment: Some(vec![vec![0, 1, 2, 17]]),
        ..CompileOptions::spmd(4)
    });
    assert!(unknown.contains("names device 17"), "{unknown}");
    // Options the plugin can judge only against the module come back as its typed error.
    let mismatch = client.compile(&module, &CompileOptions::spmd(2)).err().unwrap();
    assert_eq!(mismatch.code(), Some(ErrorCode::InvalidArgument), "{mismatch}");
    assert!(mismatch.to_string().contains("should have 2 devices but has 4"), "{mismatch}");
    // The process is still alive and the client still works.
    assert!(client.compile(&module, &CompileOptions::spmd(4)).is_ok());
}

#[test]
fn inconsistent_argument_lists_are_refused() {
    let client = cpu_client(4);
    let devices = client.devices().unwrap();
    let executable = client.compile(&fixture_bytes("sharded.mlirbc"), &CompileOptions::spmd(4)).unwrap();
    let buffer = |device: &Device, dims: &[i64]| {
        let size = dims.iter().product::<i64>() as usize * 4;
        client.buffer_from_host(&vec![0u8; size], ElementType::F32, dims, device).unwrap()
    };
    let x: Vec<Buffer> = devices.iter().map(|d| buffer(d, &[4, 16])).collect();
    let w: Vec<Buffer> = devices.iter().map(|d| buffer(d, &[16, 4])).collect();

    let error =
        executable.execute(vec![vec![ExecuteArg::Borrow(&x[0]), ExecuteArg::Borrow(&w[0])]]).unwrap_err();
    assert!(error.to_string().contains("1 argument lists for an executable on 4 devices"), "{error}");

    let swapped: Vec<Vec<ExecuteArg>> =
        (0..4).map(|d| vec![ExecuteArg::Borrow(&x[3 - d]), ExecuteArg::Borrow(&w[d])]).collect();
    let error = executable.execute(swapped).unwrap_err();
    assert!(error.to_string().contains("argument 0 of device list 0 is on device 3"), "{error}");

    let ragged: Vec<Vec<ExecuteArg>> = (0..4)
        .map(|d| {
            if d == 2 {
                vec![ExecuteArg::Borrow(&x[d])]
            } else {
                vec![ExecuteArg::Borrow(&x[d]), ExecuteArg::Borrow(&w[d])]
            }
        })
        .collect();
    let error = executable.execute(ragged).unwrap_err();
    assert!(error.to_string().contains("device list 2 has 1 arguments but list 0 has 2"), "{error}");

    // One argument too few on every device: the plugin's own check, as a typed error.
    let short: Vec<Vec<ExecuteArg>> = (0..4).map(|d| vec![ExecuteArg::Borrow(&x[d])]).collect();
    let error = executable.execute(short).unwrap_err();
    assert!(error.code().is_some(), "expected a plugin error, got {error}");

    // A buffer of the wrong shape: also the plugin's check.
    let wrong: Vec<Buffer> = devices.iter().map(|d| buffer(d, &[4, 4])).collect();
    let args = (0..4).map(|d| vec![ExecuteArg::Borrow(&wrong[d]), ExecuteArg::Borrow(&w[d])]).collect();
    let error = executable.execute(args).unwrap_err();
    assert!(error.code().is_some(), "expected a plugin error, got {error}");
}

#[test]
fn a_wrong_plugin_path_is_a_clear_error() {
    let error = Plugin::load("/nonexistent/xla_cpu_pjrt.so").unwrap_err();
    assert!(matches!(error, Error::PluginNotFound { .. }), "{error}");
    assert!(error.to_string().contains("scripts/setup.sh"), "{error}");

    // A real shared library that is not a plugin: the C library this process already uses.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("/libc.so") || path.contains("/libc-"))
        .expect("libc is mapped");
    let error = Plugin::load(libc).unwrap_err();
    assert!(matches!(error, Error::NotAPlugin { .. }), "{error}");
    assert!(error.to_string().contains("GetPjrtApi"), "{error}");
}

#[test]
fn a_serialized_program_loads_without_compiling_and_computes_the_same_bits() {
    let client = cpu_client(1);
    let fixture = &manifest()["single"];
    let compiled = client.compile(&fixture_bytes("single.mlirbc"), &CompileOptions::default()).unwrap();
    let bytes = compiled.serialize().unwrap();
    assert!(!bytes.is_empty());
    let loaded = client.deserialize_and_load(&bytes).unwrap();
    assert_eq!(loaded.num_outputs().unwrap(), compiled.num_outputs().unwrap());
    let device = &loaded.devices().unwrap()[0];
    let run = |executable: &pjrt::LoadedExecutable| {
        let inputs = upload(&client, &fixture["inputs"], device);
        let outputs = executable.execute(vec![inputs.iter().map(ExecuteArg::Borrow).collect()]).unwrap();
        outputs[0].iter().map(|b| b.to_host().unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(run(&loaded), run(&compiled));
}
