"""The retrieval planner: for each propose() call, in three steps,

0. `retrieval: auto`: the previous step measured, and which requests may draft on a
   reduced cache this step (`algorithm.retrieval_choice`);
1. `due_rows`: which requests select chunks now (a prompt, the schedule, or the
   adaptive trigger);
2. `select`: their kept chunks, from the chunk scores, stored per request, and their
   working copies built;
3. `lay_out`: the reduced block tables the draft attends through (kept blocks or
   their working copy, then the tail blocks) and how much shorter each sequence is.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from specextend_vllm.algorithm.draft_acceptance import accepted_shares
from specextend_vllm.algorithm.draft_step import DraftStep
from specextend_vllm.algorithm.positions import WorkingCopies
from specextend_vllm.algorithm.retrieval_choice import RetrievalChooser
from specextend_vllm.algorithm.retrieval_state import RetrievalState
from specextend_vllm.algorithm.selection import (
    chunks_to_blocks,
    kept_attention_share,
    reduced_block_indices,
    select_chunks,
)
from specextend_vllm.algorithm.triggers import due_by_schedule, lost_attention_share
from specextend_vllm.config import SpecExtendConfig
from specextend_vllm.metrics import RetrievalMetrics
from specextend_vllm.retrieval.scoring import ChunkScorer
from specextend_vllm.retrieval.working_copies import DraftWorkingCopies


@dataclasses.dataclass
class ReducedDraftView:
    """What the draft attends to in one propose() call: a block table holding the kept
    blocks (or the working copy of the kept chunks) then the tail blocks, and how many
    tokens shorter each reduced sequence is. The first pass, which writes the draft's KV
    of the target's tokens, attends to the full cache for prompts: `first_pass_*`."""

    block_table: torch.Tensor
    seq_len_offset: torch.Tensor
    first_pass_block_table: torch.Tensor
    first_pass_seq_len_offset: torch.Tensor


@dataclasses.dataclass(frozen=True)
class DraftGeometry:
    """What the planner needs of the draft: its KV block size, the longest context it
    was trained on, and whether its RoPE can be re-rotated (compact positions)."""

    block_size: int
    trained_length: int
    rotates: bool


@dataclasses.dataclass(frozen=True)
class MeasuredStep:
    """A drafting step whose requests long enough to be reduced all drafted the same way,
    as their batch's bucket of context lengths chose: the next step's verification
    completes its measurement."""

    request_ids: tuple[str, ...]
    length_bucket: int
    reduced: bool
    num_drafts: int
    started_s: float


