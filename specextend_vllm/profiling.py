"""Where a decoding step's time goes: the target's forward pass, the sampling (with
verification: the rejection sampler, or a tree's acceptance and KV moves), the draft
proposal and each draft pass, and within the proposal the method's own work (retrieval's
planning, of which the chunk scores and the working copies). Opt-in
(`SPECEXTEND_STEP_TIMINGS=1`), read with `step_timings(llm)`. Apart from those, the draft's
passes over prompts are always timed (`DraftPassClock`): `drafting: auto` prices them.

Times are wall clock around the work; with CUDA the timer synchronizes the device at
every boundary, which slows the engine down but attributes the time correctly.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

ENV_VARIABLE = "SPECEXTEND_STEP_TIMINGS"

# Seconds, as read by the measurements `drafting: auto` steers by: the scheduler's step
# times and the draft's passes over prompts (`DraftPassClock`). Engine tests put simulated
# time here, so that those choices follow the costs a test gives its models alone.
drafting_clock: Callable[[], float] = time.perf_counter


def step_timings_enabled() -> bool:
    return os.environ.get(ENV_VARIABLE, "0") == "1"


@dataclasses.dataclass
class StepRecord:
    """One engine step: how many tokens the target processed and how long each part took."""

    num_target_tokens: int
    target_forward_s: float = 0.0
    sample_s: float = 0.0
    propose_s: float = 0.0
    draft_passes_s: list[float] = dataclasses.field(default_factory=list)
    retrieval_s: float = 0.0
    chunk_scores_s: float = 0.0
    working_copies_s: float = 0.0


class StepTimer:
    """Records the recent steps of one worker.

    Example: a step that verifies 5 tokens and drafts 4 leaves
    StepRecord(num_target_tokens=5, target_forward_s=0.31, sample_s=0.002,
               propose_s=0.12, draft_passes_s=[0.04, 0.025, 0.025, 0.025],
               retrieval_s=0.004, chunk_scores_s=0.002, working_copies_s=0.001).
    """

    def __init__(self, synchronize: Callable[[], None] | None = None, history: int = 16384):
        self._synchronize = synchronize or (lambda: None)
        self._records: collections.deque[StepRecord] = collections.deque(maxlen=history)
        self._draft_pass_start: float | None = None

    @contextmanager
    def target_forward(self, num_target_tokens: int) -> Iterator[None]:
        record = StepRecord(num_target_tokens)
        self._records.append(record)
        record.target_forward_s = -self._now()
        try:
            yield
        finally:
            record.target_forward_s += self._now()

    @contextmanager
    def propose(self) -> Iterator[None]:
        with self._add_to("propose_s"):
            yield

    @contextmanager
    def sample(self) -> Iterator[None]:
        with self._add_to("sample_s"):
            yield

    def time_method(self, owner: object, name: str, field: str) -> None:
        """Adds the time of every call of `owner.name` to the current step's `field`.

        >>> class Planner:
        ...     def plan(self, x):
        ...         return x + 1
        >>> timer, planner = StepTimer(), Planner()
        >>> timer.time_method(planner, "plan", "retrieval_s")
        >>> with timer.target_forward(num_target_tokens=5):
        ...     pass
        >>> planner.plan(1), timer.drain()[0].retrieval_s > 0
        (2, True)
        """
        method = getattr(owner, name)

        def timed(*args: object, **kwargs: object) -> object:
            with self._add_to(field):
                return method(*args, **kwargs)

        setattr(owner, name, timed)

    @contextmanager
    def _add_to(self, field: str) -> Iterator[None]:
        record = self._current()
        start = self._now()
        try:
            yield
        finally:
            if record is not None:
                setattr(record, field, getattr(record, field) + self._now() - start)

    def draft_pass_started(self) -> None:
        self._draft_pass_start = self._now()

    def draft_pass_finished(self) -> None:
        record = self._current()
        if record is not None and self._draft_pass_start is not None:
            record.draft_passes_s.append(self._now() - self._draft_pass_start)
        self._draft_pass_start = None

    def drain(self) -> list[StepRecord]:
        """The steps recorded since the last drain, oldest first."""
        records = list(self._records)
        self._records.clear()
        return records

    def _current(self) -> StepRecord | None:
        return self._records[-1] if self._records else None

    def _now(self) -> float:
        self._synchronize()
        return time.perf_counter()


def device_synchronizer(device: torch.device) -> Callable[[], None] | None:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


# Draft passes of at least this many tokens (and more than a decoding step's 1 + k per
# request) are passes over prompts: prefills and catch-up passes.
PROMPT_PASS_MIN_TOKENS = 64
# The draft's pass that prices prompt tokens before it has passed over any prompt.
PRICING_PASS_TOKENS = 256


class DraftPassClock:
    """Times the draft model's forwards from `start()` to `stop()`, always (not only with
    `SPECEXTEND_STEP_TIMINGS`): the scheduler weighs the draft's passes over prompts by
    their measured cost (`algorithm.prompt_work`). Each forward adds (tokens, seconds) to
    the list `start()` returns.

    >>> model = torch.nn.Identity()
    >>> clock = DraftPassClock(model)
    >>> passes = clock.start()
    >>> _ = model(torch.zeros(3)), model(torch.zeros(100))
    >>> clock.stop()
    >>> _ = model(torch.zeros(7))
    >>> [tokens for tokens, _ in passes]
    [3, 100]
    """

    def __init__(self, model: torch.nn.Module, synchronize: Callable[[], None] | None = None):
        self._synchronize = synchronize or (lambda: None)
        self._passes: list[tuple[int, float]] | None = None
        self._started = 0.0
        model.register_forward_pre_hook(self._pass_started, with_kwargs=True)
        model.register_forward_hook(self._pass_finished, with_kwargs=True)

    def start(self) -> list[tuple[int, float]]:
        self._passes = passes = []
        return passes

    def stop(self) -> None:
        self._passes = None

    def _pass_started(self, module: object, args: tuple, kwargs: dict) -> None:
        if self._passes is not None:
            self._synchronize()
            self._started = drafting_clock()

    def _pass_finished(self, module: object, args: tuple, kwargs: dict, output: object) -> None:
        if self._passes is not None:
            self._synchronize()
            positions = kwargs.get("positions", args[0] if args else None)
            assert isinstance(positions, torch.Tensor)
            self._passes.append((positions.shape[-1], drafting_clock() - self._started))
