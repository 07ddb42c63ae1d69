# Sourced by scripts/*.sh: make .venv beside the repo and install port into it (once per pyproject change).
# The first run downloads MindSpore (~800 MB) and the CPU build of torch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PY" -m venv "$ROOT/.venv"
fi
# shellcheck disable=SC1091
source "$ROOT/.venv/bin/activate"
stamp="$ROOT/.venv/.port-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)-${PORT_EXTRAS:-test}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setting up $ROOT/.venv (first run downloads MindSpore and torch; a few minutes)" >&2
  python -m pip install -q --upgrade pip >/dev/null
  python -m pip install -q -e "$ROOT[${PORT_EXTRAS:-test}]"
  echo "$want" > "$stamp"
fi
