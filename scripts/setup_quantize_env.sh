#!/usr/bin/env bash
# Creates the quantization environment (default .venv-quantize, or $SPECEXTEND_QUANTIZE_VENV):
# llmcompressor with torch 2.13.0 (CPU), apart from vLLM's, whose transformers and
# compressed-tensors versions llmcompressor does not accept. Prints the environment's python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SPECEXTEND_QUANTIZE_VENV:-.venv-quantize}"
if ! "$venv/bin/python" -c "import llmcompressor" >/dev/null 2>&1; then
  echo "== installing llmcompressor 0.14.0.1 (torch 2.13.0 CPU) into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet torch==2.13.0 llmcompressor==0.14.0.1 >&2
fi
echo "$(cd "$venv" && pwd)/bin/python"
