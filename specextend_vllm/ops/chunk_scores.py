"""Chunk scores for Cross-model Retrieval: the compiled op, its fake kernel and a pure-torch
reference.

For request b with context length L (tokens 0..L-1 in the paged key cache), the score of
chunk c is the softmax attention mass of the request's query token, averaged over query heads
and over the tokens of the chunk, or -inf for chunks past the context.

The key cache is any [num_blocks, block_size, Hkv, D] view: see
`specextend_vllm.kv_cache_layout.key_cache_view`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunk_scores(
    query: torch.Tensor,  # [B, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides
    block_table: torch.Tensor,  # [B, W] int32
    context_lens: torch.Tensor,  # [B] int32, 1 <= L_b <= W * block_size
    chunk_size: int,
    scale: float,
    num_chunks: int,  # num_chunks * chunk_size >= max L_b
) -> torch.Tensor:  # [B, num_chunks] float32
    """Per-chunk attention scores, computed by the kernel of the inputs' device.

    One request, two query heads sharing one KV head, head_dim 1, one block of 4 tokens with
    keys [0, ln 3, 0, 0]. Head 0 (query 1) puts [1, 3, 1, 1] / 6 on the tokens, head 1
    (query 0) 1/4 on each; their mean is [5, 9, 5, 5] / 24, so chunks of 2 tokens score
    [7/24, 5/24, -inf]:

    >>> import math
    >>> chunk_scores(
    ...     query=torch.tensor([[[1.0], [0.0]]]),
    ...     key_cache=torch.tensor([0.0, math.log(3.0), 0.0, 0.0]).view(1, 4, 1, 1),
    ...     block_table=torch.tensor([[0]], dtype=torch.int32),
    ...     context_lens=torch.tensor([4], dtype=torch.int32),
    ...     chunk_size=2,
    ...     scale=1.0,
    ...     num_chunks=3,
    ... )
    tensor([[0.2917, 0.2083,   -inf]])
    """
    return torch.ops.specextend.chunk_scores(
        query, key_cache, block_table, context_lens, chunk_size, scale, num_chunks
    )


@torch.library.register_fake("specextend::chunk_scores")
def _chunk_scores_fake(
    query: torch.Tensor,  # [B, Hq, D]
    key_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    chunk_size: int,
    scale: float,
    num_chunks: int,
) -> torch.Tensor:  # [B, num_chunks] float32
    return query.new_empty((query.shape[0], num_chunks), dtype=torch.float32)


def chunk_scores_reference(
    query: torch.Tensor,  # [B, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides
    block_table: torch.Tensor,  # [B, W] int32
    context_lens: torch.Tensor,  # [B] int32, 1 <= L_b <= W * block_size
    chunk_size: int,
    scale: float,
    num_chunks: int,  # num_chunks * chunk_size >= max L_b
) -> torch.Tensor:  # [B, num_chunks] float32
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
