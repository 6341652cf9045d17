#!/usr/bin/env bash
# What "Python 3.11, 3.12 or 3.13" rests on: for each Python given (default: every python3.11,
# python3.12 and python3.13 on PATH), a fresh virtual environment gets both locks by hash
# (models/requirements.lock, scripts/requirements/test.lock), then the exporter's tests run in it.
# One line per Python at the end. Not part of CI: about 2 GB of wheels per Python.
#   scripts/check-pythons.sh [PYTHON...]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -gt 0 ]; then
  pythons=("$@")
else
  pythons=()
  for name in python3.11 python3.12 python3.13; do
    command -v "$name" >/dev/null && "$name" -c '' 2>/dev/null && pythons+=("$name")
  done
fi
[ ${#pythons[@]} -gt 0 ] || { echo "check-pythons: no python3.11, python3.12 or python3.13 on PATH" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=()
status=0
for python in "${pythons[@]}"; do
  version=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  venv=$work/$version
  echo "check-pythons: Python $version ($(command -v "$python"))"
  started=$SECONDS
  if "$python" -m venv "$venv" &&
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --only-binary :all: \
      -r models/requirements.lock -r scripts/requirements/test.lock &&
    (cd models && "$venv/bin/python" -m pytest -q tests); then
    results+=("Python $version: both locks installed by hash, models/tests passed ($((SECONDS - started)) s)")
  else
    results+=("Python $version: FAILED (above)")
    status=1
  fi
  rm -rf "$venv"
done
printf '%s\n' "${results[@]}"
exit $status
