"""Whether this CPU has int8 dot-product instructions, which vLLM's CPU int8 kernels need to
run int8 layers faster than unquantized ones; and the draft's int8 layers on the plugin's
small-batch kernel where it is faster than vLLM's.

vLLM 0.32 runs int8 W8A8 layers on CPU through oneDNN, or through its AMX kernel on CPUs
with AMX. Without AVX512-VNNI, AVX-VNNI or AMX-INT8, oneDNN multiplies int8 in several
instructions per product: on a Zen 3 EPYC (AVX2 only) the int8 Qwen2.5-Coder 0.5B draft
took 1.7x the time per token of the same draft unquantized, where on an earlier machine it
took 0.56-0.59x (README, What a draft token costs).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch.library import Library
from vllm import _custom_ops as vllm_ops
from vllm.utils.torch_utils import direct_register_custom_op

from specextend_vllm.ops import int8_linear
from specextend_vllm.vllm_access import logger

INT8_DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
# What `ops.int8_linear`'s vectorized path needs (the op runs anywhere, slower without).
SMALL_BATCH_KERNEL_FLAGS = frozenset({"avx512bw", "avx512_vnni"})
# Up to this many rows (tokens) `ops.int8_linear` is faster than vLLM's oneDNN GEMM, beyond
# it slower: over the 24 layers of the 0.5B draft (2 threads, an AMD EPYC with AVX512-VNNI,
# `bash scripts/bench.sh int8_linear_cpu_amd`), 6.80 against 7.90 ms for 1 row, 8.67
# against 9.08 for 4, 9.46 against 9.77 for 5, 10.22 against 9.97 for 6 (a chain's first
# draft pass at batch 1: k + 1 tokens and vLLM's extra slot), 20.96 against 15.06 for 16.
SMALL_BATCH_MAX_ROWS = 5


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
        "weights per token), and less exactly (there, products up to 9 off the exact int8 "
        "result). An unquantized draft is likely the cheaper and better one here.",
        ", ".join(sorted(INT8_DOT_PRODUCT_FLAGS)),
    )
    return True


def has_small_batch_kernel(flags: frozenset[str] | None) -> bool:
    """Whether `ops.int8_linear` runs vectorized on this CPU.

    >>> has_small_batch_kernel(frozenset({"avx512f", "avx512bw", "avx512_vnni"}))
    True
    >>> has_small_batch_kernel(frozenset({"avx2", "avx_vnni"})), has_small_batch_kernel(None)
    (False, False)
    """
    return flags is not None and SMALL_BATCH_KERNEL_FLAGS <= flags


def _int8_linear_small_batches(
    input: torch.Tensor,  # [M, K] float32
    weight: torch.Tensor,  # [N, K] int8
    weight_scales: torch.Tensor,  # [N] float32
    bias: torch.Tensor | None,  # [N] float32
    onednn_handler: torch.Tensor,  # vLLM's prepacked oneDNN GEMM of the same weights
) -> torch.Tensor:  # [M, N] float32
    if input.shape[0] <= SMALL_BATCH_MAX_ROWS:
        return int8_linear(input, weight, weight_scales, bias)
    quantized, token_scales, _ = vllm_ops.onednn_scaled_int8_quant(input.contiguous(), None, None, True)
    output = input.new_empty(input.shape[0], weight.shape[0])
    torch.ops._C.onednn_scaled_mm(output, quantized, token_scales, None, None, bias, onednn_handler)
    return output


def _int8_linear_small_batches_fake(
    input: torch.Tensor,
    weight: torch.Tensor,
    weight_scales: torch.Tensor,
    bias: torch.Tensor | None,
    onednn_handler: torch.Tensor,
) -> torch.Tensor:
    return input.new_empty(input.shape[0], weight.shape[0])


# One op, opaque to torch.compile: the choice depends on the number of tokens, which a
# compiled graph sees only as a symbol.
_LIBRARY = Library("specextend", "FRAGMENT")
direct_register_custom_op(
    "int8_linear_small_batches",
    _int8_linear_small_batches,
    fake_impl=_int8_linear_small_batches_fake,
    target_lib=_LIBRARY,
    dispatch_key="CPU",
)


class SmallBatchInt8Linear:
    """An int8 W8A8 layer (weights per output row, activations per token, symmetric) on
    `ops.int8_linear` for up to `SMALL_BATCH_MAX_ROWS` tokens and on vLLM's oneDNN GEMM of
    the same weights for more. Keeps the int8 weights [N, K] beside oneDNN's prepacked copy."""

    def __init__(self, weight: torch.Tensor, weight_scales: torch.Tensor, onednn_handler: torch.Tensor):
        self.weight = weight.contiguous()
        self.weight_scales = weight_scales.reshape(-1).float().contiguous()
        self.onednn_handler = onednn_handler

    def __call__(self, input: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = input.reshape(-1, input.shape[-1])
        # Eager, the function itself: the registered op's dispatch costs more than the kernel
        # of a small layer (10 against 3 microseconds here).
        linear = (
            torch.ops.specextend.int8_linear_small_batches
            if torch.compiler.is_compiling()
            else _int8_linear_small_batches
        )
        output = linear(rows, self.weight, self.weight_scales, bias, self.onednn_handler)
        return output.reshape(*input.shape[:-1], self.weight.shape[0])

    def apply_to_layer(self, layer: torch.nn.Module, input: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """As a vLLM int8 kernel's `linear_method`, which also receives the layer."""
        return self(input, bias)
