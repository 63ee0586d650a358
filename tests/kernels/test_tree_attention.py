"""Attention among the verified tokens under a per-request mask, against dense attention
computed one request at a time."""

from __future__ import annotations

import pytest
import torch

from specextend_vllm.ops.tree_attention import attention_to_nodes, tree_attention

HEAD_DIM = 32


def star_mask(length: int) -> torch.Tensor:
    """The root, then children that each see only the root and themselves."""
    mask = torch.eye(length, dtype=torch.bool)
    mask[:, 0] = True
    return mask


def random_tree_mask(length: int, generator: torch.Generator) -> torch.Tensor:
    """Node i's parent is a random earlier node; a node sees its ancestors and itself."""
    mask = torch.eye(length, dtype=torch.bool)
    for node in range(1, length):
        parent = int(torch.randint(0, node, (1,), generator=generator))
        mask[node] |= mask[parent]
    return mask


def dense_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request: query [L, Hq, D], key/value [L, Hkv, D], mask [L, L]."""
    group = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", query, key) * scale
    logits = logits.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", logits.softmax(-1), value), logits.logsumexp(-1)


@pytest.mark.parametrize("shape", ["chain", "star", "random"])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2), (8, 1)])
def test_tree_attention_matches_dense_attention(
    shape: str, num_q_heads: int, num_kv_heads: int
) -> None:
    generator = torch.Generator().manual_seed(num_q_heads * 10 + num_kv_heads)
    query_lens = [1, 5, 16, 3]
    total, longest = sum(query_lens), max(query_lens)
    query = torch.randn(total + 2, num_q_heads, HEAD_DIM, generator=generator)
    key = torch.randn(total + 2, num_kv_heads, HEAD_DIM, generator=generator)
    value = torch.randn(total + 2, num_kv_heads, HEAD_DIM, generator=generator)
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    masks = {
        "chain": lambda n: torch.ones(n, n, dtype=torch.bool).tril(),
        "star": star_mask,
        "random": lambda n: random_tree_mask(n, generator),
    }
    request_masks = [masks[shape](n) for n in query_lens]
    ancestor_mask = torch.zeros(len(query_lens), longest, longest, dtype=torch.bool)
    for request, mask in enumerate(request_masks):
        ancestor_mask[request, : mask.shape[0], : mask.shape[1]] = mask
    scale = HEAD_DIM**-0.5

    output, lse = tree_attention(
        query, key, value, query_start_loc, longest, scale,
        None if shape == "chain" else ancestor_mask,
    )
    for request, mask in enumerate(request_masks):
        rows = slice(int(query_start_loc[request]), int(query_start_loc[request + 1]))
        expected, expected_lse = dense_attention(query[rows], key[rows], value[rows], mask, scale)
        torch.testing.assert_close(output[rows], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse[:, rows], expected_lse, rtol=1e-5, atol=1e-5)
    assert (output[total:] == 0).all() and torch.isneginf(lse[:, total:]).all()


def test_a_chain_mask_equals_the_causal_default() -> None:
    generator = torch.Generator().manual_seed(7)
    query = torch.randn(7, 4, HEAD_DIM, generator=generator)
    key = torch.randn(7, 2, HEAD_DIM, generator=generator)
    value = torch.randn(7, 2, HEAD_DIM, generator=generator)
    query_start_loc = torch.tensor([0, 3, 7])
    chain = torch.ones(2, 4, 4, dtype=torch.bool).tril()
    causal = tree_attention(query, key, value, query_start_loc, 4, 0.2)
    masked = tree_attention(query, key, value, query_start_loc, 4, 0.2, chain)
    torch.testing.assert_close(causal, masked)


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (8, 2)])
def test_attention_to_nodes_matches_dense_attention(num_q_heads: int, num_kv_heads: int) -> None:
    """Nodes of one depth attend to the tree held so far, each to its own ancestors."""
    generator = torch.Generator().manual_seed(num_q_heads)
    num_reqs, num_nodes = 3, 9
    full_mask = random_tree_mask(num_nodes, generator)
    nodes = torch.tensor([3, 5, 6])
    query = torch.randn(num_reqs, len(nodes), num_q_heads, HEAD_DIM, generator=generator)
    key = torch.randn(num_reqs, num_nodes, num_kv_heads, HEAD_DIM, generator=generator)
    value = torch.randn(num_reqs, num_nodes, num_kv_heads, HEAD_DIM, generator=generator)
    allowed = full_mask[nodes]
    output, lse = attention_to_nodes(query, key, value, allowed, 0.3)
    for request in range(num_reqs):
        for row, node in enumerate(nodes.tolist()):
            expected, expected_lse = dense_attention(
                query[request, row : row + 1], key[request], value[request],
                allowed[row : row + 1], 0.3,
            )
            flat = request * len(nodes) + row
            torch.testing.assert_close(output[flat], expected[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lse[:, flat], expected_lse[:, 0], rtol=1e-5, atol=1e-5)
