#!/usr/bin/env bash
# Builds the podctl wheel (pyproject.toml): the podctl binary, the exporter (models/podctl_models)
# and their pinned dependencies as its requirements, with the pinned maturin. Nothing is
# published; install it with
#   python3 -m venv ENV && ENV/bin/pip install target/wheels/podctl-*.whl    # [tpu] adds libtpu
#
#   scripts/build-wheel.sh [--debug [--reuse-only]] [--out DIR]
# Release build by default; --debug builds from the dev profile, reusing the tests' build in
# target/ (see below); with --reuse-only it fails, naming them, if any dependency had to be
# compiled again (the install test's check that it costs CI seconds, not 20 minutes). Prints the
# wheel's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

maturin_version=1.16.0
profile=release
reuse_only=0
out=target/wheels
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) profile=dev ;;
    --reuse-only) reuse_only=1 ;;
    --out) out=$2; shift ;;
    *) echo "usage: scripts/build-wheel.sh [--debug [--reuse-only]] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done

# The wheel's version is the workspace's.
crate_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
wheel_version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
if [ "$crate_version" != "$wheel_version" ]; then
  echo "build-wheel: pyproject.toml says version $wheel_version, Cargo.toml $crate_version; make them agree" >&2
  exit 1
fi

tools=.tools/maturin-$maturin_version
if [ ! -x "$tools/bin/maturin" ]; then
  echo "build-wheel: installing maturin $maturin_version into $tools" >&2
  "${PYTHON:-python3}" -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check "maturin==$maturin_version"
fi

options=()
if [ "$profile" = dev ]; then
  # Reuse the tests' build. Its intermediate files (build.build-dir) are read and added to, while
  # the binary lands in a target directory of its own: target/debug/podctl, which running tests
  # execute, is never replaced. That build unifies dependency features over the whole workspace,
  # dev-dependencies included (metrics-http's tests turn on tokio's test-util), so podctl's
  # direct dependencies are given the workspace's features here; otherwise every crate above
  # tokio would be compiled again.
  build_dir=${CARGO_TARGET_DIR:-$PWD/target}
  export CARGO_BUILD_BUILD_DIR=$build_dir
  options+=(--target-dir "$build_dir/wheel")
  tree_features() { cargo tree --quiet --locked "$@" --depth 0 -f '{f}' | head -n1 | tr ',' '\n' | sort; }
  for dep in $(cargo tree --quiet --locked -p podctl -e normal --depth 1 --prefix none -f '{p}' | grep -v '(' | cut -d' ' -f1 | sort -u); do
    for feature in $(comm -13 <(tree_features -p podctl -e normal,build -i "$dep") <(tree_features --workspace -i "$dep")); do
      options+=(--features "$dep/$feature")
    done
  done
  # Features of podctl's indirect dependencies cannot be given here: a workspace member that
  # changes them (or builds a host-only crate for the target, which gives it other debug info)
  # makes this build compile the dependencies above it again. Built with cargo first to see
  # what it compiled; maturin's build below then finds every unit fresh.
  messages=$(mktemp)
  trap 'rm -f "$messages"' EXIT
  cargo build --locked --profile dev -p podctl --bin podctl "${options[@]}" \
    --message-format json-render-diagnostics >"$messages"
  compiled=$(grep '"reason":"compiler-artifact"' "$messages" | grep '"fresh":false' |
    grep -o '"package_id":"registry+[^"]*"' | sed 's/.*#//; s/"$//' | sort -u | tr '\n' ' ' || true)
  if [ -n "$compiled" ]; then
    echo "build-wheel: compiled dependencies the tests' build (cargo test --workspace) has in other features or profiles: $compiled" >&2
    if [ "$reuse_only" = 1 ]; then
      echo "build-wheel: --reuse-only: find the workspace member that changes them with 'cargo tree --workspace -e features -i <crate>' (or build the tests with --workspace first)" >&2
      exit 1
    fi
  fi
  # A test's wheel is unpacked once: no time spent compressing it.
  options+=(--compression-method stored)
fi

mkdir -p "$out"
rm -f "$out"/podctl-"$wheel_version"-*.whl
"$tools/bin/maturin" build --quiet --locked --profile "$profile" "${options[@]}" --out "$out" >&2
ls "$out"/podctl-"$wheel_version"-*.whl
