//! The checkpoint manifest: any bytes through `Manifest::parse` under the default limits and
//! under tight ones. A manifest that passes must summarize, serialize and parse back equal.
#![no_main]

use checkpoint::Limits;
use checkpoint::manifest::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let tight = Limits {
        max_manifest_bytes: 1 << 20,
        max_array_bytes: 1 << 20,
        max_arrays: 64,
        max_shards_per_array: 64,
        max_object_bytes: 1 << 20,
    };
    for limits in [Limits::default(), tight] {
        if let Ok(m) = Manifest::parse("fuzz/manifest.json", data, &limits) {
            let _ = m.summary();
            let _ = m.data_bytes();
            let json = m.to_json();
            let back = Manifest::parse("fuzz/manifest.json", &json, &Limits::default())
                .expect("a manifest that passed its checks parses back");
            assert_eq!(back, m);
        }
    }
});
