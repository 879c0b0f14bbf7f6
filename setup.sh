#!/usr/bin/env bash
# Create .venv and install energon-pack with its test and example extras.
# The pinned CPU torch wheel goes in first: installing megatron-energon into an
# environment without torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet "torch==2.13.0"
fi
.venv/bin/pip install --quiet -e ".[test,examples]"
