"""Paged KV caches in both of the layouts the method reads (vLLM's CPU "vec" layout and
FlashAttention's), filled from dense per-request keys: shared by the kernel tests and the
layout tests, so that GPU-layout indexing is proven on CPU tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specextend_vllm.algorithm.kv_cache_layout import key_cache_view

HEAD_DIM = 64
LAYOUTS = ("cpu_vec", "flash_attn")
HEAD_COUNTS = [(12, 2), (4, 4)]  # (query heads, kv heads)


@dataclass
class PagedBatch:
    query: torch.Tensor  # [B, Hq, D]
    dense_keys: list[torch.Tensor]  # per request [L_b, Hkv, D], float32
    raw_cache: torch.Tensor  # in the layout's own shape
    key_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D] view of raw_cache
    block_table: torch.Tensor  # [B, W] int32
    context_lens: torch.Tensor  # [B] int32
    scale: float


def scatter_into_raw_cache(
    dense_keys: list[torch.Tensor],
    block_table: torch.Tensor,
    num_blocks: int,
    block_size: int,
    layout: str,
    dtype: torch.dtype,
    generator: torch.Generator,
) -> torch.Tensor:
    """Writes each request's keys into the blocks its table names, in the raw layout
    of `layout`; everything else (values, unused blocks) is random."""
    num_kv_heads, head_dim = dense_keys[0].shape[1:]
    if layout == "cpu_vec":
        shape = (num_blocks, num_kv_heads, block_size, 2 * head_dim)
    else:
        shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
    raw = torch.randn(shape, generator=generator).to(dtype)
    for request, keys in enumerate(dense_keys):
        for first in range(0, keys.shape[0], block_size):
            block = int(block_table[request, first // block_size])
            block_keys = keys[first : first + block_size]  # [n, Hkv, D]
            if layout == "cpu_vec":
                # Each (block, head) slab starts with its keys as [D, block_size].
                slabs = raw.view(num_blocks, num_kv_heads, 2, head_dim, block_size)
                slabs[block, :, 0, :, : block_keys.shape[0]] = block_keys.permute(1, 2, 0).to(dtype)
            else:
                raw[0, block, : block_keys.shape[0]] = block_keys.to(dtype)
    return raw


def scatter_values_into_raw_cache(
    dense_values: list[torch.Tensor],
    block_table: torch.Tensor,
    raw_cache: torch.Tensor,
    block_size: int,
    layout: str,
) -> None:
    """Writes each request's values [L_b, Hkv, D] into the blocks its table names, in place,
    in the raw layout of `layout`; keys and unused slots are left as they are."""
    head_dim = dense_values[0].shape[2]
    for request, values in enumerate(dense_values):
        for first in range(0, values.shape[0], block_size):
            block = int(block_table[request, first // block_size])
            block_values = values[first : first + block_size].to(raw_cache.dtype)  # [n, Hkv, D]
            if layout == "cpu_vec":
                # Each (block, head) slab ends with its values as [block_size, D].
                num_blocks, num_kv_heads = raw_cache.shape[:2]
                slabs = raw_cache.view(num_blocks, num_kv_heads, 2, block_size, head_dim)
                slabs[block, :, 1, : block_values.shape[0]] = block_values.transpose(0, 1)
            else:
                raw_cache[1, block, : block_values.shape[0]] = block_values


def make_paged_batch(
    context_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    block_size: int,
    layout: str,
    cache_dtype: torch.dtype = torch.float32,
    query_dtype: torch.dtype = torch.float32,
    seed: int = 0,
    head_dim: int = HEAD_DIM,
) -> PagedBatch:
    """Random queries and keys (stored at cache precision), scattered into shuffled
    blocks of a cache with spare blocks; block table rows are padded with -1."""
    generator = torch.Generator().manual_seed(seed)
    blocks_per_request = [math.ceil(n / block_size) for n in context_lens]
    table_width = max(blocks_per_request) + 1
    num_blocks = sum(blocks_per_request) + 3
    block_ids = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.full((len(context_lens), table_width), -1, dtype=torch.int32)
    for request, count in enumerate(blocks_per_request):
        block_table[request, :count] = torch.tensor(block_ids[:count], dtype=torch.int32)
        block_ids = block_ids[count:]

    dense_keys = [
        torch.randn(n, num_kv_heads, head_dim, generator=generator).to(cache_dtype).float()
        for n in context_lens
    ]
    raw = scatter_into_raw_cache(
        dense_keys, block_table, num_blocks, block_size, layout, cache_dtype, generator
    )
    query = torch.randn(len(context_lens), num_q_heads, head_dim, generator=generator)
    return PagedBatch(
        query=query.to(query_dtype),
        dense_keys=dense_keys,
        raw_cache=raw,
        key_cache=key_cache_view(raw),
        block_table=block_table,
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        scale=head_dim**-0.5,
    )


def ragged_context_lens(block_size: int) -> list[int]:
    """A full block, a partial last block, a single token, several blocks plus one."""
    return [block_size, 2 * block_size + block_size // 2 + 3, 1, 4 * block_size + 1]
