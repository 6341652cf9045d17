//! Save under dcn(2) x (fsdp 2, tp 2), restore onto other meshes, on the file:// backend.

use crate::common::*;
use checkpoint::manifest::Limits;
use checkpoint::{Checkpoint, CommitLog, ReadOptions, Storage, StoreCommitLog, newest_verified};
use mesh::{Region, Sharding};

fn open_dir() -> (tempfile::TempDir, Storage, StoreCommitLog) {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(&format!("file://{}", dir.path().display()), &Default::default()).unwrap();
    let log = StoreCommitLog::new(storage.clone());
    (dir, storage, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hsdp_save_restores_bitwise_on_fsdp4_and_on_one_device() {
    let (_dir, storage, log) = open_dir();
    let spec = save_spec(100, "g1", hsdp(), state(2));
    let (commit, fulls) = save_and_commit(&storage, &log, &spec, &small_chunks()).await;
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap();

    // (fsdp 4): shard every array's first dimension over fsdp, replicate the rest.
    let fsdp4 = ici(&[("fsdp", 4)]);
    let shardings: Vec<Sharding> = spec
        .arrays
        .iter()
        .map(|a| match a.shape.len() {
            0 => Sharding::replicated(0),
            rank => {
                let mut dims = vec![vec![]; rank];
                if a.shape[0] % 4 == 0 {
                    dims[0] = vec!["fsdp".to_string()];
                }
                Sharding::new(dims)
            }
        })
        .collect();
    assert_restores(&checkpoint, &spec, &fulls, &fsdp4, &shardings).await;

    // One device: every array whole.
    let single = ici(&[("fsdp", 1)]);
    let whole: Vec<Sharding> = spec.arrays.iter().map(|a| Sharding::replicated(a.shape.len())).collect();
    assert_restores(&checkpoint, &spec, &fulls, &single, &whole).await;

    // The metadata came back as saved.
    let m = checkpoint.manifest();
    assert_eq!((m.step, m.data_position.seed, m.data_position.step), (100, 17, 100));
    assert_eq!(m.rng_state, vec![0xde, 0xad, 100]);
    assert_eq!(m.topology, hsdp());
    assert_eq!(m.bundle, "5eedc0ffee");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_shard_reads_only_the_chunks_it_needs() {
    let (_dir, storage, log) = open_dir();
    let spec = save_spec(1, "a", hsdp(), state(16));
    let (commit, fulls) = save_and_commit(&storage, &log, &spec, &small_chunks()).await;
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap();
    // A quarter of params/wq's rows: saved as (fsdp, tp) blocks on two hosts.
    let array = &spec.arrays[1];
    let rows = array.shape[0] / 4;
    let region = Region::new(vec![rows..2 * rows, 0..array.shape[1]]);
    let plan = checkpoint.plan_region(&array.name, &region).unwrap();
    assert_eq!(plan.needed_bytes(), region.num_elements() * 4);
    let total = checkpoint.manifest().data_bytes();
    assert!(
        plan.fetched_bytes() < total / 8,
        "read {} of {total} bytes for a {}-byte region",
        plan.fetched_bytes(),
        plan.needed_bytes()
    );
    assert!(plan.fetches.iter().all(|f| f.range.start % 1024 == 0), "reads are chunk-aligned");
    let got = checkpoint.execute(&plan).await.unwrap();
    let mut want = vec![0u8; got.len()];
    mesh::copy_region(&fulls[1], &Region::full(&array.shape), &mut want, &region, &region, 4);
    assert_eq!(got, want);

    // Tiny fetches (one chunk each, one at a time) give the same bytes.
    let narrow =
        checkpoint.clone().with_read_options(ReadOptions { max_fetch_bytes: 1, max_fetches_in_flight: 1 });
    assert_eq!(narrow.read_region(&array.name, &region).await.unwrap(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_shards_are_written_once_by_balanced_writers() {
    let (_dir, storage, log) = open_dir();
    // Everything replicated across the 2 slices, some arrays also across tp: 40 arrays.
    let arrays: Vec<_> = (0..40)
        .map(|i| {
            let sharding = if i % 2 == 0 { spec(&[&["fsdp"], &["tp"]]) } else { spec(&[&["fsdp"], &[]]) };
            checkpoint::ArraySpec::new(
                format!("a{i:02}"),
                vec![8 * (i % 5 + 1), 16],
                mesh::DType::Float32,
                sharding,
            )
        })
        .collect();
    let spec = save_spec(5, "rep", hsdp(), arrays);
    let (commit, _) = save_and_commit(&storage, &log, &spec, &small_chunks()).await;
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap();
    let m = checkpoint.manifest();
    let distinct: u64 = spec.arrays.iter().map(|a| a.num_bytes().unwrap()).sum();
    assert_eq!(m.data_bytes(), distinct, "each byte stored once although every shard has 2+ copies");
    for (a, saved) in spec.arrays.iter().zip(&m.arrays) {
        let expected = if a.sharding.dims()[1].is_empty() { 2 } else { 4 };
        assert_eq!(saved.shards.len(), expected, "{}", a.name);
    }
    let sizes: Vec<u64> = m.objects.iter().map(|o| o.size).collect();
    let largest = m.arrays.iter().flat_map(|a| &a.shards).map(|s| s.length).max().unwrap();
    assert!(sizes[0].abs_diff(sizes[1]) <= largest, "host streams {sizes:?} are unbalanced");
    assert!(sizes.iter().all(|&s| s > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_is_named_and_the_previous_checkpoint_is_used() {
    let (dir, storage, log) = open_dir();
    let older = save_spec(100, "a", hsdp(), state(4));
    let (old_commit, old_fulls) = save_and_commit(&storage, &log, &older, &small_chunks()).await;
    let newer = save_spec(200, "b", hsdp(), state(4));
    let (new_commit, _) = save_and_commit(&storage, &log, &newer, &small_chunks()).await;

    let victim = dir.path().join(new_commit.dir()).join("host-1.shards");
    let mut bytes = std::fs::read(&victim).unwrap();
    let offset = 2 * 1024 + 77;
    bytes[offset] ^= 0x10;
    std::fs::write(&victim, &bytes).unwrap();

    let checkpoint = Checkpoint::open(&storage, &new_commit, &Limits::default()).await.unwrap();
    let e = checkpoint.verify().await.unwrap_err().to_string();
    assert!(e.contains(&format!("{}/host-1.shards", new_commit.dir())), "{e}");
    assert!(e.contains("chunk 2 (bytes 2048..3072)"), "{e}");

    let (found, skipped) = newest_verified(&storage, &log, &Limits::default()).await.unwrap();
    let found = found.expect("the older checkpoint verifies");
    assert_eq!(found.commit(), &old_commit);
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].commit, new_commit);
    let whole: Vec<Sharding> = older.arrays.iter().map(|a| Sharding::replicated(a.shape.len())).collect();
    assert_restores(&found, &older, &old_fulls, &ici(&[("x", 1)]), &whole).await;
    assert_eq!(log.list().await.unwrap().len(), 2, "nothing is uncommitted by a failed check");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_any_chunk_fails_a_local_restore() {
    let (dir, storage, log) = open_dir();
    let spec = save_spec(5, "f", hsdp(), state(16));
    let (commit, fulls) = save_and_commit(&storage, &log, &spec, &small_chunks()).await;
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap();
    let wanted: Vec<(&str, Region)> =
        spec.arrays.iter().map(|a| (a.name.as_str(), Region::full(&a.shape))).collect();
    let victim = dir.path().join(commit.dir()).join("host-1.shards");
    let clean = std::fs::read(&victim).unwrap();
    // Every chunk, whether read in place (one array's or several small arrays' pieces) or
    // through scratch (one fetch per chunk), and with both files read at once.
    let options = [ReadOptions::default(), ReadOptions { max_fetch_bytes: 1, max_fetches_in_flight: 1 }];
    for (chunk, bytes) in clean.chunks(1024).enumerate() {
        let mut flipped = clean.clone();
        flipped[chunk * 1024 + (chunk * 37) % bytes.len()] ^= 0x01;
        std::fs::write(&victim, &flipped).unwrap();
        for options in options {
            let e = checkpoint.clone().with_read_options(options).read_regions(&wanted).await.unwrap_err();
            let e = e.to_string();
            assert!(e.contains(&format!("host-1.shards is corrupt: chunk {chunk} (")), "{options:?}: {e}");
        }
    }
    std::fs::write(&victim, &clean).unwrap();
    for options in options {
        assert_eq!(checkpoint.clone().with_read_options(options).read_regions(&wanted).await.unwrap(), fulls);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncommitted_saves_are_invisible() {
    let (_dir, storage, log) = open_dir();
    let spec = save_spec(7, "half", hsdp(), state(1));
    let fulls = fulls(&spec);
    // Only host 0 uploads; no finalize.
    let buffers = host_buffers(&spec, &fulls, 0);
    checkpoint::save_host(&storage, &spec, 0, buffers, &small_chunks()).await.unwrap();
    assert!(log.list().await.unwrap().is_empty());
    let (found, skipped) = newest_verified(&storage, &log, &Limits::default()).await.unwrap();
    assert!(found.is_none() && skipped.is_empty());
    let listed = checkpoint::list(&storage, &log).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].committed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_reads_share_chunks_and_both_read_paths_agree() {
    let (dir, storage, log) = open_dir();
    let spec = save_spec(3, "b", hsdp(), state(4));
    let (commit, fulls) = save_and_commit(&storage, &log, &spec, &small_chunks()).await;
    let wanted: Vec<(&str, Region)> =
        spec.arrays.iter().map(|a| (a.name.as_str(), Region::full(&a.shape))).collect();
    // file:// reads the files directly; the same directory behind a plain object store (no
    // local directory given) goes through ranged GETs.
    let direct = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap();
    let fs = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let via_store = Storage::from_store(std::sync::Arc::new(fs), "", "plain", None).unwrap();
    let ranged = Checkpoint::open(&via_store, &commit, &Limits::default()).await.unwrap();
    for checkpoint in [&direct, &ranged] {
        for options in [ReadOptions::default(), ReadOptions { max_fetch_bytes: 1, max_fetches_in_flight: 3 }]
        {
            let got = checkpoint.clone().with_read_options(options).read_regions(&wanted).await.unwrap();
            assert_eq!(got, fulls, "{} with {options:?}", checkpoint.manifest().save_id);
        }
    }
    // Arrays smaller than a chunk share it, so reading arrays one by one reads some chunks
    // twice (a batch reads each once); reads that one array covers whole land in place.
    let plans: Vec<_> = wanted.iter().map(|(a, r)| direct.plan_region(a, r).unwrap()).collect();
    let separately: u64 = plans.iter().map(|p| p.fetched_bytes()).sum();
    let stored: u64 = direct.manifest().objects.iter().map(|o| o.size).sum();
    assert!(separately > stored, "{separately} bytes read array by array, {stored} stored");
    let in_place = |p: &checkpoint::restore::RegionPlan| -> u64 {
        let inside = |f: &checkpoint::restore::Fetch| {
            p.copies
                .iter()
                .any(|c| c.object == f.object && c.src <= f.range.start && c.src + c.len >= f.range.end)
        };
        p.fetches.iter().filter(|f| inside(f)).map(|f| f.range.end - f.range.start).sum()
    };
    let embed = &plans[0];
    assert!(in_place(embed) * 2 > embed.fetched_bytes(), "most of embed's reads land in place: {embed:?}");
}
