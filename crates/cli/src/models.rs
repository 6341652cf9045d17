//! Hugging Face model directories for commands that load job specs: `config.json` read through
//! the `hf` crate (local, `s3://`, `gs://`), handed to the job crate as a [`job::ModelReader`].

use checkpoint::StoreOptions;

/// Reads a model directory's `config.json`, blocking on the process's runtime (store clients
/// are async; job specs load from synchronous code).
pub struct HfReader(pub tokio::runtime::Handle);

impl job::ModelReader for HfReader {
    fn read_config(&self, uri: &str) -> Result<bundle::ModelConfig, String> {
        self.0.block_on(async {
            let location = hf::Location::parse(uri, &StoreOptions::default()).map_err(|e| e.to_string())?;
            let (config, _) = hf::model::read_config(&location).await.map_err(|e| e.to_string())?;
            Ok(config.model)
        })
    }
}
