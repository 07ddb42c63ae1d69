#!/usr/bin/env bash
# Run `port`: sets up .venv on first use. With no arguments it runs the main job on the embedded
# default model (stories260K): parity against HF transformers, then greedy generation.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
if [ $# -eq 0 ]; then
  set -- verify --hf stories260k --generate
fi
exec port "$@"
