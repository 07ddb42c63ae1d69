#!/usr/bin/env bash
# The compatibility tier: the tests marked `compat` on the oldest supported MindSpore (2.7.2, with the CANN 8.5.0
# pairing on Ascend), in .venv-compat (made once, like .venv: the framework first, then port, then a check that
# pip kept the framework). Extra arguments go to pytest; `--set-up-only` makes the venv and stops.
set -euo pipefail
export PORT_VENV="$(cd "$(dirname "$0")/.." && pwd)/.venv-compat"
export PORT_FRAMEWORK="$(cd "$(dirname "$0")" && pwd)/constraints-compat.txt"
source "$(dirname "$0")/_venv.sh"
if [ "${1:-}" = "--set-up-only" ]; then exit 0; fi   # .ci/run makes the venv ahead, while the full suite runs
source "$(dirname "$0")/_caches.sh"
# MindSpore's default PyNative pipeline (asynchronous), as a user's `port` runs it; the full suite runs it
# synchronously (tests/conftest.py says why)
export MS_DEV_LAUNCH_BLOCKING="${MS_DEV_LAUNCH_BLOCKING:-0}"
cd "$ROOT"
python -c "import mindspore, torch; print(f'compat tier: MindSpore {mindspore.__version__}, torch {torch.__version__}')"
# msrun on 2.7.2: TP 2 in graph mode (tests/train/test_tensor_parallel.py) and DP 2's one-gradient buckets in PyNative
# (tests/train/test_comm_fusion.py); DP 2 against accumulation (tests/train/test_msrun.py, 22-26 CPU-s) is the Python
# 3.12 tier's msrun test and the full suite's
python -m pytest -q -rs -p no:cacheprovider -n "${PORT_TEST_WORKERS:-4}" --dist loadgroup -m compat \
  --deselect tests/train/test_msrun.py "$@"
