//! The bundle manifest: any bytes through `bundle::Manifest::parse` (JSON, then the checks of
//! docs/BUNDLE.md), and what a valid manifest's sizes are used for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = bundle::Manifest::parse(data, Path::new("/bundle")) {
        for t in &m.params {
            let _ = t.num_bytes();
        }
        for p in m.programs.values() {
            for t in p.inputs.iter().chain(&p.outputs) {
                let _ = t.num_bytes();
            }
        }
    }
});
