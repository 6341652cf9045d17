#!/usr/bin/env bash
# Installs what podctl needs on a fresh machine, pinned, inside the project; safe to rerun.
#   .venv/             Python 3.11: JAX 0.10.2, the CPU PJRT plugin (xla-cpu-pjrt), libtpu (TPU
#                      AOT compiles), the exporter (models/, editable), object-store emulators,
#                      kubernetes-validate
#   .tools/helm-*/     helm, for the chart tests (scripts/install-helm.sh)
#   target/release/podctl   (only with --release)
# Nothing is installed outside the project except Debian's tmux (a test drives a real terminal)
# and prometheus (a test scrapes a run with it) where they are missing; every version comes from a
# pin in this repository.
set -euo pipefail
cd "$(dirname "$0")/.."

release=0
for arg in "$@"; do
  case "$arg" in
    --release) release=1 ;;
    *) echo "usage: scripts/setup.sh [--release]" >&2; exit 2 ;;
  esac
done

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  echo "setup: need Python 3.11 (JAX 0.10.2 wheels); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

# One system tool the tests drive: tmux, the real terminal of `podctl status --watch`'s test
# (crates/podctl/tests/observe.rs). Debian's package, pinned; installed only where it is missing.
if ! command -v tmux >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's tmux 3.3a-3 (for the terminal test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux=3.3a-3 >/dev/null
  else
    echo "setup: tmux is missing and cannot be installed here (needs root and apt-get); the status --watch test needs it" >&2
    exit 1
  fi
fi

# And a real Prometheus: crates/cli/tests/prometheus.rs starts Debian's server on loopback to
# scrape a local run (promtool comes with it). Pinned, installed only where it is missing; the
# package's own service is not wanted (the test runs its own), so it is disabled where systemd runs.
if ! command -v prometheus >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's prometheus 2.42.0+ds-5+b6 (for the metrics test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus=2.42.0+ds-5+b6 >/dev/null
    if [ -d /run/systemd/system ]; then
      systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  else
    echo "setup: prometheus is missing and cannot be installed here (needs root and apt-get); the metrics test needs it" >&2
    exit 1
  fi
fi

# The stamp records what was installed, so a rerun with unchanged pins takes no time.
stamp=.venv/.podctl-setup
want=$(cat models/requirements.lock scripts/requirements/*.txt models/pyproject.toml | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$python" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing pinned Python packages into .venv (first time: a few minutes)"
  .venv/bin/pip install --quiet --disable-pip-version-check -r models/requirements.lock
  for req in scripts/requirements/*.txt; do
    # Benchmarks install their own baselines; the Hugging Face reference (torch) has its own
    # venv (scripts/setup-hf-reference.sh).
    case "$req" in *-bench.txt|*/hf-reference.txt) continue ;; esac
    .venv/bin/pip install --quiet --disable-pip-version-check -r "$req"
  done
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -e models
  echo "$want" > "$stamp"
fi

# helm for the chart tests, into .tools/ (the pinned binary is checked by sha256).
scripts/install-helm.sh

if [ "$release" = 1 ]; then
  echo "setup: building podctl (release)"
  cargo build --release --locked -p podctl
fi
