"""Every helper that depends on the KV cache layout, on CPU tensors in vLLM's CPU layout
and in FlashAttention's GPU layout: key views, block copies and working copies."""

from __future__ import annotations

import pytest
import torch

from specextend_vllm import kv_cache_layout
from specextend_vllm.algorithm.positions import DraftRotation, copy_rotated_blocks, rotate_keys
from tests.paged_cache import HEAD_DIM, LAYOUTS, make_paged_batch

BLOCK_SIZE = 16


value_view = kv_cache_layout.value_cache_view


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
def test_block_copies_move_keys_and_values_and_nothing_else(layout: str) -> None:
    raw = make_paged_batch([64], 4, 2, BLOCK_SIZE, layout).raw_cache
    before = raw.clone()
    sources, destinations = torch.tensor([0, 2]), torch.tensor([5, 1])
    kv_cache_layout.copy_blocks(raw, sources, destinations)
    for view in (kv_cache_layout.key_cache_view, value_view):
        torch.testing.assert_close(view(raw)[destinations], view(before)[sources])
        untouched = [b for b in range(view(raw).shape[0]) if b not in (5, 1)]
        torch.testing.assert_close(view(raw)[untouched], view(before)[untouched])


@pytest.mark.parametrize("is_neox_style", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_working_copies_hold_rotated_keys_and_unchanged_values(
    layout: str, is_neox_style: bool
) -> None:
    raw = make_paged_batch([80], 4, 2, BLOCK_SIZE, layout, seed=4).raw_cache
    before = raw.clone()
    angles = torch.rand(2, HEAD_DIM // 2) * 6.28
    rotation = DraftRotation(
        torch.cat([angles.cos(), angles.sin()], dim=1), HEAD_DIM, is_neox_style
    )
    sources, destinations = torch.tensor([3, 0]), torch.tensor([6, 7])
    copy_rotated_blocks(raw, sources, destinations, rotation.cos_sin, rotation)

    old_keys = kv_cache_layout.key_cache_view(before)[sources].contiguous()
    expected = rotate_keys(old_keys, rotation.cos_sin, HEAD_DIM, is_neox_style)
    torch.testing.assert_close(kv_cache_layout.key_cache_view(raw)[destinations], expected)
    torch.testing.assert_close(value_view(raw)[destinations], value_view(before)[sources])
    torch.testing.assert_close(kv_cache_layout.key_cache_view(raw)[sources], old_keys)


def test_cpu_layout_rejects_a_cache_with_strided_slabs() -> None:
    raw = torch.zeros(4, 2, 16, 128).transpose(2, 3)
    with pytest.raises(ValueError, match="contiguous"):
        kv_cache_layout.cpu_vec_key_cache_view(raw)
