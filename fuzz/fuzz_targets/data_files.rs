//! What `crates/data` reads from files it is pointed at and from model output: a model
//! directory's `tokenizer_config.json` and `generation_config.json`, its chat template (compiled
//! and rendered: a template from the hub that loops, recurses or builds huge strings must end in
//! an error, within the fuel and recursion limits, not hang or exhaust memory), a JSONL line of
//! each row format (prompt/answer, GSM8K, `messages` conversations), a completion scored against
//! a reference answer, and a Parquet file (footer, row groups, GSM8K and `messages` rows: a
//! damaged or hostile file is an error naming the file and row, never a panic or a huge
//! allocation). The first byte picks which.
#![no_main]

use data::chat::{ChatTemplate, Message, RenderOptions};
use data::hf_files::{parse_generation_config, parse_tokenizer_config};
use data::files::LocalFile;
use data::rows::RowFormat;
use data::{ExampleSource, ParquetSource, Reward, RewardWeights, leading_number};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::Arc;

fuzz_target!(|input: &[u8]| {
    let Some((&which, bytes)) = input.split_first() else { return };
    match which % 6 {
        0 => {
            let _ = parse_tokenizer_config(bytes);
        }
        1 => {
            let _ = parse_generation_config(bytes);
        }
        2 => {
            let Ok(source) = std::str::from_utf8(bytes) else { return };
            let special = vec![("eos_token".to_string(), "<|im_end|>".to_string())];
            let date = chrono::NaiveDate::from_ymd_opt(2026, 1, 31);
            let Ok(template) = ChatTemplate::new(source, Path::new("<fuzz>/tokenizer_config.json"), special, date)
            else {
                return;
            };
            let messages = [
                Message::new("system", "Answer with a number."),
                Message::new("user", "What is 48 + 24?"),
                Message::from_json(r#"{"role": "assistant", "content": "72", "reasoning_content": "48 + 24 = 72", "tool_calls": [{"function": {"name": "f", "arguments": {"a": [1, 2.5, null]}}}]}"#)
                    .expect("a valid message"),
            ];
            for add_generation_prompt in [false, true] {
                let kwargs = vec![("enable_thinking".to_string(), serde_json::Value::Bool(add_generation_prompt))];
                let _ = template.render(&messages, &RenderOptions { add_generation_prompt, kwargs });
            }
        }
        3 => {
            for format in [RowFormat::prompt_answer(), RowFormat::gsm8k(), RowFormat::chat()] {
                let _ = data::jsonl::parse_line(&format, bytes);
            }
        }
        5 => {
            // ParquetSource turns the `parquet` crate's panics on damaged pages into errors with
            // catch_unwind; libfuzzer-sys's hook would abort before the unwinding reached it. A
            // panic that escapes still aborts (fuzz_target! catches it and aborts): a finding.
            let abort_hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            for format in [RowFormat::gsm8k(), RowFormat::chat()] {
                let file = LocalFile::from_bytes("<fuzz>.parquet", bytes.to_vec());
                let Ok(source) = ParquetSource::open(vec![Arc::new(file)], format) else { continue };
                for row in 0..source.len().min(64) {
                    let _ = source.example(row);
                }
            }
            std::panic::set_hook(abort_hook);
        }
        _ => {
            let text = String::from_utf8_lossy(bytes);
            let (completion, reference) = text.split_once('\u{0}').unwrap_or((&text, "#### 72"));
            let reward = Reward::score(completion, reference, &RewardWeights::default());
            assert!(reward.total.is_finite());
            let _ = leading_number(completion);
        }
    }
});
