//! Shared by the integration tests: where the real plugins are, and the JAX fixtures.
#![allow(dead_code)] // each test binary uses a different part

use pjrt::{Buffer, Client, ElementType, NamedValue, Plugin};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn plugin_path(env: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| workspace().join(default));
    assert!(path.exists(), "{} not found (set {env} or run scripts/setup.sh)", path.display());
    path
}

/// The CPU plugin from the xla-cpu-pjrt wheel, or `PODCTL_PJRT_PLUGIN`.
pub fn cpu_plugin_path() -> PathBuf {
    plugin_path(
        "PODCTL_PJRT_PLUGIN",
        ".venv/lib/python3/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
    )
}

/// libtpu from the venv, or `PODCTL_LIBTPU`.
pub fn libtpu_path() -> PathBuf {
    plugin_path("PODCTL_LIBTPU", ".venv/lib/python3/site-packages/libtpu/libtpu.so")
}

pub fn cpu_plugin() -> &'static Plugin {
    Plugin::load(cpu_plugin_path()).expect("load the CPU plugin")
}

pub fn cpu_client(devices: i64) -> Client {
    cpu_plugin()
        .create_client(&[("cpu_device_count", NamedValue::Int64(devices))])
        .expect("create a CPU client")
}

pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixture_path(name)).unwrap_or_else(|e| panic!("read fixture {name}: {e}"))
}

/// fixtures.json, written by tests/fixtures/gen.py.
pub fn manifest() -> Value {
    serde_json::from_slice(&fixture_bytes("fixtures.json")).expect("parse fixtures.json")
}

/// A tensor described in fixtures.json: its bytes, element type and shape.
pub struct Tensor {
    pub bytes: Vec<u8>,
    pub ty: ElementType,
    pub dims: Vec<i64>,
}

pub fn tensor(description: &Value) -> Tensor {
    let ty = match description["dtype"].as_str().unwrap() {
        "float32" => ElementType::F32,
        "int32" => ElementType::S32,
        other => panic!("fixture dtype {other} not handled"),
    };
    let dims = description["shape"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
    Tensor { bytes: fixture_bytes(description["file"].as_str().unwrap()), ty, dims }
}

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Compares float32 arrays to JAX's within `tolerance` (the CPU plugin's XLA is not jaxlib's,
/// so transcendental functions may differ in the last bits).
pub fn assert_close(got: &[u8], expected: &[u8], tolerance: f32, what: &str) {
    let (got, expected) = (f32s(got), f32s(expected));
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!((g - e).abs() <= tolerance * e.abs().max(1.0), "{what}[{i}]: got {g}, JAX {e}");
    }
}

/// Reads a buffer and checks its type and shape on the way.
pub fn read(buffer: &Buffer, ty: ElementType, dims: &[i64]) -> Vec<u8> {
    assert_eq!(buffer.element_type().unwrap(), ty);
    assert_eq!(buffer.dims().unwrap(), dims);
    buffer.to_host().unwrap()
}
