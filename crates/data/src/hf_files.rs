//! The tokenizer side of a Hugging Face model directory, read as transformers reads it:
//!
//! - `tokenizer.json`: the tokenizer itself (loaded by the `tokenizers` crate);
//! - `tokenizer_config.json`: the special tokens' texts (`bos_token`, `eos_token`, `pad_token`,
//!   `unk_token`) and the `chat_template` (not `add_bos_token`, which transformers ignores when
//!   there is a `tokenizer.json`: its post-processor decides);
//! - `chat_template.jinja`: the chat template, when saved apart (it takes precedence, as in
//!   transformers);
//! - `generation_config.json`: the ids generation stops at (`eos_token_id`, one or a list) and
//!   `pad_token_id`.
//!
//! Only `tokenizer.json` is required. The parsers here are pure functions of the files' bytes
//! (fuzzed in `fuzz/fuzz_targets/data_files.rs`); other fields of these files are ignored.

use crate::files::DataFiles;
use crate::{DataError, Result};
use bytes::Bytes;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The file names transformers uses.
pub const TOKENIZER_JSON: &str = "tokenizer.json";
/// See [`TOKENIZER_JSON`].
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// See [`TOKENIZER_JSON`].
pub const GENERATION_CONFIG: &str = "generation_config.json";
/// See [`TOKENIZER_JSON`].
pub const CHAT_TEMPLATE_JINJA: &str = "chat_template.jinja";

/// Largest `tokenizer_config.json`, `generation_config.json` or `chat_template.jinja` read
/// (Qwen3's config is 10 KB; the largest on the hub, with every added token spelled out, are a
/// few MB): a bound on what a malformed directory can make podctl allocate.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// What `tokenizer_config.json` says (the fields podctl uses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerConfigFile {
    /// `bos_token`'s text.
    pub bos_token: Option<String>,
    /// `eos_token`'s text.
    pub eos_token: Option<String>,
    /// `pad_token`'s text.
    pub pad_token: Option<String>,
    /// `unk_token`'s text.
    pub unk_token: Option<String>,
    /// `chat_template` (a string, or the `default` entry of a list of named templates).
    pub chat_template: Option<String>,
}

/// What `generation_config.json` says (the fields podctl uses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenerationConfigFile {
    /// `eos_token_id`: the ids generation stops at, in the file's order.
    pub eos_token_ids: Vec<u32>,
    /// `pad_token_id`.
    pub pad_token_id: Option<u32>,
}

/// The tokenizer files found for a path: a model directory, or a `tokenizer.json` whose
/// directory may hold the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerFiles {
    /// The `tokenizer.json`.
    pub tokenizer_json: PathBuf,
    /// `tokenizer_config.json`, parsed, with its path.
    pub config: Option<(PathBuf, TokenizerConfigFile)>,
    /// `generation_config.json`, parsed, with its path.
    pub generation: Option<(PathBuf, GenerationConfigFile)>,
    /// The chat template and the file it came from (`chat_template.jinja` or
    /// `tokenizer_config.json`).
    pub chat_template: Option<(PathBuf, String)>,
}

impl TokenizerFiles {
    /// Finds and parses the files for `uri` (a path, `file://`, `s3://` or `gs://`, read through
    /// `files`): a directory holding `tokenizer.json`, or a tokenizer file itself (then the other
    /// files are looked for beside it). Returns them with `tokenizer.json`'s bytes.
    pub fn find(files: &dyn DataFiles, uri: &str) -> Result<(Self, Bytes)> {
        let is_dir = files.is_dir(uri)?;
        let (dir, tokenizer_json) = if is_dir {
            let dir = uri.trim_end_matches('/').to_owned();
            let json = format!("{dir}/{TOKENIZER_JSON}");
            (dir, json)
        } else {
            let dir = uri.rsplit_once('/').map_or_else(|| ".".to_owned(), |(dir, _)| dir.to_owned());
            (dir, uri.to_owned())
        };
        let Some(json_file) = files.open(&tokenizer_json)? else {
            let what = if is_dir {
                format!(
                    "the directory has no {TOKENIZER_JSON}; point data.tokenizer.path at a model directory that has one"
                )
            } else {
                "no such file; point data.tokenizer.path at a model directory or a tokenizer.json".into()
            };
            return Err(DataError::Tokenizer { path: PathBuf::from(tokenizer_json), message: what });
        };
        let json_bytes = json_file.read(0..json_file.len())?;
        let beside = |name: &str| format!("{dir}/{name}");
        let config = read_optional(files, &beside(TOKENIZER_CONFIG))?
            .map(|(path, bytes)| {
                parse_tokenizer_config(&bytes).map(|c| (path.clone(), c)).map_err(|m| at(&path, m))
            })
            .transpose()?;
        let generation = read_optional(files, &beside(GENERATION_CONFIG))?
            .map(|(path, bytes)| {
                parse_generation_config(&bytes).map(|c| (path.clone(), c)).map_err(|m| at(&path, m))
            })
            .transpose()?;
        let chat_template = match read_optional(files, &beside(CHAT_TEMPLATE_JINJA))? {
            Some((path, bytes)) => {
                let text = String::from_utf8(bytes.to_vec())
                    .map_err(|_| at(&path, "is not UTF-8 text; save the template as UTF-8".into()))?;
                Some((path, text))
            }
            None => config.as_ref().and_then(|(path, c)| Some((path.clone(), c.chat_template.clone()?))),
        };
        let found = Self { tokenizer_json: PathBuf::from(tokenizer_json), config, generation, chat_template };
        Ok((found, json_bytes))
    }

