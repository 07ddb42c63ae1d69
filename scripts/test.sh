#!/usr/bin/env bash
# Run the test suite: sets up .venv on first use, then pytest. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
# `port report`'s HTML is opened in headless Chromium by one test (skipped with a reason when absent)
command -v chromium >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && { apt-get update -q >/dev/null 2>&1 || true; } \
  && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } \
  || echo "note: chromium not installed; tests/diagnostics/test_report.py skips its browser check" >&2
# two xdist workers (PORT_TEST_WORKERS=0: one process); tests/conftest.py keeps msrun jobs on one of them
python -m pytest -q -rs -p no:cacheprovider -n "${PORT_TEST_WORKERS:-2}" --dist loadgroup "$@"   # -rs: skip reasons
