#!/usr/bin/env bash
# Sets up the environment, builds the offline models and texts (cached outside the repo),
# then runs the long-input suite: speed against length (with the Qwen draft, then with the
# tiny SmolLM2 draft on prompts up to 16K), needle retrieval (with the KV block
# and chunk of vLLM's CPU default, 128 tokens, and of the reference, 32), batch throughput and
# draft pass time. Results and plots go to benchmarks/results/. Extra arguments go to every
# section (for example --target DIR --draft DIR, or -k 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
python="${SPECEXTEND_VENV:-.venv}/bin/python"
"$python" -m benchmarks.assets
"$python" -m benchmarks.long_inputs speed "$@"
"$python" -m benchmarks.long_inputs tiny_draft --texts-per-length 1 "$@"
"$python" -m benchmarks.long_inputs needle "$@"
"$python" -m benchmarks.long_inputs needle --block-size 32 --specextend-keys '{"chunk_size": 32}' \
  --output long_inputs_needle_chunk32 "$@"
"$python" -m benchmarks.long_inputs batch "$@"
"$python" -m benchmarks.long_inputs draft_step "$@"
