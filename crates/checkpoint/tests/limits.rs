//! Limits on untrusted checkpoints (issue 10): a manifest claiming a 1 TB array is refused
//! before anything is sized from it, and no name with `..` ever becomes a key.
//!
//! Its own test binary: a counting global allocator records the largest single allocation, so
//! "before any allocation" is measured rather than assumed.

// The workspace names this crate `checkpoint` everywhere else; so do its tests.
extern crate podctl_checkpoint as checkpoint;

use checkpoint::manifest::{ArrayEntry, Manifest, ObjectEntry, ShardEntry};
use checkpoint::{
    Checkpoint, CheckpointError, CommitLog, CommitRecord, DataPosition, Limits, Storage, StoreCommitLog,
    StoreOptions, Topology,
};
use mesh::{DType, IciMesh, Sharding};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, noting the largest single request since the last [`reset_largest`].
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Tests measuring [`LARGEST`] run one at a time.
static MEASURING: Mutex<()> = Mutex::new(());

fn reset_largest() {
    LARGEST.store(0, Ordering::SeqCst);
}

fn largest() -> usize {
    LARGEST.load(Ordering::SeqCst)
}

/// No single allocation a refusal makes may come near the sizes the manifest claims.
const SMALL: usize = 8 << 20;

const TIB: u64 = 1 << 40;

/// A manifest claiming one float32 array of `rows x 2^18` elements in two row halves, stored in
/// one object of exactly that many bytes, with 64 MiB chunks. Every count is consistent, so only
/// the sizes can refuse it.
fn claiming(rows: u64) -> Manifest {
    let cols = 1u64 << 18;
    let bytes = rows * cols * 4;
    let chunk = 64u64 << 20;
    let topology = Topology::new(1, IciMesh::new([("fsdp", 2)]).unwrap(), 1).unwrap();
    let half = rows / 2;
    Manifest {
        format: checkpoint::manifest::FORMAT.into(),
        step: 1,
        save_id: "huge".into(),
        bundle: "abcdef01".into(),
        topology,
        data_position: DataPosition { seed: 0, step: 1 },
        rng_state: vec![],
        metadata: BTreeMap::new(),
        chunk_size: chunk,
        objects: vec![ObjectEntry {
            name: "host-0.shards".into(),
            host: 0,
            size: bytes,
            chunk_crc32c: vec![0; bytes.div_ceil(chunk) as usize],
        }],
        arrays: vec![ArrayEntry {
            name: "params/huge".into(),
            shape: vec![rows, cols],
            dtype: DType::Float32,
            sharding: Sharding::new(vec![vec!["fsdp".into()], vec![]]),
            shards: vec![
                ShardEntry { region: vec![[0, half], [0, cols]], object: 0, offset: 0, length: bytes / 2 },
                ShardEntry {
                    region: vec![[half, rows], [0, cols]],
                    object: 0,
                    offset: bytes / 2,
                    length: bytes / 2,
                },
            ],
        }],
    }
}

/// Stores `manifest` as a committed checkpoint (manifest, marker, commit record) with a stream
/// object of only `object_len` bytes, and returns its commit record.
async fn store_forged(storage: &Storage, manifest: &Manifest, object_len: usize) -> CommitRecord {
    let json = manifest.to_json();
    let commit = CommitRecord {
        step: manifest.step,
        save_id: manifest.save_id.clone(),
        bundle: manifest.bundle.clone(),
        manifest_size: json.len() as u64,
        manifest_crc32c: crc32c::crc32c(&json),
    };
    let dir = Path::from(commit.dir());
    let store = storage.object_store();
    store.put(&dir.clone().join("manifest.json"), PutPayload::from(json)).await.unwrap();
    store.put(&dir.clone().join("host-0.shards"), PutPayload::from(vec![0u8; object_len])).await.unwrap();
    StoreCommitLog::new(storage.clone()).record(&commit).await.unwrap();
    commit
}

