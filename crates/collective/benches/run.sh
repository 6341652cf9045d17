#!/usr/bin/env bash
# podctl's ring all-reduce and torch.distributed gloo's, same sizes and ranks, side by side.
#
#   crates/collective/benches/run.sh                 # ranks 2,4; 1,16,64,256 MiB
#   RANKS=2 MIB=64 crates/collective/benches/run.sh  # a subset
#
# The first run creates /.venv-bench (gitignored) with the pinned torch from
# requirements-gloo.txt; later runs reuse it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="$root/.venv-bench"
ranks="${RANKS:-2,4}"
mib="${MIB:-1,16,64,256}"

if ! "$venv/bin/python" -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null; then
    echo "installing the pinned torch into $venv (about 4 GB, once)" >&2
    python3.11 -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-deps -r "$here/requirements-gloo.txt"
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
(cd "$root" && cargo bench -p podctl-collective --bench allreduce -- --ranks "$ranks" --mib "$mib" --json "$out/podctl.json")
echo
"$venv/bin/python" "$here/gloo.py" --ranks "$ranks" --mib "$mib" --podctl "$out/podctl.json"
