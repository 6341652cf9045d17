"""Prints scripts/bench/grpo_vs_trl.sh's table: per shape, each side's median step time, the
ratio, and each side's phase split (mean seconds per step over the measured steps, and the
phases' sum against the mean step, so a phase left out would show).

`python scripts/bench/grpo_table.py OUT SHAPE...` (OUT/SHAPE/podctl/metrics.jsonl and
OUT/SHAPE/trl.json, as the benchmark leaves them).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

# podctl's phases (worker::grpo::run_step), in step order.
PODCTL_PHASES = ["prompts", "rollout", "rewards", "train_batches", "old_logprobs", "ref_logprobs",
                 "gradients", "lane_sum", "transfers", "reduce", "apply"]
TRL_PHASES = ["generate", "rewards", "logprobs", "forward", "backward", "optimizer", "other"]


def podctl_side(run: Path):
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "step_seconds" in line][1:]  # the first step warms up
    seconds = [s["step_seconds"] for s in steps]
    phases = {p: statistics.fmean(s.get(f"phase_{p}_seconds", 0.0) for s in steps)
              for p in PODCTL_PHASES}
    lengths = [s.get("completion_length", 0.0) for s in steps]
    return seconds, {p: v for p, v in phases.items() if v > 0}, statistics.fmean(lengths)


def trl_side(path: Path):
    result = json.loads(path.read_text())
    seconds = result["steps"]
    phases = {p: statistics.fmean(result["phases"][p]) for p in TRL_PHASES}
    return seconds, {p: v for p, v in phases.items() if v > 0}, result


def split(phases: dict, seconds: list) -> str:
    mean = statistics.fmean(seconds)
    parts = ", ".join(f"{name} {value:.3f} ({100 * value / mean:.0f}%)" for name, value in phases.items())
    return f"{parts}; sum {sum(phases.values()):.3f} s of a mean step of {mean:.3f} s"


def main():
    out, shapes = Path(sys.argv[1]), sys.argv[2:]
    print()
    print("| shape | podctl median | TRL median | podctl / TRL | steps |")
    print("| --- | --- | --- | --- | --- |")
    details = []
    for shape in shapes:
        ours, our_phases, length = podctl_side(out / shape / "podctl")
        theirs, their_phases, trl = trl_side(out / shape / "trl.json")
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"| {shape} | {a:.3f} s | {b:.3f} s | {a / b:.2f}x | {len(ours)} + {len(theirs)} |")
        details.append((shape, ours, our_phases, length, theirs, their_phases, trl))
    for shape, ours, our_phases, length, theirs, their_phases, trl in details:
        print()
        print(f"{shape}, podctl: {split(our_phases, ours)}")
        print(f"{shape}, TRL ({trl['threads']} threads, torch {trl['torch']}): {split(their_phases, theirs)}")
        trl_length = statistics.fmean(trl["completion_len_mean"])
        print(f"{shape}: mean completion podctl {length:.1f} tokens, TRL {trl_length:.1f}; TRL's longest "
              f"prompt per step {sorted(set(trl['prompt_len_max']))} (podctl: always its buffer), longest "
              f"completion {sorted(set(trl['completion_len_max']))}")
        print(f"{shape}: podctl steps {[round(s, 3) for s in ours]}")
        print(f"{shape}: TRL steps    {[round(s, 3) for s in theirs]}")


if __name__ == "__main__":
    main()
