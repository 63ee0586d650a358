"""The two paged KV cache layouts the method reads and writes, as plain torch views.

Pure torch, no vLLM. Every helper returns views in one logical layout,
[num_blocks, block_size, kv_heads, head_dim], so the code above it never branches on the
device:

- vLLM's CPU attention ("vec" ISA: float32/float16 caches on x86 without AMX):
  [num_blocks, kv_heads, block_size, 2 * head_dim]; each (block, head) slab holds its
  keys transposed as [head_dim, block_size], then its values as [block_size, head_dim].
- FlashAttention (GPU): [2, num_blocks, block_size, kv_heads, head_dim], keys then values.
"""

from __future__ import annotations

import torch


def is_flash_attn_layout(raw_cache: torch.Tensor) -> bool:
    return raw_cache.dim() == 5


def cpu_vec_key_cache_view(raw_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, Hkv, D] view of a vLLM CPU ("vec" ISA) KV cache.

    >>> raw = torch.arange(2 * 1 * 2 * 4.0).view(2, 1, 2, 4)  # 2 blocks, 1 head, 2 tokens, D=2
    >>> cpu_vec_key_cache_view(raw)[1, :, 0]  # block 1: keys stored as [D, block_size]
    tensor([[ 8., 10.],
            [ 9., 11.]])
    """
    dense_slabs = raw_cache.dim() == 4 and raw_cache.stride()[2:] == (raw_cache.shape[3], 1)
    if not dense_slabs:
        raise ValueError(
            "expected a [num_blocks, Hkv, block_size, 2 * D] cache with contiguous (block, head) "
            f"slabs, got shape {tuple(raw_cache.shape)} strides {raw_cache.stride()}"
        )
    num_blocks, num_kv_heads, block_size, two_head_dim = raw_cache.shape
    return raw_cache.as_strided(
        (num_blocks, block_size, num_kv_heads, two_head_dim // 2),
        (raw_cache.stride(0), 1, raw_cache.stride(1), block_size),
    )


def cpu_vec_value_cache_view(raw_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, Hkv, D] value view of a vLLM CPU ("vec" ISA) KV cache.

    >>> raw = torch.arange(2 * 1 * 2 * 4.0).view(2, 1, 2, 4)  # 2 blocks, 1 head, 2 tokens, D=2
    >>> cpu_vec_value_cache_view(raw)[1, :, 0]  # block 1: values stored as [block_size, D]
    tensor([[12., 13.],
            [14., 15.]])
    """
    keys = cpu_vec_key_cache_view(raw_cache)
    num_blocks, block_size, num_kv_heads, head_dim = keys.shape
    return raw_cache.as_strided(
        keys.shape,
        (raw_cache.stride(0), head_dim, raw_cache.stride(1), 1),
        raw_cache.storage_offset() + block_size * head_dim,
    )


def flash_attn_key_cache_view(raw_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, Hkv, D] key view of a FlashAttention KV cache
    [2, num_blocks, block_size, Hkv, D]."""
    if raw_cache.dim() != 5 or raw_cache.shape[0] != 2:
        raise ValueError(
            "expected a [2, num_blocks, block_size, Hkv, D] cache, "
            f"got shape {tuple(raw_cache.shape)}"
        )
    return raw_cache[0]


def key_cache_view(raw_cache: torch.Tensor) -> torch.Tensor:
    """The keys of either layout as [num_blocks, block_size, Hkv, D]."""
    if is_flash_attn_layout(raw_cache):
        return flash_attn_key_cache_view(raw_cache)
    return cpu_vec_key_cache_view(raw_cache)


def value_cache_view(raw_cache: torch.Tensor) -> torch.Tensor:
    """The values of either layout as [num_blocks, block_size, Hkv, D]."""
    if is_flash_attn_layout(raw_cache):
        return raw_cache[1]
    return cpu_vec_value_cache_view(raw_cache)


def copy_blocks(raw_cache: torch.Tensor, sources: torch.Tensor, destinations: torch.Tensor) -> None:
    """Block destinations[i] of either layout gets block sources[i]'s keys and values.

    >>> raw = torch.arange(3 * 1 * 2 * 4.0).view(3, 1, 2, 4)  # CPU layout, 3 blocks
    >>> copy_blocks(raw, torch.tensor([0]), torch.tensor([2]))
    >>> torch.equal(raw[2], raw[0])
    True
    """
    if is_flash_attn_layout(raw_cache):
        raw_cache[:, destinations] = raw_cache[:, sources]
    else:
        raw_cache[destinations] = raw_cache[sources]
