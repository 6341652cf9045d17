#!/usr/bin/env bash
# podctl's GRPO step against Hugging Face TRL's GRPOTrainer, same shapes, model, weights, prompts
# and cores, in one run; prints each side's median step time, the ratio and both phase splits.
#
#   scripts/bench/grpo_vs_trl.sh            # both shapes, 12 measured steps each
#   SHAPES=example STEPS=6 scripts/bench/grpo_vs_trl.sh
#
# Shapes (docs/GRPO.md, "Speed"):
#   example  examples/grpo-arith.yaml as it is (tiny preset, 32 prompts x 8 generations, 100-token
#            prompt buffer, 28 new tokens, micro-batch 64, float32, KL off), from its SFT
#            checkpoint (trained first when missing, as `podctl launch` does), evaluation off
#   small    the same job on the `small` preset (4 layers, hidden 256: 3.3M parameters), from
#            podctl's init(seed) on both sides (a random policy rarely stops, so both decode the
#            whole completion buffer at every step)
#
# podctl: the release build, `podctl launch` of the job for STEPS + 1 steps, per-step seconds and
# phases from metrics.jsonl (the first step, with warm-up, left out). TRL: scripts/bench/
# grpo_trl.py in .venv-bench (created on first use from scripts/requirements/trl-bench.txt,
# about 4.5 GB, never the project's .venv), on the same prompts in the same order, with
# torch.set_num_threads(THREADS). THREADS defaults to the machine's cores, which is what the XLA
# CPU client podctl runs uses. The two sides run one after the other, never at the same time;
# the load average is printed beside the numbers (other work on the cores skews both).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
steps=${STEPS:-12}
shapes=${SHAPES:-example small}
threads=${THREADS:-$(nproc)}
# glibc's malloc settings: podctl restarts itself with its own (crates/pjrt/src/env.rs,
# MALLOC_TUNABLES); TRL runs as its users run it, with glibc's defaults (podctl's settings made
# its step slower: 1.89 s against 1.55-1.76 s). TRL_MALLOC gives TRL's process some anyway.
trl_malloc=${TRL_MALLOC:-}
venv=$root/.venv-bench
out=${OUT:-$root/runs/bench-grpo-trl}
mkdir -p "$out"

if ! "$venv/bin/python" -c "import trl, torch, transformers" 2>/dev/null; then
  echo "installing the pinned TRL, transformers and torch into $venv (about 4.5 GB, once)" >&2
  python3.11 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r scripts/requirements/trl-bench.txt
fi

# One invocation, so both targets share one feature resolution (two would rebuild each other's crates).
nice -n 10 cargo build --release --locked -p podctl -p podctl-worker --bin podctl --example grpo_prompts
podctl=$root/target/release/podctl
prompts_bin=$root/target/release/examples/grpo_prompts

# The benchmark's job for a shape: the example with STEPS + 1 steps, evaluation and checkpoints
# off, and (small) another preset with no init_from. Prints the job's settings as JSON for TRL.
write_job() {
  .venv/bin/python - "$1" "$2" "$((steps + 1))" <<'PY'
import json, sys, yaml
shape, path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
job = yaml.safe_load(open("examples/grpo-arith.yaml"))
job["name"] = f"bench-grpo-{shape}"
job["steps"] = steps
job["eval"] = {"problems": 0}
job.pop("checkpoint", None)
if shape == "small":
    job["model"] = "small"
    del job["grpo"]["init_from"]
else:
    # The SFT job's path, relative to the example it came from.
    job["grpo"]["init_from"] = "examples/" + job["grpo"]["init_from"].removeprefix("examples/")
yaml.safe_dump(job, open(path, "w"), sort_keys=False)
g, o = job["grpo"], job.get("optimizer", {})
print(json.dumps({
    "generations": g["generations"], "global": job["batch"]["global"], "micro": job["batch"]["micro"],
    "prompt_len": g["prompt_len"], "max_new_tokens": g["max_new_tokens"],
    "temperature": g.get("temperature", 1.0), "top_p": g.get("top_p", 1.0),
    "clip_low": g.get("clip_low", 0.2), "clip_high": g.get("clip_high", 0.2),
    "scale_rewards": g.get("scale_rewards", True), "reward": g.get("reward", {}),
    "lr": o["lr"], "weight_decay": o.get("weight_decay", 0.1), "b1": o.get("b1", 0.9),
    "b2": o.get("b2", 0.95), "eps": o.get("eps", 1e-8), "max_grad_norm": o.get("max_grad_norm", 1.0),
    "model": job["model"], "init_from": g.get("init_from")}))
PY
}

echo "malloc: podctl with its own GLIBC_TUNABLES (pjrt::restart_with_malloc_for_xla), TRL with \"$trl_malloc\""
for shape in $shapes; do
  dir=$out/$shape
  rm -rf "$dir" && mkdir -p "$dir"
  settings=$(write_job "$shape" "$dir/job.yaml")
  model=$(jq -r .model <<<"$settings")
  preset=$(jq -c --arg m "$model" '.[$m]' models/podctl_models/presets.json)
  echo "== $shape: podctl ($model, $((steps + 1)) steps; load: $(cut -d' ' -f1-3 /proc/loadavg))"
  "$podctl" launch "$dir/job.yaml" --out "$dir/podctl" > "$dir/podctl.log" 2>&1 \
    || { tail -20 "$dir/podctl.log"; exit 1; }
  "$prompts_bin" "$dir/job.yaml" "$((steps + 1))" > "$dir/prompts.jsonl"
  if [ "$shape" = small ]; then
    .venv/bin/python - "$model" "$dir/init.npz" <<'PY'
import sys, numpy as np, jax.numpy as jnp
from podctl_models import config, qwen3
params = qwen3.init_params(config.preset(sys.argv[1]), jnp.uint32(0), jnp.float32)  # init_seed(0)
np.savez(sys.argv[2], **{k: np.asarray(v) for k, v in params.items()})
PY
    weights=(--init-weights "$dir/init.npz")
  else
    # The checkpoint podctl started from (its launch resolved init_from to it).
    start=$(sed -n 's/^policy and reference start from //p' "$dir/podctl.log" | head -1)
    [ -n "$start" ] || { echo "no init_from checkpoint in $dir/podctl.log" >&2; exit 1; }
    "$podctl" ckpt export "$start" --out "$dir/start.safetensors" --dtype float32 > /dev/null
    weights=(--weights "$dir/start.safetensors")
  fi
  echo "== $shape: TRL (torch threads $threads; load: $(cut -d' ' -f1-3 /proc/loadavg))"
  GLIBC_TUNABLES=$trl_malloc "$venv/bin/python" scripts/bench/grpo_trl.py --prompts "$dir/prompts.jsonl" "${weights[@]}" \
    --preset "$preset" --job "$settings" --steps "$steps" --threads "$threads" --out "$dir/trl" \
    > "$dir/trl.log" 2>&1 || { tail -30 "$dir/trl.log"; exit 1; }
  tail -1 "$dir/trl.log" > "$dir/trl.json"
  echo "== $shape: done (load: $(cut -d' ' -f1-3 /proc/loadavg))"
done

.venv/bin/python scripts/bench/grpo_table.py "$out" $shapes
