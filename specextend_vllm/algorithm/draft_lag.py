"""The draft's KV cache behind the target's, for requests whose steps ran without the draft.

A step that drafts nothing (`drafting: auto` chose not to, or a batch-size schedule gave
0 drafts) does not run the draft: its KV misses that step's tokens. The request's first
missing position is noted; when the draft next runs for it, one batched catch-up pass
writes the draft's KV of every missed token first (positions first_missing to the step's
first token), so the draft proposes from a complete cache again.
"""

from __future__ import annotations

import dataclasses

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


class DraftLag:
    """first_missing[s]: the first position whose draft KV the request in slot s lacks,
    NOT_LAGGING when it lacks none.

    >>> lag = DraftLag(4)
    >>> lag.skipped(["a", "b"], np.array([10, 30]))
    >>> lag.skipped(["a", "b"], np.array([11, 32]))
    >>> lag.catch_up(["b", "c", "a"], np.array([35, 0, 12]))
    CatchUp(rows=array([0, 2]), starts=array([30, 10]), lengths=array([5, 2]))
    >>> lag.catch_up(["b", "a"], np.array([36, 13])) is None
    True
    """

    def __init__(self, max_requests: int):
        self.first_missing = np.full(max_requests, NOT_LAGGING, dtype=np.int64)
        self._request_slots = RequestSlots(max_requests)
        self.any_lagging = False

    def _slots(self, request_ids: list[str]) -> np.ndarray:
        slots, new_slots = self._request_slots.assign(request_ids)
        self.first_missing[new_slots] = NOT_LAGGING
        return np.asarray(slots, dtype=np.int64)

    def skipped(self, request_ids: list[str], first_positions: np.ndarray) -> None:
        """A step ran the target without the draft; first_positions [R]: the position of
        each request's first token in it."""
        slots = self._slots(request_ids)
        missing = self.first_missing[slots]
        self.first_missing[slots] = np.where(missing == NOT_LAGGING, first_positions, missing)
        self.any_lagging = True

    def catch_up(self, request_ids: list[str], first_positions: np.ndarray) -> CatchUp | None:
        """The draft runs at this step, from first_positions [R] on: the tokens before
        them it lacks, whose KV must be written first; None when it lacks none."""
        if not self.any_lagging:
            return None
        slots = self._slots(request_ids)
        starts = self.first_missing[slots]
        self.first_missing[slots] = NOT_LAGGING
        self.any_lagging = bool((self.first_missing != NOT_LAGGING).any())
        rows = np.nonzero((starts != NOT_LAGGING) & (starts < first_positions))[0]
        if not rows.size:
            return None
        return CatchUp(rows, starts[rows], first_positions[rows] - starts[rows])

    def on_requests_changed(self, finished: list[str], restarted: list[str]) -> None:
        """Finished requests free their slots; requests that start over (resumed after
        preemption) compute their tokens again, the draft's KV with them."""
        self.first_missing[self._request_slots.existing(finished + restarted)] = NOT_LAGGING
        self._request_slots.free(finished)
