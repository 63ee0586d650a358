"""Attention of a step's query tokens to their request's cached prefix, with no mask, and
its log-sum-exp: the plugin's paged kernel on CPU, FlashAttention on GPU. The hybrid
verification attention and the draft's tree passes both call it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from specextend_vllm import ops
from specextend_vllm.algorithm import kv_cache_layout
from specextend_vllm.vllm_access.attention import flash_attn_varlen_func


class VerificationBatch(Protocol):
    """The fields of vLLM's attention metadata the verification path reads (the CPU
    and FlashAttention backends both have them)."""

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int  # on the host, at least every request's prefix length
    query_start_loc: torch.Tensor  # [R + 1] int32
    seq_lens: torch.Tensor  # [R] int32, prefix and new tokens
    block_table: torch.Tensor  # [R, W] int32


PrefixAttention = Callable[
    [torch.Tensor, torch.Tensor, VerificationBatch, torch.Tensor, float],
    tuple[torch.Tensor, torch.Tensor],
]


def cpu_prefix_attention(
    query: torch.Tensor,
    raw_kv_cache: torch.Tensor,
    batch: VerificationBatch,
    prefix_lens: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plugin's paged prefix-attention kernel: (output [T, Hq, D], lse [Hq, T])."""
    num_reqs = prefix_lens.shape[0]
    return ops.paged_prefix_attention(
        query,
        kv_cache_layout.key_cache_view(raw_kv_cache),
        kv_cache_layout.value_cache_view(raw_kv_cache),
        batch.block_table[:num_reqs],
        prefix_lens,
        batch.query_start_loc[: num_reqs + 1],
        scale,
    )


def flash_attn_prefix_attention(
    query: torch.Tensor,
    raw_kv_cache: torch.Tensor,
    batch: VerificationBatch,
    prefix_lens: torch.Tensor,
    scale: float,
    varlen_attention: Callable[..., Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention over the paged prefix (GPU layout), as vLLM's context-parallel path
    calls it: no mask, `seqused_k` = prefix lengths, LSE returned as [Hq, T]. Its longest
    key sequence is the batch's host-side bound, so the call reads no tensor on the host
    (a CUDA graph can capture it)."""
    varlen_attention = varlen_attention or flash_attn_varlen_func()
    num_reqs = prefix_lens.shape[0]
    output, lse = varlen_attention(
        q=query,
        k=kv_cache_layout.key_cache_view(raw_kv_cache),
        v=kv_cache_layout.value_cache_view(raw_kv_cache),
        cu_seqlens_q=batch.query_start_loc[: num_reqs + 1],
        max_seqlen_q=batch.max_query_len,
        seqused_k=prefix_lens,
        max_seqlen_k=batch.max_seq_len,
        softmax_scale=scale,
        causal=False,
        block_table=batch.block_table[:num_reqs],
        return_softmax_lse=True,
    )
    return output, lse


def prefix_attention_for(device: torch.device) -> PrefixAttention:
    return flash_attn_prefix_attention if device.type == "cuda" else cpu_prefix_attention