    /// Every file read, `tokenizer.json` first: what a model export copies beside the weights.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.tokenizer_json.clone()];
        paths.extend(self.config.iter().map(|(path, _)| path.clone()));
        paths.extend(self.generation.iter().map(|(path, _)| path.clone()));
        paths.extend(
            self.chat_template
                .iter()
                .filter(|(path, _)| path.file_name().is_some_and(|name| name == CHAT_TEMPLATE_JINJA))
                .map(|(path, _)| path.clone()),
        );
        paths
    }
}

fn at(path: &Path, message: String) -> DataError {
    DataError::Tokenizer { path: path.to_path_buf(), message }
}

/// The bytes of `uri`, or `None` when there is no such file; a file over [`MAX_CONFIG_BYTES`]
/// is refused before it is read.
fn read_optional(files: &dyn DataFiles, uri: &str) -> Result<Option<(PathBuf, Bytes)>> {
    let path = PathBuf::from(uri);
    let Some(file) = files.open(uri)? else { return Ok(None) };
    let len = file.len();
    if len > MAX_CONFIG_BYTES {
        return Err(at(
            &path,
            format!(
                "is {len} bytes, more than the {MAX_CONFIG_BYTES} a tokenizer or generation config can be"
            ),
        ));
    }
    Ok(Some((path, file.read(0..len)?)))
}

fn parse_object(bytes: &[u8]) -> std::result::Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(format!("is not a JSON object but {}", crate::jsonl::kind_of(&other))),
        Err(error) => Err(format!("is not valid JSON ({error})")),
    }
}

/// Parses `tokenizer_config.json`; the error names the field.
pub fn parse_tokenizer_config(bytes: &[u8]) -> std::result::Result<TokenizerConfigFile, String> {
    let object = parse_object(bytes)?;
    let token = |field: &str| -> std::result::Result<Option<String>, String> {
        match object.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            // transformers' AddedToken, serialized: {"content": "<s>", "lstrip": false, ...}.
            Some(Value::Object(token)) => match token.get("content") {
                Some(Value::String(text)) => Ok(Some(text.clone())),
                _ => Err(format!("field `{field}` is an object without a string `content`")),
            },
            Some(other) => Err(format!(
                "field `{field}` must be a string, an object with `content`, or null; found {}",
                crate::jsonl::kind_of(other)
            )),
        }
    };
    let chat_template = match object.get("chat_template") {
        None | Some(Value::Null) => None,
        Some(Value::String(template)) => Some(template.clone()),
        // The older form: [{"name": "default", "template": "..."}, {"name": "tool_use", ...}].
        Some(Value::Array(named)) => {
            let mut default = None;
            for entry in named {
                match (entry.get("name"), entry.get("template")) {
                    (Some(Value::String(name)), Some(Value::String(template))) => {
                        if name == "default" {
                            default = Some(template.clone());
                        }
                    }
                    _ => {
                        return Err("field `chat_template` is a list whose entries must be \
                                    {\"name\": string, \"template\": string}"
                            .into());
                    }
                }
            }
            Some(default.ok_or("field `chat_template` lists named templates but none is named `default`")?)
        }
        Some(other) => {
            return Err(format!(
                "field `chat_template` must be a string or a list of named templates, found {}",
                crate::jsonl::kind_of(other)
            ));
        }
    };
    Ok(TokenizerConfigFile {
        bos_token: token("bos_token")?,
        eos_token: token("eos_token")?,
        pad_token: token("pad_token")?,
        unk_token: token("unk_token")?,
        chat_template,
    })
}

