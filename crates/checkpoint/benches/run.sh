#!/usr/bin/env bash
# Checkpoint benchmark: podctl save/restore of a ~1 GiB state on local disk, next to Orbax
# (CPU JAX, same arrays, same run) and dd conv=fdatasync of the same byte count.
# Usage: crates/checkpoint/benches/run.sh [--gib 1.0] [--dir /path/on/disk] [--skip-orbax]
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
venv="${PODCTL_VENV:-$root/.venv}"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import orbax.checkpoint" 2>/dev/null; then
  if [[ " $* " != *" --skip-orbax "* ]]; then
    echo "orbax-checkpoint is not installed in $venv: run scripts/setup.sh" \
         "(or pip install -r scripts/requirements/checkpoint-bench.txt), or pass --skip-orbax" >&2
    exit 1
  fi
fi
cd "$root"
export PODCTL_VENV="$venv"
exec cargo bench -p podctl-checkpoint --bench save_restore -- "$@"
