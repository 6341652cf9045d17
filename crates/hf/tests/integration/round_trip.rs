//! `podctl ckpt import` then `podctl ckpt export --hf`, without devices: every tensor comes
//! back bitwise (float32 as float32; bfloat16 through float32 or bfloat16 parameters as
//! bfloat16), and the export carries the source's configuration and generation settings.

use crate::common::{fixture, open};
use checkpoint::{Checkpoint, CommitLog, Limits, Storage, StoreCommitLog, StoreOptions};
use hf::export::{ExportOptions, export_checkpoint};
use hf::import::{ImportOptions, import_checkpoint};
use mesh::DType;
use std::collections::BTreeMap;
use std::path::Path;

/// name -> (dtype, shape, bytes) of every tensor in a directory's safetensors files.
fn tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            for (name, view) in safetensors::SafeTensors::deserialize(&bytes).unwrap().tensors() {
                out.insert(
                    name,
                    (format!("{:?}", view.dtype()), view.shape().to_vec(), view.data().to_vec()),
                );
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_then_export_gives_back_the_source_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("tied-f32", DType::Float32, DType::Float32),
        ("untied-f32", DType::Float32, DType::Float32),
        ("tied-bf16", DType::Float32, DType::Bfloat16),
        ("untied-bf16", DType::Bfloat16, DType::Bfloat16),
    ];
    for (name, params, export) in cases {
        let model = open(&fixture(name)).await.unwrap();
        let root = format!("file://{}/{name}-ckpt", tmp.path().display());
        let storage = Storage::open(&root, &StoreOptions::default()).unwrap();
        let report = import_checkpoint(&model, &storage, &ImportOptions { dtype: params }).await.unwrap();
        assert_eq!(report.arrays, 3 * model.model().params().len());
        assert!(report.writers > 1 && !report.already, "{report:?}");
        let again = import_checkpoint(&model, &storage, &ImportOptions { dtype: params }).await.unwrap();
        assert!(again.already, "the same import twice writes once");

        let commit = StoreCommitLog::new(storage.clone()).list().await.unwrap().remove(0);
        let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap();
        assert_eq!(hf::export::recorded_source(&checkpoint).as_deref(), Some(model.location().uri()));
        let out = tmp.path().join(format!("{name}-export"));
        let options = ExportOptions { dtype: export, ..ExportOptions::default() };
        // The source is found from the checkpoint's metadata, as `podctl ckpt export --hf` finds it.
        let source =
            hf::Location::parse(&hf::export::recorded_source(&checkpoint).unwrap(), &StoreOptions::default())
                .unwrap();
        let written = export_checkpoint(&checkpoint, &root, &out, Some(&source), &options).await.unwrap();
        assert!(written.copied.contains(&"generation_config.json".to_string()), "{written:?}");
        let (a, b) = (tensors(&fixture(name)), tensors(&out));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{name}");
        for (tensor, value) in &a {
            assert!(b[tensor] == *value, "{name}: {tensor} differs after import and export");
        }
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        let source: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture(name).join("config.json")).unwrap()).unwrap();
        assert_eq!(config["rope_parameters"], source["rope_parameters"]);
        assert_eq!(config["dtype"], hf::config::dtype_name(export));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_export_is_sharded_with_an_index_and_an_existing_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = open(&fixture("tied-f32")).await.unwrap();
    let root = format!("file://{}/ckpt", tmp.path().display());
    let storage = Storage::open(&root, &StoreOptions::default()).unwrap();
    import_checkpoint(&model, &storage, &ImportOptions { dtype: DType::Float32 }).await.unwrap();
    let commit = StoreCommitLog::new(storage.clone()).list().await.unwrap().remove(0);
    let checkpoint = Checkpoint::open(&storage, &commit, &Limits::default()).await.unwrap();
    let out = tmp.path().join("sharded");
    // No source: the configuration is made from the model the checkpoint records.
    let options = ExportOptions { dtype: DType::Float32, max_shard_bytes: 20_000 };
    let written = export_checkpoint(&checkpoint, &root, &out, None, &options).await.unwrap();
    assert!(written.files.len() >= 4, "{:?}", written.files);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap()).unwrap();
    assert_eq!(index["weight_map"].as_object().unwrap().len(), written.tensors);
    let reopened = open(&out).await.unwrap();
    assert_eq!(reopened.model().params(), model.model().params());
    assert_eq!(tensors(&out), tensors(&fixture("tied-f32")));
    let e = export_checkpoint(&checkpoint, &root, &out, None, &options).await.unwrap_err().to_string();
    assert!(e.contains("exists and is not empty"), "{e}");
}
