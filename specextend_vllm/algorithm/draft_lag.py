"""The draft's KV cache behind the target's, for tokens computed without the draft.

A step that drafts nothing (`drafting: auto` chose not to, or a batch-size schedule gave
0 drafts), or that only prefills under `draft_prefill: deferred`, does not run the draft:
its KV misses that step's tokens. The request's first missing position is noted; when
the draft next runs for it, batched catch-up passes write the draft's KV of every missed
token first (positions first_missing up to the step's first token), so the draft
proposes from a complete cache again.

The KV blocks holding tokens the draft missed are flagged too: a request that finished
before catching up leaves them in vLLM's prefix cache, and a later request that starts
from them (a cache hit) catches up from the first flagged block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import KeysView

import numpy as np

from specextend_vllm.algorithm.request_slots import RequestSlots

NOT_LAGGING = -1


@dataclasses.dataclass(frozen=True)
class CatchUp:
    """The tokens a catch-up pass writes: rows [L] the batch rows of the lagging requests,
    starts [L] their first missing positions, lengths [L] how many tokens each misses."""

    rows: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def token_rows_and_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Each missed token's batch row and position, request by request.

        >>> CatchUp(np.array([0, 2]), np.array([7, 40]), np.array([2, 3])).token_rows_and_positions()
        (array([0, 0, 2, 2, 2]), array([ 7,  8, 40, 41, 42]))
        """
        token_rows = np.repeat(self.rows, self.lengths)
        offsets = np.arange(self.num_tokens) - np.repeat(
            np.cumsum(self.lengths) - self.lengths, self.lengths
        )
        return token_rows, np.repeat(self.starts, self.lengths) + offsets

    def pieces(self, max_tokens: int) -> list[CatchUp]:
        """The same tokens in passes of at most max_tokens, in order (a request's later
        tokens attend to the KV its earlier pieces write).

        >>> [(p.rows.tolist(), p.starts.tolist(), p.lengths.tolist())
        ...  for p in CatchUp(np.array([0, 2]), np.array([7, 40]), np.array([3, 4])).pieces(4)]
        [([0, 2], [7, 40], [3, 1]), ([2], [41], [3])]
        """
        token_rows, positions = self.token_rows_and_positions()
        pieces = []
        for first in range(0, token_rows.size, max_tokens):
            rows = token_rows[first : first + max_tokens]
            segment_starts = np.nonzero(np.r_[True, rows[1:] != rows[:-1]])[0]
            lengths = np.diff(np.r_[segment_starts, rows.size])
            pieces.append(
                CatchUp(rows[segment_starts], positions[first + segment_starts], lengths)
            )
        return pieces


