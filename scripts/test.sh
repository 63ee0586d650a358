#!/usr/bin/env bash
# Sets up the environment, then runs the whole test suite (arguments go to pytest), listing
# the 30 slowest tests at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${SPECEXTEND_VENV:-.venv}/bin/python" -m pytest -q --durations=30 "$@"
