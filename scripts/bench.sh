#!/usr/bin/env bash
# Sets up the environment, builds the offline models and texts (cached outside the repo),
# then runs the long-input suite: speed against length (with the Qwen draft, then with the
# tiny SmolLM2 draft on prompts up to 16K), needle retrieval (with 128-token chunks, and
# with the default 32-token chunks), batch throughput and draft pass time; then retrieval
# accuracy across genres, the working-copy cost and the serving benchmark. Results and
# plots go to benchmarks/results/. Extra arguments go to every long-input section (for
# example --target DIR --draft DIR, or -k 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
python="${SPECEXTEND_VENV:-.venv}/bin/python"
"$python" -m benchmarks.assets
"$python" -m benchmarks.long_inputs speed "$@"
"$python" -m benchmarks.long_inputs tiny_draft --texts-per-length 1 "$@"
"$python" -m benchmarks.long_inputs needle --specextend-keys '{"chunk_size": 128}' "$@"
"$python" -m benchmarks.long_inputs needle --output long_inputs_needle_chunk32 "$@"
"$python" -m benchmarks.long_inputs batch "$@"
"$python" -m benchmarks.long_inputs draft_step "$@"
VLLM_CPU_KVCACHE_SPACE=2 "$python" -m benchmarks.retrieval_accuracy --lengths 4096
VLLM_CPU_KVCACHE_SPACE=2 "$python" -m benchmarks.retrieval_accuracy --append --lengths 8192 \
  --texts-per-genre 1 --settings full streaming cmr_chunk32 cmr_chunk128
"$python" -m benchmarks.kernels.bench_working_copies
"$python" -m benchmarks.serving
