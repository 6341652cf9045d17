//! Python reward functions in TRL's form through the real runner and the project's Python: the
//! arguments TRL passes, weighted sums with `None`, and every bad outcome (raises, wrong length,
//! NaN, not a number, too slow, a process that dies, a module that does not load) an error that
//! names the function, after which the next call works.

use data::{CharTokenizer, Columns, Example, Prompter};
use job::GrpoSpec;
use podctl_rewards::{Completion, RewardError, Rewards};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python =
        std::env::var_os("PODCTL_PYTHON").map(PathBuf::from).unwrap_or_else(|| root.join(".venv/bin/python"));
    assert!(python.exists(), "{} is missing: run scripts/setup.sh", python.display());
    python
}

const MODULE: &str = r#"
import math, os, time

def echo_step(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
    # TRL's arguments: the prompts, the completions, their token ids, the state, the columns.
    assert len(prompts) == len(completions) == len(completion_ids) == len(answer)
    return [trainer_state.global_step + len(ids) / 100 + (1.0 if c.endswith(a) else 0.0)
            for c, ids, a in zip(completions, completion_ids, answer)]

def some_none(prompts, completions, **kwargs):
    print("scoring", len(completions), "completions")
    return [None if "skip" in p else 0.5 for p in prompts]

def raises(prompts, completions, **kwargs):
    raise ValueError("no such unit test")

def short(prompts, completions, **kwargs):
    return [1.0]

def nan(prompts, completions, **kwargs):
    return [math.nan for _ in completions]

def text(prompts, completions, **kwargs):
    return ["good" for _ in completions]

def slow(prompts, completions, **kwargs):
    if os.path.exists(os.path.join(os.path.dirname(__file__), "slow")):
        time.sleep(30)
    return [0.0 for _ in completions]

def dies(prompts, completions, **kwargs):
    if os.path.exists(os.path.join(os.path.dirname(__file__), "die")):
        os._exit(3)
    return [0.0 for _ in completions]
"#;

fn spec(rewards: serde_json::Value) -> GrpoSpec {
    serde_json::from_value(json!({
        "prompt_len": 8, "max_new_tokens": 8, "generations": 2,
        "rewards": rewards, "reward_workers": 2, "reward_timeout_seconds": 3.0,
    }))
    .expect("a grpo spec")
}

fn rewards(dir: &Path, functions: serde_json::Value) -> Result<Rewards, RewardError> {
    Rewards::new(&spec(functions), &python(), dir, |module| Ok(PathBuf::from(module)))
}

fn example(prompt: &str, answer: &str) -> Example {
    Example {
        prompt: data::Prompt::Text(prompt.into()),
        answer: answer.into(),
        columns: Columns::from([("answer".to_string(), json!(answer))]),
    }
}

#[test]
fn python_functions_score_in_trls_form_and_failures_name_them() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("my_rewards.py"), MODULE).expect("write");
    let prompter = Prompter::plain(Arc::new(CharTokenizer));
    let examples = [example("1+1", "#### 2"), example("skip 2+2", "#### 4")];
    let texts = ["#### 2", "#### 3", "#### 4", "no"];
    let ids: Vec<Vec<i32>> = texts.iter().map(|t| t.bytes().map(i32::from).collect()).collect();
    let rows: Vec<Completion<'_>> =
        (0..4).map(|i| Completion { example: &examples[i / 2], text: texts[i], ids: &ids[i] }).collect();

    let all = rewards(
        dir.path(),
        json!([
            "numeric_answer",
            {"python": "my_rewards.py:echo_step", "weight": 0.5},
            {"python": "my_rewards.py:some_none", "weight": 2.0},
            {"format": "^####", "weight": 0.25},
        ]),
    )
    .expect("loads");
    assert_eq!(all.names(), ["numeric_answer", "echo_step", "some_none", "format"]);
    let scores = all.score(&rows, 2, &prompter, 6, 10).expect("scores");
    let echo: Vec<f32> = [6.0 + 0.06 + 1.0, 6.06, 6.06 + 1.0, 6.02].into();
    assert_eq!(scores.per_function[1], echo.iter().map(|&v| Some(v)).collect::<Vec<_>>());
    assert_eq!(scores.per_function[2], [Some(0.5), Some(0.5), None, None], "None where it does not apply");
    let numeric = [1.3, 0.3, 1.3, 0.0];
    let format = [0.25, 0.25, 0.25, 0.0];
    for row in 0..4 {
        let some_none = if row < 2 { 2.0 * 0.5 } else { 0.0 };
        let expected = numeric[row] + 0.5 * echo[row] + some_none + format[row];
        assert!(
            (scores.totals[row] - expected).abs() < 1e-5,
            "row {row}: {} vs {expected}",
            scores.totals[row]
        );
    }
    // The same completions again: the same bits.
    assert_eq!(all.score(&rows, 2, &prompter, 6, 10).expect("scores"), scores);

    for (function, needle) in [
        ("raises", "ValueError: no such unit test"),
        ("short", "returned 1 rewards for 2 completions"),
        ("nan", "returned nan for completion 0; a reward is a finite number, or None"),
        ("text", "returned 'good' (str) for completion 0; a reward is a number"),
    ] {
        let one = rewards(dir.path(), json!([format!("my_rewards.py:{function}")])).expect("loads");
        let error = one.score(&rows, 2, &prompter, 6, 10).expect_err(function).to_string();
        assert!(
            error.contains(&format!("my_rewards.py:{function}")) && error.contains(needle),
            "{function}: {error}"
        );
        assert!(error.contains("step 7"), "{error}");
    }

    // Too slow: stopped at the timeout; the next call starts a fresh process.
    let slow = rewards(dir.path(), json!(["my_rewards.py:slow"])).expect("loads");
    std::fs::write(dir.path().join("slow"), "").expect("write");
    let started = std::time::Instant::now();
    let error = slow.score(&rows, 2, &prompter, 0, 10).expect_err("slow");
    assert!(matches!(error, RewardError::Timeout { .. }), "{error}");
    assert!(started.elapsed().as_secs_f64() < 15.0, "stopped at the timeout, not the sleep");
    assert!(error.to_string().contains("grpo.reward_timeout_seconds"), "{error}");
    std::fs::remove_file(dir.path().join("slow")).expect("remove");
    slow.score(&rows, 2, &prompter, 1, 10).expect("a fresh process");

    // A process that dies: an error with its exit, then a fresh one.
    let dies = rewards(dir.path(), json!(["my_rewards.py:dies"])).expect("loads");
    std::fs::write(dir.path().join("die"), "").expect("write");
    let error = dies.score(&rows, 2, &prompter, 0, 10).expect_err("dies").to_string();
    assert!(error.contains("my_rewards.py:dies") && error.contains("exit status: 3"), "{error}");
    std::fs::remove_file(dir.path().join("die")).expect("remove");
    dies.score(&rows, 2, &prompter, 1, 10).expect("a fresh process");

    // Modules that do not load: at the start, not at the first step.
    for (functions, needle) in
        [(json!(["missing.py:f"]), "missing.py"), (json!(["my_rewards.py:nowhere"]), "defines no `nowhere`")]
    {
        let error = rewards(dir.path(), functions).expect_err("does not load").to_string();
        assert!(error.contains("cannot load it") && error.contains(needle), "{error}");
    }
    std::fs::write(dir.path().join("broken.py"), "def f(:\n").expect("write");
    let error = rewards(dir.path(), json!(["broken.py:f"])).expect_err("syntax").to_string();
    assert!(error.contains("broken.py:f") && error.contains("SyntaxError"), "{error}");
}
