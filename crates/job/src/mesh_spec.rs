//! The `mesh` field: how a job lays out its devices, in the three ways a spec may write it.
//!
//! ```yaml
//! mesh: { dcn: 2, ici: { fsdp: 4, tp: 2 } }   # the axes: 2 slices, each an ICI mesh (fsdp, tp)
//! mesh: "(8,2)"                               # the short form (data, tp) on one host
//! mesh: { shape: "(8,2)", hosts: 2 }          # ... over 2 hosts: dcn 2 x ici(fsdp=4, tp=2)
//! mesh: auto                                  # the planner chooses (also { shape: auto, hosts: 2 })
//! ```
//!
//! The short form is how the seeds write meshes: `data` rows of devices that split the batch
//! (and, inside a host, the parameters) by `tp` columns that split heads, MLP and vocabulary.
//! Each host is one slice (podctl runs one SPMD program per host), so over `h` hosts the data
//! axis is `dcn = h` slices of `fsdp = data / h`. Parsing keeps what was written
//! ([`MeshRequest`]); [`crate::JobSpec::from_yaml`] resolves it to the axes, which is all the
//! rest of podctl reads and all a serialized spec carries.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The mesh: `dcn` slices, each an ICI mesh `(fsdp, tp)`.
#[derive(Debug, Clone, Eq, Serialize)]
pub struct MeshSpec {
    /// Slices (data-parallel replicas over the data-centre network); one per host.
    pub dcn: usize,
    /// The axes inside one slice.
    pub ici: IciSpec,
    /// How the spec wrote it. Not serialized: a serialized spec carries the resolved axes.
    #[serde(skip)]
    pub request: MeshRequest,
}

/// Two meshes are equal when they lay devices out the same way, however the spec wrote them.
impl PartialEq for MeshSpec {
    fn eq(&self, other: &Self) -> bool {
        self.dcn == other.dcn && self.ici == other.ici
    }
}

/// The axes inside one slice, in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IciSpec {
    /// Parameters and the batch are split over this axis (fully sharded data parallel).
    #[serde(default = "one")]
    pub fsdp: usize,
    /// Heads, the MLP and the vocabulary are split over this axis (tensor parallel).
    #[serde(default = "one")]
    pub tp: usize,
}

fn one() -> usize {
    1
}

/// How a spec wrote its mesh.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MeshRequest {
    /// `{ dcn, ici: { fsdp, tp } }`.
    #[default]
    Axes,
    /// `"(data, tp)"`, optionally `{ shape: "(data, tp)", hosts }`.
    Shape {
        /// Devices along the data axis, over all hosts.
        data: usize,
        /// Devices along the tensor-parallel axis.
        tp: usize,
        /// Hosts (slices) the data axis is spread over.
        hosts: usize,
    },
    /// `auto` or `{ shape: auto, hosts }`: the planner chooses the ICI mesh, and the
    /// micro-batch and remat policy unless the spec sets them.
    Auto {
        /// Hosts (slices).
        hosts: usize,
        /// The planner's choice, in words, once resolved.
        choice: Option<String>,
    },
}

impl MeshSpec {
    /// A mesh written as axes.
    pub fn axes(dcn: usize, fsdp: usize, tp: usize) -> Self {
        Self { dcn, ici: IciSpec { fsdp, tp }, request: MeshRequest::Axes }
    }

    /// Devices in one slice.
    pub fn devices_per_slice(&self) -> usize {
        self.ici.fsdp * self.ici.tp
    }

    /// What the layout means, in one paragraph: the short form, the axes and who holds what.
    pub fn explain(&self) -> String {
        let IciSpec { fsdp, tp } = self.ici;
        let (dcn, devices) = (self.dcn, self.devices_per_slice());
        let short = format!("({},{tp})", dcn * fsdp);
        let mut text = match &self.request {
            MeshRequest::Auto { choice: Some(choice), .. } => format!("auto: {choice}; "),
            _ => String::new(),
        };
        let hosts = if dcn == 1 { "1 host".to_string() } else { format!("{dcn} hosts") };
        text.push_str(&format!(
            "mesh {short} on {hosts} = dcn {dcn} x ici(fsdp={fsdp}, tp={tp}), {devices} devices per host"
        ));
        text.push_str(&format!(
            ": inside a host, parameters and rows are split {fsdp} ways (fsdp) and heads, MLP and \
             vocabulary {tp} ways (tp)"
        ));
        if dcn > 1 {
            text.push_str(&format!(
                "; each of the {dcn} hosts holds the same shards on the same devices, computes on its own \
                 rows, and the hosts all-reduce gradients over the data-centre network"
            ));
        }
        text
    }
}

/// Parses `(data, tp)`; spaces are allowed, both sizes must be positive.
fn parse_shape(text: &str) -> Option<(usize, usize)> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    let (data, tp) = inner.split_once(',')?;
    let data: usize = data.trim().parse().ok()?;
    let tp: usize = tp.trim().parse().ok()?;
    (data > 0 && tp > 0).then_some((data, tp))
}

const FORMS: &str = "write the mesh as \"(data, tp)\" such as \"(8,2)\", { shape: \"(8,2)\", hosts: 2 }, \
                     auto, or { dcn: 2, ici: { fsdp: 4, tp: 2 } }";

fn request_from_shape<E: de::Error>(text: &str, hosts: usize) -> Result<MeshRequest, E> {
    if hosts == 0 {
        return Err(E::custom("mesh.hosts is 0; a job runs on at least one host"));
    }
    if text.trim() == "auto" {
        return Ok(MeshRequest::Auto { hosts, choice: None });
    }
    match parse_shape(text) {
        Some((data, tp)) => Ok(MeshRequest::Shape { data, tp, hosts }),
        None => Err(E::custom(format!("mesh '{text}' is not a mesh; {FORMS}"))),
    }
}

