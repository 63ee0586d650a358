"""Chunk scores for Cross-model Retrieval: the compiled op, a pure-torch reference,
and the key cache views both take.

For request b with context length L (tokens 0..L-1 in the paged key cache), the
score of chunk c is the softmax attention mass of the request's query token,
averaged over query heads and over the tokens of the chunk, or -inf for chunks
past the context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    from specextend_vllm import _C  # noqa: F401  (registers torch.ops.specextend)
except ImportError as error:
    raise ImportError(
        "specextend_vllm._C (the compiled chunk-scores kernel) could not be loaded; "
        "reinstall the package with `pip install -e .`"
    ) from error

try:
    from specextend_vllm import _C_cuda  # noqa: F401  (registers the CUDA kernel)
except ImportError:
    pass


def chunk_scores(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    chunk_size: int,
    scale: float,
    num_chunks: int,
) -> torch.Tensor:
    """Per-chunk attention scores, [B, num_chunks] float32.

    query: [B, Hq, D]; key_cache: [num_blocks, block_size, Hkv, D] view (any
    strides, see `cpu_vec_key_cache_view` / `flash_attn_key_cache_view`);
    block_table: [B, W] int32; context_lens: [B] int32, 1 <= L_b <= W * block_size.
    """
    return torch.ops.specextend.chunk_scores(
        query, key_cache, block_table, context_lens, chunk_size, scale, num_chunks
    )


def chunk_scores_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    chunk_size: int,
    scale: float,
    num_chunks: int,
) -> torch.Tensor:
    """Pure-torch `chunk_scores`, fp32 throughout.

    One request, one head, head_dim 1, blocks of 2 tokens; block 1 holds tokens
    0-1 and block 0 holds token 2, so the logits are [0, 0, ln 2], the softmax is
    [1/4, 1/4, 1/2], and chunks of 2 tokens score [1/4, 1/2, -inf]:

    >>> import math
    >>> key_cache = torch.tensor([math.log(2.0), 9.0, 0.0, 0.0]).view(2, 2, 1, 1)
    >>> chunk_scores_reference(
    ...     query=torch.ones(1, 1, 1),
    ...     key_cache=key_cache,
    ...     block_table=torch.tensor([[1, 0]], dtype=torch.int32),
    ...     context_lens=torch.tensor([3], dtype=torch.int32),
    ...     chunk_size=2,
    ...     scale=1.0,
    ...     num_chunks=3,
    ... )
    tensor([[0.2500, 0.5000,   -inf]])
    """
    batch, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    device = key_cache.device
    context_lens = context_lens.to(device=device, dtype=torch.long)
    max_context_len = int(context_lens.max())

    positions = torch.arange(max_context_len, device=device)
    in_context = positions < context_lens[:, None]  # [B, T]
    blocks = block_table.to(device=device, dtype=torch.long)[:, positions // block_size]
    blocks = torch.where(in_context, blocks, 0)
    keys = key_cache[blocks, positions % block_size].float()  # [B, T, Hkv, D]

    group_size = num_q_heads // num_kv_heads
    grouped_query = query.to(device=device, dtype=torch.float32)
    grouped_query = grouped_query.reshape(batch, num_kv_heads, group_size, head_dim)
    logits = scale * torch.einsum("bkgd,btkd->bkgt", grouped_query, keys)
    logits = logits.reshape(batch, num_q_heads, max_context_len)
    probs = logits.masked_fill(~in_context[:, None, :], float("-inf")).softmax(dim=-1)
    token_scores = probs.mean(dim=1)  # [B, T]; 0 past each context

    chunked = F.pad(token_scores, (0, num_chunks * chunk_size - max_context_len))
    chunk_mass = chunked.view(batch, num_chunks, chunk_size).sum(dim=-1)
    chunk_starts = torch.arange(num_chunks, device=device) * chunk_size
    chunk_tokens = (context_lens[:, None] - chunk_starts).clamp(0, chunk_size)
    scores = chunk_mass / chunk_tokens.clamp(min=1)
    return scores.masked_fill(chunk_tokens == 0, float("-inf")).to(query.device)


def cpu_vec_key_cache_view(raw_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, Hkv, D] view of a vLLM CPU ("vec" ISA) KV cache.

    raw_cache: [num_blocks, Hkv, block_size, 2 * D]; the keys of each (block, head)
    occupy its first block_size * D elements, stored transposed as [D, block_size].
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


def flash_attn_key_cache_view(raw_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, Hkv, D] key view of a FlashAttention KV cache
    [2, num_blocks, block_size, Hkv, D]."""
    if raw_cache.dim() != 5 or raw_cache.shape[0] != 2:
        raise ValueError(
            "expected a [2, num_blocks, block_size, Hkv, D] cache, "
            f"got shape {tuple(raw_cache.shape)}"
        )
    return raw_cache[0]
