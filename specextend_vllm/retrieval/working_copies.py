"""The draft's working copies: each request slot with a copy gets its kept chunks packed
side by side into blocks set aside for it, in every draft layer (re-rotated on compact
positions); the reduced block table then points its kept columns there."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specextend_vllm.algorithm.positions import (
    DraftRotation,
    WorkingCopies,
    copy_kept_tokens,
    packed_chunk_tokens,
    packed_copy_slots,
)
from specextend_vllm.algorithm.retrieval_state import RetrievalState


class DraftWorkingCopies:
    """copies: where each slot's copy lives; draft_caches(): the draft layers' raw KV
    caches; rotation: the draft's RoPE table, None where its RoPE cannot re-rotate."""

    def __init__(
        self,
        copies: WorkingCopies,
        draft_caches: Callable[[], list[torch.Tensor]],
        rotation: DraftRotation | None,
        chunk_size: int,
        block_size: int,
    ):
        self.copies = copies
        self.draft_caches = draft_caches
        self.rotation = rotation
        self.chunk_size = chunk_size
        self.block_size = block_size
        self._after_first_pass: Callable[[], None] | None = None

    def has_copy(self, slots: torch.Tensor) -> torch.Tensor:
        return self.copies.has_copy(slots)

    def build(
        self,
        state: RetrievalState,
        row_slots: torch.Tensor,
        compact: torch.Tensor,
        full_block_table: torch.Tensor,
    ) -> None:
        """row_slots: [n] the slots of the requests to copy; compact: [n] which of them
        draft on compact positions; full_block_table: [n, W] their block tables. On
        compact positions the keys are re-rotated so that the kept tokens end where the
        tail starts."""
        sources, shifts, is_kept = packed_chunk_tokens(
            state.kept_chunks[row_slots],
            state.num_kept_chunks[row_slots],
            self.chunk_size,
            state.tail_start[row_slots],
        )
        source_slots, copy_slots = packed_copy_slots(
            full_block_table, self.copies.block_ids(row_slots), sources, is_kept, self.block_size
        )
        cos_sin = None
        rotation = self.rotation
        if bool(compact.any()):
            assert rotation is not None
            cos_sin = rotation.cos_sin[torch.where(compact[:, None], shifts, 0)[is_kept]]
        for raw_cache in self.draft_caches():
            copy_kept_tokens(raw_cache, source_slots, copy_slots, cos_sin, rotation)

    def build_after_first_pass(
        self,
        state: RetrievalState,
        row_slots: torch.Tensor,
        compact: torch.Tensor,
        full_block_table: torch.Tensor,
    ) -> None:
        """As `build`, once the draft's first pass has run: kept chunks of a prompt may
        lie in the step's own tokens, whose draft KV that pass writes."""
        self._after_first_pass = lambda: self.build(state, row_slots, compact, full_block_table)

    def first_pass_done(self) -> None:
        build, self._after_first_pass = self._after_first_pass, None
        if build is not None:
            build()

    def discard_pending(self) -> None:
        self._after_first_pass = None

    def point_kept_blocks(
        self,
        reduced_block_table: torch.Tensor,
        slots: torch.Tensor,
        drafts_on_copy: torch.Tensor,
        num_kept_blocks: torch.Tensor,
    ) -> None:
        """reduced_block_table: [R, W], its first num_kept_blocks[r] columns replaced by
        the slot's copy where drafts_on_copy[r]."""
        copies = self.copies
        if not copies.num_copies:
            return
        width = min(copies.blocks_per_copy, reduced_block_table.shape[1])
        columns = torch.arange(width, device=slots.device)[None, :]
        on_copy = drafts_on_copy[:, None] & (columns < num_kept_blocks[:, None])
        kept_part = reduced_block_table[:, :width]
        reduced_block_table[:, :width] = torch.where(
            on_copy, copies.block_ids(slots)[:, :width].to(kept_part.dtype), kept_part
        )
