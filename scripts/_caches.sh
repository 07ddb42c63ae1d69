# Sourced by the test scripts: the caches a suite run's many `port train` runs share, each a fresh folder per
# suite run removed at its end, unless the caller set one (docs/rundir.md):
# - PORT_COMPILE_CACHE_SHARED (porting/train/run/step/shared_cache.py): runs of the same recipe in different run
#   directories load the graphs the first compiled;
# - PORT_TOKEN_CACHE (porting/train/data/token_cache.py): runs of the same data and tokenizer take the tokens
#   the first made, without loading transformers (about 3 CPU-s per launch, BENCHMARKS.md "Test suite").
_port_caches=()
if [ -z "${PORT_COMPILE_CACHE_SHARED:-}" ]; then
  PORT_COMPILE_CACHE_SHARED="$(mktemp -d "${TMPDIR:-/tmp}/port-compile-cache.XXXXXX")"
  export PORT_COMPILE_CACHE_SHARED
  _port_caches+=("$PORT_COMPILE_CACHE_SHARED")
fi
if [ -z "${PORT_TOKEN_CACHE:-}" ]; then
  PORT_TOKEN_CACHE="$(mktemp -d "${TMPDIR:-/tmp}/port-token-cache.XXXXXX")"
  export PORT_TOKEN_CACHE
  _port_caches+=("$PORT_TOKEN_CACHE")
fi
if [ "${#_port_caches[@]}" -gt 0 ]; then
  trap 'rm -rf "${_port_caches[@]}"' EXIT
fi
