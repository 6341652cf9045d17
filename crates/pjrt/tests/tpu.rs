//! Against the real libtpu: a v6e:2x4 topology compiled on this CPU-only machine.
//!
//! libtpu reads its environment when loaded, and without `TPU_SKIP_MDS_QUERY` it would query
//! the cloud metadata server. The test therefore runs itself again as a child process with
//! [`pjrt::LIBTPU_AOT_ENV`] set (changing the environment of a running, threaded test process
//! is not sound).

mod common;

use common::*;
use pjrt::{CompileOptions, Error, LIBTPU_AOT_ENV, MemoryStats, Plugin};
use std::process::Command;

/// Runs `test` in a child process with libtpu's environment; true if this is the child.
fn in_libtpu_env(test: &str) -> bool {
    if LIBTPU_AOT_ENV.iter().all(|(name, value)| std::env::var(name).as_deref() == Ok(*value)) {
        return true;
    }
    let child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .envs(LIBTPU_AOT_ENV)
        .output()
        .expect("run the test binary again");
    assert!(
        child.status.success(),
        "{test} failed in the child process ({}):\n{}\n{}",
        child.status,
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    false
}

#[test]
fn tpu_memory_stats_equal_jax() {
    if !in_libtpu_env("tpu_memory_stats_equal_jax") {
        return;
    }
    let fixture = &manifest()["tpu_step"];
    let plugin = Plugin::load(libtpu_path()).unwrap();
    assert_eq!(plugin.api_version().0, 0);
    let unknown = plugin.topology("v6e:3x3x3x3", &[]).err().unwrap();
    assert!(unknown.code().is_some(), "{unknown}");
    let topology = plugin.topology(fixture["topology"].as_str().unwrap(), &[]).unwrap();
    assert_eq!(topology.platform_name().unwrap(), "tpu");
    assert_eq!(topology.num_devices().unwrap(), 8);

    let partitions = fixture["num_partitions"].as_u64().unwrap() as u32;
    let module = fixture_bytes("tpu_step.mlirbc");
    let too_many = topology.compile(&module, &CompileOptions::spmd(16)).err().unwrap();
    assert!(matches!(too_many, Error::InvalidCompileOptions { .. }), "{too_many}");

    let assignment: Vec<Vec<i64>> = serde_json::from_value(fixture["device_assignment"].clone()).unwrap();
    let options = CompileOptions { device_assignment: Some(assignment), ..CompileOptions::spmd(partitions) };
    let executable = topology.compile(&module, &options).unwrap();
    assert_eq!(executable.num_outputs().unwrap(), 3);
    let stats = executable.memory_stats().unwrap();
    let jax = &fixture["jax_memory"];
    let field = |name: &str| jax[name].as_i64().unwrap();
    let expected = MemoryStats {
        argument_bytes: field("argument_bytes"),
        output_bytes: field("output_bytes"),
        alias_bytes: field("alias_bytes"),
        temp_bytes: field("temp_bytes"),
        generated_code_bytes: field("generated_code_bytes"),
        host_argument_bytes: field("host_argument_bytes"),
        host_output_bytes: field("host_output_bytes"),
        host_alias_bytes: field("host_alias_bytes"),
        host_temp_bytes: field("host_temp_bytes"),
        host_generated_code_bytes: field("host_generated_code_bytes"),
        // JAX's memory_analysis() does not report the peak.
        peak_bytes: stats.peak_bytes,
    };
    assert_eq!(stats, expected);
    assert!(stats.temp_bytes > 0 && stats.alias_bytes > 0, "{stats:?}");
}
