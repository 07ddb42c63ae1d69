# Sourced by scripts/*.sh: make .venv beside the repo and install port into it (once per pyproject change).
# The first run downloads MindSpore (~800 MB) and the CPU build of torch.
# Output: one line per phase. pip's own output goes to .venv/pip.log; when pip fails, the log's
# error lines (or its last lines, if it has none) are shown, so a real install error is never hidden.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"

# _venv_phase DESCRIPTION COMMAND...: run one set-up phase quietly (one line); on failure show why, stop.
_venv_phase() {
  local what="$1"; shift
  local log="$ROOT/.venv/pip.log" part="$ROOT/.venv/pip.part.log"
  local t0=$SECONDS
  printf 'set-up: %s ... ' "$what" >&2
  if "$@" >"$part" 2>&1; then
    cat "$part" >>"$log"
    echo "done ($((SECONDS - t0)) s)" >&2
    # warnings are not noise: pass pip's own WARNING lines through (progress and "Collecting" stay in the log)
    grep -E '^WARNING:' "$part" >&2 || true
    rm -f "$part"
    return 0
  fi
  cat "$part" >>"$log"; rm -f "$part"
  echo "failed" >&2
  echo "error: set-up could not $what; pip said (full log: $log):" >&2
  # pip writes its reasons on ERROR:/error: lines and in the indented block under them
  if grep -q -E '^(ERROR|error|  ×)' "$log"; then
    grep -E '^(ERROR|error|  ×|  [│╰]|note:|hint:|      )' "$log" | tail -n 40 >&2
  else
    tail -n 40 "$log" >&2
  fi
  return 1
}

if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "set-up: creating $ROOT/.venv" >&2
  "$PY" -m venv "$ROOT/.venv"
fi
# shellcheck disable=SC1091
source "$ROOT/.venv/bin/activate"
stamp="$ROOT/.venv/.port-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)-${PORT_EXTRAS:-test}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  : >"$ROOT/.venv/pip.log"
  # root in a container is the normal case here; pip's warning about it is not news to the user
  export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
  _venv_phase "upgrade pip" python -m pip install --upgrade pip
  _venv_phase "install port[${PORT_EXTRAS:-test}] (first run downloads MindSpore and torch; a few minutes)" \
    python -m pip install -e "$ROOT[${PORT_EXTRAS:-test}]"
  echo "$want" > "$stamp"
fi
