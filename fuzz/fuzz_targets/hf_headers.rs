//! What a Hugging Face model directory's files are parsed by before anything is sized from
//! them: the same bytes as a safetensors file (the header length against the file's size, then
//! the header through the `safetensors` crate's types), as `model.safetensors.index.json` and
//! as `config.json` (whose dimensions then size the parameter list).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let size = data.len() as u64;
    if let Ok(n) = hf::header::header_len(data, size, "model.safetensors")
        && let Ok(header) = hf::header::parse_header(&data[8..8 + n as usize], size, "model.safetensors")
    {
        for entry in header.tensors.values() {
            assert!(entry.range.start >= header.data_start && entry.range.end <= size);
        }
    }
    if let Ok(index) = hf::header::Index::parse(data, "model.safetensors.index.json") {
        let _ = index.files();
    }
    if let Ok(config) = hf::HfConfig::parse(data, "model", "config.json") {
        let _ = config.model.num_params();
        let _ = hf::names::hf_tensors(&config.model).len();
    }
});
