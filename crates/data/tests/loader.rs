//! The loader through its public API: determinism across instances and slices, epochs of files,
//! the SFT mask, truncation, and the data config end to end.

use podctl_data::{
    Arithmetic, ArithmeticConfig, Batch, BatchSpec, CharTokenizer, DataConfig, DataError, Example,
    ExampleSource, FileConfig, Loader, LocalFiles, Prompter, Split, TokenDtype, TokenFileConfig, Tokenizer,
    TokenizerConfig,
};
use std::collections::{BTreeSet, HashSet};
use std::io::Write;

fn arithmetic(config: ArithmeticConfig, spec: BatchSpec, seed: u64) -> Loader {
    Loader::from_config(&DataConfig::Arithmetic(config), spec, seed, &LocalFiles).expect("loader")
}

fn spec(global_batch: usize, micro_batch: usize, seq_len: usize) -> BatchSpec {
    BatchSpec::new(global_batch, micro_batch, seq_len).expect("valid spec")
}

/// The rows of one row of a batch.
fn row<T: Copy>(values: &[T], seq_len: usize, row: usize) -> &[T] {
    &values[row * seq_len..(row + 1) * seq_len]
}

#[test]
fn resuming_and_other_hosts_see_the_same_batches() {
    let spec = spec(16, 4, 128);
    let original = arithmetic(ArithmeticConfig::default(), spec, 1234);
    let run: Vec<Batch> = (0..6)
        .flat_map(|step| (0..4).map(move |m| (step, m)))
        .map(|(step, m)| original.micro_batch(step, m).expect("batch"))
        .collect();
    // A loader built after a "restart" at step 3, on another "host".
    let resumed = arithmetic(ArithmeticConfig::default(), spec, 1234);
    for step in 3..6 {
        for m in 0..4 {
            assert_eq!(resumed.micro_batch(step, m).expect("batch"), run[(step * 4 + m) as usize]);
        }
    }
}

#[test]
fn four_slices_together_see_the_global_batch_of_one_slice() {
    let spec = spec(32, 4, 128);
    let single = arithmetic(ArithmeticConfig::default(), spec, 9);
    for step in [0, 1, 17] {
        let whole: Vec<Batch> = (0..8).map(|m| single.micro_batch(step, m).expect("batch")).collect();
        // Slice s of 4 takes micro-batches s, s + 4, with its own loader instance.
        for slice in 0..4u64 {
            let own = arithmetic(ArithmeticConfig::default(), spec, 9);
            for m in (slice..8).step_by(4) {
                assert_eq!(own.micro_batch(step, m).expect("batch"), whole[m as usize]);
            }
        }
        // The micro-batches of a step are disjoint positions of the endless stream.
        let indices: HashSet<u64> = whole.iter().flat_map(|b| b.example_indices.clone()).collect();
        assert_eq!(indices.len(), 32);
        assert_eq!(indices, (step * 32..step * 32 + 32).collect());
    }
}

#[test]
fn mask_covers_exactly_the_answer_and_eos() {
    let seq_len = 128;
    let loader = arithmetic(ArithmeticConfig::default(), spec(64, 16, seq_len), 3);
    let source = Arithmetic::new(&ArithmeticConfig::default(), 3).expect("valid");
    let mut rows_checked = 0;
    for step in 0..3 {
        for m in 0..4 {
            let batch = loader.micro_batch(step, m).expect("batch");
            assert_eq!(batch.truncated_rows, 0, "default difficulty fits 128 tokens");
            for r in 0..batch.rows {
                let example = source.example(batch.example_indices[r]).expect("example");
                let (targets, mask) = (row(&batch.targets, seq_len, r), row(&batch.loss_mask, seq_len, r));
                let masked: Vec<u32> =
                    targets.iter().zip(mask).filter(|&(_, &w)| w == 1.0).map(|(&t, _)| t as u32).collect();
                let expected: Vec<u32> = CharTokenizer
                    .encode(&example.answer)
                    .expect("ascii")
                    .into_iter()
                    .chain([CharTokenizer::EOS])
                    .collect();
                assert_eq!(masked, expected);
                // The masked positions are one contiguous run ending at the EOS target.
                let first = mask.iter().position(|&w| w == 1.0).expect("some target counts");
                assert!(mask[first..first + expected.len()].iter().all(|&w| w == 1.0));
                assert!(mask.iter().all(|&w| w == 0.0 || w == 1.0));
                assert_eq!(CharTokenizer.decode(&masked).expect("decodes"), example.answer);
                // Inputs are BOS + prompt + answer, and targets the inputs shifted by one.
                let tokens = row(&batch.tokens, seq_len, r);
                assert_eq!(tokens[0], CharTokenizer::BOS as i32);
                assert_eq!(&tokens[1..], &targets[..seq_len - 1]);
                rows_checked += 1;
            }
        }
    }
    assert_eq!(rows_checked, 192);
}