#[test]
fn a_manifest_claiming_a_1tb_array_is_refused_before_any_allocation() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let manifest = claiming(4 << 20); // 4 Mi x 256 Ki float32 = 4 TiB
    assert_eq!(manifest.objects[0].size, 4 * TIB);
    let json = manifest.to_json();
    assert!(json.len() < SMALL, "the forged manifest itself is small: {} bytes", json.len());

    reset_largest();
    let e = Manifest::parse("ck/manifest.json", &json, &Limits::default()).unwrap_err().to_string();
    let peak = largest();
    assert!(e.contains("exceeds the limit of 274877906944 bytes"), "{e}");
    assert!(peak < SMALL, "refusing it allocated {peak} bytes at once");

    // Exactly 1 TiB: over the default array limit (256 GiB) too.
    let one_tib = claiming(1 << 20);
    assert_eq!(one_tib.objects[0].size, TIB);
    let e = Manifest::parse("k", &one_tib.to_json(), &Limits::default()).unwrap_err().to_string();
    assert!(e.contains("params/huge") && e.contains("exceeds the limit"), "{e}");
}

// The guard only serializes tests of this process on a current-thread runtime: nothing else
// awaits it.
#[allow(clippy::await_holding_lock)]
#[tokio::test]
async fn a_1tb_claim_within_raised_limits_is_refused_by_the_objects_real_length() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(dir.path().to_str().unwrap(), &StoreOptions::default()).unwrap();
    let manifest = claiming(1 << 20);
    // An operator raised every limit to 2 TiB: the manifest's own numbers now pass ...
    let generous = Limits { max_array_bytes: 2 * TIB, max_object_bytes: 2 * TIB, ..Limits::default() };
    manifest.check("k", &generous).unwrap();
    // ... but the store holds 4 KiB where the manifest claims 1 TiB.
    let commit = store_forged(&storage, &manifest, 4096).await;

    reset_largest();
    let e = Checkpoint::open(&storage, &commit, &generous).await.unwrap_err();
    let peak = largest();
    assert!(matches!(e, CheckpointError::SizeMismatch { .. }), "{e}");
    let e = e.to_string();
    assert!(e.contains("the manifest says 1099511627776 bytes, the store holds 4096"), "{e}");
    assert!(peak < SMALL, "refusing it allocated {peak} bytes at once");

    // With the default limits it never gets as far as asking the store.
    let e = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap_err().to_string();
    assert!(e.contains("exceeds the limit"), "{e}");
}

#[tokio::test]
async fn names_with_dot_dot_never_become_keys() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(dir.path().join("outside"), b"keep me").unwrap();
    let storage = Storage::open(root.to_str().unwrap(), &StoreOptions::default()).unwrap();
    let log = StoreCommitLog::new(storage.clone());

    // A manifest naming an object outside its directory.
    for name in ["../outside", "../../outside", "..", "a/../../outside", "/etc/passwd", "..\\outside"] {
        let mut m = claiming(2);
        m.objects[0].name = name.into();
        let e = m.check("k", &Limits::default()).unwrap_err().to_string();
        assert!(e.contains("not a plain file name"), "{name}: {e}");
    }
    // A save id that climbs: refused by every entry point that takes one.
    for save_id in ["..", "../x", "../../outside", "a/../b", ".hidden"] {
        let e = checkpoint::remove(&storage, &log, 1, save_id).await.unwrap_err().to_string();
        assert!(e.contains("save id"), "{save_id}: {e}");
        let mut m = claiming(2);
        m.save_id = save_id.into();
        let e = m.check("k", &Limits::default()).unwrap_err().to_string();
        assert!(e.contains("save id"), "{save_id}: {e}");
    }
    // A forged commit record with a climbing save id opens nothing outside the root.
    let forged = CommitRecord {
        step: 1,
        save_id: "../../outside".into(),
        bundle: "ab".into(),
        manifest_size: 7,
        manifest_crc32c: crc32c::crc32c(b"keep me"),
    };
    assert!(Checkpoint::open(&storage, &forged, &Limits::default()).await.is_err());
    // Store URLs whose prefix climbs.
    for url in ["s3://bucket/jobs/../other", "gs://bucket/a/../../b", "s3://bucket/./a"] {
        let e = Storage::open(url, &StoreOptions::default()).unwrap_err().to_string();
        assert!(e.contains("'..'"), "{url}: {e}");
    }
    assert_eq!(std::fs::read(dir.path().join("outside")).unwrap(), b"keep me");
}