@dataclasses.dataclass(frozen=True)
class StepTokens:
    """A step's tokens per request ([R] each): first_positions, the position of its first
    token; query_lens, how many it has; block_table [R, W], its KV blocks (host copy)."""

    first_positions: np.ndarray
    query_lens: np.ndarray
    block_table: np.ndarray

    def select(self, rows: np.ndarray) -> StepTokens:
        """The step's tokens of these rows only."""
        return StepTokens(self.first_positions[rows], self.query_lens[rows], self.block_table[rows])

    def block_spans(self, starts: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The blocks holding positions starts[r] to the step's last token of each request:
        (the block ids, their rows' indices), every span flattened.

        >>> step = StepTokens(np.array([9, 0]), np.array([1, 5]), np.array([[4, 7, 2], [5, 6, 0]]))
        >>> step.block_spans(np.array([3, 0]), 4)
        (array([4, 7, 2, 5, 6]), array([0, 0, 0, 1, 1]))
        """
        ends = self.first_positions + self.query_lens - 1
        first_blocks, last_blocks = starts // block_size, ends // block_size
        counts = last_blocks - first_blocks + 1
        rows = np.repeat(np.arange(starts.shape[0]), counts)
        columns = np.repeat(first_blocks, counts) + (
            np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
        )
        return self.block_table[rows, columns], rows


class DraftLag:
    """first_missing[s]: the first position whose draft KV the request in slot s lacks,
    NOT_LAGGING when it lacks none; missing_blocks[b]: KV block b holds tokens whose draft
    KV was never written.

    >>> lag = DraftLag(max_requests=4, num_blocks=8, block_size=16)
    >>> table = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 0]])
    >>> lag.skipped(["a", "b"], StepTokens(np.array([10, 30]), np.array([1, 1]), table[:2]))
    >>> lag.skipped(["a", "b"], StepTokens(np.array([11, 32]), np.array([1, 1]), table[:2]))
    >>> lag.catch_up(["b", "c", "a"], StepTokens(np.array([35, 0, 12]), np.array([1, 9, 1]), table))
    CatchUp(rows=array([0, 2]), starts=array([30, 10]), lengths=array([5, 2]))
    >>> lag.catch_up(["b", "a"], StepTokens(np.array([36, 13]), np.array([1, 1]), table[:2])) is None
    True
    """

    def __init__(self, max_requests: int, num_blocks: int, block_size: int):
        self.first_missing = np.full(max_requests, NOT_LAGGING, dtype=np.int64)
        self.missing_blocks = np.zeros(num_blocks, dtype=bool)
        self.block_size = block_size
        self._request_slots = RequestSlots(max_requests)
        self._lagging_requests = False

    @property
    def request_ids(self) -> KeysView[str]:
        """The requests holding a slot."""
        return self._request_slots.request_ids

    @property
    def may_lag(self) -> bool:
        """Whether a request may lag: one does, or a block holds tokens the draft missed."""
        return self._lagging_requests or bool(self.missing_blocks.any())

    def skipped(self, request_ids: list[str], step: StepTokens) -> None:
        """A step ran the target without the draft."""
        slots, new_slots = self._slots(request_ids)
        self._starts_of_new_requests(slots, new_slots, step)
        missing = self.first_missing[slots]
        self.first_missing[slots] = np.where(
            missing == NOT_LAGGING, step.first_positions, missing
        )
        self._lagging_requests = True
        blocks, _ = step.block_spans(step.first_positions, self.block_size)
        self.missing_blocks[blocks] = True

    def catch_up(self, request_ids: list[str], step: StepTokens) -> CatchUp | None:
        """The draft runs at this step: the tokens before each request's first that it
        lacks, whose KV must be written first; None when it lacks none. The blocks of
        those tokens and of the step's own are complete afterwards."""
        slots, new_slots = self._slots(request_ids)
        self._starts_of_new_requests(slots, new_slots, step)
        starts = self.first_missing[slots]
        self.first_missing[slots] = NOT_LAGGING
        self._lagging_requests = bool((self.first_missing != NOT_LAGGING).any())
        lagging = (starts != NOT_LAGGING) & (starts < step.first_positions)
        blocks, _ = step.block_spans(
            np.where(lagging, starts, step.first_positions), self.block_size
        )
        self.missing_blocks[blocks] = False
        rows = np.nonzero(lagging)[0]
        if not rows.size:
            return None
        return CatchUp(rows, starts[rows], step.first_positions[rows] - starts[rows])

    def copied(
        self,
        request_ids: list[str],
        step: StepTokens,
        sources: np.ndarray,
        destinations: np.ndarray,
    ) -> None:
        """Requests whose step's tokens had their draft KV copied, block by block, from
        blocks holding the same tokens (`algorithm.block_twins`): a destination lacks what
        its source lacked, and a request new to the step lacks what its blocks lack, the
        copied ones included.

        >>> lag = DraftLag(max_requests=2, num_blocks=8, block_size=4)
        >>> lag.missing_blocks[1] = True  # a cached block the draft skipped
        >>> step = StepTokens(np.array([8]), np.array([4]), np.array([[0, 1, 5]]))
        >>> lag.copied(["b"], step, sources=np.array([1]), destinations=np.array([5]))
        >>> np.nonzero(lag.missing_blocks)[0], lag.first_missing[:1]
        (array([1, 5]), array([4]))
        """
        self.missing_blocks[destinations] = self.missing_blocks[sources]
        slots, new_slots = self._slots(request_ids)
        self._starts_of_new_requests(
            slots,
            new_slots,
            dataclasses.replace(step, first_positions=step.first_positions + step.query_lens),
        )

    def _slots(self, request_ids: list[str]) -> tuple[np.ndarray, list[int]]:
        slots, new_slots = self._request_slots.assign(request_ids)
        self.first_missing[new_slots] = NOT_LAGGING
        return np.asarray(slots, dtype=np.int64), new_slots

    def _starts_of_new_requests(
        self, slots: np.ndarray, new_slots: list[int], step: StepTokens
    ) -> None:
        """A request new to this step whose first tokens came from the prefix cache lags
        from the first cached block the draft missed tokens of."""
        if not new_slots or not self.missing_blocks.any():
            return
        rows = np.nonzero(np.isin(slots, new_slots) & (step.first_positions > 0))[0]
        cached_blocks = -(-step.first_positions[rows] // self.block_size)
        columns = np.arange(step.block_table.shape[1])
        flagged = self.missing_blocks[step.block_table[rows]] & (columns < cached_blocks[:, None])
        lagging = flagged.any(axis=1)
        if lagging.any():
            first_flagged = flagged[lagging].argmax(axis=1)
            self.first_missing[slots[rows[lagging]]] = first_flagged * self.block_size
            self._lagging_requests = True

    def on_requests_changed(self, finished: list[str], restarted: list[str]) -> None:
        """Finished requests free their slots; requests that start over (resumed after
        preemption) are new again at their next step."""
        self.first_missing[self._request_slots.existing(finished + restarted)] = NOT_LAGGING
        self._request_slots.free(finished + restarted)
