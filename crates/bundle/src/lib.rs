//! The bundle: a train step exported from JAX as StableHLO programs plus a manifest.
//!
//! The bundle is the contract between the Python side (`models/`) and everything in Rust; its
//! format is documented in `docs/BUNDLE.md`. [`Bundle::load`] reads a bundle directory, checks the
//! manifest against that contract (every tensor's sharding against the mesh, every program's
//! signature, the files) and computes the bundle's identity, the SHA-256 of its manifest and
//! programs, which names compile caches and is recorded in checkpoints.
//!
//! **API Boundary:** nothing else crosses between JAX and Rust. **Architecture Invariant:** this
//! crate reads files and validates; it never compiles or runs anything.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod manifest;
mod model;
mod presets;

pub use manifest::{
    ExporterInfo, HOST_MEMORY_KIND, LoraConfig, MAX_TENSOR_BYTES, Manifest, ModelConfig, OptimizerConfig,
    ProgramSpec, TensorSpec, TrainConfig,
};
pub use model::{DIMENSION_LIMITS, MAX_PARAMS, ParamShape};
pub use presets::{preset, presets};

use mesh::IciMesh;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The manifest format this build reads.
pub const FORMAT: &str = "podctl-bundle/1";

/// The manifest's file name in a bundle directory (written last by the exporter and by copies).
pub const MANIFEST_FILE: &str = "manifest.json";

/// The programs every SFT bundle (`train.kind = "sft"`) carries.
pub const TRAIN_PROGRAMS: [&str; 4] = ["init", "zero_grads", "grad_step", "apply_step"];

/// The programs every GRPO bundle (`train.kind = "grpo"`) carries: SFT's without `grad_step`,
/// plus sampling, scoring and the GRPO gradient.
pub const GRPO_PROGRAMS: [&str; 6] =
    ["init", "zero_grads", "apply_step", "rollout", "logprobs", "grpo_grad_step"];

/// Slots of the rollout's `sample/stop_ids` input (`int32[8]`, replicated): the ids a row stops
/// at, unused slots -1. More than any tokenizer lists (Qwen3: 2, Llama 3: 3).
pub const STOP_IDS: u64 = 8;
/// Programs a bundle of either kind carries only when its exporter was asked for them:
/// `logits` (full float32 logits of a batch, for parity tests; training never compiles it).
pub const OPTIONAL_PROGRAMS: [&str; 1] = ["logits"];

/// Why a bundle cannot be used. Messages name the file or field and what to do.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The manifest or a program file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("{path} is not a valid bundle manifest: {source}")]
    Parse {
        /// The manifest file.
        path: PathBuf,
        /// The parse error, with line and column.
        source: serde_json::Error,
    },
    /// The manifest parses but breaks the contract of docs/BUNDLE.md.
    #[error("bundle {dir}: {field}: {reason}")]
    Invalid {
        /// The bundle directory.
        dir: PathBuf,
        /// The manifest field at fault, e.g. `programs.grad_step.inputs[3]`.
        field: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The bundle was lowered for another mesh than the one the job runs on.
    #[error(
        "bundle {dir} was lowered for mesh {bundle_mesh}, but the job runs on {job_mesh}; \
         export the bundle again for {job_mesh} (podctl does this when the bundle is not given explicitly)"
    )]
    MeshMismatch {
        /// The bundle directory.
        dir: PathBuf,
        /// The mesh in the manifest.
        bundle_mesh: IciMesh,
        /// The mesh the job asked for.
        job_mesh: IciMesh,
    },
}

impl fault::Classify for BundleError {
    /// A bundle that does not load or fit is the input's: export it again.
    fn fault(&self) -> fault::Fault {
        match self {
            BundleError::Io { .. }
            | BundleError::Parse { .. }
            | BundleError::Invalid { .. }
            | BundleError::MeshMismatch { .. } => fault::Fault::Input,
        }
    }
}

/// A loaded, validated bundle.
#[derive(Debug, Clone)]
pub struct Bundle {
    dir: PathBuf,
    manifest: Manifest,
    id: String,
}

impl Bundle {
    /// Reads and validates the bundle in `dir`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, BundleError> {
        let dir = dir.as_ref().to_path_buf();
        let manifest_path = dir.join(MANIFEST_FILE);
        let text = read(&manifest_path)?;
        let manifest = Manifest::parse(&text, &dir)?;

        let mut hash = Sha256::new();
        hash.update(&text);
        for (name, program) in &manifest.programs {
            let path = dir.join(&program.file);
            if !path.starts_with(&dir) || program.file.contains("..") {
                return Err(BundleError::Invalid {
                    dir,
                    field: format!("programs.{name}.file"),
                    reason: format!("'{}' must be a path inside the bundle directory", program.file),
                });
            }
            hash.update(name.as_bytes());
            hash.update(read(&path)?);
        }
        let id = hex::encode(hash.finalize());
        Ok(Self { dir, manifest, id })
    }

    /// The bundle directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The bundle's identity: hex SHA-256 over the manifest and every program.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The ICI mesh the programs were lowered for.
    pub fn mesh(&self) -> &IciMesh {
        &self.manifest.mesh
    }

    /// Refuses to run the bundle on another mesh than the one it was lowered for.
    pub fn check_mesh(&self, job_mesh: &IciMesh) -> Result<(), BundleError> {
        if self.mesh() == job_mesh {
            Ok(())
        } else {
            Err(BundleError::MeshMismatch {
                dir: self.dir.clone(),
                bundle_mesh: self.mesh().clone(),
                job_mesh: job_mesh.clone(),
            })
        }
    }

    /// A program's signature.
    pub fn program(&self, name: &str) -> Result<&ProgramSpec, BundleError> {
        self.manifest.programs.get(name).ok_or_else(|| BundleError::Invalid {
            dir: self.dir.clone(),
            field: format!("programs.{name}"),
            reason: "this program is missing; export the bundle again with a current exporter".into(),
        })
    }

    /// A program's StableHLO (MLIR bytecode or text), ready to compile.
    pub fn program_bytes(&self, name: &str) -> Result<Vec<u8>, BundleError> {
        read(&self.dir.join(&self.program(name)?.file))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, BundleError> {
    std::fs::read(path).map_err(|source| BundleError::Io { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests;
