#!/usr/bin/env bash
# README command 2 (and what CI runs): the whole test suite on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "test: Rust workspace"
cargo nextest run --workspace --locked --no-fail-fast
echo "test: exporter (pytest)"
.venv/bin/python -m pytest -q models/tests
