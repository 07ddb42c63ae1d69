#!/usr/bin/env bash
# Run the test suite: sets up .venv on first use, then pytest. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
python -m pytest -q -p no:cacheprovider "$@"
