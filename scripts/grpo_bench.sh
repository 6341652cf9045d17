#!/usr/bin/env bash
# The GRPO benchmark (issue 12): GRPO raises the tiny model's exact-match accuracy on held-out
# arithmetic problems, starting from an SFT checkpoint well below 70% (examples/sft-arith.yaml,
# trained first when its checkpoint is missing; that part is not timed). Prints the held-out
# accuracy before and after (greedy, same problems), GRPO's wall time, and the machine's load
# average before and after: the number means little while other work shares the cores.
# Extra arguments go to `podctl launch` (e.g. --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p podctl-cli
echo "load before: $(uptime)"
target/release/podctl launch examples/grpo-arith.yaml "$@"
echo "load after: $(uptime)"
