"""Working copies: a request's kept chunks packed side by side in KV blocks of its own.

A copy lets the draft attend to exactly the kept tokens when a chunk is smaller than a KV
block, and places them right before the newest tokens (compact positions). vLLM caches
keys after RoPE. RoPE angles grow linearly with the position, so a key rotated for
position p becomes the key for position p + s after one more rotation by s: each kept
token, rotated by its own shift, lands right before the tail of newest tokens. Queries
and tail keys keep their absolute positions: attention depends only on position
differences, so the draft sees exactly what it would see on a prompt made of the kept
tokens and the tail. On absolute positions the copy is plain: a key's rotation, not its
slot, carries its position.

The copies live in KV cache blocks the scheduler never hands out.
"""

from __future__ import annotations

import dataclasses

import torch

from specextend_vllm.algorithm import kv_cache_layout

# A working copy may take at most this share of the KV cache's blocks, all copies together.
MAX_WORKING_COPY_SHARE = 0.25


@dataclasses.dataclass
class DraftRotation:
    """The draft's rotary embedding, as the working copies re-rotate keys with it."""

    cos_sin: torch.Tensor  # [positions, rotary_dim], float32: cosines, then sines
    rotary_dim: int
    is_neox_style: bool


def packed_chunk_tokens(
    kept_chunks: torch.Tensor,
    num_kept_chunks: torch.Tensor,
    chunk_size: int,
    tail_start: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packs each request's kept chunks side by side into its working copy.

    kept_chunks: [R, K] sorted chunk indices, the first num_kept_chunks[r] of them kept;
    tail_start: [R] the first position of the newest tokens. Returns, for each column of
    the copy ([R, K * chunk_size] each): the position of the token it holds, how far that
    token moves so that the kept tokens end where the tail starts, and whether it is kept.

    Chunks 1 and 4 of 2 tokens kept, the tail starting at 12: tokens 2, 3, 8, 9 land on
    positions 8 to 11.

    >>> sources, shifts, is_kept = packed_chunk_tokens(
    ...     torch.tensor([[1, 4, 7]]), torch.tensor([2]), 2, torch.tensor([12])
    ... )
    >>> sources[0, :4].tolist(), shifts[0, :4].tolist(), is_kept[0].tolist()
    ([2, 3, 8, 9], [6, 6, 2, 2], [True, True, True, True, False, False])
    """
    offsets = torch.arange(chunk_size, device=kept_chunks.device)
    sources = (kept_chunks[:, :, None] * chunk_size + offsets).flatten(1)
    columns = torch.arange(sources.shape[1], device=kept_chunks.device)[None, :]
    kept_tokens = num_kept_chunks[:, None] * chunk_size
    landing = tail_start[:, None] - kept_tokens + columns
    return sources, landing - sources, columns < kept_tokens


def packed_copy_slots(
    block_table: torch.Tensor,
    copy_block_ids: torch.Tensor,
    sources: torch.Tensor,
    is_kept: torch.Tensor,
    block_size: int,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Where each kept token of `packed_chunk_tokens` is read and written, as (block,
    offset) pairs of the paged cache, one entry per kept token in row order.

    block_table: [R, W] the requests' blocks; copy_block_ids: [R, C] their copies' blocks;
    sources, is_kept: [R, C * block_size or less] from `packed_chunk_tokens`.

    Blocks of 4 tokens at [7, 3], a copy in block 9; tokens 5 and 6 kept:

    >>> (src_blocks, src_offsets), (dst_blocks, dst_offsets) = packed_copy_slots(
    ...     torch.tensor([[7, 3]]), torch.tensor([[9]]), torch.tensor([[5, 6, 0, 0]]),
    ...     torch.tensor([[True, True, False, False]]), 4,
    ... )
    >>> src_blocks.tolist(), src_offsets.tolist(), dst_blocks.tolist(), dst_offsets.tolist()
    ([3, 3], [1, 2], [9, 9], [0, 1])
    """
    source_blocks = block_table.gather(1, (sources // block_size).clamp(max=block_table.shape[1] - 1))
    columns = torch.arange(sources.shape[1], device=sources.device).expand_as(sources)
    copy_blocks = copy_block_ids.gather(1, columns // block_size)
    return (
        (source_blocks[is_kept].long(), sources[is_kept] % block_size),
        (copy_blocks[is_kept].long(), columns[is_kept] % block_size),
    )


def rotate_keys(
    keys: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int, is_neox_style: bool
) -> torch.Tensor:
    """Rotates each token's keys by one angle per frequency.

    keys: [n, kv_heads, head_dim]; cos_sin: [n, rotary_dim], the cosines then the sines,
    as a row of vLLM's `cos_sin_cache`. Dimensions past `rotary_dim` are not rotated.
    Neox style, head_dim 2: a quarter turn (cos 0, sin 1) of the key (1, 0):

    >>> rotate_keys(torch.tensor([1.0, 0.0]).view(1, 1, 2), torch.tensor([[0.0, 1.0]]), 2, True)
    tensor([[[0., 1.]]])
    """
    cos, sin = cos_sin[:, None, :].float().chunk(2, dim=-1)
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


def copy_kept_tokens(
    raw_cache: torch.Tensor,
    sources: tuple[torch.Tensor, torch.Tensor],
    destinations: tuple[torch.Tensor, torch.Tensor],
    cos_sin: torch.Tensor | None,
    rotation: DraftRotation | None,
) -> None:
    """Copies tokens (keys and values) of a paged KV cache in either layout (see
    `kv_cache_layout`): token i sits at (block, offset) `sources[0][i], sources[1][i]` and
    goes to `destinations`. With `cos_sin` ([n, rotary_dim]) each copied key is also
    rotated by its row; without it the copy is plain."""
    keys = kv_cache_layout.key_cache_view(raw_cache)
    values = kv_cache_layout.value_cache_view(raw_cache)
    copied_keys = keys[sources]
    if cos_sin is not None:
        assert rotation is not None
        copied_keys = rotate_keys(copied_keys, cos_sin, rotation.rotary_dim, rotation.is_neox_style)
    keys[destinations] = copied_keys
    values[destinations] = values[sources]


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
