//! Held-out problems for evaluation, for any job whose data has them: the arithmetic task's
//! held-out split (disjoint from its training problems for every seed), or the `test` file of a
//! JSONL kind (GSM8K's `test.jsonl`: 1,319 problems).
//!
//! An evaluation scores the first `problems` of them (the whole file when it has fewer), always
//! the same ones in the same order, so evaluations before, during and after training, and
//! between runs, compare the same problems.

use crate::arithmetic::{Arithmetic, Split};
use crate::config::DataConfig;
use crate::jsonl::{JsonlFormat, JsonlSource};
use crate::source::{Example, ExampleSource};
use crate::{DataError, Result};

/// The held-out problems of the data `config` describes, the first `problems` of them (fewer
/// when a test file holds fewer). An error when the data has none (see
/// [`DataConfig::has_held_out`]) or its test file does not read.
pub fn held_out_examples(config: &DataConfig, problems: u64, seed: u64) -> Result<Vec<Example>> {
    let source: Box<dyn ExampleSource> = match config {
        DataConfig::Arithmetic(arithmetic) => {
            let held_out = crate::ArithmeticConfig { split: Split::HeldOut, ..arithmetic.clone() };
            Box::new(Arithmetic::new(&held_out, seed)?)
        }
        DataConfig::Jsonl(jsonl) | DataConfig::Gsm8k(jsonl) => {
            let test = jsonl.test.as_ref().ok_or_else(|| no_held_out(config))?;
            let format = config.jsonl_format().unwrap_or(JsonlFormat::PromptAnswer);
            Box::new(JsonlSource::open(test, format)?)
        }
        DataConfig::Tokens(_) => return Err(no_held_out(config)),
    };
    let count = source.num_examples().map_or(problems, |len| len.min(problems));
    (0..count).map(|index| source.example(index)).collect()
}

fn no_held_out(config: &DataConfig) -> DataError {
    DataError::InvalidConfig {
        field: "eval",
        message: format!(
            "data of kind {} has no held-out problems; {}",
            config.kind(),
            if config.has_examples() {
                "set data.test to a file of held-out problems in the same format, or drop eval"
            } else {
                "token files have no prompts to answer: drop eval"
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ArithmeticConfig, JsonlConfig, TokenizerConfig};
    use std::io::Write;

    #[test]
    fn arithmetic_held_out_problems_are_the_held_out_split_in_index_order() {
        let config = DataConfig::Arithmetic(ArithmeticConfig::default());
        let examples = held_out_examples(&config, 20, 3).expect("held out");
        let split = Arithmetic::new(&ArithmeticConfig { split: Split::HeldOut, ..Default::default() }, 3)
            .expect("valid");
        assert_eq!(examples.len(), 20);
        for (index, example) in examples.iter().enumerate() {
            assert_eq!(example, &split.example(index as u64).expect("example"));
            assert_eq!(split.problem(index as u64).expect("problem").split(), Split::HeldOut);
        }
    }

    #[test]
    fn a_test_file_gives_its_first_problems_and_at_most_all() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        for i in 0..5 {
            writeln!(file, r#"{{"question": "q{i}", "answer": "{i} + 1 = {}\n#### {}"}}"#, i + 1, i + 1)
                .expect("write");
        }
        let config = DataConfig::Gsm8k(JsonlConfig {
            path: "train.jsonl".into(),
            test: Some(file.path().into()),
            tokenizer: TokenizerConfig::Char {},
            chat: None,
        });
        let first = held_out_examples(&config, 3, 0).expect("held out");
        assert_eq!(first.iter().map(|e| e.prompt.as_str()).collect::<Vec<_>>(), ["q0", "q1", "q2"]);
        assert_eq!(held_out_examples(&config, 100, 0).expect("held out").len(), 5);
    }

    #[test]
    fn data_without_held_out_problems_is_an_error_naming_the_fix() {
        let config = DataConfig::Jsonl(JsonlConfig {
            path: "train.jsonl".into(),
            test: None,
            tokenizer: TokenizerConfig::Char {},
            chat: None,
        });
        let message = held_out_examples(&config, 8, 0).expect_err("no test file").to_string();
        assert!(message.starts_with("eval:") && message.contains("data.test"), "{message}");
    }
}
