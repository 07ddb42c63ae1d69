#!/usr/bin/env bash
# The Python 3.12 tier: the tests marked `compat` and `port verify --hf stories260k` on Python 3.12 with MindSpore
# 2.10.0 (its cp312 wheel) and the lowest torch and transformers in range (scripts/constraints-py312.txt), in
# .venv-py312 (made once, like .venv-compat). Python 3.12 is `python3.12` where it runs, else pyenv's newest 3.12;
# a machine without one skips the tier with a one-line reason. PYTHON=/path/to/python3.12 picks one. Extra
# arguments go to pytest; `--set-up-only` makes the venv and stops.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
is312() { "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; }
if [ -n "${PYTHON:-}" ]; then   # named by the caller: it must be a 3.12
  is312 "$PYTHON" || { echo "error: PYTHON=$PYTHON is not a working Python 3.12; name one or unset PYTHON" >&2; exit 1; }
elif python3.12 -c '' >/dev/null 2>&1; then
  PYTHON="$(python3.12 -c 'import sys; print(sys.executable)')"
else   # pyenv's shim runs python3.12 only where 3.12 is the selected version: take pyenv's newest 3.12 itself
  root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  for cand in $(ls -d "$root"/versions/3.12.* 2>/dev/null | sort -t. -k3 -n -r); do
    if is312 "$cand/bin/python3.12"; then PYTHON="$cand/bin/python3.12"; break; fi
  done
fi
if [ -z "${PYTHON:-}" ]; then
  echo "compat312: skipped: no Python 3.12 on this machine (neither python3.12 nor a pyenv 3.12); PYTHON=... names one"
  exit 0
fi
export PYTHON
export PORT_VENV="$(cd "$here/.." && pwd)/.venv-py312"
export PORT_FRAMEWORK="$here/constraints-py312.txt"
source "$here/_venv.sh"
if [ "${1:-}" = "--set-up-only" ]; then exit 0; fi   # .ci/run makes the venv ahead, while the full suite runs
source "$here/_caches.sh"
# MindSpore's default PyNative pipeline (asynchronous), as a user's `port` runs it; the full suite runs it
# synchronously (tests/conftest.py says why)
export MS_DEV_LAUNCH_BLOCKING="${MS_DEV_LAUNCH_BLOCKING:-0}"
cd "$ROOT"
python -c "import sys, mindspore, torch, transformers; print(f'py312 tier: Python {sys.version.split()[0]}, MindSpore \
{mindspore.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
port verify --hf stories260k
# This tier runs the suite's MindSpore (2.10.0): the compat tests about a MindSpore version, not Python's or torch's,
# are the 2.7.2 tier's (scripts/compat.sh) and the full suite's: the one-gradient PyNative buckets (a 2.7.2 bug,
# tests/train/test_comm_fusion.py) and TP 2 in graph mode; its msrun test on Python 3.12 is tests/train/test_msrun.py's
python -m pytest -q -rs -p no:cacheprovider -n "${PORT_TEST_WORKERS:-4}" --dist loadgroup -m compat \
  --deselect tests/train/test_comm_fusion.py --deselect tests/train/test_tensor_parallel.py "$@"
