#!/usr/bin/env bash
# Sets up the environment, builds the offline models and texts (cached outside the repo,
# minutes the first time), then runs the demo (arguments go to benchmarks/demo.py): its
# progress and result table on the terminal, vLLM's logs in $SPECEXTEND_DEMO_LOG
# (default /tmp/specextend-demo.log).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
"${SPECEXTEND_VENV:-.venv}/bin/python" -m benchmarks.assets
source scripts/cpu_allocator.sh
log="${SPECEXTEND_DEMO_LOG:-/tmp/specextend-demo.log}"
echo "== the demo: vLLM's logs go to $log"
if ! VLLM_LOGGING_STREAM=ext://sys.stderr "${SPECEXTEND_VENV:-.venv}/bin/python" -m benchmarks.demo "$@" 2>"$log"; then
  tail -n 40 "$log"
  exit 1
fi