#[test]
fn truncation_is_counted_never_silent() {
    // Long operands make long examples; a row length at the median of the first micro-batch's
    // example lengths truncates about half of them.
    let config = ArithmeticConfig { digits: [4, 6], ..ArithmeticConfig::default() };
    let source = Arithmetic::new(&config, 5).expect("valid");
    // BOS + prompt + answer + EOS, in characters (the char tokenizer's tokens).
    let full_len = |e: &Example| e.prompt.display().len() + e.answer.len() + 2;
    let mut lengths: Vec<usize> = (0..32).map(|i| full_len(&source.example(i).expect("example"))).collect();
    lengths.sort_unstable();
    let seq_len = lengths[16] - 1;
    let loader = arithmetic(config, spec(32, 32, seq_len), 5);
    let batch = loader.micro_batch(0, 0).expect("batch");
    let too_long = batch
        .example_indices
        .iter()
        .filter(|&&i| full_len(&source.example(i).expect("example")) > seq_len + 1)
        .count();
    assert!(too_long > 0 && too_long < 32, "the test needs a mix, got {too_long}");
    assert_eq!(batch.truncated_rows, too_long);
    // A truncated row has no EOS target and its mask ends at the last position.
    for r in 0..32 {
        let targets = row(&batch.targets, seq_len, r);
        let has_eos = targets.contains(&(CharTokenizer::EOS as i32));
        let example = source.example(batch.example_indices[r]).expect("example");
        assert_eq!(has_eos, full_len(&example) <= seq_len + 1);
        if !has_eos {
            assert_eq!(row(&batch.loss_mask, seq_len, r)[seq_len - 1], 1.0);
        }
    }
}

#[test]
fn held_out_loader_serves_only_held_out_problems() {
    let config = ArithmeticConfig { split: Split::HeldOut, ..ArithmeticConfig::default() };
    let held_out = arithmetic(config.clone(), spec(8, 8, 128), 1);
    let train_problems: HashSet<_> = {
        let train = Arithmetic::new(&ArithmeticConfig::default(), 1).expect("valid");
        (0..4000).map(|i| train.problem(i).expect("problem")).collect()
    };
    let source = Arithmetic::new(&config, 1).expect("valid");
    for step in 0..50 {
        let prompts = held_out.prompts(step, 0).expect("prompts");
        for (r, example) in prompts.iter().enumerate() {
            let index = held_out.example_index(step, 0, r).expect("index");
            let problem = source.problem(index).expect("problem");
            assert_eq!(source.example(index).expect("example"), *example);
            assert!(!train_problems.contains(&problem), "{problem:?}");
        }
    }
}

fn jsonl_file(lines: usize) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    for i in 0..lines {
        let line = serde_json::json!({"prompt": format!("Q{i}?\n"), "answer": format!("#### {i}")});
        writeln!(file, "{line}").expect("write");
    }
    file
}

#[test]
fn jsonl_epochs_are_seeded_bijections() {
    let file = jsonl_file(37);
    let config = DataConfig::Jsonl(FileConfig {
        path: file.path().display().to_string(),
        test: None,
        format: None,
        columns: Default::default(),
        tokenizer: TokenizerConfig::Char {},
        chat: None,
    });
    for (global, micro) in [(1, 1), (6, 3), (8, 2)] {
        let loader = Loader::from_config(&config, spec(global, micro, 32), 77, &LocalFiles).expect("loader");
        assert_eq!(loader.epoch_len(), Some(37));
        let per_step = (global / micro) as u64;
        // Enough steps for three epochs, then read every position in order.
        let steps = (3 * 37u64).div_ceil(global as u64);
        let mut order = Vec::new();
        for step in 0..steps {
            for m in 0..per_step {
                let prompts = loader.prompts(step, m).expect("prompts");
                for (r, example) in prompts.iter().enumerate() {
                    let index = loader.example_index(step, m, r).expect("index");
                    assert_eq!(example.answer, format!("#### {index}"));
                    order.push(index);
                }
            }
        }
        let epochs: Vec<&[u64]> = order.chunks(37).take(3).collect();
        for epoch in &epochs {
            assert_eq!(epoch.iter().copied().collect::<BTreeSet<_>>(), (0..37).collect());
        }
        assert_ne!(epochs[0], epochs[1]);
        // The order is a function of the seed alone, not of the batch shape.
        let reference = Loader::from_config(&config, spec(1, 1, 32), 77, &LocalFiles).expect("loader");
        let reference_order: Vec<u64> =
            (0..order.len() as u64).map(|step| reference.example_index(step, 0, 0).expect("index")).collect();
        assert_eq!(order, reference_order);
    }
    let other_seed = Loader::from_config(&config, spec(1, 1, 32), 78, &LocalFiles).expect("loader");
    let reference = Loader::from_config(&config, spec(1, 1, 32), 77, &LocalFiles).expect("loader");
    let order =
        |loader: &Loader| (0..37).map(|s| loader.example_index(s, 0, 0).expect("index")).collect::<Vec<_>>();
    assert_ne!(order(&other_seed), order(&reference));
}

