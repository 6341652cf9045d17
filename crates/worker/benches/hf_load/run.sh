#!/usr/bin/env bash
# The loading benchmark (benches/hf_load.rs): makes the Qwen3-1.7B-shaped bf16 checkpoint once
# (about 3.4 GB, in $HF_BENCH_DIR or target/hf-load-bench/; delete it when done), then compares
# podctl's load onto a (fsdp 2, tp 2) CPU mesh with transformers' from_pretrained.
#
#   crates/worker/benches/hf_load/run.sh [--rounds N]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
dir="${HF_BENCH_DIR:-$root/target/hf-load-bench/Qwen3-1.7B-bf16}"
"$root/scripts/setup-hf-reference.sh"
if [ ! -f "$dir/model.safetensors.index.json" ]; then
  mkdir -p "$(dirname "$dir")"
  "$root/.venv-hf/bin/python" "$root/crates/worker/benches/hf_load/make_checkpoint.py" "$dir"
fi
cd "$root"
cargo bench -p podctl-worker --bench hf_load -- --model "$dir" "$@"
