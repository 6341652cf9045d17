//! The shard reader: a checkpoint in an in-memory store whose manifest and stream objects come
//! from the input, opened, verified and read back region by region, as restore does.
//!
//! Input: `[manifest length: u16 LE][flags: u8][manifest bytes][object bytes]`. Every object the
//! manifest names holds the object bytes. With flag bit 0 set, a manifest that passes its checks
//! is rewritten with the objects' real sizes and correct chunk CRCs, so the fuzzer reaches the
//! ranged reads and copies behind the CRC checks rather than stopping at them.
#![no_main]

use checkpoint::manifest::Manifest;
use checkpoint::{Checkpoint, CommitRecord, Limits, Storage};
use libfuzzer_sys::fuzz_target;
use mesh::Region;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use std::sync::{Arc, OnceLock};

const LIMITS: Limits = Limits {
    max_manifest_bytes: 1 << 16,
    max_array_bytes: 1 << 20,
    max_arrays: 64,
    max_shards_per_array: 64,
    max_object_bytes: 1 << 20,
};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let len = u16::from_le_bytes([data[0], data[1]]) as usize;
    let flags = data[2];
    let rest = &data[3..];
    let (manifest_bytes, object) = rest.split_at(len.min(rest.len()));
    let Ok(mut manifest) = Manifest::parse("fuzz/manifest.json", manifest_bytes, &LIMITS) else { return };
    let manifest_bytes = if flags & 1 == 1 {
        for o in &mut manifest.objects {
            o.size = object.len() as u64;
            o.chunk_crc32c = object.chunks(manifest.chunk_size as usize).map(crc32c::crc32c).collect();
        }
        manifest.to_json()
    } else {
        manifest_bytes.to_vec()
    };
    runtime().block_on(async {
        let store = Arc::new(InMemory::new());
        let commit = CommitRecord {
            step: manifest.step,
            save_id: manifest.save_id.clone(),
            bundle: manifest.bundle.clone(),
            manifest_size: manifest_bytes.len() as u64,
            manifest_crc32c: crc32c::crc32c(&manifest_bytes),
        };
        let dir = Path::from("ck").join(commit.dir().as_str());
        let put = |key: Path, bytes: Vec<u8>| {
            let store = store.clone();
            async move { store.put(&key, PutPayload::from(bytes)).await.unwrap() }
        };
        put(dir.clone().join("manifest.json"), manifest_bytes.clone()).await;
        for o in &manifest.objects {
            put(dir.clone().join(o.name.as_str()), object.to_vec()).await;
        }
        let storage = Storage::from_store(store.clone(), "ck", "memory://ck", None).unwrap();
        let Ok(ck) = Checkpoint::open(&storage, &commit, &LIMITS).await else { return };
        let _ = ck.verify().await;
        for a in &ck.manifest().arrays {
            let full = Region::full(&a.shape);
            if let Ok(bytes) = ck.read_region(&a.name, &full).await {
                let elems: u64 = a.shape.iter().product();
                assert_eq!(bytes.len() as u64, elems * a.dtype.size() as u64);
            }
            // A region straddling the shards: the middle half of every dimension.
            let mid = Region::new(a.shape.iter().map(|&d| d / 4..(d - d / 4).max(d / 4 + 1)).collect());
            let _ = ck.read_region(&a.name, &mid).await;
        }
    });
});
