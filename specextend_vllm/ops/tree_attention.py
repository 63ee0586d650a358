"""Attention among the tokens being verified, from their own keys and values (no cache
read-back), under a per-request mask: the "tree" half of hybrid tree attention. The
compiled op (CPU), its fake kernel and a pure-torch reference, which other devices run:
the tokens of a step number a few per request, so one batched einsum over requests padded
to the longest covers them there. On CPU the op's one call replaces the reference's two
dozen small torch calls, which cost about 0.2 ms a layer.

`attention_to_nodes` is the same attention for a draft tree's nodes, pure torch.
"""

from __future__ import annotations

import torch


def tree_attention(
    query: torch.Tensor,  # [T, Hq, D]
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    query_start_loc: torch.Tensor,  # [R + 1]
    max_query_len: int,
    scale: float,
    ancestor_mask: torch.Tensor | None = None,  # [R, L, L] bool, L >= max_query_len
) -> tuple[torch.Tensor, torch.Tensor]:  # output [T, Hq, D] float32, lse [Hq, T] float32
    """`tree_attention_reference`, computed by the compiled op on CPU.

    >>> output, lse = tree_attention(
    ...     query=torch.tensor([[[0.0]], [[1.0]]]),
    ...     key=torch.tensor([[[0.0]], [[1.0986123]]]),
    ...     value=torch.tensor([[[1.0]], [[5.0]]]),
    ...     query_start_loc=torch.tensor([0, 2], dtype=torch.int32),
    ...     max_query_len=2,
    ...     scale=1.0,
    ... )
    >>> [round(x, 4) for x in output.flatten().tolist()], [round(x, 4) for x in lse.flatten().tolist()]
    ([1.0, 4.0], [0.0, 1.3863])
    """
    if query.device.type != "cpu":
        return tree_attention_reference(
            query, key, value, query_start_loc, max_query_len, scale, ancestor_mask
        )
    return torch.ops.specextend.tree_attention(
        query,
        key,
        value,
        query_start_loc.to(torch.int32),
        max_query_len,
        scale,
        None if ancestor_mask is None else ancestor_mask.to(torch.bool),
    )


@torch.library.register_fake("specextend::tree_attention")
def _tree_attention_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    ancestor_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_q_heads, _ = query.shape
    output = query.new_empty(query.shape, dtype=torch.float32)
    lse = query.new_empty((num_q_heads, num_tokens), dtype=torch.float32)
    return output, lse


