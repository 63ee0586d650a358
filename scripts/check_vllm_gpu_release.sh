#!/usr/bin/env bash
# The plugin against the GPU release of vLLM (default 0.33.0), checked without a GPU:
# installs that vLLM and its CUDA torch into a separate environment ($SPECEXTEND_GPU_VENV,
# default .venv-vllm-gpu; the CPU environment .venv is untouched), builds the plugin from a
# copy of the working tree with its CUDA kernels (nvcc, for $TORCH_CUDA_ARCH_LIST, default
# sm_80 and sm_90; a build failure fails the script), then runs every test that needs no
# engine and no device: every patch target and overridden method found, config validation
# and its errors, the pure and kernel tests, the GPU cache layout on CPU tensors, the
# docstring examples. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${SPECEXTEND_GPU_VLLM:-0.33.0}"
venv="${SPECEXTEND_GPU_VENV:-.venv-vllm-gpu}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
# torch finds CUDA through CUDA_HOME, else from the nvcc on PATH, which here is a wrapper
# script in /usr/local/bin that runs /usr/local/cuda-13.0/bin/nvcc: CUDA's usual home is used.
if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda/include ]; then
  export CUDA_HOME=/usr/local/cuda
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)
if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null)" != "$version" ]; then
  echo "== installing vllm $version and its requirements"
  "${pip[@]}" --no-deps "vllm==$version"
  "${pip[@]}" packaging
  # vLLM's own requirements, resolved by pip, except that a pin the package index cannot
  # meet (certifi>=2026.10.19 for 0.33.0: the index's newest is 2026.10.18) is relaxed to
  # what the index has; certifi is a CA bundle, nothing the checks below use.
  "$venv/bin/python" - "$venv/requirements.txt" <<'PY'
import importlib.metadata
import sys

from packaging.requirements import Requirement

RELAXED = {"certifi"}
lines = []
for text in importlib.metadata.requires("vllm") or []:
    requirement = Requirement(text)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    if requirement.name in RELAXED:
        requirement.specifier = type(requirement.specifier)("")
        requirement.marker = None
    lines.append(str(requirement))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
  "${pip[@]}" -r "$venv/requirements.txt" pytest scipy gguf setuptools wheel ninja
fi
"$venv/bin/python" - <<'PY'
import torch
import vllm

print(f"== vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda})")
PY
# A copy of the working tree, so that the kernels built here never replace the CPU build's.
source="$venv/src"
rm -rf "$source" && mkdir -p "$source"
git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$source"
venv="$(cd "$venv" && pwd)"
cd "$source"
echo "== building specextend-vllm with its CUDA kernels for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
"$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps -e .
"$venv/bin/python" - <<'PY'
import os
import pathlib
import subprocess

import torch  # noqa: F401  (loads the libraries the extension links to)

import specextend_vllm._C as kernels

library = pathlib.Path(kernels.__file__)
import triton

# The toolkit's cuobjdump, else the one Triton (a vLLM requirement) ships.
cuobjdump = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")
if not cuobjdump.exists():
    cuobjdump = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
listing = subprocess.run([str(cuobjdump), "--list-elf", str(library)], capture_output=True, text=True)
architectures = sorted({part for part in listing.stdout.split(".") if part.startswith("sm_")})
print(f"== {library.name}: CUDA kernels for {', '.join(architectures) or 'none'}")
if not architectures:
    raise SystemExit("the extension holds no CUDA kernels")
PY
echo "== checks that need no GPU"
# Without a GPU vLLM cannot infer its device; the CPU platform lets it build and validate
# engine configs (no kernel runs). Tests that need vLLM's CPU build's own ops skip.
VLLM_TARGET_DEVICE=cpu exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not engine and not serving and not real_models" \
  tests/patches tests/unit tests/kernels specextend_vllm "$@"
