"""Whether this CPU has int8 dot-product instructions, which vLLM's CPU int8 kernels need to
run int8 layers faster than unquantized ones.

vLLM 0.32 runs int8 W8A8 layers on CPU through oneDNN, or through its AMX kernel on CPUs
with AMX. Without AVX512-VNNI, AVX-VNNI or AMX-INT8, oneDNN multiplies int8 in several
instructions per product: on a Zen 3 EPYC (AVX2 only) the int8 Qwen2.5-Coder 0.5B draft
took 1.7x the time per token of the same draft unquantized, where on an earlier machine it
took 0.56-0.59x (README, What a draft token costs).
"""

from __future__ import annotations

import functools
from pathlib import Path

from specextend_vllm.vllm_access import logger

INT8_DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


@functools.cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The feature flags of the first CPU in `cpuinfo` (Linux); None where unknown."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return None


def has_int8_dot_products(flags: frozenset[str] | None) -> bool | None:
    """None where the flags are unknown.

    >>> has_int8_dot_products(frozenset({"avx2", "avx512f", "avx512_vnni"}))
    True
    >>> has_int8_dot_products(frozenset({"avx2", "fma"})), has_int8_dot_products(None)
    (False, None)
    """
    if flags is None:
        return None
    return bool(flags & INT8_DOT_PRODUCT_FLAGS)


@functools.cache
def warn_int8_layers_without_dot_products(flags: frozenset[str] | None) -> bool:
    """Logs once per process where int8 layers run on a CPU without int8 dot products;
    returns whether it warned."""
    if has_int8_dot_products(flags) is not False:
        return False
    logger.warning(
        "SpecExtend: this model has int8 W8A8 layers, and this CPU has no int8 dot-product "
        "instructions (%s): vLLM's oneDNN kernel can run them slower than unquantized "
        "layers (on a Zen 3 EPYC the int8 Qwen2.5-Coder 0.5B draft cost 1.7x its fp32 "
        "weights per token). An unquantized draft is likely the cheaper one here.",
        ", ".join(sorted(INT8_DOT_PRODUCT_FLAGS)),
    )
    return True
