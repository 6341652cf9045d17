//! A checkpoint report's two parts, the checkpoint crate's [`SaveSpec`] and [`HostReport`], as
//! protobuf messages: written by the workers, read back by the leader. Reading checks every
//! field a message cannot check itself (a missing message, an unknown element type, a number too
//! large for this host, a topology the checkpoint crate refuses, metadata that is not JSON) and
//! names the field in its error, so a refusal says which field of which report is wrong.

use checkpoint::manifest::ObjectEntry;
use checkpoint::save::ReportedShard;
use checkpoint::{ArraySpec, DataPosition, HostReport, SaveSpec, Topology};
use mesh::{DType, IciMesh, MeshAxis, Sharding};
use proto::v1::{self, ElementType};

/// A report's field that does not convert.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct WireError {
    /// The field's path, e.g. `save_spec.arrays[1].dtype`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

fn wrong(field: impl Into<String>, reason: impl Into<String>) -> WireError {
    WireError { field: field.into(), reason: reason.into() }
}

/// `value` of `field` as a `usize`.
fn size(field: impl FnOnce() -> String, value: u64) -> Result<usize, WireError> {
    usize::try_from(value).map_err(|_| wrong(field(), format!("{value} does not fit this host's usize")))
}

/// A save's spec as the wire carries it.
pub fn save_spec_to_wire(spec: &SaveSpec) -> v1::SaveSpec {
    let t = &spec.topology;
    v1::SaveSpec {
        step: spec.step,
        save_id: spec.save_id.clone(),
        topology: Some(v1::Topology {
            dcn: t.dcn() as u64,
            ici: t
                .ici()
                .axes()
                .iter()
                .map(|a| v1::MeshAxis { name: a.name.clone(), size: a.size as u64 })
                .collect(),
            hosts_per_slice: t.hosts_per_slice() as u64,
        }),
        arrays: spec
            .arrays
            .iter()
            .map(|a| v1::ArraySpec {
                name: a.name.clone(),
                shape: a.shape.clone(),
                dtype: element_type(a.dtype) as i32,
                sharding: a
                    .sharding
                    .dims()
                    .iter()
                    .map(|axes| v1::ShardedDim { axes: axes.clone() })
                    .collect(),
            })
            .collect(),
        bundle: spec.bundle.clone(),
        data_position: Some(v1::DataPosition {
            seed: spec.data_position.seed,
            step: spec.data_position.step,
        }),
        rng_state: spec.rng_state.clone(),
        metadata: spec.metadata.iter().map(|(k, v)| (k.clone(), v.to_string())).collect(),
    }
}

/// A save's spec from the wire; the error names the field (below `save_spec`) that is wrong.
pub fn save_spec_from_wire(wire: v1::SaveSpec) -> Result<SaveSpec, WireError> {
    let t = wire.topology.ok_or_else(|| wrong("save_spec.topology", "missing"))?;
    let ici = t
        .ici
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            Ok(MeshAxis { size: size(|| format!("save_spec.topology.ici[{i}].size"), a.size)?, name: a.name })
        })
        .collect::<Result<Vec<_>, WireError>>()?;
    let ici = IciMesh::try_from(ici).map_err(|e| wrong("save_spec.topology.ici", e.to_string()))?;
    let topology = Topology::new(
        size(|| "save_spec.topology.dcn".into(), t.dcn)?,
        ici,
        size(|| "save_spec.topology.hosts_per_slice".into(), t.hosts_per_slice)?,
    )
    .map_err(|e| wrong("save_spec.topology", e.to_string()))?;
    let arrays = wire
        .arrays
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let dtype = dtype(a.dtype).ok_or_else(|| {
                wrong(format!("save_spec.arrays[{i}].dtype"), format!("{} is not an element type", a.dtype))
            })?;
            let sharding = Sharding::new(a.sharding.into_iter().map(|d| d.axes).collect());
            Ok(ArraySpec::new(a.name, a.shape, dtype, sharding))
        })
        .collect::<Result<Vec<_>, WireError>>()?;
    let position = wire.data_position.ok_or_else(|| wrong("save_spec.data_position", "missing"))?;
    let metadata = wire
        .metadata
        .into_iter()
        .map(|(key, text)| {
            let value = serde_json::from_str(&text).map_err(|e| {
                wrong(format!("save_spec.metadata[{key:?}]"), format!("is not one JSON value: {e}"))
            })?;
            Ok((key, value))
        })
        .collect::<Result<_, WireError>>()?;
    Ok(SaveSpec {
        step: wire.step,
        save_id: wire.save_id,
        topology,
        arrays,
        bundle: wire.bundle,
        data_position: DataPosition { seed: position.seed, step: position.step },
        rng_state: wire.rng_state,
        metadata,
    })
}

