"""Compact draft positions: kept blocks re-rotated to sit right before the newest tokens.

vLLM caches keys after RoPE. RoPE angles grow linearly with the position, so a key
rotated for position p becomes the key for position p + s after one more rotation by s.
A working copy of each kept block, rotated by its own shift, places the kept blocks side
by side, ending where the tail of newest tokens starts. Queries and tail keys keep their
absolute positions: attention depends only on position differences, so the draft sees
exactly what it would see on a prompt made of the kept tokens and the tail.

The copies live in KV cache blocks the scheduler never hands out.
"""

from __future__ import annotations

import dataclasses

import torch

from specextend_vllm import kv_cache_layout

# A working copy may take at most this share of the KV cache's blocks, all copies together.
MAX_WORKING_COPY_SHARE = 0.25


@dataclasses.dataclass
class DraftRotation:
    """The draft's rotary embedding, as the working copies re-rotate keys with it."""

    cos_sin: torch.Tensor  # [positions, rotary_dim], float32: cosines, then sines
    rotary_dim: int
    is_neox_style: bool


def kept_block_shifts(
    kept_blocks: torch.Tensor,
    num_kept_blocks: torch.Tensor,
    tail_start_block: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """Positions each kept block moves forward so that the kept blocks end where the
    tail starts. Columns past a row's count are meaningless.

    Blocks 1, 4 and 6 kept, the tail starting at block 9: they land on blocks 6, 7, 8.

    >>> kept_block_shifts(torch.tensor([[1, 4, 6]]), torch.tensor([3]), torch.tensor([9]), 16)
    tensor([[80, 48, 32]])
    """
    columns = torch.arange(kept_blocks.shape[1], device=kept_blocks.device)[None, :]
    landing = tail_start_block[:, None] - num_kept_blocks[:, None] + columns
    return (landing - kept_blocks) * block_size


def rotate_keys(
    keys: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int, is_neox_style: bool
) -> torch.Tensor:
    """Rotates each block's keys by one angle per frequency.

    keys: [n, block_size, kv_heads, head_dim]; cos_sin: [n, rotary_dim], the cosines
    then the sines, as a row of vLLM's `cos_sin_cache`. Dimensions past `rotary_dim`
    are not rotated. Neox style, head_dim 2: a quarter turn (cos 0, sin 1) of the key (1, 0):

    >>> rotate_keys(torch.tensor([1.0, 0.0]).view(1, 1, 1, 2), torch.tensor([[0.0, 1.0]]), 2, True)
    tensor([[[[0., 1.]]]])
    """
    cos, sin = cos_sin[:, None, None, :].float().chunk(2, dim=-1)
    rotated = keys.float().clone()
    if is_neox_style:
        first, second = rotated[..., : rotary_dim // 2], rotated[..., rotary_dim // 2 : rotary_dim]
    else:
        first, second = rotated[..., 0:rotary_dim:2], rotated[..., 1:rotary_dim:2]
    new_first = first * cos - second * sin
    new_second = second * cos + first * sin
    first.copy_(new_first)
    second.copy_(new_second)
    return rotated.to(keys.dtype)


def copy_rotated_blocks(
    raw_cache: torch.Tensor,
    sources: torch.Tensor,
    destinations: torch.Tensor,
    cos_sin: torch.Tensor,
    rotation: DraftRotation,
) -> None:
    """Copies whole blocks `sources[i]` -> `destinations[i]` of a paged KV cache in either
    layout (see `kv_cache_layout`), then rotates the copied keys by `cos_sin[i]`
    ([n, rotary_dim]); values are copied unchanged."""
    kv_cache_layout.copy_blocks(raw_cache, sources, destinations)
    keys = kv_cache_layout.key_cache_view(raw_cache)
    keys[destinations] = rotate_keys(
        keys[destinations], cos_sin, rotation.rotary_dim, rotation.is_neox_style
    )


def reserved_manager_blocks(
    num_blocks: int, max_num_seqs: int, max_kept_tokens: int, block_size: int
) -> int:
    """KV cache blocks (of the scheduler's size) set aside for working copies: one copy
    of `max_kept_tokens` per concurrent request, within `MAX_WORKING_COPY_SHARE` of the
    cache. 1000 blocks of 128 tokens, 256 requests, 1024 kept tokens: 31 copies of 8 blocks.

    >>> reserved_manager_blocks(1000, 256, 1024, 128)
    248
    """
    blocks_per_copy = -(-max_kept_tokens // block_size)
    num_copies = min(max_num_seqs, int(num_blocks * MAX_WORKING_COPY_SHARE) // blocks_per_copy)
    return num_copies * blocks_per_copy


class WorkingCopies:
    """Where each request slot's working copy lives: copy c takes the kernel blocks
    first_block + c * blocks_per_copy onwards. Slots from `num_copies` on have none
    and draft with absolute positions."""

    def __init__(
        self, first_block: int, num_blocks: int, blocks_per_copy: int, device: torch.device
    ):
        self.blocks_per_copy = blocks_per_copy
        self.num_copies = num_blocks // blocks_per_copy if blocks_per_copy else 0
        self._block_ids = (
            (first_block + torch.arange(self.num_copies * blocks_per_copy, device=device))
            .view(self.num_copies, blocks_per_copy)
            .to(torch.int32)
        )

    def has_copy(self, slots: torch.Tensor) -> torch.Tensor:
        return slots < self.num_copies

    def block_ids(self, slots: torch.Tensor) -> torch.Tensor:
        """[len(slots), blocks_per_copy] block ids; rows of slots without a copy repeat copy 0."""
        return self._block_ids[torch.where(self.has_copy(slots), slots, 0)]
