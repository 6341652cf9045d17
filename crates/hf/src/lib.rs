//! Hugging Face model directories in and out: a `Qwen3ForCausalLM` checkpoint's `config.json`
//! and safetensors weights read straight onto a mesh, and podctl checkpoints written back as a
//! directory `transformers` loads.
//!
//! # Layout
//! - [`config`]: `config.json` to a [`bundle::ModelConfig`] (architecture `Qwen3ForCausalLM`
//!   only, every size bounded before anything is allocated) and back.
//! - [`header`]: a safetensors file's header (read with the `safetensors` crate's own types,
//!   from the header bytes alone) and `model.safetensors.index.json`.
//! - [`names`]: Hugging Face tensor names and layouts against podctl's parameters: one tensor
//!   per layer and `nn.Linear` weights `[out, in]` there, layers stacked and matrices
//!   `[in, out]` here.
//! - [`source`]: where a model directory is ([`Location`]: a local path, `file://`, `s3://`,
//!   `gs://`) and its files read whole (small files) or by byte range.
//! - [`model`]: [`HfModel`], an opened directory with every tensor checked, and
//!   [`HfModel::read_regions`]: the bytes of any regions of a podctl parameter, converted to
//!   its dtype, reading each source byte once (local files through a memory map, object stores
//!   through ranged reads).
//! - [`convert`]: the element copies (dtype conversion, transposition).
//! - [`export`]: a podctl checkpoint (LoRA merged) as a Hugging Face directory: `config.json`,
//!   safetensors shards with their index, `generation_config.json`, the tokenizer files.
//! - [`import`]: a Hugging Face directory as a podctl checkpoint at step 0 (`podctl ckpt
//!   import`), so restarts and replacements read the fast format.
//!
//! **Architecture Invariant:** knows nothing of PJRT, the coordinator or the job spec. It turns
//! files into host bytes laid out as podctl's parameters (and back); placing them on devices is
//! the worker's business (`worker::hf`).
//!
//! **Architecture Invariant:** nothing is sized from a file before it is checked: headers are
//! bounded by the file's length, `config.json`'s dimensions by [`bundle::DIMENSION_LIMITS`], and
//! every tensor's shape against the one `config.json` implies, before any tensor buffer exists.
//!
//! `unsafe`: the crate denies it except in `mmap.rs` (read-only maps of local safetensors
//! files, the same contract as the data crate's token files) and the call of `convert.rs`'s SSE2
//! tile transposes (SSE2 is part of the x86-64 baseline).
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod config;
pub mod convert;
pub mod export;
pub mod header;
pub mod import;
mod mmap;
pub mod model;
pub mod names;
pub mod source;

pub use config::HfConfig;
pub use model::HfModel;
pub use source::Location;

/// Why a model directory cannot be read or written. Messages name the file and the tensor or
/// field at fault, and what would work.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// A file's content is not what a Qwen3 checkpoint holds.
    #[error("{file}: {reason}")]
    Invalid {
        /// The file (its name in the model directory, or a full path/URI).
        file: String,
        /// What is wrong, naming the tensor or field, and the fix.
        reason: String,
    },
    /// A file is missing.
    #[error("{file}: missing; {hint}")]
    Missing {
        /// The file expected.
        file: String,
        /// Why it is expected.
        hint: String,
    },
    /// Reading or writing a local file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The object store or a podctl checkpoint failed.
    #[error(transparent)]
    Store(#[from] checkpoint::CheckpointError),
    /// The model and what it is placed on (a bundle, a checkpoint) disagree.
    #[error("{0}")]
    Mismatch(String),
}

impl fault::Classify for HfError {
    /// A model directory that does not read or fit is the input's.
    fn fault(&self) -> fault::Fault {
        match self {
            HfError::Store(e) => e.fault(),
            _ => fault::Fault::Input,
        }
    }
}

impl HfError {
    pub(crate) fn invalid(file: impl Into<String>, reason: impl Into<String>) -> Self {
        HfError::Invalid { file: file.into(), reason: reason.into() }
    }

    pub(crate) fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        HfError::Io { path: path.to_string(), source }
    }
}

/// The crate's result type.
pub type Result<T, E = HfError> = std::result::Result<T, E>;
