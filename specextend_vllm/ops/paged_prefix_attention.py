"""Attention over each request's cached prefix, the prefix half of hybrid tree attention: the
compiled op, its fake kernel and a pure-torch reference.

Every query token of request r (rows query_start_loc[r]..query_start_loc[r + 1] - 1) attends to
the request's prefix (tokens 0..prefix_lens[r] - 1 in the paged KV cache) with no mask. Besides
the output, the op returns the log-sum-exp of each row's logits, so that the output can be merged
exactly with attention over other keys (the speculative tokens), as vLLM's merge_attn_states
does. Rows with an empty prefix, and rows past query_start_loc[R], get output 0 and lse -inf.

The caches are any [num_blocks, block_size, Hkv, D] views: see
`specextend_vllm.kv_cache_layout.key_cache_view` and `value_cache_view`.
"""

from __future__ import annotations

import torch


def paged_prefix_attention(
    query: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides
    value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides
    block_table: torch.Tensor,  # [R, W] int32
    prefix_lens: torch.Tensor,  # [R] int32, 0 <= L_r <= W * block_size
    query_start_loc: torch.Tensor,  # [R + 1] int32, from 0, non-decreasing, at most T
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # output [T, Hq, D] float32, lse [Hq, T] float32
    """Prefix attention and its log-sum-exp, computed by the kernel of the inputs' device.

    One request with two query tokens, one head, head_dim 1, a prefix of two tokens with keys
    [0, ln 3] and values [1, 3]. The query 1 puts [1/4, 3/4] on the prefix (output 2.5, lse
    ln 4); the query 0 puts 1/2 on each (output 2, lse ln 2):

    >>> import math
    >>> output, lse = paged_prefix_attention(
    ...     query=torch.tensor([[[1.0]], [[0.0]]]),
    ...     key_cache=torch.tensor([0.0, math.log(3.0)]).view(1, 2, 1, 1),
    ...     value_cache=torch.tensor([1.0, 3.0]).view(1, 2, 1, 1),
    ...     block_table=torch.tensor([[0]], dtype=torch.int32),
    ...     prefix_lens=torch.tensor([2], dtype=torch.int32),
    ...     query_start_loc=torch.tensor([0, 2], dtype=torch.int32),
    ...     scale=1.0,
    ... )
    >>> output.flatten(), lse
    (tensor([2.5000, 2.0000]), tensor([[1.3863, 0.6931]]))
    """
    return torch.ops.specextend.paged_prefix_attention(
        query, key_cache, value_cache, block_table, prefix_lens, query_start_loc, scale
    )


@torch.library.register_fake("specextend::paged_prefix_attention")
def _paged_prefix_attention_fake(
    query: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # output [T, Hq, D] float32, lse [Hq, T] float32
    num_tokens, num_q_heads, _ = query.shape
    output = query.new_empty(query.shape, dtype=torch.float32)
    lse = query.new_empty((num_q_heads, num_tokens), dtype=torch.float32)
    return output, lse


def paged_prefix_attention_reference(
    query: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides
    value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides
    block_table: torch.Tensor,  # [R, W] int32
    prefix_lens: torch.Tensor,  # [R] int32, 0 <= L_r <= W * block_size
    query_start_loc: torch.Tensor,  # [R + 1] int32, from 0, non-decreasing, at most T
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # output [T, Hq, D] float32, lse [Hq, T] float32
    """Pure-torch `paged_prefix_attention`, fp32 throughout.

    Two requests, one head, head_dim 1, blocks of 2 tokens. Request 0 has one query token (1)
    over a prefix of three tokens: block 1 holds tokens 0-1 (keys 0, 0; values 2, 2) and block
    0 holds token 2 (key ln 2, value 5), so the softmax is [1/4, 1/4, 1/2], the output
    2/4 + 2/4 + 5/2 = 3.5 and the lse log(1 + 1 + 2) = ln 4. Request 1's query token has an
    empty prefix, and the third query row is padding:

    >>> import math
    >>> output, lse = paged_prefix_attention_reference(
    ...     query=torch.ones(3, 1, 1),
    ...     key_cache=torch.tensor([math.log(2.0), 9.0, 0.0, 0.0]).view(2, 2, 1, 1),
    ...     value_cache=torch.tensor([5.0, 9.0, 2.0, 2.0]).view(2, 2, 1, 1),
    ...     block_table=torch.tensor([[1, 0], [0, 0]], dtype=torch.int32),
    ...     prefix_lens=torch.tensor([3, 0], dtype=torch.int32),
    ...     query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
    ...     scale=1.0,
    ... )
    >>> output.flatten(), lse
    (tensor([3.5000, 0.0000, 0.0000]), tensor([[1.3863,   -inf,   -inf]]))
    """
    num_tokens, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group_size = num_q_heads // num_kv_heads
    device = key_cache.device
    output = torch.zeros(num_tokens, num_q_heads, head_dim, device=device)
    lse = torch.full((num_q_heads, num_tokens), float("-inf"), device=device)
    starts = query_start_loc.tolist()
    for request, prefix_len in enumerate(prefix_lens.tolist()):
        first, end = starts[request], starts[request + 1]
        if prefix_len == 0 or first == end:
            continue
        positions = torch.arange(prefix_len, device=device)
        blocks = block_table[request].to(device=device, dtype=torch.long)[positions // block_size]
        # [L, Hq, D]: each KV head repeated for the query heads of its group
        keys = key_cache[blocks, positions % block_size].float().repeat_interleave(group_size, 1)
        values = value_cache[blocks, positions % block_size].float()
        values = values.repeat_interleave(group_size, 1)
        queries = query[first:end].to(device=device, dtype=torch.float32)
        logits = scale * torch.einsum("thd,lhd->htl", queries, keys)
        lse[:, first:end] = logits.logsumexp(dim=-1)
        output[first:end] = torch.einsum("htl,lhd->thd", logits.softmax(dim=-1), values)
    return output.to(query.device), lse.to(query.device)
