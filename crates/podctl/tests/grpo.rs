//! GRPO through the real `podctl` binary and the CPU PJRT plugin: the loop raises a verifiable
//! reward, and a job of two slices (worker processes under the embedded coordinator, the all-reduce
//! between them) gives the metrics of one slice with the same global batch.

use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use common::podctl;

/// Launches `spec`; returns its stdout.
fn launch(spec: &Path) -> String {
    let out = podctl().arg("launch").arg(spec).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{} failed:\n{stdout}\n{stderr}", spec.display());
    stdout
}

fn metrics(run: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

/// A reward the untrained tiny model can move within a few steps: an eighth of a point off per
/// character of the completion. Special tokens decode to no character, so the policy learns to
/// say nothing (it finds PAD rather than EOS). It exercises everything the arithmetic reward
/// does (sampling, decoding, scoring, group advantages, the clipped objective, apply) without
/// needing a model that can add; `examples/grpo-arith.yaml` is the benchmark that does.
const SHORT_REWARD: &str = "{ exact_match: 0.0, has_marker: 0.0, well_formed: 0.0, stops_cleanly: 0.0, \
                            length_penalty: 0.125, soft_max_chars: 0 }";

#[test]
fn grpo_raises_a_verifiable_reward() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("short");
    let spec = write(
        &dir.path().join("short.yaml"),
        &format!(
            "name: grpo-short\nmodel: tiny\nmesh: {{ ici: {{ fsdp: 1, tp: 1 }} }}\n\
             grpo: {{ prompt_len: 24, max_new_tokens: 8, generations: 8, reward: {SHORT_REWARD} }}\n\
             eval: {{ problems: 0 }}\n\
             batch: {{ global: 64, micro: 32 }}\ntrain: {{ loss_chunk: 32 }}\nsteps: 8\nseed: 1\n\
             optimizer: {{ lr: 1.0e-2, schedule: constant, weight_decay: 0.0 }}\n\
             data: {{ kind: arithmetic, digits: [2, 2], ops: [add] }}\noutput: {}\n",
            run.display()
        ),
    );
    launch(&spec);
    let lines = metrics(&run);
    assert_eq!(lines.len(), 8);
    let series = |key: &str| -> Vec<f64> { lines.iter().map(|l| l[key].as_f64().unwrap()).collect() };
    let reward = series("reward");
    println!("mean reward per step {reward:.3?}");
    // Random completions of 8 characters score about -1; the best score is 0.
    assert!(reward[0] < -0.5, "the untrained policy talks: {reward:?}");
    assert!(reward[5..].iter().all(|&r| r > -0.1), "the policy learns to say nothing: {reward:?}");
    for key in ["loss", "kl", "clip_fraction", "groups_with_spread", "ratio"] {
        assert!(series(key).iter().all(|v| v.is_finite()), "{key}: {:?}", series(key));
    }
    for plot in ["reward.png", "loss.png", "kl.png", "step_time.png"] {
        assert!(run.join(plot).exists(), "{plot} is drawn");
    }
    // Where each step's time went: the phases cover the step (within 5%), the programs among them.
    for line in &lines {
        let phases: Vec<(&str, f64)> = line
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("phase_")?.strip_suffix("_seconds")?, v.as_f64()?)))
            .collect();
        let names: Vec<&str> = phases.iter().map(|&(name, _)| name).collect();
        for phase in ["prompts", "rollout", "rewards", "gradients", "apply"] {
            assert!(names.contains(&phase), "step {} has no {phase} phase: {names:?}", line["step"]);
        }
        let step_seconds = series_at(line, "step_seconds");
        let sum: f64 = phases.iter().map(|&(_, seconds)| seconds).sum();
        assert!(
            (step_seconds - sum).abs() <= 0.05 * step_seconds,
            "step {}: the phases add up to {sum:.4} s of {step_seconds:.4} s: {phases:?}",
            line["step"]
        );
    }
}

