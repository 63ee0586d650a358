"""vLLM's attention pieces the verification path reuses: the LSE merge of two partial
attention outputs, FlashAttention with LSE on GPU, and what a layer's backend computes
beyond plain softmax attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.attention.ops.merge_attn_states import merge_attn_states

__all__ = [
    "flash_attn_varlen_func",
    "hybrid_cache_layout_blocker",
    "attends_on_cpu_backend",
    "merge_attn_states",
    "plain_attention_blockers",
]


def flash_attn_varlen_func() -> Callable[..., Any]:
    """vLLM's FlashAttention varlen call (GPU builds only)."""
    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func as function

    return function


def plain_attention_blockers(impl: Any) -> list[str]:
    """What the layer's attention does beyond softmax(q k^T * scale) v over its cache,
    which hybrid verification attention does not reproduce; empty when nothing."""
    sliding_window = getattr(impl, "sliding_window", None)
    blockers = {
        "sliding window": sliding_window not in (None, -1, (-1, -1)),
        "ALiBi": getattr(impl, "alibi_slopes", None) is not None,
        "logit soft cap": bool(getattr(impl, "logits_soft_cap", None)),
        "attention sinks": getattr(impl, "sinks", None) is not None,
        f"KV cache dtype {getattr(impl, 'kv_cache_dtype', 'auto')}": getattr(
            impl, "kv_cache_dtype", "auto"
        )
        != "auto",
    }
    return [name for name, present in blockers.items() if present]


def hybrid_cache_layout_blocker(layer: Any) -> str | None:
    """Why the verification kernels cannot read the layer's paged cache, or None: they
    read the CPU backend's 'vec' layout and FlashAttention's. Known once the layer's
    metadata builder exists (it sets the CPU layout), before any cache is allocated."""
    isa = getattr(layer, "isa", None)
    if isa is not None:
        return None if isa == "vec" else f"CPU KV cache layout '{isa}'"
    backend = layer.get_attn_backend().get_name()
    return None if backend == "FLASH_ATTN" else f"attention backend {backend}"


def attends_on_cpu_backend(layer: Any) -> bool:
    """Whether the layer attends on vLLM's CPU backend, whose metadata builder keeps no
    buffer sized by the batch (a pass may then hold more rows than requests)."""
    return layer.get_attn_backend().get_name() == "CPU_ATTN"
