#!/usr/bin/env bash
# Checkpoint benchmark: podctl save/restore of a ~1 GiB state on local disk, next to Orbax
# (CPU JAX, same arrays, same run) and dd conv=fdatasync of the same byte count.
# Usage: crates/checkpoint/benches/run.sh [--gib 1.0] [--dir /path/on/disk] [--skip-orbax]
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
# Orbax runs in .venv-ckpt-bench (gitignored), made on first use: the project's .venv (JAX, numpy)
# on its path plus the pinned orbax-checkpoint, so the shared .venv stays as setup.sh made it.
venv="${PODCTL_VENV:-$root/.venv-ckpt-bench}"
if [[ " $* " != *" --skip-orbax "* ]] && ! "$venv/bin/python" -c "import orbax.checkpoint" 2>/dev/null; then
  [[ -x "$root/.venv/bin/python" ]] || "$root/scripts/setup.sh"
  echo "installing the pinned orbax-checkpoint into $venv (once)" >&2
  "$root/.venv/bin/python" -m venv "$venv"
  "$root/.venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
    > "$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/podctl-venv.pth"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/scripts/requirements/checkpoint-bench.txt"
fi
cd "$root"
export PODCTL_VENV="$venv"
exec cargo bench -p podctl-checkpoint --bench save_restore -- "$@"
