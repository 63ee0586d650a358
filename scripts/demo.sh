#!/usr/bin/env bash
# Sets up the environment, builds the offline models and texts (cached outside the repo,
# minutes the first time), then runs the demo (arguments go to benchmarks/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
"${SPECEXTEND_VENV:-.venv}/bin/python" -m benchmarks.assets
exec "${SPECEXTEND_VENV:-.venv}/bin/python" -m benchmarks.demo "$@"
