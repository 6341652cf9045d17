#!/usr/bin/env bash
# Installs the Hugging Face reference into .venv-hf/ (pinned by scripts/requirements/hf-reference.txt;
# about 4 GB: torch's CPU path still loads the CUDA runtime libraries). Only the fixture generator
# (models/hf_reference/make_fixtures.py), the tests that compare against transformers where it is
# installed, and the loading benchmark use it; the project's .venv never gets torch. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  echo "setup-hf-reference: need Python 3.11; set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
venv=.venv-hf
stamp=$venv/.podctl-setup
want=$(sha256sum scripts/requirements/hf-reference.txt | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
[ -x $venv/bin/python ] || "$python" -m venv $venv
echo "setup-hf-reference: installing torch and transformers into $venv (first time: about 4 GB)"
$venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r scripts/requirements/hf-reference.txt
$venv/bin/python -c 'import torch, transformers; from transformers import Qwen3ForCausalLM'
echo "$want" > "$stamp"
