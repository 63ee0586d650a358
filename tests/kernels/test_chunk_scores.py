"""The chunk-scores op on the CPU: C++ kernel against the torch reference, and the reference
against attention computed directly from dense keys."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from specextend_vllm import ops
from tests.paged_cache import (
    HEAD_COUNTS,
    LAYOUTS,
    PagedBatch,
    make_paged_batch,
    ragged_context_lens,
)


def dense_chunk_scores(
    query: torch.Tensor, keys: torch.Tensor, chunk_size: int, scale: float, num_chunks: int
) -> torch.Tensor:
    """Scores of one request from its dense keys [L, Hkv, D] and query [Hq, D]."""
    num_q_heads, num_kv_heads = query.shape[0], keys.shape[1]
    head_keys = keys.float().repeat_interleave(num_q_heads // num_kv_heads, dim=1)  # [L, Hq, D]
    logits = torch.einsum("hd,lhd->hl", query.float(), head_keys) * scale
    token_scores = torch.softmax(logits, dim=-1).mean(dim=0)
    scores = torch.full((num_chunks,), float("-inf"))
    for chunk, chunk_tokens in enumerate(token_scores.split(chunk_size)):
        scores[chunk] = chunk_tokens.mean()
    return scores


def run_both(
    batch: PagedBatch, chunk_size: int, num_chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel scores, reference scores)."""
    args = (
        batch.query,
        batch.key_cache,
        batch.block_table,
        batch.context_lens,
        chunk_size,
        batch.scale,
        num_chunks,
    )
    return ops.chunk_scores(*args), ops.chunk_scores_reference(*args)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_blocks", [1, 2])
@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", HEAD_COUNTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_matches_reference(
    layout: str,
    num_q_heads: int,
    num_kv_heads: int,
    block_size: int,
    chunk_blocks: int,
    cache_dtype: torch.dtype,
) -> None:
    context_lens = ragged_context_lens(block_size)
    batch = make_paged_batch(
        context_lens, num_q_heads, num_kv_heads, block_size, layout, cache_dtype, cache_dtype
    )
    chunk_size = chunk_blocks * block_size
    num_chunks = math.ceil(max(context_lens) / chunk_size) + 1
    scores, expected = run_both(batch, chunk_size, num_chunks)

    assert scores.dtype == torch.float32 and scores.shape == (len(context_lens), num_chunks)
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-7)
    for request, context_len in enumerate(context_lens):
        num_filled = math.ceil(context_len / chunk_size)
        assert torch.isfinite(scores[request, :num_filled]).all()
        assert torch.isneginf(scores[request, num_filled:]).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_mixed_dtypes_and_strided_query(layout: str) -> None:
    batch = make_paged_batch([70, 33], 8, 2, 16, layout, torch.float16, torch.float32, seed=1)
    head_major_query = batch.query.to(torch.bfloat16).transpose(0, 1).contiguous()
    batch.query = head_major_query.transpose(0, 1)
    assert not batch.query.is_contiguous()
    scores, expected = run_both(batch, chunk_size=32, num_chunks=3)
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", HEAD_COUNTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_matches_dense_attention(
    layout: str, num_q_heads: int, num_kv_heads: int, block_size: int
) -> None:
    context_lens = ragged_context_lens(block_size)
    batch = make_paged_batch(context_lens, num_q_heads, num_kv_heads, block_size, layout, seed=2)
    chunk_size = 2 * block_size
    num_chunks = math.ceil(max(context_lens) / chunk_size) + 1
    expected = torch.stack(
        [
            dense_chunk_scores(batch.query[b], keys, chunk_size, batch.scale, num_chunks)
            for b, keys in enumerate(batch.dense_keys)
        ]
    )
    _, reference = run_both(batch, chunk_size, num_chunks)
    torch.testing.assert_close(reference, expected, rtol=1e-5, atol=1e-8)


def test_scores_are_attention_mass_per_token() -> None:
    batch = make_paged_batch([100, 37], 12, 2, 16, "cpu_vec", seed=3)
    scores, _ = run_both(batch, chunk_size=16, num_chunks=7)
    chunk_tokens = (batch.context_lens[:, None] - torch.arange(7) * 16).clamp(0, 16)
    total_mass = (scores.nan_to_num(neginf=0.0) * chunk_tokens).sum(dim=1)
    torch.testing.assert_close(total_mass, torch.ones(2))


def test_kernel_is_stable_for_large_logits() -> None:
    """Logits in the hundreds overflow exp() unless every chunk's softmax state is taken
    relative to its maximum and rescaled when merged into the row's."""
    batch = make_paged_batch([300, 129], 6, 2, 16, "cpu_vec", seed=4)
    batch.scale = 8.0
    scores, expected = run_both(batch, chunk_size=16, num_chunks=19)
    assert torch.isfinite(scores[0]).all()
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "context_len,num_chunks,message",
    [(0, 4, "context_lens"), (65, 5, "context_lens"), (64, 1, "num_chunks")],
)
def test_kernel_rejects_bad_inputs(context_len: int, num_chunks: int, message: str) -> None:
    batch = make_paged_batch([64], 4, 4, 16, "cpu_vec")
    block_table = batch.block_table[:, :4]  # room for 64 tokens
    context_lens = torch.tensor([context_len], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=message):
        ops.chunk_scores(
            batch.query, batch.key_cache, block_table, context_lens, 16, batch.scale, num_chunks
        )


ChunkScoresArgs = dict[str, object]


def chunk_scores_args(batch: PagedBatch) -> ChunkScoresArgs:
    """Valid arguments: contexts of 64 tokens, chunks of 16."""
    return {
        "query": batch.query,
        "key_cache": batch.key_cache,
        "block_table": batch.block_table,
        "context_lens": batch.context_lens,
        "chunk_size": 16,
        "scale": batch.scale,
        "num_chunks": 4,
    }


@pytest.mark.parametrize(
    "name,bad_value,message",
    [
        ("query", lambda args: args["query"][0], r"query must be \[B, Hq, D\]"),
        ("query", lambda args: args["query"][..., :32], "does not match query head_dim"),
        ("query", lambda args: args["query"][:, :3], "must be a multiple of num kv heads"),
        ("key_cache", lambda args: args["key_cache"][0], "key_cache must be a"),
        ("key_cache", lambda args: args["key_cache"].double(), "float32, float16 or bfloat16"),
        ("block_table", lambda args: args["block_table"].long(), "block_table must be a 2-D int32"),
        ("block_table", lambda args: args["block_table"] + 1000, r"block_table\[0, 0\]"),
        ("context_lens", lambda args: args["context_lens"].repeat(2), "batch size 1"),
        ("chunk_size", lambda args: 0, "chunk_size must be positive"),
    ],
)
def test_kernel_rejects_malformed_inputs(
    name: str, bad_value: Callable[[ChunkScoresArgs], object], message: str
) -> None:
    args = chunk_scores_args(make_paged_batch([64], 4, 2, 16, "flash_attn"))
    args[name] = bad_value(args)
    with pytest.raises(RuntimeError, match=message):
        ops.chunk_scores(**args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_registration_and_fake_kernel(dtype: torch.dtype) -> None:
    """The fake kernel's outputs are the kernel's: float32 whatever the inputs' dtype."""
    batch = make_paged_batch([40, 7], 4, 2, 16, "flash_attn")
    torch.library.opcheck(
        torch.ops.specextend.chunk_scores.default,
        (
            batch.query.to(dtype), batch.key_cache.to(dtype), batch.block_table,
            batch.context_lens, 16, batch.scale, 3,
        ),
    )
