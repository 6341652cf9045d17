"""TRL's side of trl_parity.rs: scores the completions in a JSON file with TRL's GRPOTrainer
(`_calculate_rewards`, then the weighted `nansum` of `_generate_and_score_completions`), the reward
functions imported from trl_rewards.py unchanged. Run with TRL's venv (.venv-bench, pinned in
scripts/requirements/trl-bench.txt):

    python trl_reference.py MODEL_DIR CASE.json  ->  {"per_function": [[...]], "totals": [...]}
"""

import json
import math
import os
import sys
import tempfile

import datasets
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trl_rewards  # noqa: E402


def main():
    model_dir, case_path = sys.argv[1:3]
    case = json.load(open(case_path))
    functions = [getattr(trl_rewards, name) for name in case["functions"]]
    rows = case["rows"]
    dataset = datasets.Dataset.from_list(
        [{"prompt": row["prompt"], "answer": row["answer"], "level": row["level"]} for row in rows]
    )
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            reward_weights=case["weights"],
            num_generations=case["generations"],
            per_device_train_batch_size=len(rows),
            max_steps=case["max_steps"],
            report_to=[],
            use_cpu=True,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            reward_funcs=functions,
            args=args,
            train_dataset=dataset,
        )
        trainer.state.global_step = case["step"]
        trainer.state.max_steps = case["max_steps"]
        inputs = [dict(dataset[i]) for i in range(len(rows))]
        prompts = [row["prompt"] for row in rows]
        completions = [[{"role": "assistant", "content": row["completion"]}] for row in rows]
        ids = [row["completion_ids"] for row in rows]
        per_function = trainer._calculate_rewards(inputs, prompts, completions, ids)
        totals = (per_function * trainer.reward_weights.unsqueeze(0)).nansum(dim=1)
    as_json = lambda v: None if math.isnan(v) else v
    json.dump(
        {
            "per_function": [[as_json(v) for v in per_function[:, f].tolist()] for f in range(len(functions))],
            "totals": totals.tolist(),
        },
        sys.stdout,
    )


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
