"""Counters of the method's work, read through logs and `retrieval_stats(llm)`."""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from specextend_vllm.scoring import ChunkScorer

LOG_INTERVAL_SECONDS = 10.0


@dataclasses.dataclass
class Selection:
    """One request's chunk selection: the context it was scored over, the chunks it
    chose from (those before the newest tokens) and the kept ones."""

    request_id: str
    context_len: int
    num_candidates: int
    kept_chunks: list[int]


class RetrievalStats:
    def __init__(self, history: int = 256):
        self.retrievals = 0
        # reduced draft steps, full draft steps, kept tokens, context tokens, reduced steps
        # on compact positions: summed on the device so that recording never waits for it.
        self._step_counters: torch.Tensor | None = None
        self.scorer: ChunkScorer | None = None
        self._selections: collections.deque[tuple[list[str], torch.Tensor, ...]] = (
            collections.deque(maxlen=history)
        )
        self._last_log = time.monotonic()

    def record_draft_step(
        self,
        active: torch.Tensor,
        compact: torch.Tensor,
        context_lens: torch.Tensor,
        seq_len_offset: torch.Tensor,
    ) -> None:
        active_long = active.long()
        step = torch.stack(
            [
                active_long.sum(),
                (1 - active_long).sum(),
                ((context_lens - seq_len_offset) * active_long).sum(),
                (context_lens * active_long).sum(),
                (compact & active).long().sum(),
            ]
        )
        if self._step_counters is None:
            self._step_counters = torch.zeros_like(step)
        self._step_counters += step

    def record_selection(
        self,
        request_ids: list[str],
        rows: torch.Tensor,
        context_lens: torch.Tensor,
        num_candidates: torch.Tensor,
        kept_chunks: torch.Tensor,
        num_kept_chunks: torch.Tensor,
    ) -> None:
        self.retrievals += rows.numel()
        self._selections.append(
            (request_ids, rows, context_lens, num_candidates, kept_chunks, num_kept_chunks)
        )

    def selections(self) -> list[Selection]:
        """The recent selections, oldest first."""
        return [
            Selection(request_ids[row], int(context_len), int(candidates), kept[:count].tolist())
            for request_ids, rows, context_lens, num_candidates, kept_chunks, counts in self._selections
            for row, context_len, candidates, kept, count in zip(
                rows.tolist(), context_lens, num_candidates, kept_chunks, counts.tolist()
            )
        ]

    def summary(self) -> dict[str, Any]:
        scorer_calls = self.scorer.calls if self.scorer else 0
        scorer_seconds = self.scorer.seconds if self.scorer else 0.0
        reduced, full, kept, context, compact = (
            [0] * 5 if self._step_counters is None else self._step_counters.tolist()
        )
        return {
            "retrievals": self.retrievals,
            "reduced_draft_steps": reduced,
            "full_draft_steps": full,
            "compact_draft_steps": compact,
            "mean_kept_tokens": kept / max(reduced, 1),
            "mean_context_tokens": context / max(reduced, 1),
            "scorer_calls": scorer_calls,
            "scorer_seconds": scorer_seconds,
        }

    def due_for_log(self) -> bool:
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_SECONDS:
            return False
        self._last_log = now
        return True
