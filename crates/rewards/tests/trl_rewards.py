"""Reward functions written for TRL's GRPOTrainer, in its documented form, used unchanged by
trl_parity.rs: TRL's `_calculate_rewards` (trl_reference.py, in TRL's venv) and podctl's pool score
the same completions with them and must agree.
"""

import re


def format_reward(completions, **kwargs):
    """1 when the completion ends with a `#### <number>` line (TRL's docs' format reward)."""
    pattern = r"#### -?\d+\s*$"
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.search(pattern, content) else 0.0 for content in contents]


def accuracy(prompts, completions, answer, **kwargs):
    """1 for the reference's number after ####, 0 otherwise; None when the row has no reference."""
    rewards = []
    for completion, reference in zip(completions, answer):
        if not reference:
            rewards.append(None)
            continue
        want = reference.split("####")[-1].strip()
        got = re.findall(r"#### (-?\d+)", completion[0]["content"])
        rewards.append(1.0 if got and got[-1] == want else 0.0)
    return rewards


def shorter_is_better(completion_ids, trainer_state, **kwargs):
    """A length penalty that grows with training progress (trainer_state, completion_ids)."""
    scale = (trainer_state.global_step + 1) / trainer_state.max_steps
    return [-scale * len(ids) / 64 for ids in completion_ids]


def by_level(prompts, completions, level, **kwargs):
    """A bonus by the row's `level` column; None for level 0 (not applicable)."""
    return [None if lv == 0 else 0.1 * lv * len(p) for lv, p in zip(level, prompts)]
