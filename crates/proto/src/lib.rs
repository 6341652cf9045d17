//! gRPC services between podctl, the coordinator and the workers (package `podctl.v1`).
//!
//! The schema is `proto/podctl/v1/podctl.proto` at the workspace root; `docs/PROTOCOL.md` gives
//! the sequences. `build.rs` compiles it with protox, so building needs no `protoc`. Everything
//! generated lives in [`v1`]: the messages, a `*_client` module per service (tonic clients) and
//! a `*_server` module per service (tonic servers).
//!
//! **Architecture Invariant:** this crate is only the wire schema: no logic, no I/O. Protobuf
//! types do not leak past the coordinator, the client crate and the worker: the client answers
//! podctl's commands in its own types, and the cli never depends on this crate (checked by
//! `podctl-layering` against docs/ARCHITECTURE.md: `never cli: proto`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

/// The generated code of package `podctl.v1`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("podctl.v1");
}

/// The metadata key a follower puts its leader's address in when it refuses a write.
pub const LEADER_METADATA_KEY: &str = "x-podctl-leader";

/// The `domain` of the google.rpc.ErrorInfo a refusal carries; its `reason` names a
/// [`v1::Refusal`].
pub const ERROR_DOMAIN: &str = "podctl.v1";

#[cfg(test)]
mod tests {
    use super::v1;
    use prost::Message;

    #[test]
    fn messages_round_trip_through_the_wire_format() {
        let assignment = v1::Assignment {
            job_id: "j1".into(),
            generation: 7,
            virtual_ranks: vec![0, 2],
            resume: Some(v1::Resume {
                source: Some(v1::resume::Source::Peer(v1::FromPeer {
                    worker_id: "w2".into(),
                    data_addr: "127.0.0.1:9000".into(),
                    step: 41,
                })),
            }),
            ..Default::default()
        };
        let bytes = assignment.encode_to_vec();
        assert_eq!(v1::Assignment::decode(bytes.as_slice()).unwrap(), assignment);
    }

    #[test]
    fn job_states_keep_their_wire_numbers() {
        assert_eq!(v1::JobState::Pending as i32, 1);
        assert_eq!(v1::JobState::Stopped as i32, 6);
        assert_eq!(v1::JobState::from_str_name("JOB_STATE_RECOVERING"), Some(v1::JobState::Recovering));
    }
}
