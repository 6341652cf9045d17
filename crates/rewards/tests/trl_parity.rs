//! A reward module written for TRL (trl_rewards.py) is passed unchanged to TRL's GRPOTrainer
//! (trl_reference.py: `_calculate_rewards` and the weighted `nansum`, in TRL's own venv) and to
//! podctl's pool, on the same conversational prompts, completions, token ids, columns and trainer
//! state: the same per-function rewards (`None` where TRL has NaN) and the same weighted sums.
//!
//! Needs TRL's venv, `.venv-bench` (4.5 GB; `scripts/bench/grpo_vs_trl.sh` installs it from
//! scripts/requirements/trl-bench.txt), so it is not in the default run:
//! `cargo nextest run -p podctl-rewards --run-ignored only trl`.

use data::{Columns, Example, LocalFiles, Prompt, build_prompter};
use podctl_rewards::{Completion, Rewards};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const FUNCTIONS: [(&str, f32); 4] =
    [("format_reward", 1.0), ("accuracy", 2.0), ("shorter_is_better", 0.5), ("by_level", 0.25)];

#[test]
#[ignore = "needs TRL's venv (.venv-bench); run with --run-ignored only"]
fn a_trl_reward_module_scores_the_same_in_trl_and_in_podctl() {
    let trl_python = root().join(".venv-bench/bin/python");
    assert!(
        trl_python.exists(),
        "{} is missing: run scripts/bench/grpo_vs_trl.sh once",
        trl_python.display()
    );
    let model = root().join("tests/fixtures/hf-gsm8k/model");
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");

    // Three problems, two completions each; one row without a reference (accuracy: None) and
    // levels 0 (by_level: None).
    let problems = [
        ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7", 2),
        ("A box holds 12 eggs. How many eggs are in 3 boxes?", "", 0),
        ("Sara read 15 pages on Monday and 9 on Tuesday. How many pages did she read?", "#### 24", 1),
    ];
    let completions = [
        "He has 3 + 4 = 7 apples.\n#### 7",
        "#### 8",
        "3 * 12 = 36\n#### 36",
        "thirty-six",
        "15 + 9 = 24\n#### 24\n",
        "#### 24 pages",
    ];
    let examples: Vec<Example> = problems
        .iter()
        .map(|(question, answer, level)| Example {
            prompt: Prompt::Text((*question).into()),
            answer: (*answer).into(),
            columns: Columns::from([
                ("answer".to_string(), json!(answer)),
                ("level".to_string(), json!(level)),
            ]),
        })
        .collect();
    let ids: Vec<Vec<i32>> = completions.iter().map(|c| (0..c.len() as i32 / 3).collect()).collect();
    let (step, max_steps) = (3, 10);

    // TRL.
    let case = json!({
        "functions": FUNCTIONS.map(|(name, _)| name),
        "weights": FUNCTIONS.map(|(_, weight)| weight),
        "generations": 2,
        "step": step,
        "max_steps": max_steps,
        "rows": completions.iter().enumerate().map(|(row, completion)| {
            let (question, answer, level) = problems[row / 2];
            json!({
                "prompt": [{"role": "user", "content": question}],
                "answer": answer,
                "level": level,
                "completion": completion,
                "completion_ids": ids[row],
            })
        }).collect::<Vec<_>>(),
    });
    let dir = tempfile::tempdir().unwrap();
    let case_path = dir.path().join("case.json");
    std::fs::write(&case_path, case.to_string()).unwrap();
    let out = Command::new(&trl_python)
        .arg(tests.join("trl_reference.py"))
        .arg(&model)
        .arg(&case_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "trl_reference.py: {}", String::from_utf8_lossy(&out.stderr));
    let trl: Value = serde_json::from_slice(&out.stdout).unwrap();

    // podctl: the chat-templated prompts TRL's reward functions see, through the pool.
    let spec: job::GrpoSpec = serde_json::from_value(json!({
        "prompt_len": 64, "max_new_tokens": 16, "generations": 2, "reward_workers": 2,
        "rewards": FUNCTIONS.map(|(name, weight)| json!({"python": format!("trl_rewards.py:{name}"), "weight": weight})),
    }))
    .unwrap();
    let python = std::env::var_os("PODCTL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    let rewards = Rewards::new(&spec, &python, &tests, |module| Ok(PathBuf::from(module))).unwrap();
    let tokenizer = serde_json::from_value(json!({"kind": "hf", "path": model})).unwrap();
    let prompter = build_prompter(&tokenizer, Some(&data::ChatConfig::default()), &LocalFiles).unwrap();
    let rows: Vec<Completion<'_>> = completions
        .iter()
        .enumerate()
        .map(|(row, text)| Completion { example: &examples[row / 2], text, ids: &ids[row] })
        .collect();
    let ours = rewards.score(&rows, 2, &prompter, step, max_steps).unwrap();

    println!("TRL    {trl}");
    println!("podctl {:?}", ours);
    for (f, (name, _)) in FUNCTIONS.iter().enumerate() {
        let theirs: Vec<Option<f32>> =
            trl["per_function"][f].as_array().unwrap().iter().map(|v| v.as_f64().map(|v| v as f32)).collect();
        assert_eq!(ours.per_function[f], theirs, "{name}");
    }
    let theirs: Vec<f32> =
        trl["totals"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    for (row, (a, b)) in ours.totals.iter().zip(&theirs).enumerate() {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "row {row}: podctl {a}, TRL {b}");
    }
    assert!(
        ours.per_function[1].contains(&None) && ours.per_function[3].contains(&None),
        "None is exercised"
    );
}