fn series_at(line: &Value, key: &str) -> f64 {
    line[key].as_f64().unwrap_or_else(|| panic!("{key} in {line}"))
}

/// The keys both run records carry per step, compared between one slice and two.
const COMPARED: [&str; 9] = [
    "loss",
    "grad_norm",
    "reward",
    "accuracy",
    "digits_right",
    "completion_length",
    "kl",
    "clip_fraction",
    "ratio",
];

#[test]
fn two_slices_give_the_metrics_of_one_slice() {
    let dir = tempfile::tempdir().unwrap();
    // The starting point: a few steps of SFT, trained by the first GRPO launch (init_from names
    // the job) and found by the second.
    let sft = write(
        &dir.path().join("sft.yaml"),
        &format!(
            "name: sft\nmodel: tiny\nmesh: {{ ici: {{ fsdp: 1, tp: 1 }} }}\nbatch: {{ global: 8, micro: 8 }}\n\
             seq_len: 128\nsteps: 4\noptimizer: {{ lr: 3.0e-3 }}\ndata: {{ kind: arithmetic, digits: [2, 2], ops: [add] }}\n\
             checkpoint: {{ every: 4 }}\noutput: {}\n",
            dir.path().join("sft").display()
        ),
    );
    let grpo = |name: &str, mesh: &str| {
        let run = dir.path().join(name);
        let spec = write(
            &dir.path().join(format!("{name}.yaml")),
            &format!(
                "name: {name}\nmodel: tiny\nmesh: {mesh}\n\
                 grpo: {{ prompt_len: 24, max_new_tokens: 8, generations: 4, init_from: {}, top_p: 0.95, \
                 kl_beta: 0.05, reward: {{ length_penalty: 0.125, soft_max_chars: 0 }} }}\n\
                 eval: {{ problems: 16, every: 2 }}\n\
                 batch: {{ global: 32, micro: 8 }}\ntrain: {{ loss_chunk: 32 }}\nsteps: 4\nseed: 5\n\
                 optimizer: {{ lr: 3.0e-3, schedule: constant }}\n\
                 data: {{ kind: arithmetic, digits: [2, 2], ops: [add] }}\noutput: {}\n",
                sft.display(),
                run.display()
            ),
        );
        (spec, run)
    };
    let (one_spec, one) = grpo("one", "{ ici: { fsdp: 1, tp: 1 } }");
    let (two_spec, two) = grpo("two", "{ dcn: 2, ici: { fsdp: 1, tp: 1 } }");
    let out = launch(&one_spec);
    assert!(out.contains("no checkpoint under") && out.contains("training that job first"), "{out}");
    assert!(out.contains("held-out accuracy (greedy, 16 problems):"), "{out}");
    let out = launch(&two_spec);
    assert!(!out.contains("training that job first"), "the SFT checkpoint is found: {out}");
    assert!(out.contains("held-out accuracy (greedy):"), "{out}");

    let (one, two) = (metrics(&one), metrics(&two));
    assert_eq!((one.len(), two.len()), (4, 4));
    let mut worst = 0.0f64;
    for (a, b) in one.iter().zip(&two) {
        for key in COMPARED.iter().chain(a.get("eval_accuracy").map(|_| &"eval_accuracy")) {
            let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap_or(f64::NAN));
            let relative = (x - y).abs() / x.abs().max(y.abs()).max(1e-6);
            worst = worst.max(relative);
            assert!(relative <= 1e-4, "step {}: {key} is {x} on one slice, {y} on two", a["step"]);
        }
    }
    println!("largest relative difference between one slice and two over {COMPARED:?}: {worst:.2e}");
    // The comparison is not vacuous: the policy moved away from the reference, evaluations ran.
    assert!(one[3]["kl"].as_f64().unwrap() > 0.0, "{:?}", one[3]);
    assert!(two[0].get("eval_accuracy_initial").is_some() && two[3].get("eval_accuracy").is_some());
    assert!(one[1].get("eval_accuracy").is_some() && two[1].get("eval_accuracy").is_some());

    // TensorBoard's own reader finds every number of metrics.jsonl, in both run records (the
    // launch's own, and the embedded coordinator's): the loss, each reward function's share
    // (digits_right, has_marker, ...), the held-out accuracy.
    for run in [&dir.path().join("one"), &dir.path().join("two")] {
        let scalars = common::tensorboard_scalars(run);
        for tag in ["loss", "reward", "digits_right", "has_marker", "well_formed", "eval_accuracy"] {
            assert!(
                scalars.keys().any(|(t, _)| t == tag),
                "no {tag} in {}'s TensorBoard file",
                run.display()
            );
        }
        let count = common::assert_tensorboard_has_the_metrics(run);
        println!("TensorBoard reads the {count} numbers of {}/metrics.jsonl back", run.display());
    }
}

