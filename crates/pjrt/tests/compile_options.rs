//! The hand-written CompileOptionsProto encoder against what JAX itself serializes.

mod common;

use common::*;
use pjrt::CompileOptions;
use std::collections::BTreeMap;

fn varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut value = 0;
    for shift in (0..64).step_by(7) {
        let byte = bytes[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            break;
        }
    }
    value
}

/// Splits a message into its records: field number -> the record's raw bytes (key included).
fn records(bytes: &[u8]) -> BTreeMap<u64, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut at = 0;
    while at < bytes.len() {
        let start = at;
        let key = varint(bytes, &mut at);
        match key & 7 {
            0 => {
                varint(bytes, &mut at);
            }
            2 => {
                let len = varint(bytes, &mut at) as usize;
                at += len;
            }
            wire => panic!("wire type {wire} not expected"),
        }
        assert!(out.insert(key >> 3, bytes[start..at].to_vec()).is_none(), "field {} twice", key >> 3);
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn build_options_match_jax_byte_for_byte() {
    let cases = manifest()["compile_options"].as_array().unwrap().clone();
    assert!(!cases.is_empty());
    for case in cases {
        let assignment: Vec<Vec<i64>> = case["device_assignment"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row.as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect())
            .collect();
        let options = CompileOptions {
            num_replicas: case["num_replicas"].as_u64().unwrap() as u32,
            device_assignment: Some(assignment),
            ..CompileOptions::spmd(case["num_partitions"].as_u64().unwrap() as u32)
        };
        let outer = records(&options.encode().unwrap());
        assert_eq!(outer.keys().collect::<Vec<_>>(), [&3], "only executable_build_options is set");
        // Skip the record's key and length to reach the ExecutableBuildOptionsProto.
        let record = &outer[&3];
        let mut at = 0;
        varint(record, &mut at);
        varint(record, &mut at);
        let ours: BTreeMap<String, String> = records(&record[at..])
            .into_iter()
            .map(|(field, bytes)| (field.to_string(), hex(&bytes)))
            .collect();
        let jax: BTreeMap<String, String> = case["jax_records"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(field, bytes)| (field.clone(), bytes.as_str().unwrap().to_string()))
            .collect();
        assert_eq!(ours, jax, "{options:?}");
    }
}
