#!/usr/bin/env bash
# Sets up the environment, then runs the whole test suite (arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${SPECEXTEND_VENV:-.venv}/bin/python" -m pytest -q "$@"
