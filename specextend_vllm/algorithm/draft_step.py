"""One drafting step's batch as the algorithm sees it, derived once per step."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class DraftStep:
    """The requests of one propose() call, one row each ([R] tensors unless noted).

    sample_rows: the target batch row of each request's last accepted token;
    accepted_drafts: how many draft tokens its last verification accepted;
    context_lens: its tokens up to and including the last accepted one;
    first_query_positions: the position of its first token in this target batch;
    tail_start_chunk: the chunk holding that token, where the newest tokens start;
    eligible: long enough to draft on a reduced cache, and decoding (not prefilling);
    block_table: [R + padding rows, W], the full block table of the batch.
    """

    slots: torch.Tensor
    sample_rows: torch.Tensor
    accepted_drafts: torch.Tensor
    context_lens: torch.Tensor
    first_query_positions: torch.Tensor
    tail_start_chunk: torch.Tensor
    eligible: torch.Tensor
    block_table: torch.Tensor
    max_seq_len: int

    @classmethod
    def from_target_batch(
        cls,
        slots: torch.Tensor,
        target_positions: torch.Tensor,
        query_start_loc: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        block_table: torch.Tensor,
        max_seq_len: int,
        chunk_size: int,
        activation_length: int,
        num_speculative_tokens: int,
    ) -> DraftStep:
        """slots: [R]; target_positions: [num_tokens]; query_start_loc: [R + 1].

        Example: two requests, the first prefilling 5 tokens (positions 0-4), the second
        verifying 3 (positions 40-42) of which 1 draft was accepted (sample row 6):

        >>> step = DraftStep.from_target_batch(
        ...     slots=torch.tensor([0, 1]),
        ...     target_positions=torch.tensor([0, 1, 2, 3, 4, 40, 41, 42]),
        ...     query_start_loc=torch.tensor([0, 5, 8]),
        ...     token_indices_to_sample=torch.tensor([4, 6]),
        ...     block_table=torch.zeros(2, 4, dtype=torch.int32),
        ...     max_seq_len=43,
        ...     chunk_size=16,
        ...     activation_length=32,
        ...     num_speculative_tokens=2,
        ... )
        >>> step.context_lens.tolist(), step.tail_start_chunk.tolist(), step.eligible.tolist()
        ([5, 42], [0, 2], [False, True])
        >>> step.accepted_drafts[1].item()
        1
        """
        query_lens = query_start_loc[1:] - query_start_loc[:-1]
        sample_rows = (
            query_start_loc[1:] - 1 if token_indices_to_sample is None else token_indices_to_sample
        ).long()
        context_lens = target_positions[sample_rows] + 1
        first_query_positions = target_positions[query_start_loc[:-1].long()]
        eligible = (context_lens >= activation_length) & (query_lens <= num_speculative_tokens + 1)
        return cls(
            slots=slots,
            sample_rows=sample_rows,
            accepted_drafts=sample_rows - query_start_loc[:-1],
            context_lens=context_lens,
            first_query_positions=first_query_positions,
            tail_start_chunk=first_query_positions // chunk_size,
            eligible=eligible,
            block_table=block_table,
            max_seq_len=max_seq_len,
        )

    @property
    def num_reqs(self) -> int:
        return self.slots.shape[0]
