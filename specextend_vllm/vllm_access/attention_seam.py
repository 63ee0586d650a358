"""Attention seams, installed per layer when the models are loaded (vLLM picks each
layer's backend implementation then).

`AttentionLayerSeam` is the one place where the plugin enters a layer's attention: it
replaces the layer's `impl.forward` once, and every use (the capture of the target's
final-layer query, the hybrid verification attention) registers on it rather than
wrapping the method again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from vllm.model_executor.layers.attention import Attention

from specextend_vllm.patches.base import PatchTargetMissing

QueryObserver = Callable[[torch.Tensor], None]


class AttentionPath(Protocol):
    """Computes a layer's attention for the batches it `handles`, in place of the backend."""

    def handles(self, attn_metadata: Any) -> bool: ...

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
        backend: Callable[[], Any],
    ) -> torch.Tensor:
        """`backend()` runs the backend's forward into `output`, for paths that
        compute some rows only."""
        ...


class AttentionLayerSeam:
    """Stands in for one layer's `impl.forward(layer, query, key, value, kv_cache,
    attn_metadata, output=..., ...)`: shows the post-RoPE query to the observers, then
    runs the alternative path for the batches it handles, the backend's forward otherwise."""

    def __init__(self, backend_forward: Callable[..., Any]):
        self.backend_forward = backend_forward
        self.query_observers: list[QueryObserver] = []
        self.alternative_path: AttentionPath | None = None

    def observe_query(self, observer: QueryObserver) -> None:
        self.query_observers.append(observer)

    def compute_with(self, path: AttentionPath | None) -> None:
        self.alternative_path = path

    def __call__(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        for observe in self.query_observers:
            observe(query)
        path = self.alternative_path
        if (
            path is not None
            and output is not None
            and attn_metadata is not None
            and kwargs.get("output_scale") is None
            and path.handles(attn_metadata)
        ):
            return path(
                query, key, value, kv_cache, attn_metadata, output,
                lambda: self.backend_forward(
                    layer, query, key, value, kv_cache, attn_metadata, output=output, **kwargs
                ),
            )
        return self.backend_forward(
            layer, query, key, value, kv_cache, attn_metadata, output=output, **kwargs
        )


def attention_layer_seam(layer: Attention) -> AttentionLayerSeam:
    """The layer's seam, installed on first use."""
    impl = getattr(layer, "impl", None)
    seam = getattr(impl, "forward", None)
    if isinstance(seam, AttentionLayerSeam):
        return seam
    if not callable(seam):
        raise PatchTargetMissing(
            f"specextend-vllm: attention layer {getattr(layer, 'layer_name', layer)!r} has no "
            "impl.forward to compute attention through."
        )
    seam = AttentionLayerSeam(seam)
    impl.forward = seam
    return seam


def limit_attention_window(layers: list[Attention], window: int) -> None:
    """Each layer attends to its last `window` tokens at most (FlashAttention keeps the
    window as a (left, right) pair, the CPU backend as a token count)."""
    for layer in layers:
        if isinstance(layer.impl.sliding_window, tuple):
            layer.impl.sliding_window = (window - 1, 0)
        else:
            layer.impl.sliding_window = window
