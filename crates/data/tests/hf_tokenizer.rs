//! HfTokenizer against the Python `tokenizers` library's own output for the same tokenizer.json
//! (fixtures/make_tiny_bpe.py wrote both files).

use podctl_data::{
    BatchSpec, DataConfig, DataError, FileConfig, HfTokenizer, HfTokenizerConfig, Loader, LocalFiles,
    SpecialTokens, Tokenizer, TokenizerConfig,
};
use serde::Deserialize;
use std::io::Write;
use std::path::PathBuf;

#[derive(Deserialize)]
struct Expected {
    vocab_size: u32,
    special: std::collections::BTreeMap<String, u32>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    ids_with_special_tokens: Vec<u32>,
    decoded: String,
    decoded_with_special_tokens_skipped: String,
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn expected() -> Expected {
    let text = std::fs::read_to_string(fixture("tiny_bpe_expected.json")).expect("fixture");
    serde_json::from_str(&text).expect("fixture parses")
}

fn special() -> SpecialTokens {
    SpecialTokens { pad: Some("<pad>".into()), bos: Some("<s>".into()), eos: Some("</s>".into()) }
}

fn tokenizer() -> HfTokenizer {
    HfTokenizer::load(&LocalFiles, &fixture("tiny_bpe.json").display().to_string(), &special(), None)
        .expect("loads")
}

#[test]
fn encode_and_decode_match_the_python_library() {
    let (tokenizer, expected) = (tokenizer(), expected());
    assert!(expected.cases.len() >= 5);
    for case in &expected.cases {
        assert_eq!(tokenizer.encode(&case.text).expect("encodes"), case.ids, "{:?}", case.text);
        assert_eq!(tokenizer.decode(&case.ids).expect("decodes"), case.decoded, "{:?}", case.text);
        // Special tokens (which the file's post-processor adds) are dropped when decoding.
        assert_eq!(
            tokenizer.decode(&case.ids_with_special_tokens).expect("decodes"),
            case.decoded_with_special_tokens_skipped,
            "{:?}",
            case.text
        );
    }
}

#[test]
fn special_ids_and_vocab_size_match_the_python_library() {
    let (tokenizer, expected) = (tokenizer(), expected());
    assert_eq!(tokenizer.vocab_size(), expected.vocab_size);
    assert_eq!(tokenizer.pad_id(), expected.special["<pad>"]);
    assert_eq!(tokenizer.bos_id(), Some(expected.special["<s>"]));
    assert_eq!(tokenizer.eos_id(), expected.special["</s>"]);
    assert_eq!(tokenizer.stop_ids(), [expected.special["</s>"]]);
    assert!(tokenizer.chat_template().is_none());
}

#[test]
fn bos_comes_from_the_post_processor_and_a_bare_file_needs_an_eos() {
    // The file's post-processor is `<s> $A </s>`: its BOS is found without being named.
    let only_eos = SpecialTokens { eos: Some("</s>".into()), ..SpecialTokens::default() };
    let tokenizer =
        HfTokenizer::load(&LocalFiles, &fixture("tiny_bpe.json").display().to_string(), &only_eos, None)
            .expect("loads");
    assert_eq!(tokenizer.bos_id(), Some(expected().special["<s>"]));
    // No pad token anywhere: padding uses EOS.
    assert_eq!(tokenizer.pad_id(), tokenizer.eos_id());
    let error = HfTokenizer::load(
        &LocalFiles,
        &fixture("tiny_bpe.json").display().to_string(),
        &SpecialTokens::default(),
        None,
    )
    .expect_err("no eos");
    let message = error.to_string();
    assert!(message.contains("tiny_bpe.json") && message.contains("data.tokenizer.eos"), "{message}");
}

#[test]
fn a_missing_special_token_is_named() {
    let special = SpecialTokens { eos: Some("<|im_end|>".into()), ..special() };
    let error =
        HfTokenizer::load(&LocalFiles, &fixture("tiny_bpe.json").display().to_string(), &special, None)
            .expect_err("no such token");
    assert!(matches!(&error, DataError::MissingSpecialToken { role: "eos", .. }), "{error:?}");
    assert!(error.to_string().contains("<|im_end|>"), "{error}");
}

#[test]
fn a_file_that_is_not_a_tokenizer_is_an_error() {
    let error = HfTokenizer::load(
        &LocalFiles,
        &fixture("tiny_bpe_expected.json").display().to_string(),
        &special(),
        None,
    )
    .expect_err("not a tokenizer");
    assert!(error.to_string().contains("tiny_bpe_expected.json"), "{error}");
    assert!(error.to_string().contains("cannot load"), "{error}");
}

#[test]
fn ids_outside_the_vocabulary_do_not_decode() {
    let error = tokenizer().decode(&[5, 400]).expect_err("400 is past the vocabulary");
    assert!(matches!(error, DataError::UndecodableId { id: 400, position: 1, vocab_size: 400 }), "{error:?}");
}

#[test]
fn loader_lays_out_hf_ids_with_its_own_bos_and_eos() {
    let (tokenizer, expected) = (tokenizer(), expected());
    let (prompt, answer) = (&expected.cases[0], &expected.cases[1]);
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    let line = serde_json::json!({"prompt": prompt.text, "answer": answer.text});
    writeln!(file, "{line}").expect("write");
    let hf = HfTokenizerConfig {
        path: fixture("tiny_bpe.json").display().to_string(),
        pad: Some("<pad>".into()),
        bos: Some("<s>".into()),
        eos: Some("</s>".into()),
    };
    let config = DataConfig::Jsonl(FileConfig {
        path: file.path().display().to_string(),
        test: None,
        format: None,
        columns: Default::default(),
        tokenizer: TokenizerConfig::Hf(hf),
        chat: None,
    });
    let seq_len = 64;
    let loader = Loader::from_config(&config, BatchSpec::new(1, 1, seq_len).expect("valid"), 0, &LocalFiles)
        .expect("loader");
    let batch = loader.micro_batch(0, 0).expect("batch");

    let sequence: Vec<i32> = tokenizer
        .bos_id()
        .into_iter()
        .chain(prompt.ids.iter().copied())
        .chain(answer.ids.iter().copied())
        .chain(std::iter::once(tokenizer.eos_id()))
        .map(|id| id as i32)
        .collect();
    assert!(sequence.len() <= seq_len);
    assert_eq!(&batch.tokens[..sequence.len()], &sequence[..]);
    assert!(batch.tokens[sequence.len()..].iter().all(|&id| id == tokenizer.pad_id() as i32));
    let masked: Vec<u32> = batch
        .targets
        .iter()
        .zip(&batch.loss_mask)
        .filter(|&(_, &m)| m == 1.0)
        .map(|(&t, _)| t as u32)
        .collect();
    let answer_and_eos: Vec<u32> = answer.ids.iter().copied().chain([tokenizer.eos_id()]).collect();
    assert_eq!(masked, answer_and_eos);
    assert_eq!(tokenizer.decode(&masked).expect("decodes"), answer.text);
}
