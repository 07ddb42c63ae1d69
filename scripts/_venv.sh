# Sourced by scripts/*.sh: make .venv beside the repo and install port into it (once per pyproject change).
# The first run downloads MindSpore (~800 MB) and the CPU build of torch; scripts/constraints.txt picks the
# versions (MindSpore 2.10.0, torch 2.13.0) inside pyproject.toml's ranges.
# PORT_VENV=DIR PORT_FRAMEWORK=FILE (scripts/compat.sh): a venv that first gets the framework a cluster already
# has (FILE: name==version lines), then port without constraints, then a check that pip kept that framework.
# Output: one line per phase, plus pip's own WARNING lines. pip's full output goes to .venv/pip.log;
# when pip fails, the end of it (the failing step's error, pip's ERROR line) is shown and set-up stops.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
VENV="${PORT_VENV:-$ROOT/.venv}"

# _venv_phase WHAT NOTE COMMAND...: run one set-up phase quietly (one line); on failure show why, stop.
_venv_phase() {
  local what="$1" note="$2"; shift 2
  local log="$VENV/pip.log" part="$VENV/pip.part.log"
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

if [ ! -x "$VENV/bin/python" ]; then
  echo "set-up: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
stamp="$VENV/.port-installed"
pins="${PORT_FRAMEWORK:-$ROOT/scripts/constraints.txt}"
want="$(cat "$ROOT/pyproject.toml" "$pins" | sha256sum | cut -c1-16)-${PORT_EXTRAS:-test}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  : >"$VENV/pip.log"
  # root in a container is the normal case here; pip's warning about it is not news to the user
  export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
  _venv_phase "upgrade pip" "" python -m pip install --upgrade pip
  if [ -n "${PORT_FRAMEWORK:-}" ]; then
    # --no-compile: no .pyc for the ~4,000 .py files of torch and transformers (3,944 with torch 2.4.0 and transformers 4.56.0) at install time (Python writes them, unless PYTHONDONTWRITEBYTECODE is set,
    # for the modules a test imports); it only shortens the set-up of these CI tiers.
    _venv_phase "install the framework a cluster already has" "$(grep -v '^#' "$pins" | xargs)" \
      python -m pip install --no-compile -r "$pins" "numpy<2"
    _venv_phase "install port[${PORT_EXTRAS:-test}] into it, without constraints" "" \
      python -m pip install --no-compile -e "$ROOT[${PORT_EXTRAS:-test}]"
    _venv_phase "check that pip kept that framework" "" python - "$pins" <<'PYEOF'
import re, sys
from importlib.metadata import version
for line in open(sys.argv[1], encoding="utf-8"):
    m = re.match(r"\s*([\w.-]+)==([\w.+-]+)", line)
    if m and version(m[1]).split("+")[0] != m[2].split("+")[0]:
        sys.exit(f"error: pip install -e . replaced {m[1]} {m[2]} with {version(m[1])}")
PYEOF
  else
    # pip compiles every installed module one file after another (about 39 of a fresh clone's 66 s here);
    # compileall on every core does the same in about 19 s. Files this Python cannot parse (torch's Python 3.12
    # test helpers) are skipped, as pip skips them.
    _venv_phase "install port[${PORT_EXTRAS:-test}]" "the first time this downloads MindSpore and torch: minutes" \
      python -m pip install --no-compile -c "$pins" -e "$ROOT[${PORT_EXTRAS:-test}]"
    _venv_phase "compile the installed modules" "all cores" python - <<'PYEOF'
import compileall, sysconfig
compileall.compile_dir(sysconfig.get_paths()["purelib"], quiet=2, workers=0)
PYEOF
  fi
  echo "$want" > "$stamp"
fi
