"""One drafting step's batch as the algorithm sees it, derived once per step."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class DraftStep:
    """The requests of one propose() call, one row each ([R] tensors unless noted).

    sample_rows: the target batch row of each request's last accepted token;
    verified_drafts: how many draft tokens this step's target pass verified (0 for a
        prompt);
    accepted_drafts: how many of them it accepted;
    context_lens: its tokens up to and including the last accepted one;
    prefilling: whether it processes more tokens than a verification (a prompt), so
        that the draft's first pass must write their KV attending to the full cache;
    newest_positions: its first token whose draft KV this step writes on a reduced
        cache: the first verified token, or a prompt's last token;
    tail_start: where its newest tokens start: newest_positions rounded down to
        `tail_alignment`; the draft attends to every token from there on;
    eligible: long enough to draft on a reduced cache;
    block_table: [R + padding rows, W], the full block table of the batch.
    """

    slots: torch.Tensor
    sample_rows: torch.Tensor
    verified_drafts: torch.Tensor
    accepted_drafts: torch.Tensor
    context_lens: torch.Tensor
    prefilling: torch.Tensor
    newest_positions: torch.Tensor
    tail_start: torch.Tensor
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
        tail_alignment: int,
        activation_length: int,
        max_drafts: int,
    ) -> DraftStep:
        """slots: [R]; target_positions: [num_tokens]; query_start_loc: [R + 1];
        max_drafts: the most drafts a step verifies (`num_speculative_tokens`; a step may
        verify fewer, and draft another number next): a longer query prefills.

        Example: two requests, the first prefilling 5 tokens (positions 0-4), the second
        verifying 3 (positions 40-42) of which 1 draft was accepted (sample row 6); tails
        start on multiples of 16:

        >>> step = DraftStep.from_target_batch(
        ...     slots=torch.tensor([0, 1]),
        ...     target_positions=torch.tensor([0, 1, 2, 3, 4, 40, 41, 42]),
        ...     query_start_loc=torch.tensor([0, 5, 8]),
        ...     token_indices_to_sample=torch.tensor([4, 6]),
        ...     block_table=torch.zeros(2, 4, dtype=torch.int32),
        ...     max_seq_len=43,
        ...     tail_alignment=16,
        ...     activation_length=5,
        ...     max_drafts=2,
        ... )
        >>> step.context_lens.tolist(), step.prefilling.tolist(), step.newest_positions.tolist()
        ([5, 42], [True, False], [4, 40])
        >>> step.tail_start.tolist(), step.eligible.tolist()
        ([0, 32], [True, True])
        >>> step.verified_drafts.tolist(), step.accepted_drafts[1].item()
        ([0, 2], 1)
        """
        query_lens = query_start_loc[1:] - query_start_loc[:-1]
        sample_rows = (
            query_start_loc[1:] - 1 if token_indices_to_sample is None else token_indices_to_sample
        ).long()
        context_lens = target_positions[sample_rows] + 1
        prefilling = query_lens > max_drafts + 1
        first_query_positions = target_positions[query_start_loc[:-1].long()]
        newest_positions = torch.where(prefilling, context_lens - 1, first_query_positions)
        return cls(
            slots=slots,
            sample_rows=sample_rows,
            verified_drafts=torch.where(prefilling, 0, query_lens - 1),
            accepted_drafts=sample_rows - query_start_loc[:-1],
            context_lens=context_lens,
            prefilling=prefilling,
            newest_positions=newest_positions,
            tail_start=newest_positions // tail_alignment * tail_alignment,
            eligible=context_lens >= activation_length,
            block_table=block_table,
            max_seq_len=max_seq_len,
        )

    @property
    def num_reqs(self) -> int:
        return self.slots.shape[0]