def tree_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    ancestor_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's query tokens attend to its own new tokens.

    query: [T, Hq, D]; key, value: [T, Hkv, D]; query_start_loc: [R + 1];
    ancestor_mask: [R, L, L] bool, L >= max_query_len, row i of request r may attend to
    column j where True (None: causal, as for a chain).
    Returns (output [T, Hq, D] float32, lse [Hq, T] float32); rows past
    query_start_loc[R] get output 0 and lse -inf.

    Two tokens, one head, D=1, causal: the first attends to itself only, the second to
    both with logits [0, ln 3] (values 1 and 5), so it gets (1 + 3 * 5) / 4 = 4:

    >>> import math
    >>> out, lse = tree_attention_reference(
    ...     query=torch.tensor([[[0.0]], [[1.0]]]),
    ...     key=torch.tensor([[[0.0]], [[math.log(3.0)]]]),
    ...     value=torch.tensor([[[1.0]], [[5.0]]]),
    ...     query_start_loc=torch.tensor([0, 2]),
    ...     max_query_len=2,
    ...     scale=1.0,
    ... )
    >>> out.flatten().tolist(), [round(x, 4) for x in lse.flatten().tolist()]
    ([1.0, 4.0], [0.0, 1.3863])
    """
    num_tokens, num_q_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    group = num_q_heads // num_kv_heads
    starts = query_start_loc[:-1].long()
    query_lens = query_start_loc[1:].long() - starts
    columns = torch.arange(max_query_len, device=query.device)
    is_token = columns[None, :] < query_lens[:, None]  # [R, L]
    rows = (starts[:, None] + columns[None, :]).clamp(max=max(num_tokens - 1, 0))

    padded_query = query[rows].float().view(*rows.shape, num_kv_heads, group, head_dim)
    padded_key = key[rows].float()  # [R, L, Hkv, D]
    padded_value = value[rows].float()
    logits = torch.einsum("rqkgd,rjkd->rkgqj", padded_query, padded_key) * scale

    if ancestor_mask is None:
        allowed = columns[None, :] <= columns[:, None]
        allowed = allowed[None].expand(rows.shape[0], -1, -1)
    else:
        allowed = ancestor_mask[:, :max_query_len, :max_query_len].to(torch.bool)
    allowed = allowed & is_token[:, None, :] & is_token[:, :, None]  # [R, L(q), L(j)]
    logits = logits.masked_fill(~allowed[:, None, None], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [R, Hkv, G, L]
    probs = torch.exp(logits - lse[..., None].clamp(min=torch.finfo(torch.float32).min))
    padded_output = torch.einsum("rkgqj,rjkd->rqkgd", probs, padded_value)

    # Padding slots write to a spare last row, so every shape is known before the call
    # (a CUDA graph can capture it).
    token_rows = torch.where(is_token, rows, num_tokens).flatten()  # [R * L]
    output = query.new_zeros(num_tokens + 1, num_q_heads, head_dim, dtype=torch.float32)
    output[token_rows] = padded_output.reshape(-1, num_q_heads, head_dim)
    token_lse = torch.full(
        (num_q_heads, num_tokens + 1), float("-inf"), device=query.device, dtype=torch.float32
    )
    token_lse[:, token_rows] = lse.permute(1, 2, 0, 3).reshape(num_q_heads, -1)
    return output[:num_tokens], token_lse[:, :num_tokens]


def attention_to_nodes(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's W query nodes attend to the M nodes of its tree held so far.

    query: [R, W, Hq, D]; key, value: [R, M, Hkv, D]; allowed: [R, W, M] bool, or
    [W, M] for the same nodes in every request. Returns (output [R * W, Hq, D] float32, lse [Hq, R * W] float32);
    a row allowed no node gets output 0 and lse -inf.

    One request, one head, D=1: the node attends to itself (logit ln 3, value 5) and to
    its parent (logit 0, value 1), not to node 1:

    >>> import math
    >>> out, lse = attention_to_nodes(
    ...     query=torch.tensor([[[[1.0]]]]),
    ...     key=torch.tensor([[[[0.0]], [[9.0]], [[math.log(3.0)]]]]),
    ...     value=torch.tensor([[[[1.0]], [[7.0]], [[5.0]]]]),
    ...     allowed=torch.tensor([[True, False, True]]),
    ...     scale=1.0,
    ... )
    >>> out.flatten().tolist(), [round(x, 4) for x in lse.flatten().tolist()]
    ([4.0], [1.3863])
    """
    num_reqs, width, num_q_heads, head_dim = query.shape
    num_kv_heads = key.shape[2]
    grouped_query = query.float().view(num_reqs, width, num_kv_heads, -1, head_dim)
    logits = torch.einsum("rwkgd,rmkd->rkgwm", grouped_query, key.float()) * scale
    allowed = allowed.expand(num_reqs, width, key.shape[1])
    logits = logits.masked_fill(~allowed[:, None, None], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # [R, Hkv, G, W]
    probs = torch.exp(logits - lse[..., None].clamp(min=torch.finfo(torch.float32).min))
    output = torch.einsum("rkgwm,rmkd->rwkgd", probs, value.float())
    return (
        output.reshape(num_reqs * width, num_q_heads, head_dim),
        lse.permute(1, 2, 0, 3).reshape(num_q_heads, num_reqs * width),
    )
