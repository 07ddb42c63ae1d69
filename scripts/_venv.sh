# Sourced by scripts/*.sh: make .venv beside the repo and install port into it (once per pyproject change).
# The first run downloads MindSpore (~800 MB) and the CPU build of torch.
# Output: one line per phase, plus pip's own WARNING lines. pip's full output goes to .venv/pip.log;
# when pip fails, the end of it (the failing step's error, pip's ERROR line) is shown and set-up stops.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"

# _venv_phase WHAT NOTE COMMAND...: run one set-up phase quietly (one line); on failure show why, stop.
_venv_phase() {
  local what="$1" note="$2"; shift 2
  local log="$ROOT/.venv/pip.log" part="$ROOT/.venv/pip.part.log"
  local t0=$SECONDS
  printf 'set-up: %s%s ... ' "$what" "${note:+ ($note)}" >&2
  if "$@" >"$part" 2>&1; then
    cat "$part" >>"$log"
    echo "done ($((SECONDS - t0)) s)" >&2
    # Warnings are not noise: pip's WARNING lines pass through (progress and "Collecting" stay in the log),
    # except one per package about index folders that the machine's pip configuration names but lacks,
    # which are counted on one line instead.
    local missing
    missing=$(grep -c -E "^WARNING: Location '.*' is ignored: it is neither a file nor a directory" "$part" || true)
    grep -E '^WARNING:' "$part" | grep -v -E "^WARNING: Location '.*' is ignored: it is neither" >&2 || true
    if [ "${missing:-0}" -gt 0 ]; then
      echo "note: pip skipped $missing index location(s) that this machine's pip configuration names but lacks" >&2
    fi
    rm -f "$part"
    return 0
  fi
  cat "$part" >>"$log"; rm -f "$part"
  echo "failed" >&2
  echo "error: set-up could not $what; the end of pip's output (all of it: $log):" >&2
  # pip ends with its reason (ERROR: ...) after the failing step's own output (a build backend's error)
  grep -v -E "^WARNING: Location '.*' is ignored: it is neither" "$log" | tail -n 25 >&2
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
  _venv_phase "upgrade pip" "" python -m pip install --upgrade pip
  _venv_phase "install port[${PORT_EXTRAS:-test}]" "the first time this downloads MindSpore and torch: minutes" \
    python -m pip install -e "$ROOT[${PORT_EXTRAS:-test}]"
  echo "$want" > "$stamp"
fi