/// A host's report as the wire carries it.
pub fn host_report_to_wire(report: &HostReport) -> v1::HostReport {
    let o = &report.object;
    v1::HostReport {
        host: report.host as u64,
        step: report.step,
        save_id: report.save_id.clone(),
        chunk_size: report.chunk_size,
        object: Some(v1::StreamObject {
            name: o.name.clone(),
            host: o.host as u64,
            size: o.size,
            chunk_crc32c: o.chunk_crc32c.clone(),
        }),
        shards: report
            .shards
            .iter()
            .map(|s| v1::ReportedShard {
                array: s.array.clone(),
                region: s.region.iter().map(|&[start, end]| v1::DimRange { start, end }).collect(),
                offset: s.offset,
                length: s.length,
            })
            .collect(),
    }
}

/// A host's report from the wire; the error names the field (below `host_report`) that is
/// wrong. What the numbers mean (offsets inside the object, regions inside the array) the
/// commit checks against the save's write plan.
pub fn host_report_from_wire(wire: v1::HostReport) -> Result<HostReport, WireError> {
    let o = wire.object.ok_or_else(|| wrong("host_report.object", "missing"))?;
    let shards = wire
        .shards
        .into_iter()
        .map(|s| ReportedShard {
            array: s.array,
            region: s.region.into_iter().map(|r| [r.start, r.end]).collect(),
            offset: s.offset,
            length: s.length,
        })
        .collect();
    Ok(HostReport {
        host: size(|| "host_report.host".into(), wire.host)?,
        step: wire.step,
        save_id: wire.save_id,
        chunk_size: wire.chunk_size,
        object: ObjectEntry {
            name: o.name,
            host: size(|| "host_report.object.host".into(), o.host)?,
            size: o.size,
            chunk_crc32c: o.chunk_crc32c,
        },
        shards,
    })
}

fn element_type(dtype: DType) -> ElementType {
    match dtype {
        DType::Float16 => ElementType::Float16,
        DType::Bfloat16 => ElementType::Bfloat16,
        DType::Float32 => ElementType::Float32,
        DType::Float64 => ElementType::Float64,
        DType::Int8 => ElementType::Int8,
        DType::Int32 => ElementType::Int32,
        DType::Int64 => ElementType::Int64,
        DType::Uint8 => ElementType::Uint8,
        DType::Uint32 => ElementType::Uint32,
        DType::Bool => ElementType::Bool,
    }
}

