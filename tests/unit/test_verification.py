"""Hybrid verification attention on CPU tensors in both cache layouts: prefix attention
with LSE, masked attention among the new tokens and the LSE merge together equal causal
attention over each request's whole sequence. On the FlashAttention layout the kernel
reference stands in for flash-attn's call, with flash-attn's arguments."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from specextend_vllm import ops
from specextend_vllm.algorithm import kv_cache_layout
from specextend_vllm.verification.hybrid import HybridVerificationAttention, TreeAttentionStep
from specextend_vllm.verification.prefix_attention import (
    cpu_prefix_attention,
    flash_attn_prefix_attention,
)

BLOCK_SIZE = 16
HEAD_DIM = 32
NUM_Q_HEADS, NUM_KV_HEADS = 8, 2
PREFIX_LENS = [0, 5, 40, 100]
QUERY_LENS = [3, 1, 5, 2]
PADDING_ROWS = 2


def flash_attn_stand_in(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    seqused_k: torch.Tensor,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    block_table: torch.Tensor,
    return_softmax_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    assert not causal and return_softmax_lse
    assert k.shape[1:] == (BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM) and max_seqlen_q == max(QUERY_LENS)
    assert max_seqlen_k >= max(PREFIX_LENS)
    return ops.paged_prefix_attention_reference(
        q, k, v, block_table, seqused_k, cu_seqlens_q, softmax_scale
    )


def verification_batch(
    layout: str, seed: int = 0, query_lens: list[int] = QUERY_LENS
) -> dict[str, Any]:
    """Requests with a cached prefix and new tokens, whose keys and values are already
    in the cache (vLLM writes them before attention runs), in shuffled blocks."""
    generator = torch.Generator().manual_seed(seed)
    seq_lens = [p + q for p, q in zip(PREFIX_LENS, query_lens)]
    blocks_per_request = [-(-n // BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(blocks_per_request) + 2
    order = torch.randperm(num_blocks, generator=generator).tolist()
    block_table = torch.zeros(len(seq_lens), max(blocks_per_request) + 1, dtype=torch.int32)
    if layout == "cpu_vec":
        raw = torch.randn(num_blocks, NUM_KV_HEADS, BLOCK_SIZE, 2 * HEAD_DIM, generator=generator)
    else:
        raw = torch.randn(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    keys_view, values_view = kv_cache_layout.key_cache_view(raw), kv_cache_layout.value_cache_view(raw)
    dense_keys, dense_values = [], []
    for request, (count, length) in enumerate(zip(blocks_per_request, seq_lens)):
        block_table[request, :count] = torch.tensor(order[:count])
        order = order[count:]
        keys = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=generator)
        values = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=generator)
        positions = torch.arange(length)
        blocks = block_table[request, positions // BLOCK_SIZE].long()
        keys_view[blocks, positions % BLOCK_SIZE] = keys
        values_view[blocks, positions % BLOCK_SIZE] = values
        dense_keys.append(keys)
        dense_values.append(values)
    num_tokens = sum(query_lens)
    new_rows = [slice(p, p + q) for p, q in zip(PREFIX_LENS, query_lens)]
    padding = torch.zeros(PADDING_ROWS, NUM_KV_HEADS, HEAD_DIM)
    return {
        "raw": raw,
        "query": torch.randn(num_tokens + PADDING_ROWS, NUM_Q_HEADS, HEAD_DIM, generator=generator),
        "key": torch.cat([k[rows] for k, rows in zip(dense_keys, new_rows)] + [padding]),
        "value": torch.cat([v[rows] for v, rows in zip(dense_values, new_rows)] + [padding]),
        "dense_keys": dense_keys,
        "dense_values": dense_values,
        "query_lens": query_lens,
        "batch": SimpleNamespace(
            num_actual_tokens=num_tokens,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_table=block_table,
        ),
    }


def causal_attention(
    data: dict[str, Any], scale: float, new_token_masks: dict[int, torch.Tensor] | None = None
) -> torch.Tensor:
    """Each request's new tokens over its whole sequence: the prefix, then the new
    tokens causally, or under `new_token_masks[request]` ([L, L] bool)."""
    outputs = []
    start = 0
    for request, (prefix_len, query_len, keys, values) in enumerate(
        zip(PREFIX_LENS, data["query_lens"], data["dense_keys"], data["dense_values"])
    ):
        query = data["query"][start : start + query_len]
        group = NUM_Q_HEADS // NUM_KV_HEADS
        logits = torch.einsum("qhd,khd->hqk", query, keys.repeat_interleave(group, 1)) * scale
        positions = prefix_len + torch.arange(query_len)
        visible = torch.arange(keys.shape[0])[None, :] <= positions[:, None]
        if new_token_masks and request in new_token_masks:
            visible[:, prefix_len:] = new_token_masks[request][:query_len, :query_len]
        probs = logits.masked_fill(~visible[None], float("-inf")).softmax(-1)
        outputs.append(torch.einsum("hqk,khd->qhd", probs, values.repeat_interleave(group, 1)))
        start += query_len
    return torch.cat(outputs)


@pytest.mark.parametrize("layout", ["cpu_vec", "flash_attn"])
def test_hybrid_verification_equals_causal_attention_over_the_whole_sequence(layout: str) -> None:
    data = verification_batch(layout)
    prefix_attention = (
        cpu_prefix_attention
        if layout == "cpu_vec"
        else lambda *args: flash_attn_prefix_attention(*args, varlen_attention=flash_attn_stand_in)
    )
    scale = HEAD_DIM**-0.5
    path = HybridVerificationAttention(scale, max(QUERY_LENS), prefix_attention)
    output = torch.full_like(data["query"], 7.0)
    assert path.handles(data["batch"])
    path(data["query"], data["key"], data["value"], data["raw"], data["batch"], output, None)
    num_tokens = data["batch"].num_actual_tokens
    torch.testing.assert_close(output[:num_tokens], causal_attention(data, scale), rtol=1e-5, atol=1e-5)
    assert (output[num_tokens:] == 7.0).all()


def test_a_plain_decoding_step_on_the_kernel_equals_attention_over_the_whole_sequence() -> None:
    """One new token a request (a request's first token after an empty prefix too)."""
    data = verification_batch("cpu_vec", query_lens=[1] * len(PREFIX_LENS))
    scale = HEAD_DIM**-0.5
    path = HybridVerificationAttention(scale, max(QUERY_LENS), cpu_prefix_attention)
    assert not path.handles(data["batch"])
    output = torch.full_like(data["query"], 7.0)
    path.attend(data["query"], data["key"], data["value"], data["raw"], data["batch"], output, None)
    num_tokens = data["batch"].num_actual_tokens
    torch.testing.assert_close(output[:num_tokens], causal_attention(data, scale), rtol=1e-5, atol=1e-5)
    assert (output[num_tokens:] == 7.0).all()


def test_the_gpu_layout_path_reads_no_tensor_on_the_host() -> None:
    """On a GPU, vLLM may capture a verifying step in a CUDA graph, where reading a tensor
    on the host fails. With fake tensors (shapes, no values) the FlashAttention-layout path
    runs through, a stand-in of flash-attn's output shapes in its call's place. (The
    longest prefix read from `prefix_lens` on the host, as before, fails here.)"""
    data = verification_batch("flash_attn")
    mode = FakeTensorMode()
    query, key, value, raw = (
        mode.from_tensor(data[name]) for name in ("query", "key", "value", "raw")
    )
    batch = SimpleNamespace(
        **{
            name: mode.from_tensor(field) if isinstance(field, torch.Tensor) else field
            for name, field in vars(data["batch"]).items()
        }
    )

    def output_shapes(**kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        q = kwargs["q"]
        return torch.empty_like(q), q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)

    path = HybridVerificationAttention(
        HEAD_DIM**-0.5,
        max(QUERY_LENS),
        lambda *args: flash_attn_prefix_attention(*args, varlen_attention=output_shapes),
    )
    with mode:
        output = torch.empty_like(query)
        path(query, key, value, raw, batch, output, None)
    assert output.shape == query.shape


def test_only_verification_batches_are_handled() -> None:
    path = HybridVerificationAttention(1.0, 4, cpu_prefix_attention)
    assert not path.handles(SimpleNamespace(max_query_len=1))
    assert not path.handles(SimpleNamespace(max_query_len=5))
    assert path.handles(SimpleNamespace(max_query_len=2))
    assert path.handles(SimpleNamespace(max_query_len=4))


def tree_step(requests: list[int]) -> tuple[TreeAttentionStep, dict[int, torch.Tensor]]:
    """Requests in `requests` verify trees (a star for the first, a branching tree for
    the others); the rest are causal."""
    longest = max(QUERY_LENS)
    causal = torch.ones(longest, longest, dtype=torch.bool).tril()
    star = torch.eye(longest, dtype=torch.bool)
    star[:, 0] = True
    branching = causal.clone()
    branching[2, 1] = False  # node 2 is a second child of the root
    branching[3:, 2] = False  # nodes 3.. descend from node 1
    tree_masks = {request: star if index == 0 else branching for index, request in enumerate(requests)}
    masks = torch.stack([tree_masks.get(r, causal) for r in range(len(QUERY_LENS))])
    return TreeAttentionStep(torch.tensor(requests), masks), tree_masks


def test_hybrid_verification_of_trees_masks_each_tree_by_its_ancestors() -> None:
    data = verification_batch("cpu_vec", seed=1)
    step, tree_masks = tree_step([0, 2])
    scale = HEAD_DIM**-0.5
    path = HybridVerificationAttention(
        scale, max(QUERY_LENS), cpu_prefix_attention, tree_masks=SimpleNamespace(attention_step=lambda: step)
    )
    output = torch.zeros_like(data["query"])
    assert path.handles(SimpleNamespace(max_query_len=1))
    path(data["query"], data["key"], data["value"], data["raw"], data["batch"], output, None)
    num_tokens = data["batch"].num_actual_tokens
    expected = causal_attention(data, scale, tree_masks)
    torch.testing.assert_close(output[:num_tokens], expected, rtol=1e-5, atol=1e-5)


def test_a_batch_with_prompt_chunks_recomputes_only_the_tree_requests() -> None:
    """Request 2 brings more tokens than a verification holds: the backend computes the
    whole batch causally, once, then the tree requests' rows are computed again, masked
    (request 0 a star, request 3 a branching tree of 4 nodes; both differ from causal)."""
    query_lens = [3, 1, 5, 4]
    data = verification_batch("cpu_vec", seed=2, query_lens=query_lens)
    step, tree_masks = tree_step([0, 3])
    scale = HEAD_DIM**-0.5
    path = HybridVerificationAttention(
        scale, max(query_lens) - 1, cpu_prefix_attention, tree_masks=SimpleNamespace(attention_step=lambda: step)
    )
    output = torch.zeros_like(data["query"])
    num_tokens = data["batch"].num_actual_tokens
    backend_calls = []

    def backend() -> None:
        backend_calls.append(True)
        output[:num_tokens] = causal_attention(data, scale)

    path(data["query"], data["key"], data["value"], data["raw"], data["batch"], output, backend)
    assert len(backend_calls) == 1
    expected = causal_attention(data, scale, tree_masks)
    torch.testing.assert_close(output[:num_tokens], expected, rtol=1e-5, atol=1e-5)
    starts = [sum(query_lens[:request]) for request in range(len(query_lens) + 1)]
    causal = causal_attention(data, scale)
    for request in tree_masks:
        rows = slice(starts[request], starts[request + 1])
        assert not torch.allclose(expected[rows], causal[rows]), request


def installed_vllm_source(relative: str) -> str | None:
    """A file of the installed vLLM, read without importing it (GPU extensions do not
    load without a GPU); None where this vLLM build has no such file."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path.read_text() if path.exists() else None


@pytest.mark.skipif(
    installed_vllm_source("vllm_flash_attn/flash_attn_interface.py") is None,
    reason="this vLLM build has no vllm_flash_attn",
)
def test_the_gpu_prefix_call_matches_the_installed_flash_attention_signature() -> None:
    """The keywords the GPU prefix path passes are parameters of the installed vLLM's
    `flash_attn_varlen_func`, and its `fa_utils` (where the access layer imports it from)
    still re-exports the function."""
    import ast

    calls: list[dict[str, Any]] = []

    def recording_stand_in(**kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(kwargs)
        return flash_attn_stand_in(**kwargs)

    data = verification_batch("flash_attn")
    flash_attn_prefix_attention(
        data["query"][: data["batch"].num_actual_tokens],
        data["raw"],
        data["batch"],
        torch.tensor(PREFIX_LENS, dtype=torch.int32),
        HEAD_DIM**-0.5,
        varlen_attention=recording_stand_in,
    )
    interface = ast.parse(installed_vllm_source("vllm_flash_attn/flash_attn_interface.py") or "")
    [function] = [
        node for node in interface.body
        if isinstance(node, ast.FunctionDef) and node.name == "flash_attn_varlen_func"
    ]
    parameters = {arg.arg for arg in function.args.args + function.args.kwonlyargs}
    assert set(calls[0]) <= parameters
    assert "flash_attn_varlen_func" in (installed_vllm_source("v1/attention/backends/fa_utils.py") or "")
