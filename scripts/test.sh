#!/usr/bin/env bash
# Run the test suite: sets up .venv on first use, then pytest. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
# `port report`'s HTML is opened in headless Chromium by one test (skipped with a reason when absent)
command -v chromium >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && { apt-get update -q >/dev/null 2>&1 || true; } \
  && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } \
  || echo "note: chromium not installed; tests/diagnostics/test_report.py skips its browser check" >&2
python -m pytest -q -rs -p no:cacheprovider "$@"   # -rs: every skip with its reason
