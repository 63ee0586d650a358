"""Compact positions: re-rotated keys against keys rotated directly by vLLM's RoPE."""

from __future__ import annotations

import pytest
import torch

from specextend_vllm.algorithm.kv_cache_layout import cpu_vec_key_cache_view
from specextend_vllm.vllm_access.rotary import extend_draft_rotary_table
from specextend_vllm.algorithm.positions import (
    WorkingCopies,
    packed_chunk_tokens,
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


def test_packed_chunks_end_where_the_tail_starts() -> None:
    """Chunks of 4 tokens: request 0 keeps chunks 1, 4 and 6 before a tail at 36, request 1
    keeps only chunk 0 before a tail at 8."""
    sources, shifts, is_kept = packed_chunk_tokens(
        torch.tensor([[1, 4, 6], [0, 9, 9]]), torch.tensor([3, 1]), 4, torch.tensor([36, 8])
    )
    landing = sources + shifts
    assert landing[0].tolist() == list(range(24, 36))
    assert sources[0].tolist() == [4, 5, 6, 7, 16, 17, 18, 19, 24, 25, 26, 27]
    assert is_kept[1].tolist() == [True] * 4 + [False] * 8
    assert landing[1, :4].tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("is_neox_style", [True, False])
@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, HEAD_DIM // 2])
def test_rerotated_keys_equal_keys_rotated_at_the_new_positions(
    is_neox_style: bool, rotary_dim: int
) -> None:
    """Keys rotated at their prompt positions, then moved by their shifts, equal the same
    raw keys rotated by vLLM at the compact positions."""
    torch.manual_seed(0)
    max_positions = 4096
    rope = vllm_rope(is_neox_style, rotary_dim, max_positions)
    table = rope._compute_cos_sin_cache().float()
    old_positions = torch.tensor([200, 201, 37, 150, 151, 152])
    shifts = torch.tensor([1000, 1000, 5, 3500, 3500, 3500])
    raw = torch.randn(len(old_positions), NUM_KV_HEADS, HEAD_DIM)
    cached = rotated_keys(rope, raw, old_positions)
    moved = rotate_keys(cached, table[shifts], rotary_dim, is_neox_style)
    direct = rotated_keys(rope, raw, old_positions + shifts)
    # vLLM's fp32 table holds each angle to within position * 2**-24 radians.
    torch.testing.assert_close(moved, direct, atol=1e-3, rtol=1e-3)


def test_rotate_keys_reads_strided_cache_views() -> None:
    """The CPU cache stores keys transposed inside a block; the view is not contiguous."""
    torch.manual_seed(0)
    raw_cache = torch.randn(4, NUM_KV_HEADS, BLOCK_SIZE, 2 * HEAD_DIM)
    keys = cpu_vec_key_cache_view(raw_cache)
    table = vllm_rope(True)._compute_cos_sin_cache().float()
    blocks, offsets = torch.tensor([2, 3]), torch.tensor([5, 0])
    expected = rotate_keys(keys[blocks, offsets].contiguous(), table[[7, 9]], HEAD_DIM, True)
    keys[blocks, offsets] = rotate_keys(keys[blocks, offsets], table[[7, 9]], HEAD_DIM, True)
    torch.testing.assert_close(cpu_vec_key_cache_view(raw_cache)[blocks, offsets], expected)


@pytest.mark.parametrize("is_neox_style", [True, False])
def test_draft_rotary_table_extends_past_the_trained_length(is_neox_style: bool) -> None:
    """... and the rotation the working copies re-rotate with is the draft's: its table,
    its rotary dimension (half the head here) and its layout."""
    rope = vllm_rope(is_neox_style, rotary_dim=HEAD_DIM // 2, max_positions=256)
    model = torch.nn.ModuleDict({"rotary": rope})
    rotation = extend_draft_rotary_table(model, 1024)
    assert rotation is not None and rope.cos_sin_cache.shape[0] == 1024
    reference = vllm_rope(is_neox_style, HEAD_DIM // 2, max_positions=1024)._compute_cos_sin_cache()
    torch.testing.assert_close(rope.cos_sin_cache, reference)
    torch.testing.assert_close(rotation.cos_sin, reference)
    assert (rotation.rotary_dim, rotation.is_neox_style) == (HEAD_DIM // 2, is_neox_style)


def test_reserved_blocks_stay_within_a_quarter_of_the_cache() -> None:
    assert reserved_manager_blocks(1000, 256, 1024, 128) == 31 * 8
    assert reserved_manager_blocks(100_000, 4, 1024, 128) == 4 * 8


def test_working_copies_by_slot() -> None:
    copies = WorkingCopies(
        first_block=90, num_blocks=6, blocks_per_copy=3, device=torch.device("cpu")
    )
    slots = torch.tensor([1, 0, 2, 5])
    assert copies.has_copy(slots).tolist() == [True, True, False, False]
    assert copies.block_ids(slots)[:2].tolist() == [[93, 94, 95], [90, 91, 92]]
