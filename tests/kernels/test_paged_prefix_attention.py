"""The paged prefix-attention op on the CPU: C++ kernel against the torch reference, the
reference against attention computed directly from dense keys and values, and the merge by
log-sum-exp that the op exists for."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from specextend_vllm import ops
from specextend_vllm.algorithm.kv_cache_layout import value_cache_view
from tests.paged_cache import (
    HEAD_DIM,
    LAYOUTS,
    make_paged_batch,
    ragged_context_lens,
    scatter_values_into_raw_cache,
)

# (query heads, kv heads): GQA groups of 1, 2, 4, 8 and Qwen2.5-1.5B's 6.
GQA_HEAD_COUNTS = [(2, 2), (4, 2), (8, 2), (16, 2), (12, 2)]


@dataclass
class PrefixBatch:
    query: torch.Tensor  # [T, Hq, D]; rows from query_start_loc[-1] on are padding
    key_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D] view
    value_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D] view
    block_table: torch.Tensor  # [R, W] int32
    prefix_lens: torch.Tensor  # [R] int32
    query_start_loc: torch.Tensor  # [R + 1] int32
    scale: float
    dense_keys: list[torch.Tensor]  # per request [L_r, Hkv, D], float32
    dense_values: list[torch.Tensor]  # per request [L_r, Hkv, D], float32

    def args(self) -> tuple[object, ...]:
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_table,
            self.prefix_lens,
            self.query_start_loc,
            self.scale,
        )


def make_prefix_batch(
    prefix_lens: list[int],
    query_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    block_size: int,
    layout: str,
    cache_dtype: torch.dtype = torch.float32,
    query_dtype: torch.dtype = torch.float32,
    num_padding_rows: int = 0,
    seed: int = 0,
    head_dim: int = HEAD_DIM,
) -> PrefixBatch:
    """Random keys and values (stored at cache precision) in shuffled blocks, and
    query_lens[r] random query tokens for request r, then num_padding_rows more."""
    paged = make_paged_batch(
        prefix_lens,
        num_q_heads,
        num_kv_heads,
        block_size,
        layout,
        cache_dtype,
        seed=seed,
        head_dim=head_dim,
    )
    generator = torch.Generator().manual_seed(seed + 1000)
    dense_values = [
        torch.randn(n, num_kv_heads, head_dim, generator=generator).to(cache_dtype).float()
        for n in prefix_lens
    ]
    scatter_values_into_raw_cache(
        dense_values, paged.block_table, paged.raw_cache, block_size, layout
    )
    num_tokens = sum(query_lens) + num_padding_rows
    query = torch.randn(num_tokens, num_q_heads, head_dim, generator=generator)
    return PrefixBatch(
        query=query.to(query_dtype),
        key_cache=paged.key_cache,
        value_cache=value_cache_view(paged.raw_cache),
        block_table=paged.block_table,
        prefix_lens=paged.context_lens,
        query_start_loc=torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32),
        scale=paged.scale,
        dense_keys=paged.dense_keys,
        dense_values=dense_values,
    )


def dense_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [n, Hq, D], lse [Hq, n]) of queries [n, Hq, D] over keys and values [L, Hkv, D]."""
    group_size = query.shape[1] // keys.shape[1]
    head_keys = keys.float().repeat_interleave(group_size, dim=1)  # [L, Hq, D]
    head_values = values.float().repeat_interleave(group_size, dim=1)
    logits = torch.einsum("nhd,lhd->hnl", query.float(), head_keys) * scale
    output = torch.einsum("hnl,lhd->nhd", torch.softmax(logits, dim=-1), head_values)
    return output, torch.logsumexp(logits, dim=-1)