#[test]
fn a_bad_jsonl_line_fails_the_loader_with_file_and_line() {
    let mut file = jsonl_file(3);
    writeln!(file, "{{\"prompt\": \"x\", \"answer\": 4}}").expect("write");
    let config = DataConfig::Jsonl(FileConfig {
        path: file.path().display().to_string(),
        test: None,
        format: None,
        columns: Default::default(),
        tokenizer: TokenizerConfig::Char {},
        chat: None,
    });
    let error = Loader::from_config(&config, spec(1, 1, 8), 0, &LocalFiles).expect_err("line 4 is bad");
    let message = error.to_string();
    assert!(message.contains(&format!("{}:4:", file.path().display())), "{message}");
    assert!(message.contains("`answer`"), "{message}");
}

#[test]
fn token_windows_fill_every_target() {
    let seq_len = 8;
    let tokens: Vec<u16> = (0..100u16).map(|t| t * 3 + 1).collect();
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(&tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>()).expect("write");
    let config = DataConfig::Tokens(TokenFileConfig {
        path: file.path().display().to_string(),
        dtype: TokenDtype::U16,
    });
    let loader = Loader::from_config(&config, spec(4, 2, seq_len), 11, &LocalFiles).expect("loader");
    // 99 targets / 8 = 12 whole windows.
    assert_eq!(loader.epoch_len(), Some(12));
    let mut windows = BTreeSet::new();
    for step in 0..3 {
        for m in 0..2 {
            let batch = loader.micro_batch(step, m).expect("batch");
            assert!(batch.loss_mask.iter().all(|&w| w == 1.0));
            assert_eq!(batch.token_count(), 2 * seq_len as u64);
            for r in 0..2 {
                let window = batch.example_indices[r] as usize;
                let expected: Vec<i32> = tokens[window * seq_len..=window * seq_len + seq_len]
                    .iter()
                    .map(|&t| i32::from(t))
                    .collect();
                assert_eq!(row(&batch.tokens, seq_len, r), &expected[..seq_len]);
                assert_eq!(row(&batch.targets, seq_len, r), &expected[1..]);
                windows.insert(window);
            }
        }
    }
    // Three steps of four rows are exactly one epoch of twelve windows.
    assert_eq!(windows, (0..12).collect());
    assert_eq!(loader.step_token_count(0).expect("count"), 4 * seq_len as u64);
    let error = loader.prompts(0, 0).expect_err("windows have no prompts");
    assert!(matches!(error, DataError::NotAnExampleSource { .. }), "{error:?}");
}

#[test]
fn a_token_file_shorter_than_a_window_is_refused() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(&[1, 0, 2, 0, 3, 0]).expect("write");
    let config = DataConfig::Tokens(TokenFileConfig {
        path: file.path().display().to_string(),
        dtype: TokenDtype::U16,
    });
    let error = Loader::from_config(&config, spec(1, 1, 8), 0, &LocalFiles).expect_err("too short");
    assert!(error.to_string().contains("fewer than one window of seq_len + 1 = 9"), "{error}");
}

#[test]
fn custom_example_sources_plug_in() {
    struct Squares;
    impl ExampleSource for Squares {
        fn num_examples(&self) -> Option<u64> {
            Some(5)
        }
        fn example(&self, index: u64) -> podctl_data::Result<Example> {
            Ok(Example::text(format!("{index}^2=\n"), format!("#### {}", index * index)))
        }
    }
    let loader = Loader::from_examples(
        Box::new(Squares),
        Prompter::plain(std::sync::Arc::new(CharTokenizer)),
        spec(5, 5, 16),
        2,
    )
    .expect("loader");
    let mut answers: Vec<String> =
        loader.prompts(0, 0).expect("prompts").into_iter().map(|e| e.answer).collect();
    answers.sort();
    assert_eq!(answers, ["#### 0", "#### 1", "#### 16", "#### 4", "#### 9"]);
}

#[test]
fn golden_values_pin_the_streams_across_versions_and_platforms() {
    // A change here changes every run's data: resumed jobs would see different batches than
    // the steps before the restart. Update only on purpose.
    let source = Arithmetic::new(&ArithmeticConfig::default(), 0).expect("valid");
    assert_eq!(
        source.example(0).expect("example"),
        Example::text(
            "There were 772 stickers on a shelf. Ines took 606 of them. How many stickers are on the shelf now?\n",
            "772 - 606 = 166\n#### 166",
        )
    );
    let permutation = podctl_data::EpochPermutation::new(0, 0, 10);
    let order: Vec<u64> = (0..10).map(|i| permutation.apply(i).expect("in range")).collect();
    assert_eq!(order, [2, 6, 4, 9, 3, 7, 5, 8, 0, 1]);
}
