#!/usr/bin/env bash
# The plugin's own CUDA kernels on a CUDA machine, with the torch already installed there
# and no vLLM: builds specextend_vllm._C in place with its CUDA kernels for this GPU (a build
# without them fails the script), runs the kernel tests (the CUDA ops against their
# references on the GPU, the CPU kernels too), runs the CUDA op tests again under
# compute-sanitizer's memcheck and initcheck where it is installed, then times the CUDA scorer
# (benchmarks/results/scorer_cuda.json, or $SPECEXTEND_GPU_RESULTS/scorer_cuda.json).
# Arguments go to pytest. The compiler is the one CC/CXX name: one CUDA image's own
# (/opt/gcc) built a module whose every rejected input (a TORCH_CHECK) crashed the process,
# where the system's /usr/bin/g++ built one that raised; CC=/usr/bin/gcc CXX=/usr/bin/g++
# CUDAHOSTCXX=/usr/bin/g++ there.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
"$python" - <<'PY'
import torch
assert torch.cuda.is_available(), "gpu_check.sh needs a CUDA device"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
PY
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST="$("$python" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')"
  export TORCH_CUDA_ARCH_LIST
fi
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
  export PATH="$CUDA_HOME/bin:$PATH"
fi
echo "== building the kernels for sm_${TORCH_CUDA_ARCH_LIST} (nvcc: $(command -v nvcc || echo none))"
build_log="$(mktemp)"
"$python" setup.py build_ext --inplace >"$build_log" 2>&1 || { cat "$build_log"; exit 1; }
if grep -q "CUDA kernel skipped" "$build_log"; then
  grep "CUDA kernel skipped" "$build_log"
  exit 1
fi
"$python" - <<'PY'
import torch
import specextend_vllm.ops  # noqa: F401
assert torch._C._dispatch_has_kernel_for_dispatch_key("specextend::chunk_scores", "CUDA")
print("specextend::chunk_scores has its CUDA kernel")
PY
echo "== kernel tests"
"$python" -m pytest -q -p no:cacheprovider tests/kernels "$@"
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck initcheck; do
    echo "== the CUDA op tests under compute-sanitizer --tool $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
      "$python" -m pytest -q -p no:cacheprovider tests/kernels/test_chunk_scores_cuda.py -k test_cuda_op
  done
fi
echo "== CUDA scorer timings"
results="${SPECEXTEND_GPU_RESULTS:-benchmarks/results}"
"$python" -m benchmarks.kernels.bench_chunk_scores --device cuda --output "$results/scorer_cuda.json"
