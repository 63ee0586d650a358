"""The method's numbers, produced in the worker: counters of its work and its recent
selections (`RetrievalMetrics`), read through `retrieval_stats(llm)`; and a periodic log
line of them (`MetricsLogger`), kept apart from the numbers."""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

LOG_INTERVAL_SECONDS = 10.0


@dataclasses.dataclass
class Selection:
    """One request's chunk selection: the context it was scored over, the chunks it
    chose from (those before the newest tokens) and the kept ones."""

    request_id: str
    context_len: int
    num_candidates: int
    kept_chunks: list[int]


class RetrievalMetrics:
    def __init__(self, history: int = 256):
        self.retrievals = 0
        self.scorer_calls = 0
        self.scorer_seconds = 0.0
        self.hybrid_verifications = 0
        # reduced draft steps, full draft steps, kept tokens, context tokens, reduced steps
        # on compact positions: summed on the device so that recording never waits for it.
        self._step_counters: torch.Tensor | None = None
        self._selections: collections.deque[tuple[list[str], torch.Tensor, ...]] = (
            collections.deque(maxlen=history)
        )

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

    def record_hybrid_verification(self) -> None:
        self.hybrid_verifications += 1

    def record_scoring(self, seconds: float) -> None:
        self.scorer_calls += 1
        self.scorer_seconds += seconds

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
            "scorer_calls": self.scorer_calls,
            "scorer_seconds": self.scorer_seconds,
            "hybrid_verifications": self.hybrid_verifications,
        }


class MetricsLogger:
    """Logs a summary of the metrics at most every `interval_s` seconds."""

    def __init__(self, log: Callable[[str], None], interval_s: float = LOG_INTERVAL_SECONDS):
        self._log = log
        self._interval_s = interval_s
        self._last_log = time.monotonic()

    def maybe_log(self, metrics: RetrievalMetrics) -> None:
        now = time.monotonic()
        if now - self._last_log >= self._interval_s:
            self._last_log = now
            self._log(f"SpecExtend: {metrics.summary()}")