/// A reward function in TRL's form, run by the worker's pool of Python processes: 1 for a
/// completion without a digit.
const NO_DIGITS: &str = r#"
def no_digits(prompts, completions, completion_ids, **kwargs):
    assert len(prompts) == len(completions) == len(completion_ids)
    return [0.0 if any(c.isdigit() for c in text) else 1.0 for text in completions]
"#;

#[test]
fn a_format_reward_beside_the_numeric_one_rises_and_each_function_has_its_curve() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("format");
    let module = write(&dir.path().join("my_rewards.py"), NO_DIGITS);
    // The untrained tiny model's completions are random characters: few match "no digit at all"
    // (the format), and the policy can learn to match it within a few steps.
    let spec = write(
        &dir.path().join("format.yaml"),
        &format!(
            "name: grpo-format\nmodel: tiny\nmesh: {{ ici: {{ fsdp: 1, tp: 1 }} }}\n\
             grpo: {{ prompt_len: 24, max_new_tokens: 8, generations: 8, rewards: [\
               numeric_answer, {{ format: '^[^0-9]*$', weight: 1.0 }}, \
               {{ python: '{}:no_digits', weight: 0.25 }} ] }}\n\
             eval: {{ problems: 0 }}\n\
             batch: {{ global: 64, micro: 32 }}\ntrain: {{ loss_chunk: 32 }}\nsteps: 8\nseed: 1\n\
             optimizer: {{ lr: 1.0e-2, schedule: constant, weight_decay: 0.0 }}\n\
             data: {{ kind: arithmetic, digits: [2, 2], ops: [add] }}\noutput: {}\n",
            module.display(),
            run.display()
        ),
    );
    launch(&spec);
    let lines = metrics(&run);
    assert_eq!(lines.len(), 8);
    let series = |key: &str| -> Vec<f64> { lines.iter().map(|l| series_at(l, key)).collect() };
    let (format, no_digits, numeric) =
        (series("reward_format"), series("reward_no_digits"), series("reward_numeric_answer"));
    println!("format {format:.3?}\nno_digits (Python) {no_digits:.3?}\nnumeric_answer {numeric:.3?}");
    assert!(format[0] < 0.6, "few random completions have no digit: {format:?}");
    assert!(format[6..].iter().all(|&f| f > format[0] + 0.25), "the format reward rises: {format:?}");
    // The Python function scores the same property: the same means, through the pool.
    assert_eq!(no_digits, format, "the Python function and the format agree on every step");
    // The step's reward is the weighted sum of the functions' means.
    for (i, line) in lines.iter().enumerate() {
        let sum = numeric[i] + format[i] + 0.25 * no_digits[i];
        assert!((series_at(line, "reward") - sum).abs() < 1e-4, "step {}: {line}", i + 1);
    }
    // Both per-function curves are in TensorBoard's file and on the reward plot.
    let scalars = common::tensorboard_scalars(&run);
    for tag in ["reward_format", "reward_numeric_answer", "reward_no_digits"] {
        assert!(scalars.keys().any(|(t, _)| t == tag), "no {tag} in TensorBoard's file");
    }
    assert!(run.join("reward.png").exists());
}