def run_both(
    batch: PrefixBatch,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """((kernel output, kernel lse), (reference output, reference lse))."""
    args = batch.args()
    return ops.paged_prefix_attention(*args), ops.paged_prefix_attention_reference(*args)


def assert_close(actual: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> None:
    for actual_tensor, expected_tensor in zip(actual, expected, strict=True):
        torch.testing.assert_close(actual_tensor, expected_tensor, rtol=1e-4, atol=1e-5)


def ragged_prefix_lens(block_size: int) -> list[int]:
    """A full block, a partial last block, a single token, several blocks plus one, empty."""
    return [*ragged_context_lens(block_size), 0]


QUERY_LENS = [3, 16, 1, 5, 2]  # per request of ragged_prefix_lens


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", GQA_HEAD_COUNTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_matches_reference(
    layout: str, num_q_heads: int, num_kv_heads: int, block_size: int, cache_dtype: torch.dtype
) -> None:
    batch = make_prefix_batch(
        ragged_prefix_lens(block_size),
        QUERY_LENS,
        num_q_heads,
        num_kv_heads,
        block_size,
        layout,
        cache_dtype,
        cache_dtype,
        num_padding_rows=2,
    )
    (output, lse), expected = run_both(batch)

    num_tokens = batch.query.shape[0]
    assert output.dtype == lse.dtype == torch.float32
    assert output.shape == (num_tokens, num_q_heads, HEAD_DIM)
    assert lse.shape == (num_q_heads, num_tokens)
    assert_close((output, lse), expected)
    empty_prefix_rows = [
        *range(int(batch.query_start_loc[-2]), int(batch.query_start_loc[-1])),
        num_tokens - 2,
        num_tokens - 1,
    ]
    assert (output[empty_prefix_rows] == 0).all()
    assert torch.isneginf(lse[:, empty_prefix_rows]).all()
    assert torch.isfinite(lse[:, : empty_prefix_rows[0]]).all()


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_matches_reference_at_qwen_shapes(layout: str, cache_dtype: torch.dtype) -> None:
    """Qwen2.5-1.5B's heads (12 query, 2 KV, 128 dims: keys summed over in two spans) in
    128-token blocks, with 1 to 17 query tokens a request: register tiles of both shapes
    (fewer and more than 24 rows a KV head) over full and partial blocks."""
    batch = make_prefix_batch(
        [300, 1000, 129, 64, 700, 0],
        [1, 3, 5, 9, 17, 2],
        12,
        2,
        128,
        layout,
        cache_dtype,
        seed=8,
        head_dim=128,
    )
    assert_close(*run_both(batch))


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (8, 2), (12, 2)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference_matches_dense_attention(
    layout: str, num_q_heads: int, num_kv_heads: int, block_size: int
) -> None:
    prefix_lens = ragged_context_lens(block_size)
    query_lens = QUERY_LENS[: len(prefix_lens)]
    batch = make_prefix_batch(
        prefix_lens, query_lens, num_q_heads, num_kv_heads, block_size, layout, seed=2
    )
    output, lse = ops.paged_prefix_attention_reference(*batch.args())
    starts = batch.query_start_loc.tolist()
    for request, (keys, values) in enumerate(zip(batch.dense_keys, batch.dense_values)):
        rows = slice(starts[request], starts[request + 1])
        expected = dense_attention(batch.query[rows], keys, values, batch.scale)
        torch.testing.assert_close(output[rows], expected[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse[:, rows], expected[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_threads", [1, 2, 3, 8])
def test_kernel_splits_long_prefixes(num_threads: int) -> None:
    """With several threads, long prefixes are split across them and the parts merged; the
    result must not depend on how."""
    batch = make_prefix_batch([2000, 4100, 37, 700], [4, 9, 2, 1], 12, 2, 16, "cpu_vec", seed=5)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        result, expected = run_both(batch)
    finally:
        torch.set_num_threads(previous_threads)
    assert_close(result, expected)


def test_merge_with_disjoint_keys_is_attention_over_the_union() -> None:
    """Hybrid tree attention: the prefix part merged by LSE with attention over other keys (the
    speculative tokens, here a few random ones per request) is attention over all keys."""
    prefix_lens, query_lens = [45, 0, 130, 16], [3, 2, 9, 1]
    batch = make_prefix_batch(prefix_lens, query_lens, 8, 2, 16, "cpu_vec", seed=6)
    prefix_output, prefix_lse = ops.paged_prefix_attention(*batch.args())
    generator = torch.Generator().manual_seed(7)
    starts = batch.query_start_loc.tolist()
    for request, (keys, values) in enumerate(zip(batch.dense_keys, batch.dense_values)):
        rows = slice(starts[request], starts[request + 1])
        tree_keys, tree_values = torch.randn(2, 4, 2, HEAD_DIM, generator=generator)
        tree_output, tree_lse = dense_attention(
            batch.query[rows], tree_keys, tree_values, batch.scale
        )
        prefix_weight = torch.sigmoid(prefix_lse[:, rows] - tree_lse).T[..., None]  # [n, Hq, 1]
        merged = prefix_weight * prefix_output[rows] + (1 - prefix_weight) * tree_output
        merged_lse = torch.logaddexp(prefix_lse[:, rows], tree_lse)

        expected, expected_lse = dense_attention(
            batch.query[rows],
            torch.cat([keys, tree_keys]),
            torch.cat([values, tree_values]),
            batch.scale,
        )
        torch.testing.assert_close(merged, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(merged_lse, expected_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_mixed_dtypes_and_strided_query(layout: str) -> None:
    batch = make_prefix_batch([70, 33], [4, 7], 8, 2, 16, layout, torch.float16, seed=1)
    head_major_query = batch.query.to(torch.bfloat16).transpose(0, 1).contiguous()
    batch.query = head_major_query.transpose(0, 1)
    assert not batch.query.is_contiguous()
    result, expected = run_both(batch)
    assert_close(result, expected)


def test_kernel_is_stable_for_large_logits() -> None:
    """Logits in the hundreds overflow exp() unless every block's softmax state is taken
    relative to its maximum and rescaled when merged into the row's."""
    batch = make_prefix_batch([300, 129, 1500], [5, 2, 8], 6, 2, 16, "cpu_vec", seed=4)
    batch.scale = 8.0
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (output, lse), expected = run_both(batch)
    finally:
        torch.set_num_threads(previous_threads)
    assert torch.isfinite(output).all() and torch.isfinite(lse).all()
    assert lse.abs().max() > 100
    assert_close((output, lse), expected)


PrefixAttentionArgs = dict[str, object]


def prefix_attention_args(batch: PrefixBatch) -> PrefixAttentionArgs:
    """Valid arguments: one request, a prefix of 64 tokens in blocks of 16, 3 query tokens."""
    return {
        "query": batch.query,
        "key_cache": batch.key_cache,
        "value_cache": batch.value_cache,
        "block_table": batch.block_table,
        "prefix_lens": batch.prefix_lens,
        "query_start_loc": batch.query_start_loc,
        "scale": batch.scale,
    }


def int32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


@pytest.mark.parametrize(
    "name,bad_value,message",
    [
        ("query", lambda args: args["query"][0], r"query must be \[T, Hq, D\]"),
        ("query", lambda args: args["query"][..., :32], "does not match query head_dim"),
        ("query", lambda args: args["query"][:, :3], "must be a multiple of num kv heads"),
        ("query", lambda args: args["query"].double(), "float32, float16 or bfloat16"),
        ("key_cache", lambda args: args["key_cache"][0], "key_cache must be a"),
        ("key_cache", lambda args: args["key_cache"].double(), "float32, float16 or bfloat16"),
        ("value_cache", lambda args: args["value_cache"][:, :8], "value_cache must have the shape"),
        ("value_cache", lambda args: args["value_cache"].half(), "value_cache must have the dtype"),
        ("block_table", lambda args: args["block_table"].long(), "block_table must be a 2-D int32"),
        ("block_table", lambda args: args["block_table"][:, :2], r"prefix_lens\[0\] = 64"),
        ("block_table", lambda args: args["block_table"] + 1000, r"block_table\[0, 0\]"),
        ("block_table", lambda args: args["block_table"].repeat(2, 1), "one row per request"),
        ("prefix_lens", lambda args: args["prefix_lens"].long(), "prefix_lens must be a 1-D int32"),
        ("prefix_lens", lambda args: int32(-1), r"prefix_lens\[0\] = -1 is outside"),
        ("query_start_loc", lambda args: int32(0, 2, 3), r"num requests \+ 1 = 2"),
        ("query_start_loc", lambda args: int32(1, 3), r"query_start_loc\[0\] must be 0"),
        ("query_start_loc", lambda args: int32(0, 4), "at most the number of query tokens, 3"),
        ("query_start_loc", lambda args: int32(0, -1), "non-decreasing"),
    ],
)
def test_kernel_rejects_malformed_inputs(
    name: str, bad_value: Callable[[PrefixAttentionArgs], object], message: str
) -> None:
    args = prefix_attention_args(make_prefix_batch([64], [3], 4, 2, 16, "flash_attn"))
    args[name] = bad_value(args)
    with pytest.raises(RuntimeError, match=message):
        ops.paged_prefix_attention(**args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_registration_and_fake_kernel(dtype: torch.dtype) -> None:
    """The fake kernel's outputs are the kernel's: float32 whatever the inputs' dtype."""
    batch = make_prefix_batch([40, 7, 0], [3, 1, 2], 4, 2, 16, "cpu_vec", num_padding_rows=1)
    args = tuple(
        arg.to(dtype) if isinstance(arg, torch.Tensor) and arg.is_floating_point() else arg
        for arg in batch.args()
    )
    torch.library.opcheck(torch.ops.specextend.paged_prefix_attention.default, args)
