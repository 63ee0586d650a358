"""The chunk-scores op: C++ kernel against the torch reference, and the reference
against attention computed directly from dense keys."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from specextend_vllm import ops

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


def key_cache_view(raw: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "cpu_vec":
        return ops.cpu_vec_key_cache_view(raw)
    return ops.flash_attn_key_cache_view(raw)


def make_paged_batch(
    context_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    block_size: int,
    layout: str,
    cache_dtype: torch.dtype = torch.float32,
    query_dtype: torch.dtype = torch.float32,
    seed: int = 0,
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
        torch.randn(n, num_kv_heads, HEAD_DIM, generator=generator).to(cache_dtype).float()
        for n in context_lens
    ]
    raw = scatter_into_raw_cache(
        dense_keys, block_table, num_blocks, block_size, layout, cache_dtype, generator
    )
    query = torch.randn(len(context_lens), num_q_heads, HEAD_DIM, generator=generator)
    return PagedBatch(
        query=query.to(query_dtype),
        dense_keys=dense_keys,
        raw_cache=raw,
        key_cache=key_cache_view(raw, layout),
        block_table=block_table,
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        scale=HEAD_DIM**-0.5,
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


def ragged_context_lens(block_size: int) -> list[int]:
    """A full block, a partial last block, a single token, several blocks plus one."""
    return [block_size, 2 * block_size + block_size // 2 + 3, 1, 4 * block_size + 1]


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


def test_op_registration_and_fake_kernel() -> None:
    batch = make_paged_batch([40, 7], 4, 2, 16, "flash_attn")
    torch.library.opcheck(
        torch.ops.specextend.chunk_scores.default,
        (batch.query, batch.key_cache, batch.block_table, batch.context_lens, 16, batch.scale, 3),
    )
