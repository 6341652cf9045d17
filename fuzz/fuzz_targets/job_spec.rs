//! The job spec parser: any text through `JobSpec::from_yaml` (parse, resolve, validate), the
//! coordinator's Submit path. A spec that parses must also serialize and derive without panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(spec) = job::JobSpec::from_yaml(text, Path::new("<fuzz>")) {
        let _ = spec.ici_mesh();
        let _ = spec.accum_steps();
        let _ = spec.micro_batches_per_step();
        let _ = spec.checkpoint_uri();
        let _ = spec.to_yaml();
    }
});
