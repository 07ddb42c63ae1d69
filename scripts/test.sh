#!/usr/bin/env bash
# Run the test suite: sets up .venv on first use, then pytest. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
# `port report`'s HTML is opened in headless Chromium by one test (skipped with a reason when absent)
command -v chromium >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && { apt-get update -q >/dev/null 2>&1 || true; } \
  && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } \
  || echo "note: chromium not installed; tests/report/test_report.py skips its browser check" >&2
# Everything by default (CI): `-m "slow or not slow"` replaces pyproject's addopts (`pytest` alone is the fast tier,
# `-m "not slow"`); a `-m` among the extra arguments replaces it in turn (README, BENCHMARKS.md).
# Two xdist workers (PORT_TEST_WORKERS=0: one process); tests/conftest.py keeps msrun jobs and machine-wide
# checks on one of them, each other file on one worker, and puts that serial group first
# (--no-loadscope-reorder: xdist keeps that order instead of sorting groups by their number of tests).
python -m pytest -q -rs -p no:cacheprovider -n "${PORT_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder \
  -m "slow or not slow" "$@"   # -rs: skip reasons
