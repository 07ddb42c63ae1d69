# Sourced by the test scripts: one compile cache shared by the suite's runs (PORT_COMPILE_CACHE_SHARED,
# porting/train/run/shared_cache.py; docs/rundir.md), a fresh folder per suite run removed at its end, unless
# the caller set one. Runs of the same recipe in different run directories load the graphs the first compiled.
if [ -z "${PORT_COMPILE_CACHE_SHARED:-}" ]; then
  PORT_COMPILE_CACHE_SHARED="$(mktemp -d "${TMPDIR:-/tmp}/port-compile-cache.XXXXXX")"
  export PORT_COMPILE_CACHE_SHARED
  trap 'rm -rf "$PORT_COMPILE_CACHE_SHARED"' EXIT
fi