/// The element type a wire value names; `None` for `UNSPECIFIED` and values this build does not
/// know.
fn dtype(value: i32) -> Option<DType> {
    Some(match ElementType::try_from(value).ok()? {
        ElementType::Unspecified => return None,
        ElementType::Float16 => DType::Float16,
        ElementType::Bfloat16 => DType::Bfloat16,
        ElementType::Float32 => DType::Float32,
        ElementType::Float64 => DType::Float64,
        ElementType::Int8 => DType::Int8,
        ElementType::Int32 => DType::Int32,
        ElementType::Int64 => DType::Int64,
        ElementType::Uint8 => DType::Uint8,
        ElementType::Uint32 => DType::Uint32,
        ElementType::Bool => DType::Bool,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn spec() -> SaveSpec {
        let ici = IciMesh::new([("fsdp", 2), ("tp", 2)]).unwrap();
        let all = [
            DType::Float16,
            DType::Bfloat16,
            DType::Float32,
            DType::Float64,
            DType::Int8,
            DType::Int32,
            DType::Int64,
            DType::Uint8,
            DType::Uint32,
            DType::Bool,
        ];
        let arrays = all
            .iter()
            .enumerate()
            .map(|(i, &dtype)| {
                let sharding =
                    Sharding::new(vec![vec!["dcn".into(), "fsdp".into()], vec![], vec!["tp".into()]]);
                ArraySpec::new(format!("params/{i}"), vec![8, 3, 2], dtype, sharding)
            })
            .collect();
        // A seed above 2^53: a double would not bring it back.
        let identity = serde_json::json!({ "seed": u64::MAX - 1, "model": "qwen3-0.6b", "lr": 1.5e-5 });
        SaveSpec {
            step: 12,
            save_id: "s-12".into(),
            topology: Topology::new(2, ici, 2).unwrap(),
            arrays,
            bundle: "00ff".into(),
            data_position: DataPosition { seed: u64::MAX, step: 12 },
            rng_state: vec![1, 2, 3],
            metadata: BTreeMap::from([
                ("identity".to_string(), identity),
                ("none".to_string(), serde_json::Value::Null),
            ]),
        }
    }

    fn report() -> HostReport {
        HostReport {
            host: 3,
            step: 12,
            save_id: "s-12".into(),
            chunk_size: 1 << 20,
            object: ObjectEntry {
                name: "host-3.shards".into(),
                host: 3,
                size: 96,
                chunk_crc32c: vec![7, u32::MAX],
            },
            shards: vec![ReportedShard {
                array: "params/0".into(),
                region: vec![[6, 8], [0, 3], [1, 2]],
                offset: 0,
                length: 12,
            }],
        }
    }

    #[test]
    fn both_parts_come_back_as_they_went() {
        let spec = spec();
        assert_eq!(save_spec_from_wire(save_spec_to_wire(&spec)).unwrap(), spec);
        let report = report();
        assert_eq!(host_report_from_wire(host_report_to_wire(&report)).unwrap(), report);
    }

    /// Breaks one field of a spec on the wire.
    type Break = Box<dyn Fn(&mut v1::SaveSpec)>;

    #[test]
    fn a_wrong_field_is_named() {
        let cases: Vec<(Break, &str, &str)> = vec![
            (Box::new(|w| w.topology = None), "save_spec.topology", "missing"),
            (Box::new(|w| w.data_position = None), "save_spec.data_position", "missing"),
            (Box::new(|w| w.arrays[2].dtype = 0), "save_spec.arrays[2].dtype", "0 is not an element type"),
            (Box::new(|w| w.arrays[1].dtype = 99), "save_spec.arrays[1].dtype", "99 is not an element type"),
            (Box::new(|w| w.topology.as_mut().unwrap().dcn = 0), "save_spec.topology", "at least 1"),
            (Box::new(|w| w.topology.as_mut().unwrap().hosts_per_slice = 3), "save_spec.topology", "evenly"),
            (
                Box::new(|w| w.topology.as_mut().unwrap().ici[0].name = "tp".into()),
                "save_spec.topology.ici",
                "tp",
            ),
            (
                Box::new(|w| _ = w.metadata.insert("identity".into(), "{\"seed\": ".into())),
                "save_spec.metadata[\"identity\"]",
                "is not one JSON value",
            ),
        ];
        for (break_it, field, says) in cases {
            let mut wire = save_spec_to_wire(&spec());
            break_it(&mut wire);
            let e = save_spec_from_wire(wire).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.reason.contains(says), "{e}");
        }
        let mut wire = host_report_to_wire(&report());
        wire.object = None;
        assert_eq!(host_report_from_wire(wire).unwrap_err().to_string(), "host_report.object: missing");
    }
}
