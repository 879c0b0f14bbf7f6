#!/usr/bin/env bash
# Set up .venv in two steps (README, Quickstart):
#   bash setup.sh          the runtime: the pinned CPU torch wheel, then energon-pack with its Hugging Face
#                          extra (the demo and examples/train_hf.py run on it); nothing test-only
#   bash setup.sh --test   the above, plus the test, docs and example extras and the test-only environments
#                          (Megatron-Bridge's wheel, the video reference, the compatibility environments)
# The pinned CPU torch wheel goes in first: installing megatron-energon into an environment without torch
# would pull a multi-GB CUDA build. On a machine that already has torch (a GPU node), skip this script:
# `pip install .` (or ".[s3]", ".[hf]") from the clone uses the torch that is there.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
TEST=0
case "${1:-}" in
  "") ;;
  --test) TEST=1 ;;
  *) echo "usage: bash setup.sh [--test]  (--test adds the test environments)" >&2; exit 2 ;;
esac
say() { echo "setup.sh: $*"; }  # one line per step: the whole set-up takes minutes
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)..."
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  say "installing torch 2.13.0 (the CPU wheel, first: see the top of this file)..."
  .venv/bin/pip install --quiet "torch==2.13.0"
fi
if [ "$TEST" = 0 ]; then
  say "installing energon-pack[hf] (editable) and its requirements..."
  .venv/bin/pip install --quiet -e ".[hf]"
  say "done: .venv/bin/energon-pack demo"
  exit 0
fi
say "installing energon-pack[hf,test,docs,examples] (editable) and its requirements..."
.venv/bin/pip install --quiet -e ".[hf,test,docs,examples]"
# Test-only: Megatron-Bridge's pure-Python wheel (no deps; it declares Python >= 3.12 but its
# modules run on 3.11), so tests/integrations/test_integration_bridge.py runs Bridge's own VLM-step batch and
# M-RoPE code on our packs through a CPU light import. Nothing in energon_pack imports it.
say "building test environments: Megatron-Bridge's wheel..."
.venv/bin/pip install --quiet --no-deps --ignore-requires-python "megatron-bridge==0.6.2"
# Test-only: the video reference (tests/video/test_video_parity.py): qwen-vl-utils with its decord reader and
# transformers' Qwen video processors need torchvision; its wheel here is built against CUDA torch, so it
# goes into .venv/video-reference/ (never on the main environment's path) and the parity tests import it
# in a subprocess. torchvision's release is the one paired with the installed torch (2.N -> 0.N+15).
TV=$(.venv/bin/python -c "import torch; print('0.%d.*' % (int(torch.__version__.split('.')[1]) + 15))")
REF_PINS="torchvision==$TV qwen-vl-utils==0.0.14 decord==0.6.0"
if [ "$(cat .venv/video-reference/.pins 2>/dev/null)" != "$REF_PINS" ]; then
  say "building test environments: the video reference (.venv/video-reference)..."
  rm -rf .venv/video-reference
  # shellcheck disable=SC2086
  .venv/bin/pip install --quiet --no-deps --target .venv/video-reference $REF_PINS
  echo "$REF_PINS" > .venv/video-reference/.pins
fi
# Test-only: the compatibility environments under .venv-compat/ (git-ignored), each the main venv's
# packages with a few releases pinned in front (--no-deps, so never a torch download): the oldest
# supported transformers, Megatron-Bridge's newest allowed and the GPU image's; the lowest
# megatron-energon, Pillow and numpy allowed. tests/project/test_compat_matrix.py runs each row's tests in
# its environment. Up-to-date environments are skipped (a stamp of the pins), so a re-run is instant.
say "building test environments: the compatibility environments (.venv-compat)..."
.venv/bin/python scripts/compat_envs.py setup
say "done: .venv/bin/python -m pytest -q -n 2 --dist loadfile"
