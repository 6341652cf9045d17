#!/usr/bin/env bash
# Writes the lock files from the pins (run it after changing one; needs PyPI):
#   models/requirements.lock         what podctl runs: pyproject.toml's dependencies (README
#                                    command 1's setup, the same pins as the wheel)
#   scripts/requirements/test.lock   that plus what the tests add: libtpu (the wheel's `tpu`
#                                    extra) and scripts/requirements/*.txt (bench and Hugging
#                                    Face reference files excepted: they have venvs of their own)
# Each is resolved once for Python 3.11 to 3.13 on every platform (uv's universal mode: a package
# whose version differs between them gets one pinned line per marker) and carries the sha256 of
# every file of each pinned version, so `pip install --require-hashes` takes nothing else.
# uv is pinned and installed into .tools/uv-<version>/ from PyPI; setup.sh never needs it.
#   scripts/lock.sh           rewrite both
#   scripts/lock.sh --check   exit 1 if either lock's pins differ from what the inputs resolve to
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.13.9
tools=.tools/uv-$version
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: scripts/lock.sh [--check]" >&2; exit 2 ;;
esac

if [ ! -x "$tools/bin/uv" ]; then
  echo "lock: installing uv $version into $tools" >&2
  "${PYTHON:-python3}" -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check "uv==$version"
fi
uv=$tools/bin/uv

mapfile -t test_inputs < <(ls scripts/requirements/*.txt | grep -v -e '-bench\.txt$' -e '/hf-reference\.txt$')
compile() { # OUT ARGS...: a universal, hashed lock
  local out=$1
  shift
  "$uv" pip compile --quiet --universal --python-version 3.11 --generate-hashes --no-header \
    --index-url https://pypi.org/simple "$@" -o "$out"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
compile "$tmp/requirements.lock" pyproject.toml
compile "$tmp/test.lock" pyproject.toml --extra tpu "${test_inputs[@]}"

header() { # WHAT: the comment every lock starts with
  echo "# $1"
  echo "# Written by scripts/lock.sh from pyproject.toml${2:-}; do not edit. Hashes for Python 3.11-3.13."
}
{
  header "What podctl runs (README command 1's setup; the wheel's dependencies)."
  cat "$tmp/requirements.lock"
} >"$tmp/requirements.out"
{
  header "What the tests add to models/requirements.lock (scripts/setup.sh --test)." \
    " [tpu] and ${test_inputs[*]}"
  cat "$tmp/test.lock"
} >"$tmp/test.out"

if [ "$check" = 1 ]; then
  pins() { grep -v '^\s*#\|^\s*--hash' "$1" | sed 's/ \\$//'; }
  status=0
  for pair in "models/requirements.lock:$tmp/requirements.out" "scripts/requirements/test.lock:$tmp/test.out"; do
    lock=${pair%%:*}
    if ! diff <(pins "$lock") <(pins "${pair#*:}") >/dev/null; then
      echo "lock: $lock is out of date with its inputs; run scripts/lock.sh" >&2
      diff <(pins "$lock") <(pins "${pair#*:}") >&2 || true
      status=1
    fi
  done
  exit $status
fi
cp "$tmp/requirements.out" models/requirements.lock
cp "$tmp/test.out" scripts/requirements/test.lock
echo "lock: wrote models/requirements.lock ($(grep -c '==' models/requirements.lock) pins) and scripts/requirements/test.lock ($(grep -c '==' scripts/requirements/test.lock) pins)"
