"""TRL's side of scripts/bench/grpo_vs_trl.sh: `GRPOTrainer` on the shapes of a podctl GRPO job.

Runs in the benchmark venv (.venv-bench: torch, transformers, TRL; scripts/requirements/
trl-bench.txt), never the project's. Like with like, by construction:

- the model is transformers' `Qwen3ForCausalLM` with the podctl preset's sizes and vocabulary,
  loaded with the same weights (`podctl ckpt export` of the checkpoint podctl starts from, or
  podctl's `init(seed)` for a run without one), float32, eager sdpa attention, no dropout;
- the prompts are podctl's, in podctl's order, as the token ids its rollout sees (from the
  `grpo_prompts` example; TRL's own tokenization is replaced by a lookup, so a prompt podctl cut
  to `prompt_len` is cut the same way); TRL pads them on the left to the longest in the batch;
- the same groups (`generations`), prompts per step, micro-batch and accumulation, completion
  buffer, sampling (temperature, top-p, no top-k), clipping, `beta = 0` (KL off), one update per
  batch (no old-policy pass, as in podctl), loss normalized by the batch's completion tokens
  (`dapo`), AdamW with podctl's betas, eps, weight decay, learning rate and gradient clipping;
- rewards are podctl's (`data::Reward`, ported below) with the job's weights;
- gradient checkpointing is off, as podctl's `train.remat: none` is; `torch.set_num_threads`
  is the number of cores podctl uses.

Each phase is timed by wrapping the trainer's own methods (no guesses): `generate`
(`transformers.generate` with its KV cache), `rewards`, `logprobs` (forward passes without
gradients: TRL's old-policy and reference passes, 0 here), `forward` (the loss's forward pass),
`backward`, `optimizer` (gradient clipping and AdamW), and `other` (the rest of the step:
batching, advantages, padding, logging), so that the phases add up to the step. A step is the
time between two `on_step_end` callbacks (the first step, with warm-up, is left out).

Prints one JSON object on stdout's last line: per-step seconds and per-phase seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import torch
from datasets import Dataset
from safetensors.numpy import load_file
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

PAD, BOS, EOS = 0, 1, 2


def char_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """podctl's character vocabulary (PAD 0, BOS 1, EOS 2, printable ASCII = its code): a BPE
    with single characters and no merges, decoded by concatenation."""
    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS}
    vocab.update({chr(c): c for c in range(32, min(vocab_size, 127))})
    vocab["\n"] = 10
    vocab["\t"] = 9
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def hf_weights(podctl: dict, layers: int) -> dict[str, torch.Tensor]:
    """podctl's tensors (`embed`, `layers/<name>` stacked `[L, in, out]`, `final_norm`) under
    Hugging Face Qwen3's names (`nn.Linear` weights are `[out, in]`)."""
    linear = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
              "v_proj": "self_attn.v_proj", "o_proj": "self_attn.o_proj",
              "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj"}
    norms = {"input_norm": "input_layernorm", "post_norm": "post_attention_layernorm",
             "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
    out = {"model.embed_tokens.weight": torch.from_numpy(podctl["embed"].copy()),
           "model.norm.weight": torch.from_numpy(podctl["final_norm"].copy())}
    for i in range(layers):
        for name, hf in linear.items():
            out[f"model.layers.{i}.{hf}.weight"] = torch.from_numpy(
                podctl[f"layers/{name}"][i].T.copy())
        for name, hf in norms.items():
            out[f"model.layers.{i}.{hf}.weight"] = torch.from_numpy(podctl[f"layers/{name}"][i].copy())
    return out


# data::Reward (crates/data/src/reward.rs), the same terms and weights.
MARKER = "####"


def final_answer(text: str) -> str | None:
    if MARKER not in text:
        return None
    answer = text.rsplit(MARKER, 1)[1].split("\n", 1)[0].strip()
    return answer.replace(",", "") if answer else None


def well_formed(answer: str) -> bool:
    unsigned = answer[1:] if answer.startswith("-") else answer
    whole, _, fraction = unsigned.partition(".")
    fraction = fraction if "." in unsigned else "0"
    return all(part and part.isascii() and part.isdigit() for part in (whole, fraction))


def canonical(answer: str) -> str:
    negative = answer.startswith("-")
    unsigned = answer[1:] if negative else answer
    whole, _, fraction = unsigned.partition(".")
    whole, fraction = whole.lstrip("0"), fraction.rstrip("0")
    text = (whole or "0") + ("." + fraction if fraction else "")
    return ("-" if negative and (whole or fraction) else "") + text


def digit_credit(found: str, expected: str) -> float:
    if not (well_formed(found) and "." not in found and well_formed(expected) and "." not in expected):
        return 0.0
    found, expected = canonical(found), canonical(expected)
    if found.startswith("-") != expected.startswith("-"):
        return 0.0
    a, b = found.lstrip("-"), expected.lstrip("-")
    right = sum(x == y for x, y in zip(reversed(a), reversed(b)))
    return right / max(len(a), len(b))


def score(completion: str, reference: str, weights: dict) -> float:
    expected = final_answer(reference) or reference.strip().replace(",", "")
    found = final_answer(completion)
    formed = found is not None and well_formed(found)
    if found is None:
        exact = False
    elif formed and well_formed(expected):
        exact = canonical(found) == canonical(expected)
    else:
        exact = found == expected
    digits = 1.0 if exact else (digit_credit(found, expected) if found is not None else 0.0)
    has_marker = MARKER in completion
    after = completion.rsplit(MARKER, 1)[1] if has_marker else None
    clean = after is not None and ("\n" not in after or not after.split("\n", 1)[1].strip())
    excess = max(0, len(completion) - weights.get("soft_max_chars", 512))
    return (weights.get("exact_match", 1.0) * exact + weights.get("partial_credit", 0.0) * digits
            + weights.get("has_marker", 0.1) * has_marker + weights.get("well_formed", 0.1) * formed
            + weights.get("stops_cleanly", 0.1) * clean - weights.get("length_penalty", 0.0) * excess)


class Clock:
    """Wall time per phase for the step in progress, and the steps done."""

    def __init__(self):
        self.current = defaultdict(float)
        self.steps = []  # (seconds, {phase: seconds})
        self.last_end = None
        self.prompt_lengths = []
        self.completion_lengths = []

    def wrap(self, obj, method: str, phase):
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            name = phase() if callable(phase) else phase
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.current[name] += time.perf_counter() - started

        setattr(obj, method, timed)


class StepClock(TrainerCallback):
    def __init__(self, clock: Clock):
        self.clock = clock

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        clock = self.clock
        if clock.last_end is not None:
            seconds = now - clock.last_end
            phases = dict(clock.current)
            # Nested wrappers: generate and logprobs run inside the scoring call, the forward
            # inside compute_loss; keep each second in exactly one phase.
            phases["other"] = seconds - sum(v for k, v in phases.items())
            clock.steps.append((seconds, phases))
        clock.current = defaultdict(float)
        clock.last_end = now


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True, type=Path, help="grpo_prompts' JSON lines")
    parser.add_argument("--weights", type=Path, help="safetensors from `podctl ckpt export`")
    parser.add_argument("--init-weights", type=Path, help="or: npz of podctl's init(seed)")
    parser.add_argument("--preset", required=True, help="JSON of the model preset's sizes")
    parser.add_argument("--job", required=True, help="JSON of the job's GRPO shapes and optimizer")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps (one warm-up more)")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="TRL's output_dir (scratch)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    preset, job = json.loads(args.preset), json.loads(args.job)

    config = Qwen3Config(
        vocab_size=preset["vocab_size"], hidden_size=preset["hidden_size"],
        num_hidden_layers=preset["num_layers"], num_attention_heads=preset["num_heads"],
        num_key_value_heads=preset["num_kv_heads"], head_dim=preset["head_dim"],
        intermediate_size=preset["intermediate_size"], rope_theta=preset["rope_theta"],
        rms_norm_eps=preset["rms_norm_eps"], tie_word_embeddings=preset["tie_embeddings"],
        max_position_embeddings=job["prompt_len"] + job["max_new_tokens"], attention_dropout=0.0,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, use_sliding_window=False)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    if args.weights:
        podctl = load_file(str(args.weights))
    else:
        import numpy as np
        podctl = dict(np.load(args.init_weights))
    missing, unexpected = model.load_state_dict(hf_weights(podctl, preset["num_layers"]),
                                                strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise SystemExit(f"weights do not fit Qwen3: missing {missing}, unexpected {unexpected}")
    model.tie_weights()

    rows = [json.loads(line) for line in args.prompts.read_text().splitlines()]
    # TRL tokenizes prompt texts itself; these keys map each text to podctl's exact ids.
    ids_of = {row["prompt"]: row["tokens"] for row in rows}
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    weights = job["reward"]

    def reward(prompts, completions, answer, **_):
        return [score(c, a, weights) for c, a in zip(completions, answer)]

    generations, global_rows, micro = job["generations"], job["global"], job["micro"]
    grpo = GRPOConfig(
        output_dir=str(args.out), use_cpu=True, report_to="none", bf16=False, fp16=False,
        per_device_train_batch_size=micro, gradient_accumulation_steps=global_rows // micro,
        num_generations=generations, generation_batch_size=global_rows,
        max_completion_length=job["max_new_tokens"], temperature=job["temperature"],
        top_p=job["top_p"], top_k=0, beta=0.0, num_iterations=1, epsilon=job["clip_low"],
        epsilon_high=job["clip_high"], loss_type="dapo",
        scale_rewards="group" if job["scale_rewards"] else "none",
        learning_rate=job["lr"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=job["weight_decay"], adam_beta1=job["b1"], adam_beta2=job["b2"],
        adam_epsilon=job["eps"], max_grad_norm=job["max_grad_norm"], optim="adamw_torch",
        gradient_checkpointing=False, max_steps=args.steps + 1, shuffle_dataset=False,
        logging_steps=1_000_000, save_strategy="no", disable_dropout=True, seed=0,
        dataloader_num_workers=0, log_completions=False)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=grpo, train_dataset=dataset,
                          processing_class=char_tokenizer(preset["vocab_size"]))

    clock = Clock()

    def tokenize(prompts):
        ids = [ids_of[p] for p in prompts]
        clock.prompt_lengths.append(max(map(len, ids)))
        return ids, None, {}

    trainer._tokenize_prompts = tokenize
    clock.wrap(trainer, "_generate_single_turn", "generate")
    clock.wrap(trainer, "_calculate_rewards", "rewards")
    clock.wrap(trainer, "_get_per_token_logps_and_entropies",
               lambda: "forward" if torch.is_grad_enabled() else "logprobs")
    clock.wrap(trainer.accelerator, "backward", "backward")
    clock.wrap(trainer, "_clip_grad_norm", "optimizer")
    trainer.add_callback(StepClock(clock))

    def on_optimizer(phase_start):
        class Optimizer(TrainerCallback):
            def on_pre_optimizer_step(self, *_, **__):
                phase_start[0] = time.perf_counter()

            def on_optimizer_step(self, *_, **__):
                clock.current["optimizer"] += time.perf_counter() - phase_start[0]
        return Optimizer()

    trainer.add_callback(on_optimizer([0.0]))
    completion_lengths = []
    generate_single = trainer._generate_single_turn

    def generate_and_count(*a, **k):
        completion_ids, logprobs = generate_single(*a, **k)
        lengths = [len(c) for c in completion_ids]
        completion_lengths.append((max(lengths), sum(lengths) / len(lengths)))
        return completion_ids, logprobs

    trainer._generate_single_turn = generate_and_count
    trainer.train()

    seconds = [s for s, _ in clock.steps]
    names = ["generate", "rewards", "logprobs", "forward", "backward", "optimizer", "other"]
    phases = {n: [p.get(n, 0.0) for _, p in clock.steps] for n in names}
    print(json.dumps({"threads": torch.get_num_threads(), "steps": seconds, "phases": phases,
                      "prompt_len_max": clock.prompt_lengths[1:],
                      "completion_len_max": [m for m, _ in completion_lengths[1:]],
                      "completion_len_mean": [a for _, a in completion_lengths[1:]],
                      "torch": torch.__version__, "median": sorted(seconds)[len(seconds) // 2]
                      if seconds else math.nan}))


if __name__ == "__main__":
    main()
