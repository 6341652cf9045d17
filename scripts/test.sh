#!/usr/bin/env bash
# README command 2 (and what CI runs): the whole test suite on this machine. Its setup adds what
# only the tests need to README command 1's (scripts/setup.sh --test): tmux and prometheus, which
# it installs as root and otherwise names with the command that installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
echo "test: [${SECONDS}s] crate layering (docs/ARCHITECTURE.md)"
cargo run --quiet --locked -p podctl-layering
echo "test: [${SECONDS}s] Rust workspace"
cargo nextest run --workspace --locked --no-fail-fast
echo "test: [${SECONDS}s] fail points (collective, checkpoint, coordinator)"
# `fail_point!`s are compiled only with each crate's `failpoints` feature, and their test binaries
# require it, so the run above skips them. `--workspace` keeps the dependencies' features those of
# the run above (nothing of theirs is rebuilt); `--test failpoints` builds only the three fail-point
# binaries and the three crates (with the coordinator's node binary) again: about 1 CPU-minute
# of compiling (3.5 min wall at load average 20 on 2 cores) and 70 s of tests.
cargo nextest run --workspace --locked --no-fail-fast --test failpoints \
  --features podctl-collective/failpoints,podctl-checkpoint/failpoints,podctl-coordinator/failpoints
# Its own workspace, so the run above never builds it; a wire change once broke it unseen until
# CI's fuzz run. `.ci/run` skips it (PODCTL_FUZZ_CHECK=0): its fuzz run builds them next.
if [ "${PODCTL_FUZZ_CHECK:-1}" != 0 ]; then
  echo "test: [${SECONDS}s] fuzz targets compile (fuzz/, run by scripts/fuzz.sh)"
  CARGO_TARGET_DIR=target/fuzz-check cargo check --quiet --locked --manifest-path fuzz/Cargo.toml --bins
fi
echo "test: [${SECONDS}s] exporter (pytest)"
.venv/bin/python -m pytest -q --durations=8 models/tests
echo "test: done after ${SECONDS}s"
