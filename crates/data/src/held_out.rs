//! Held-out problems for evaluation, for any job whose data has them: the arithmetic task's
//! held-out split (disjoint from its training problems for every seed), or the `test` file of a
//! file kind (GSM8K's test split: 1,319 problems), read through the job's [`DataFiles`].
//!
//! An evaluation scores the first `problems` of them (the whole file when it has fewer), always
//! the same ones in the same order, so evaluations before, during and after training, and
//! between runs, compare the same problems.

use crate::arithmetic::{Arithmetic, Split};
use crate::batch::open_examples;
use crate::config::DataConfig;
use crate::files::DataFiles;
use crate::source::{Example, ExampleSource};
use crate::{DataError, Result};

/// The held-out problems of the data `config` describes, the first `problems` of them (fewer
/// when a test file holds fewer). An error when the data has none (see
/// [`DataConfig::has_held_out`]) or its test file does not read.
pub fn held_out_examples(
    config: &DataConfig,
    problems: u64,
    seed: u64,
    files: &dyn DataFiles,
) -> Result<Vec<Example>> {
    let source: Box<dyn ExampleSource> = match config {
        DataConfig::Arithmetic(arithmetic) => {
            let held_out = crate::ArithmeticConfig { split: Split::HeldOut, ..arithmetic.clone() };
            Box::new(Arithmetic::new(&held_out, seed)?)
        }
        DataConfig::Jsonl(file) | DataConfig::Gsm8k(file) | DataConfig::Chat(file) => {
            let test = file.test.as_ref().ok_or_else(|| no_held_out(config))?;
            open_examples(config, test, files)?
        }
        DataConfig::Tokens(_) => return Err(no_held_out(config)),
    };
    let count = source.num_examples().map_or(problems, |len| len.min(problems));
    let indices: Vec<u64> = (0..count).collect();
    source.prefetch(&indices)?;
    indices.into_iter().map(|index| source.example(index)).collect()
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
    use crate::config::{ArithmeticConfig, FileConfig, TokenizerConfig};
    use crate::files::LocalFiles;
    use std::io::Write;

    #[test]
    fn arithmetic_held_out_problems_are_the_held_out_split_in_index_order() {
        let config = DataConfig::Arithmetic(ArithmeticConfig::default());
        let examples = held_out_examples(&config, 20, 3, &LocalFiles).expect("held out");
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
        let config = DataConfig::Gsm8k(FileConfig {
            path: "train.jsonl".into(),
            test: Some(file.path().display().to_string()),
            format: None,
            columns: Default::default(),
            tokenizer: TokenizerConfig::Char {},
            chat: None,
        });
        let first = held_out_examples(&config, 3, 0, &LocalFiles).expect("held out");
        assert_eq!(first.iter().map(|e| e.prompt.display()).collect::<Vec<_>>(), ["q0", "q1", "q2"]);
        assert_eq!(held_out_examples(&config, 100, 0, &LocalFiles).expect("held out").len(), 5);
    }

    #[test]
    fn data_without_held_out_problems_is_an_error_naming_the_fix() {
        let config = DataConfig::Jsonl(FileConfig {
            path: "train.jsonl".into(),
            test: None,
            format: None,
            columns: Default::default(),
            tokenizer: TokenizerConfig::Char {},
            chat: None,
        });
        let message = held_out_examples(&config, 8, 0, &LocalFiles).expect_err("no test file").to_string();
        assert!(message.starts_with("eval:") && message.contains("data.test"), "{message}");
    }
}