/// Parses `generation_config.json`; the error names the field.
pub fn parse_generation_config(bytes: &[u8]) -> std::result::Result<GenerationConfigFile, String> {
    let object = parse_object(bytes)?;
    let id = |field: &str, value: &Value| -> std::result::Result<u32, String> {
        value.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| {
            format!("field `{field}` must hold token ids (integers from 0 to 2^32 - 1), found {value}")
        })
    };
    let eos_token_ids = match object.get("eos_token_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) => {
            ids.iter().map(|value| id("eos_token_id", value)).collect::<Result<_, _>>()?
        }
        Some(value) => vec![id("eos_token_id", value)?],
    };
    let pad_token_id = match object.get("pad_token_id") {
        None | Some(Value::Null) => None,
        Some(value) => Some(id("pad_token_id", value)?),
    };
    Ok(GenerationConfigFile { eos_token_ids, pad_token_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_config_reads_strings_added_tokens_and_nulls() {
        let config = parse_tokenizer_config(
            br#"{"bos_token": null, "eos_token": "<|im_end|>", "pad_token": {"__type": "AddedToken", "content": "<pad>", "lstrip": false},
                "add_bos_token": false, "chat_template": "{{ messages }}", "model_max_length": 131072}"#,
        )
        .expect("parses");
        assert_eq!(
            config,
            TokenizerConfigFile {
                bos_token: None,
                eos_token: Some("<|im_end|>".into()),
                pad_token: Some("<pad>".into()),
                unk_token: None,
                chat_template: Some("{{ messages }}".into()),
            }
        );
    }

    #[test]
    fn a_list_of_named_templates_gives_the_default() {
        let config = parse_tokenizer_config(
            br#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        )
        .expect("parses");
        assert_eq!(config.chat_template.as_deref(), Some("D"));
        let error = parse_tokenizer_config(br#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#)
            .expect_err("no default");
        assert!(error.contains("`default`"), "{error}");
    }

    #[test]
    fn tokenizer_config_errors_name_the_field() {
        for (text, field) in [
            (r#"{"eos_token": 5}"#, "`eos_token`"),
            (r#"{"pad_token": {"text": "<pad>"}}"#, "`pad_token`"),
            (r#"{"chat_template": 3}"#, "`chat_template`"),
            (r#"{"chat_template": [1]}"#, "`chat_template`"),
        ] {
            let error = parse_tokenizer_config(text.as_bytes()).expect_err(text);
            assert!(error.contains(field), "{text}: {error}");
        }
        assert!(parse_tokenizer_config(b"[1]").expect_err("not an object").contains("an array"));
        assert!(parse_tokenizer_config(b"{").expect_err("not json").contains("not valid JSON"));
    }

    #[test]
    fn generation_config_takes_one_eos_id_or_a_list() {
        let config = parse_generation_config(
            br#"{"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643, "top_p": 0.95}"#,
        )
        .expect("parses");
        assert_eq!(
            config,
            GenerationConfigFile { eos_token_ids: vec![151645, 151643], pad_token_id: Some(151643) }
        );
        let config = parse_generation_config(br#"{"eos_token_id": 2}"#).expect("parses");
        assert_eq!(config.eos_token_ids, [2]);
        assert_eq!(parse_generation_config(b"{}").expect("parses"), GenerationConfigFile::default());
        for text in
            [r#"{"eos_token_id": -1}"#, r#"{"eos_token_id": [1, "2"]}"#, r#"{"pad_token_id": 4294967296}"#]
        {
            let error = parse_generation_config(text.as_bytes()).expect_err(text);
            assert!(error.contains("_token_id` must hold token ids"), "{text}: {error}");
        }
    }

    fn find(path: &Path) -> Result<TokenizerFiles> {
        Ok(TokenizerFiles::find(&crate::files::LocalFiles, &path.display().to_string())?.0)
    }

    #[test]
    fn a_directory_without_tokenizer_json_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let error = find(dir.path()).expect_err("empty directory");
        assert!(error.to_string().contains("tokenizer.json"), "{error}");
        assert!(error.to_string().contains("has no tokenizer.json"), "{error}");
    }

    #[test]
    fn a_bad_config_beside_the_tokenizer_names_its_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(TOKENIZER_JSON), "{}").expect("write");
        std::fs::write(dir.path().join(GENERATION_CONFIG), r#"{"eos_token_id": "x"}"#).expect("write");
        let error = find(dir.path()).expect_err("bad generation config");
        let message = error.to_string();
        assert!(
            message.contains("generation_config.json") && message.contains("`eos_token_id`"),
            "{message}"
        );
    }

    #[test]
    fn chat_template_jinja_takes_precedence_and_is_listed() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(TOKENIZER_JSON), "{}").expect("write");
        std::fs::write(dir.path().join(TOKENIZER_CONFIG), r#"{"chat_template": "old"}"#).expect("write");
        let files = find(&dir.path().join(TOKENIZER_JSON)).expect("found");
        assert_eq!(files.chat_template.as_ref().map(|(_, t)| t.as_str()), Some("old"));
        assert_eq!(files.paths().len(), 2);
        std::fs::write(dir.path().join(CHAT_TEMPLATE_JINJA), "new").expect("write");
        let files = find(dir.path()).expect("found");
        let (path, template) = files.chat_template.as_ref().expect("template");
        assert_eq!((path.ends_with(CHAT_TEMPLATE_JINJA), template.as_str()), (true, "new"));
        assert_eq!(files.paths().len(), 3);
    }
}