/// `mesh` as a map: the axes, or a shape with hosts.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MeshMap {
    dcn: Option<usize>,
    ici: Option<IciSpec>,
    shape: Option<String>,
    hosts: Option<usize>,
}

/// Placeholder axes for a mesh that is resolved after parsing (the short form and `auto`).
fn unresolved(request: MeshRequest) -> MeshSpec {
    MeshSpec { dcn: 0, ici: IciSpec { fsdp: 0, tp: 0 }, request }
}

impl<'de> Deserialize<'de> for MeshSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MeshVisitor;

        impl<'de> Visitor<'de> for MeshVisitor {
            type Value = MeshSpec;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mesh: \"(data, tp)\", auto, { shape, hosts } or { dcn, ici }")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<MeshSpec, E> {
                request_from_shape(text, 1).map(unresolved)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MeshSpec, A::Error> {
                let m = MeshMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                match (m.shape, m.ici, m.dcn, m.hosts) {
                    (Some(_), Some(_), ..) => Err(de::Error::custom(
                        "mesh: give either shape (with hosts) or ici (with dcn), not both",
                    )),
                    (Some(_), None, Some(_), _) => Err(de::Error::custom(
                        "mesh.dcn goes with mesh.ici; with a shape, the number of hosts is mesh.hosts",
                    )),
                    (Some(shape), None, None, hosts) => {
                        request_from_shape(&shape, hosts.unwrap_or(1)).map(unresolved)
                    }
                    (None, Some(_), _, Some(_)) => Err(de::Error::custom(
                        "mesh.hosts goes with mesh.shape; with ici axes, the number of hosts is mesh.dcn",
                    )),
                    (None, Some(ici), dcn, None) => {
                        Ok(MeshSpec { dcn: dcn.unwrap_or(1), ici, request: MeshRequest::Axes })
                    }
                    (None, None, ..) => {
                        Err(de::Error::custom(format!("mesh needs ici axes or a shape; {FORMS}")))
                    }
                }
            }
        }

        deserializer.deserialize_any(MeshVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(yaml: &str) -> Result<MeshSpec, String> {
        serde_saphyr::from_str::<MeshSpec>(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn every_form_parses_to_its_request() {
        assert_eq!(mesh("{ dcn: 2, ici: { fsdp: 4, tp: 2 } }").unwrap(), MeshSpec::axes(2, 4, 2));
        assert_eq!(mesh("{ ici: { tp: 2 } }").unwrap(), MeshSpec::axes(1, 1, 2));
        assert_eq!(mesh("\"(8,2)\"").unwrap().request, MeshRequest::Shape { data: 8, tp: 2, hosts: 1 });
        assert_eq!(
            mesh("{ shape: \"( 8, 2 )\", hosts: 2 }").unwrap().request,
            MeshRequest::Shape { data: 8, tp: 2, hosts: 2 }
        );
        assert_eq!(mesh("auto").unwrap().request, MeshRequest::Auto { hosts: 1, choice: None });
        assert_eq!(
            mesh("{ shape: auto, hosts: 3 }").unwrap().request,
            MeshRequest::Auto { hosts: 3, choice: None }
        );
    }

    #[test]
    fn bad_forms_say_how_to_write_a_mesh() {
        for (yaml, needle) in [
            ("\"(8,2\"", "'(8,2' is not a mesh; write the mesh as \"(data, tp)\""),
            ("\"(0,2)\"", "'(0,2)' is not a mesh"),
            ("\"8x2\"", "'8x2' is not a mesh"),
            ("{ shape: \"(8,2)\", hosts: 0 }", "mesh.hosts is 0"),
            ("{ shape: \"(8,2)\", ici: { fsdp: 4 } }", "either shape (with hosts) or ici"),
            ("{ shape: \"(8,2)\", dcn: 2 }", "mesh.dcn goes with mesh.ici"),
            ("{ hosts: 2, ici: { fsdp: 4 } }", "mesh.hosts goes with mesh.shape"),
            ("{ dcn: 2 }", "mesh needs ici axes or a shape"),
            ("{ shape: \"(8,2)\", host: 2 }", "unknown field"),
        ] {
            let e = mesh(yaml).unwrap_err();
            assert!(e.contains(needle), "{yaml}: {e}");
        }
    }

    #[test]
    fn equality_is_the_layout_and_serialization_the_axes() {
        let written =
            MeshSpec { request: MeshRequest::Shape { data: 8, tp: 2, hosts: 2 }, ..MeshSpec::axes(2, 4, 2) };
        assert_eq!(written, MeshSpec::axes(2, 4, 2));
        assert_eq!(serde_json::to_string(&written).unwrap(), r#"{"dcn":2,"ici":{"fsdp":4,"tp":2}}"#);
    }

    #[test]
    fn explanations_name_the_short_form_and_the_axes() {
        let two = MeshSpec::axes(2, 4, 2).explain();
        assert!(
            two.starts_with("mesh (8,2) on 2 hosts = dcn 2 x ici(fsdp=4, tp=2), 8 devices per host"),
            "{two}"
        );
        assert!(two.contains("all-reduce gradients over the data-centre network"), "{two}");
        let one = MeshSpec::axes(1, 2, 2).explain();
        assert!(one.starts_with("mesh (2,2) on 1 host") && !one.contains("all-reduce"), "{one}");
        let auto = MeshSpec {
            request: MeshRequest::Auto { hosts: 1, choice: Some("the planner chose it".into()) },
            ..MeshSpec::axes(1, 2, 2)
        };
        assert!(auto.explain().starts_with("auto: the planner chose it; mesh (2,2)"));
    }
}
