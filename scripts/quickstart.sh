#!/usr/bin/env bash
# README command 1: install what podctl needs (pinned, inside the project), then train the tiny
# example on this machine's CPU. The run record lands in runs/tiny-arith/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --release
exec target/release/podctl launch examples/tiny.yaml "$@"
