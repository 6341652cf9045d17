#!/usr/bin/env bash
# Installs what podctl needs, pinned, inside the project, with no root and no system package;
# safe to rerun (a stamp makes a rerun with unchanged pins take no time).
#   .venv/                  a Python 3.11, 3.12 or 3.13 ($PYTHON, else the first of python3,
#                           python3.13, python3.12, python3.11 in that range) with
#                           models/requirements.lock installed by hash: JAX 0.10.2, the CPU PJRT
#                           plugin (xla-cpu-pjrt); the exporter (models/) on its path
#   target/release/podctl   with --release (README command 1, scripts/quickstart.sh)
# With --test (scripts/test.sh, README command 2), also what the tests need: the system tools two
# tests drive (tmux, prometheus: scripts/install-test-tools.sh installs them as root, and names
# itself as the fix without root), scripts/requirements/test.lock (libtpu, pytest, object-store
# emulators, kubernetes-validate, the tokenizer references), and helm (scripts/install-helm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

release=0
test=0
for arg in "$@"; do
  case "$arg" in
    --release) release=1 ;;
    --test) test=1 ;;
    *) echo "usage: scripts/setup.sh [--release] [--test]" >&2; exit 2 ;;
  esac
done

# The system tools first: without root this fails at once, naming the command, before minutes of
# downloads.
if [ "$test" = 1 ] && ! scripts/install-test-tools.sh --check; then
  if [ "$(id -u)" = 0 ]; then
    scripts/install-test-tools.sh
  else
    echo "setup: the tests need the tools above; install them with: sudo scripts/install-test-tools.sh" >&2
    exit 1
  fi
fi

# The Pythons JAX 0.10.2 and the locks have wheels for.
in_range='import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))'
minor_of() { "$1" -c 'import sys; print(sys.version_info[1])'; }
python=
for candidate in ${PYTHON:-python3 python3.13 python3.12 python3.11}; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "$in_range" 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  found=$(for p in ${PYTHON:-python3 python3.13 python3.12 python3.11}; do
    command -v "$p" >/dev/null && echo "$p is $("$p" -V 2>&1)"
  done | paste -sd, -)
  echo "setup: need Python 3.11, 3.12 or 3.13 (JAX 0.10.2 has wheels for those); found: ${found:-no python3}." >&2
  echo "setup: install one (uv python install 3.12, brew install python@3.12, apt install python3.11-venv)" \
    "and rerun, or set PYTHON=/path/to/python3.12" >&2
  exit 1
fi

# A .venv of another Python than the one chosen (or whose Python is gone) is made again.
if [ -e .venv ] && ! { [ -x .venv/bin/python ] && .venv/bin/python -c "$in_range" 2>/dev/null &&
  [ "$(minor_of .venv/bin/python)" = "$(minor_of "$python")" ]; }; then
  echo "setup: .venv is not a Python $("$python" -V 2>&1 | cut -d' ' -f2) environment; making it again"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$python" -V 2>&1) ($(command -v "$python"))"
  if ! "$python" -m venv .venv; then
    rm -rf .venv
    echo "setup: $python cannot create a virtual environment (on Debian and Ubuntu its venv module is" \
      "the python3.X-venv package); install it, or set PYTHON to another Python 3.11-3.13" >&2
    exit 1
  fi
fi
minor=$(minor_of .venv/bin/python)
site=.venv/lib/python3.$minor/site-packages
# One path for tests and tools whatever the Python: .venv/lib/python3/site-packages/...
ln -sfn "python3.$minor" .venv/lib/python3

pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes --only-binary :all:)
# The stamps record what was installed, so a rerun with unchanged pins takes no time.
stamp() { cat "$@" | { cat; echo "3.$minor $PWD"; } | sha256sum | cut -c1-16; }
if [ "$(cat .venv/.podctl-setup 2>/dev/null)" != "$(stamp models/requirements.lock)" ]; then
  echo "setup: installing models/requirements.lock into .venv (first time: a minute or two)"
  "${pip[@]}" -r models/requirements.lock
  # The exporter runs from the checkout: podctl puts models/ on PYTHONPATH, this does it for
  # everything else that runs .venv's Python (pytest, benchmarks).
  echo "$PWD/models" >"$site/podctl-models.pth"
  stamp models/requirements.lock >.venv/.podctl-setup
fi

if [ "$test" = 1 ]; then
  if [ "$(cat .venv/.podctl-setup-test 2>/dev/null)" != "$(stamp scripts/requirements/test.lock)" ]; then
    echo "setup: installing scripts/requirements/test.lock into .venv (first time: a few minutes)"
    "${pip[@]}" -r scripts/requirements/test.lock
    stamp scripts/requirements/test.lock >.venv/.podctl-setup-test
  fi
  # helm for the chart tests, into .tools/ (the pinned binary is checked by sha256).
  scripts/install-helm.sh
fi

if [ "$release" = 1 ]; then
  echo "setup: building podctl (release)"
  cargo build --release --locked -p podctl
fi
