//! Fixtures and helpers.

use checkpoint::StoreOptions;
use hf::HfModel;
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A copy of a fixture to break.
pub fn copy(name: &str, into: &Path) -> PathBuf {
    let dir = into.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    dir
}

pub async fn open(dir: &Path) -> Result<HfModel, hf::HfError> {
    HfModel::open(dir.to_str().unwrap(), &StoreOptions::default()).await
}

/// Every parameter of the model, whole, in `dtype`.
pub async fn all_params(model: &HfModel, dtype: mesh::DType) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for p in model.model().params() {
        let whole = mesh::Region::full(&p.shape);
        let bytes = model.read_regions(p.path, &p.shape, dtype, &[whole]).await.unwrap().remove(0);
        out.push((p.path.to_string(), bytes));
    }
    out
}
