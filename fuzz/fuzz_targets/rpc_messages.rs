//! Every request message the coordinator decodes (package `podctl.v1`): the first byte picks
//! the type, the rest is its protobuf encoding. Decoded messages go on through the checks the
//! coordinator applies to their untrusted contents: a submitted spec through the job parser, a
//! checkpoint report's parts through the wire conversion and the checkpoint crate into the
//! manifest the leader would write. A message that decodes must re-encode to bytes that decode
//! again.
#![no_main]

use checkpoint::Limits;
use checkpoint::commit::build_manifest;
use client::checkpoint::{host_report_from_wire, save_spec_from_wire};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use proto::v1;

/// Decodes `bytes` as `M`; what decodes must encode to bytes that decode to a message of the
/// same encoded length. (Neither messages nor bytes compare equal reliably: a float field may
/// hold NaN, which equals nothing, and map fields encode in hash order.)
fn round_trip<M: Message + Default>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let encoded = m.encode_to_vec();
    let again = M::decode(encoded.as_slice()).expect("an encoded message decodes");
    assert_eq!(again.encoded_len(), encoded.len());
    Some(m)
}

/// What the leader does with a `CheckpointReport` (grpc/workers.rs, then finalize).
fn checkpoint_report(r: &v1::CheckpointReport) {
    const MAX_REPORT_PART: usize = 1 << 20; // as grpc/workers.rs
    let (Some(report), Some(spec)) = (r.host_report.clone(), r.save_spec.clone()) else { return };
    if report.encoded_len() > MAX_REPORT_PART || spec.encoded_len() > MAX_REPORT_PART {
        return;
    }
    let Ok(report) = host_report_from_wire(report) else { return };
    let Ok(spec) = save_spec_from_wire(spec) else { return };
    if let Ok(manifest) = build_manifest(&spec, &[report]) {
        let _ = manifest.check("fuzz/manifest.json", &Limits::default());
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else { return };
    match kind % 17 {
        0 => {
            if let Some(m) = round_trip::<v1::SubmitJobRequest>(bytes) {
                let _ = job::JobSpec::from_yaml(&m.spec_yaml, std::path::Path::new("<submitted spec>"));
                let _ = checkpoint::manifest::check_bundle_id(&m.bundle_id);
            }
        }
        1 => drop(round_trip::<v1::GetJobRequest>(bytes)),
        2 => drop(round_trip::<v1::ListJobsRequest>(bytes)),
        3 => drop(round_trip::<v1::WatchJobRequest>(bytes)),
        4 => drop(round_trip::<v1::StopJobRequest>(bytes)),
        5 => drop(round_trip::<v1::LogsRequest>(bytes)),
        6 => drop(round_trip::<v1::ClusterInfoRequest>(bytes)),
        7 => drop(round_trip::<v1::AddMemberRequest>(bytes)),
        8 => drop(round_trip::<v1::RemoveMemberRequest>(bytes)),
        9 => drop(round_trip::<v1::RegisterRequest>(bytes)),
        10 => drop(round_trip::<v1::WorkerEvent>(bytes)),
        11 => drop(round_trip::<v1::StepReport>(bytes)),
        12 => {
            if let Some(r) = round_trip::<v1::CheckpointReport>(bytes) {
                checkpoint_report(&r);
            }
        }
        13 => drop(round_trip::<v1::LogLine>(bytes)),
        14 => drop(round_trip::<v1::KvPutRequest>(bytes)),
        15 => drop(round_trip::<v1::KvGetRequest>(bytes)),
        _ => drop(round_trip::<v1::RaftPayload>(bytes)),
    }
});
