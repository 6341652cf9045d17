#!/usr/bin/env bash
# The GRPO benchmark (issue 12): GRPO raises the tiny model's exact-match accuracy on held-out
# arithmetic problems, starting from an SFT checkpoint well below 70% (examples/sft-arith.yaml,
# trained first when its checkpoint is missing; that part is not timed). Prints the held-out
# accuracy before and after (greedy, same problems), then every evaluation with the seconds of
# GRPO it took to get there (the 10-minute mark is what the issue asks about), and the machine's
# load average before and after: the number means little while other work shares the cores.
# OUT=DIR chooses the run directory (default runs/grpo-arith; its records are overwritten).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/grpo-arith}
cargo build --release --locked -p podctl
echo "load before: $(uptime)"
target/release/podctl launch examples/grpo-arith.yaml --out "$out"
echo "load after: $(uptime)"
echo "held-out accuracy (greedy) per evaluation, seconds since GRPO started:"
python3 - "$out/events.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    event = json.loads(line)
    if event["kind"] == "eval":
        d = event["detail"]
        print(f"  step {event['step']:>3}  {event['t']:7.1f} s  {100 * d['accuracy']:5.1f}% ({d['correct']}/{d['problems']})")
PY
