"""Attention among the verified tokens under a per-request mask: the compiled op and its
reference against dense attention computed one request at a time, and against each other."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from specextend_vllm.ops.tree_attention import (
    attention_to_nodes,
    tree_attention,
    tree_attention_reference,
)

IMPLEMENTATIONS = {"kernel": tree_attention, "reference": tree_attention_reference}

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


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("shape", ["chain", "star", "random"])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2), (8, 1)])
def test_tree_attention_matches_dense_attention(
    implementation: str, shape: str, num_q_heads: int, num_kv_heads: int
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

    output, lse = IMPLEMENTATIONS[implementation](
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


def random_case(
    query_lens: list[int], dtype: torch.dtype, seed: int, num_padding_rows: int = 2
) -> tuple[torch.Tensor, ...]:
    """query [T, 12, 128], key and value [T, 2, 128] in `dtype`, query_start_loc int32 and a
    random tree mask per request, whose row 1 (where there is one) allows nothing; the
    mask is True past each request's nodes (a request attends only to its own tokens,
    whatever the padding of its mask holds)."""
    generator = torch.Generator().manual_seed(seed)
    total, longest = sum(query_lens), max(query_lens)
    num_rows = total + num_padding_rows
    query = torch.randn(num_rows, 12, 128, generator=generator).to(dtype)
    key = torch.randn(num_rows, 2, 128, generator=generator).to(dtype)
    value = torch.randn(num_rows, 2, 128, generator=generator).to(dtype)
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    mask = torch.ones(len(query_lens), longest + 1, longest + 1, dtype=torch.bool)
    for request, length in enumerate(query_lens):
        mask[request, :length, :length] = random_tree_mask(length, generator)
        if length > 1:
            mask[request, 1, :length] = False
    return query, key, value, query_start_loc, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_kernel_matches_reference(dtype: torch.dtype, masked: bool) -> None:
    """Chains of 5 (k = 4), a 17-node tree, a request of one token, padding rows, and with a
    mask a row that may attend to nothing (output 0, lse -inf); output and LSE compared."""
    query_lens = [5, 17, 1, 3]
    query, key, value, query_start_loc, mask = random_case(query_lens, dtype, seed=int(masked))
    args = (query, key, value, query_start_loc, max(query_lens), 0.088, mask if masked else None)
    output, lse = tree_attention(*args)
    expected, expected_lse = tree_attention_reference(*args)
    assert output.dtype == lse.dtype == torch.float32
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-5, atol=1e-5)
    if masked:
        assert (output[1] == 0).all() and torch.isneginf(lse[:, 1]).all()
    assert (output[sum(query_lens):] == 0).all() and torch.isneginf(lse[:, sum(query_lens):]).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.__setitem__(1, a[1][:, :1, :64]), "key and value must be"),
        (lambda a: a.__setitem__(3, a[3].long()), "query_start_loc must be a 1-D int32"),
        (lambda a: a.__setitem__(3, torch.tensor([0, 9, 4], dtype=torch.int32)), "non-decreasing"),
        (lambda a: a.__setitem__(4, 2), "at most max_query_len"),
        (lambda a: a.__setitem__(6, torch.ones(2, 2, 2, dtype=torch.bool)), "ancestor_mask must be"),
    ],
)
def test_kernel_rejects_malformed_inputs(change, message: str) -> None:
    query, key, value, query_start_loc, mask = random_case([3, 4], torch.float32, seed=3)
    args = [query, key, value, query_start_loc, 4, 0.1, mask]
    change(args)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.specextend.tree_attention(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_registration_and_fake_kernel(dtype: torch.dtype) -> None:
    """The fake kernel's outputs are the kernel's: float32 whatever the inputs' dtype."""
    query, key, value, query_start_loc, mask = random_case([3, 4], dtype, seed=4)
    for ancestor_mask in (None, mask):
        torch.library.opcheck(
            torch.ops.specextend.tree_attention.default,
            (query, key, value, query_start_loc, 4, 0.1, ancestor_mask),
        )


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


def test_reference_output_shapes_follow_from_input_shapes_alone() -> None:
    """The reference runs on GPUs, where vLLM captures decoding steps in CUDA graphs: no
    op whose output's shape depends on tensor values (boolean-mask indexing), which a
    graph cannot replay. Fake tensors carry shapes without values and refuse such ops."""
    query_lens = [5, 17, 1, 3]
    mode = FakeTensorMode()
    query, key, value, query_start_loc, mask = (
        mode.from_tensor(t) for t in random_case(query_lens, torch.float32, seed=3)
    )
    with mode:
        output, lse = tree_attention_reference(
            query, key, value, query_start_loc, max(query_lens), 0.088, mask
        )
    assert output.shape == query.shape and lse.shape == (query.shape[1], query.shape[0])


def test_reference_keeps_every_tensor_on_its_inputs_device() -> None:
    """On a GPU the reference runs on CUDA tensors: a tensor it made without the inputs'
    device would be on the CPU there and fail. Meta tensors stand in for CUDA ones (a CPU
    tensor meeting them fails the same way)."""
    query_lens = [5, 17, 1, 3]
    query, key, value, query_start_loc, mask = (
        t.to("meta") for t in random_case(query_lens, torch.float32, seed=3)
    )
    output, lse = tree_attention_reference(
        query, key, value, query_start_loc, max(query_lens), 0.088, mask
    )
    assert output.device.type == lse.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_reference_replays_in_a_cuda_graph() -> None:
    """Captured once, replayed on another step's values (same shapes): equal to eager."""
    query_lens = [5, 17, 1, 3]
    cases = [
        [t.cuda() for t in random_case(query_lens, torch.bfloat16, seed)] for seed in (4, 5)
    ]
    static = [t.clone() for t in cases[0]]

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        query, key, value, query_start_loc, mask = static
        return tree_attention_reference(
            query, key, value, query_start_loc, max(query_lens), 0.088, mask
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output, lse = step()
    for case in cases[::-1]:
        for target, source in zip(static, case):
            target.copy_(source)
        graph.replay()
        expected, expected_lse = tree_attention_reference(
            *case[:4], max(query_lens), 0.088, case[4]
        )
        torch.testing.assert_close(output, expected)
        torch.testing.assert_close(lse, expected_lse)
