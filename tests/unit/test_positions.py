"""Compact positions: re-rotated keys against keys rotated directly by vLLM's RoPE."""

from __future__ import annotations

import pytest
import torch

from specextend_vllm.kv_cache_layout import cpu_vec_key_cache_view
from specextend_vllm.patches.model import extend_draft_rotary_table
from specextend_vllm.algorithm.positions import (
    WorkingCopies,
    kept_block_shifts,
    reserved_manager_blocks,
    rotate_keys,
)

HEAD_DIM = 64
NUM_KV_HEADS = 2
BLOCK_SIZE = 16


def vllm_rope(
    is_neox_style: bool, rotary_dim: int = HEAD_DIM, max_positions: int = 256
) -> torch.nn.Module:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        return get_rope(
            HEAD_DIM,
            max_position=max_positions,
            is_neox_style=is_neox_style,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": rotary_dim / HEAD_DIM,
            },
            dtype=torch.float32,
        )


def rotated_keys(
    rope: torch.nn.Module, raw_keys: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """raw_keys [tokens, kv_heads, head_dim] rotated by vLLM's own op at `positions`."""
    flat = raw_keys.reshape(raw_keys.shape[0], -1).clone()
    _, keys = rope.forward_native(positions, flat.clone(), flat)
    return keys.view_as(raw_keys)


def test_kept_block_shifts_land_kept_blocks_before_the_tail() -> None:
    shifts = kept_block_shifts(torch.tensor([[1, 4, 6]]), torch.tensor([3]), torch.tensor([9]), 16)
    assert shifts.tolist() == [[80, 48, 32]]


@pytest.mark.parametrize("is_neox_style", [True, False])
@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, HEAD_DIM // 2])
def test_rerotated_keys_equal_keys_rotated_at_the_new_positions(
    is_neox_style: bool, rotary_dim: int
) -> None:
    """A kept block of keys rotated at its prompt positions, then moved by its shift,
    equals the same raw keys rotated by vLLM at the compact positions."""
    torch.manual_seed(0)
    max_positions = 4096
    rope = vllm_rope(is_neox_style, rotary_dim, max_positions)
    table = rope._compute_cos_sin_cache().float()
    blocks_at = torch.tensor([200, 37, 150])
    shifts = torch.tensor([1000, 5, 3500])
    raw = torch.randn(len(blocks_at), BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    offsets = torch.arange(BLOCK_SIZE)
    old_positions = (blocks_at[:, None] + offsets).flatten()
    cached = rotated_keys(rope, raw.flatten(0, 1), old_positions).view_as(raw)
    moved = rotate_keys(cached, table[shifts], rotary_dim, is_neox_style)
    direct = rotated_keys(
        rope, raw.flatten(0, 1), old_positions + shifts.repeat_interleave(BLOCK_SIZE)
    ).view_as(raw)
    # vLLM's fp32 table holds each angle to within position * 2**-24 radians.
    torch.testing.assert_close(moved, direct, atol=1e-3, rtol=1e-3)


def test_rotate_keys_reads_strided_cache_views() -> None:
    """The CPU cache stores keys transposed inside a block; the view is not contiguous."""
    torch.manual_seed(0)
    raw_cache = torch.randn(4, NUM_KV_HEADS, BLOCK_SIZE, 2 * HEAD_DIM)
    keys = cpu_vec_key_cache_view(raw_cache)
    table = vllm_rope(True)._compute_cos_sin_cache().float()
    expected = rotate_keys(keys[[2, 3]].contiguous(), table[[7, 9]], HEAD_DIM, True)
    keys[[2, 3]] = rotate_keys(keys[[2, 3]], table[[7, 9]], HEAD_DIM, True)
    torch.testing.assert_close(cpu_vec_key_cache_view(raw_cache)[[2, 3]], expected)


def test_draft_rotary_table_extends_past_the_trained_length() -> None:
    rope = vllm_rope(True, max_positions=256)
    model = torch.nn.ModuleDict({"rotary": rope})
    rotation = extend_draft_rotary_table(model, 1024)
    assert rotation is not None and rope.cos_sin_cache.shape[0] == 1024
    reference = vllm_rope(True, max_positions=1024)._compute_cos_sin_cache()
    torch.testing.assert_close(rope.cos_sin_cache, reference)
    torch.testing.assert_close(rotation.cos_sin, reference)


def test_reserved_blocks_stay_within_a_quarter_of_the_cache() -> None:
    assert reserved_manager_blocks(1000, 256, 1024, 128) == 31 * 8
    assert reserved_manager_blocks(100_000, 4, 1024, 128) == 4 * 8


def test_working_copies_by_slot() -> None:
    copies = WorkingCopies(
        first_block=90, num_blocks=6, blocks_per_copy=3, device=torch.device("cpu")
    )
    slots = torch.tensor([1, 0, 5])
    assert copies.has_copy(slots).tolist() == [True, True, False]
    assert copies.block_ids(slots)[:2].tolist() == [[93, 94, 95], [90, 91, 92]]