class RetrievalPlanner:
    def __init__(
        self,
        config: SpecExtendConfig,
        geometry: DraftGeometry,
        max_requests: int,
        max_drafts: int,
        working_copies: DraftWorkingCopies,
        chunk_scorer: ChunkScorer,
        metrics: RetrievalMetrics,
        device: torch.device,
        mean_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.config = config
        self.max_drafts = max_drafts
        self.device = device
        self.geometry = geometry
        self.max_requests = max_requests
        self.working_copies = working_copies
        self.chunk_scorer = chunk_scorer
        self.metrics = metrics
        self.mean_over_ranks = mean_over_ranks
        self.clock = time.perf_counter
        self.state = self._new_state()
        self.chooser = self._new_chooser()
        self._measured_step: MeasuredStep | None = None
        self._reduced_block_table: torch.Tensor | None = None

    def _new_state(self) -> RetrievalState:
        return RetrievalState(
            self.max_requests,
            self.config.num_kept_chunks(self.geometry.block_size),
            self.device,
        )

    def _new_chooser(self) -> RetrievalChooser | None:
        if self.config.retrieval != "auto":
            return None
        return RetrievalChooser(self.config.activation_length, self.max_drafts)

    def reconfigure(self, config: SpecExtendConfig, copies: WorkingCopies) -> None:
        """Every request selects its chunks afresh at its next step."""
        self.config = config
        self.chunk_scorer.chunk_size = config.chunk_size
        self.working_copies.chunk_size = config.chunk_size
        self.working_copies.copies = copies
        self.state = self._new_state()
        self.chooser = self._new_chooser()
        self._measured_step = None

    def plan(
        self,
        request_ids: list[str],
        target_positions: torch.Tensor,
        query_start_loc: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        block_table: torch.Tensor,
        max_seq_len: int,
        num_speculative_tokens: int,
    ) -> ReducedDraftView:
        """request_ids: the batch's R requests; target_positions: [num_tokens];
        query_start_loc: [R + 1]; block_table: [R + padding rows, W]."""
        started_s = self.clock()
        step = DraftStep.from_target_batch(
            slots=self.state.slots(request_ids),
            target_positions=target_positions,
            query_start_loc=query_start_loc,
            token_indices_to_sample=token_indices_to_sample,
            block_table=block_table,
            max_seq_len=max_seq_len,
            tail_alignment=max(self.config.chunk_size, self.geometry.block_size),
            activation_length=self.config.activation_length,
            max_drafts=self.max_drafts,
        )
        eligible = step.eligible
        batch_bucket = -1
        if self.chooser is not None:
            self._complete_measurement(step, request_ids, started_s)
            batch_bucket = self.chooser.batch_bucket(step.context_lens)
            if batch_bucket >= 0 and self.state.num_new_requests == len(request_ids):
                self.chooser.new_batch(batch_bucket)
            if batch_bucket < 0 or not self.chooser.reduces(batch_bucket, num_speculative_tokens):
                self.state.forget_selections(step.slots[eligible])
                eligible = torch.zeros_like(eligible)
        compact = self._drafts_compact(step.context_lens, step.slots)
        on_copy = self.working_copies.has_copy(step.slots) & (compact | self._chunks_within_blocks)
        reducible = eligible & (on_copy | (not self._chunks_within_blocks))
        rows = self.due_rows(step, reducible, compact)
        if rows.numel():
            self.select(step, rows, compact, on_copy, request_ids)
        view, active = self.lay_out(step, reducible, on_copy)
        if self.chooser is not None:
            self._measured_step = self._measurable(
                step, request_ids, active, batch_bucket, num_speculative_tokens, started_s
            )
        return view

    def _complete_measurement(
        self, step: DraftStep, request_ids: list[str], now_s: float
    ) -> None:
        """Feeds the chooser the previous step, if it was measurable and this step verified
        all its drafts: the time from its drafting to this one, and the tokens it gave."""
        measured, self._measured_step = self._measured_step, None
        if (
            measured is None
            or measured.request_ids != tuple(request_ids)
            or not bool((step.verified_drafts == measured.num_drafts).all())
        ):
            return
        assert self.chooser is not None
        seconds = torch.tensor([now_s - measured.started_s], dtype=torch.float32)
        if self.mean_over_ranks is not None:
            seconds = self.mean_over_ranks(seconds.to(self.device)).cpu()
        self.chooser.record_step(
            measured.length_bucket,
            measured.num_drafts,
            measured.reduced,
            seconds.item(),
            accepted_shares(step.accepted_drafts.cpu().numpy(), measured.num_drafts),
        )

    def _measurable(
        self,
        step: DraftStep,
        request_ids: list[str],
        active: torch.Tensor,
        batch_bucket: int,
        num_drafts: int,
        started_s: float,
    ) -> MeasuredStep | None:
        """This step, if it drafted, none of its requests prefilling, and those long enough
        to be reduced all drafted the same way."""
        eligible = step.eligible
        reduced, full, prefilling = torch.stack(
            [(active | ~eligible).all(), (~active).all(), step.prefilling.any()]
        ).tolist()
        if num_drafts == 0 or batch_bucket < 0 or prefilling or not (reduced or full):
            return None
        return MeasuredStep(tuple(request_ids), batch_bucket, bool(reduced), num_drafts, started_s)

    def due_rows(
        self, step: DraftStep, reducible: torch.Tensor, compact: torch.Tensor
    ) -> torch.Tensor:
        """The rows of the requests that select chunks this step."""
        state, slots = self.state, step.slots
        due = due_by_schedule(
            reducible,
            state.steps_since_selection[slots],
            step.newest_positions,
            state.tail_start[slots],
            compact,
            state.compact[slots],
            self.config.retrieval_interval,
        ) | (reducible & step.prefilling)
        if self.config.retrieval_trigger == "adaptive":
            selected = state.steps_since_selection[slots] >= 0
            due |= self._adaptive_trigger(step, reducible & selected & ~due)
        return due.nonzero().squeeze(1)

    def select(
        self,
        step: DraftStep,
        rows: torch.Tensor,
        compact: torch.Tensor,
        on_copy: torch.Tensor,
        request_ids: list[str],
    ) -> None:
        """Selects and stores the kept chunks of the requests in `rows`, and builds their
        working copies (a prompt's once the draft's first pass has written its KV)."""
        config = self.config
        num_candidates = step.tail_start[rows] // config.chunk_size
        chunk_scores = None
        if config.policy == "cmr" or config.retrieval_trigger == "adaptive":
            chunk_scores = self._chunk_scores(step, rows)
        kept_chunks, num_kept_chunks = select_chunks(
            config.policy,
            config.chunk_ranking,
            chunk_scores,
            num_candidates,
            config.num_kept_chunks(self.geometry.block_size),
        )
        selected_share = (
            torch.zeros(rows.shape, device=rows.device)
            if chunk_scores is None
            else kept_attention_share(chunk_scores, kept_chunks, num_kept_chunks, num_candidates)
        )
        self.state.store(
            step.slots[rows],
            kept_chunks,
            num_kept_chunks,
            step.tail_start[rows],
            compact[rows],
            selected_share,
        )
        for rows_to_copy, build in (
            (rows[on_copy[rows] & ~step.prefilling[rows]], self.working_copies.build),
            (
                rows[on_copy[rows] & step.prefilling[rows]],
                self.working_copies.build_after_first_pass,
            ),
        ):
            if rows_to_copy.numel():
                build(
                    self.state,
                    step.slots[rows_to_copy],
                    compact[rows_to_copy],
                    step.block_table[rows_to_copy],
                )
        self.metrics.record_selection(
            request_ids,
            rows,
            step.context_lens[rows],
            num_candidates,
            kept_chunks,
            num_kept_chunks,
        )

    def lay_out(
        self, step: DraftStep, reducible: torch.Tensor, on_copy: torch.Tensor
    ) -> tuple[ReducedDraftView, torch.Tensor]:
        """The step's reduced block tables, from every request's stored selection, and
        which requests draft on them ([R] bool)."""
        state, slots, block_size = self.state, step.slots, self.geometry.block_size
        num_reqs = step.num_reqs
        active = reducible & (state.steps_since_selection[slots] >= 0)
        kept_tokens = torch.where(active, state.num_kept_chunks[slots] * self.config.chunk_size, 0)
        tail_start = torch.where(active, state.tail_start[slots], 0)
        full_block_table = step.block_table
        reduced = self._reduced_block_table_buffer(full_block_table)
        reduced[:num_reqs] = full_block_table[:num_reqs].gather(
            1,
            reduced_block_indices(
                self._kept_logical_blocks(slots),
                kept_tokens // block_size,
                tail_start // block_size,
                full_block_table.shape[1],
            ),
        )
        reduced[num_reqs:] = full_block_table[num_reqs:]
        self.working_copies.point_kept_blocks(
            reduced[:num_reqs], slots, active & on_copy, kept_tokens // block_size
        )
        seq_len_offset = tail_start - kept_tokens
        state.steps_since_selection.index_add_(0, slots, active.long())
        self.metrics.record_draft_step(
            active,
            active & state.compact[slots],
            step.context_lens,
            seq_len_offset,
            step.verified_drafts,
            step.accepted_drafts,
            state.drafted_reduced[slots],
        )
        state.drafted_reduced[slots] = active
        seq_len_offset = seq_len_offset.to(torch.int32)
        first_pass_reduced = active & ~step.prefilling
        first_pass_block_table = reduced
        if not bool(first_pass_reduced.all()):
            first_pass_block_table = full_block_table.clone()
            first_pass_block_table[:num_reqs] = torch.where(
                first_pass_reduced[:, None], reduced[:num_reqs], full_block_table[:num_reqs]
            )
        view = ReducedDraftView(
            reduced,
            seq_len_offset,
            first_pass_block_table,
            torch.where(first_pass_reduced, seq_len_offset, 0),
        )
        return view, active

    @property
    def _chunks_within_blocks(self) -> bool:
        """Chunks smaller than a KV block: the draft reads them from working copies only."""
        return self.config.chunk_size % self.geometry.block_size != 0

    def _kept_logical_blocks(self, slots: torch.Tensor) -> torch.Tensor:
        """The logical blocks of the kept chunks, where chunks are whole blocks; a
        placeholder column otherwise, as every kept chunk is then read from a copy."""
        if self._chunks_within_blocks:
            return torch.zeros(slots.shape[0], 1, dtype=torch.int64, device=slots.device)
        return chunks_to_blocks(
            self.state.kept_chunks[slots], self.config.chunk_size // self.geometry.block_size
        )

    def _drafts_compact(self, context_lens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Which requests draft on compact positions: by the `positions` key, where the
        draft's RoPE allows it and the request's slot has a working copy."""
        config = self.config
        if not config.uses_compact_positions() or not self.geometry.rotates:
            return torch.zeros_like(context_lens, dtype=torch.bool)
        wanted = (
            context_lens > self.geometry.trained_length
            if config.positions == "auto"
            else torch.ones_like(context_lens, dtype=torch.bool)
        )
        return wanted & self.working_copies.has_copy(slots)

    def _adaptive_trigger(self, step: DraftStep, watched: torch.Tensor) -> torch.Tensor:
        """Requests whose last verification accepted no draft token, or whose kept chunks
        lost attention share since their selection."""
        triggered = watched & (step.accepted_drafts == 0)
        rows = (watched & ~triggered).nonzero().squeeze(1)
        if rows.numel():
            state = self.state
            row_slots = step.slots[rows]
            share = kept_attention_share(
                self._chunk_scores(step, rows),
                state.kept_chunks[row_slots],
                state.num_kept_chunks[row_slots],
                state.tail_start[row_slots] // self.config.chunk_size,
            )
            lost = lost_attention_share(share, state.selected_share[row_slots])
            triggered = triggered.index_put((rows,), lost | triggered[rows])
        return triggered

    def _chunk_scores(self, step: DraftStep, rows: torch.Tensor) -> torch.Tensor:
        return self.chunk_scorer(
            step.sample_rows[rows],
            step.block_table[rows],
            step.context_lens[rows],
            -(-step.max_seq_len // self.config.chunk_size),
        )

    def _reduced_block_table_buffer(self, full_block_table: torch.Tensor) -> torch.Tensor:
        buffer = self._reduced_block_table
        if buffer is None or buffer.shape != full_block_table.shape:
            buffer = torch.empty_like(full_block_table)
            self._reduced_block_table = buffer
        return buffer
