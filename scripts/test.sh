#!/usr/bin/env bash
# Run the test suite: sets up .venv on first use, then pytest. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
source "$(dirname "$0")/_caches.sh"
cd "$ROOT"
# port's own modules compiled once: where PYTHONDONTWRITEBYTECODE is set (it is on this project's machines) Python
# never caches them, and each of the suite's `port`, msrun and worker processes compiled them again (0.1-0.15 s
# each; .gitignore keeps __pycache__ out of git)
python -m compileall -q -j 0 porting model_zoo converters >/dev/null || true
# `port report`'s HTML is opened in headless Chromium by one test (skipped with a reason when absent)
command -v chromium >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && { apt-get update -q >/dev/null 2>&1 || true; } \
  && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } \
  || echo "note: chromium not installed; tests/report/test_report.py skips its browser check" >&2
# Everything by default (CI): `-m "slow or not slow"` replaces pyproject's addopts (`pytest` alone is the fast tier,
# `-m "not slow"`); a `-m` among the extra arguments replaces it in turn (README, BENCHMARKS.md).
# Four xdist workers on 2 cores (PORT_TEST_WORKERS=N sets them, 0: one process): the msrun tests wait on their
# workers' start-up and on the scheduler, so two left the cores about 45% idle (BENCHMARKS.md, "Test suite");
# tests/conftest.py keeps the machine-wide checks on one worker and each file on one worker, starts the longest
# files first (one that keeps a core busy beside one that mostly waits), then the other files that start msrun
# jobs, and builds the read-only session runs once for all workers (built_once)
# (--no-loadscope-reorder: xdist keeps that order instead of sorting groups by their number of tests).
# --durations=30: the 30 slowest calls and set-ups, so every CI log says where the suite's time went
python -m pytest -q -rs -p no:cacheprovider -n "${PORT_TEST_WORKERS:-4}" --dist loadgroup --no-loadscope-reorder \
  --durations=30 -m "slow or not slow" "$@"   # -rs: skip reasons
