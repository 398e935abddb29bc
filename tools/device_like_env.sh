#!/usr/bin/env bash
# The lease's code under the lent GPU's Python, on this CPU machine, before a lease spends
# device time on it.
#
# The device runs `tools/lease_run.sh` and call 0's benchmarks with its own `python3`, not
# with our .venv: Python 3.12 with torch 2.11, torchvision 0.26 and numpy 2.5 (as sessions
# saw it in 2026-11, /work/.library/device/KINDS.md), where CI here has Python 3.11 and torch
# 2.14.1. An API that one of them lacks fails only there, in a lease that comes rarely.
# This builds a virtual environment of those versions (once: torch's CUDA wheels from the
# package registry, ~3 GB, a few minutes) outside the checkout and runs there, with the
# checkout on PYTHONPATH as on the device (ccu is not installed there), the tests of
# everything a lease runs: lease_run.sh and lease.py, call 0's benchmarks, ACET's graphs and
# the training step's (their CUDA checks skip here), the time box, the mixtures' fit on the
# GPU (against the scikit-learn installed there). Not part of `ci/test.sh` (the download).
#
#     bash tools/device_like_env.sh              # build if missing, then the tests
#     DEVICE_LIKE_ENV=/tmp/x bash tools/device_like_env.sh -k plan   # pytest arguments pass on
#
# Exit codes: pytest's; 3 when no Python 3.12 is found (install one, or set PYTHON312).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="${DEVICE_LIKE_ENV:-/tmp/ccu-device-like}"
# the device's versions (KINDS.md's pip list); change them here when the device's image does
PINS=(torch==2.11.0 torchvision==0.26.0 numpy==2.5.2)
REST=(typing_extensions sympy networkx jinja2 fsspec filelock scipy pandas scikit-learn
      matplotlib seaborn tqdm hypothesis pytest pytest-xdist pillow pyyaml)

if [ ! -x "$ENV_DIR/bin/python" ] || [ ! -f "$ENV_DIR/.pins" ] \
    || [ "$(cat "$ENV_DIR/.pins")" != "${PINS[*]}" ]; then
  py="${PYTHON312:-$(command -v python3.12 || true)}"
  if [ -z "$py" ] || ! "$py" --version >/dev/null 2>&1; then  # pyenv's shim without 3.12 on
    py=$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)
  fi
  if [ -z "$py" ]; then
    echo "[device-like] no Python 3.12 here: install one or set PYTHON312=/path/to/python3.12" >&2
    exit 3
  fi
  echo "[device-like] building $ENV_DIR with $("$py" --version) and ${PINS[*]}"
  rm -rf "$ENV_DIR"
  "$py" -m venv "$ENV_DIR"
  "$ENV_DIR/bin/python" -m pip install -q --upgrade pip
  "$ENV_DIR/bin/python" -m pip install -q "${PINS[@]}" "${REST[@]}"
  echo "${PINS[*]}" > "$ENV_DIR/.pins"
fi
"$ENV_DIR/bin/python" -c 'import sys, torch, numpy; print("[device-like] python",
  sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__)'
cd "$ROOT"
# as on the device: its python3 first on PATH (lease_run.sh calls `python3`), the checkout
# importable, one torch thread a process (two workers on 2 cores)
exec env -u PYTHONPATH PATH="$ENV_DIR/bin:$PATH" PYTHONPATH="$ROOT" OMP_NUM_THREADS=1 \
  MPLBACKEND=Agg PYTHONHASHSEED=0 python -m pytest -q -n 2 -p no:cacheprovider \
  tests/run/test_lease.py tests/run/test_bench_epochs.py tests/methods/test_cuda_graphs.py \
  tests/methods/test_graphed_step.py tests/run/test_time_box.py tests/core/test_em_device.py "$@"
