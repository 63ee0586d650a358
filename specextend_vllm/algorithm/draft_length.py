"""Whether drafting pays, per batch size, from measured step times and acceptance.

A decoding step with k drafts gives each request `tokens_per_step` tokens (1 + accepted
drafts) in `step_seconds(k)`; a step with none gives 1 token in `step_seconds(0)` (the draft
does not run: the next step that drafts first writes its KV of the missed tokens in one
pass, a cost that falls on the first drafting step, which is not measured). Drafting pays while

    tokens_per_step / step_seconds(k) >= 1 / step_seconds(0).

Both step times depend on the batch size (on a CPU the target becomes compute-bound as the
batch grows, and verifying k + 1 tokens per request costs up to k + 1 times a plain step),
so they are measured per bucket of batch sizes (1, 2-3, 4-7, ...), each as the lower
median of its recent steps (a pause of the process moves it by one rank, not by its size).
Acceptance depends on the requests, not the batch size: one moving average for all. Each
bucket measures drafting first, then not drafting, then keeps the better one and tries the
other again for a few steps after a number of steps that starts small and doubles while
the choice holds (`algorithm.exploration`), so a wrong first choice is left quickly and a
changed workload changes it. While drafting is kept its own rate is measured at every step, and a plain
step's time hardly changes (it depends on the batch and the context length, not on the
text): plain steps are measured again rarely (after 32 steps, up to 256). While not
drafting is kept, drafting is measured again sooner (after 8 steps, up to 64): only
drafting tells whether the draft is accepted again. After the first check, a choice that
wins clearly is checked no more often than keeps what the checks lose within 3% of the
time (`algorithm.exploration.budgeted_period`; up to 256 steps apart): a draft that
narrowly loses (on a CPU where it costs 0.4 of a target step) would otherwise lose 4%.
"""

from __future__ import annotations

import dataclasses

from specextend_vllm.algorithm.exploration import (
    Exploration,
    MovingAverage,
    RecentMedian,
    keeps_preference,
)

# Recent steps whose median is a choice's step time: a drafting step is measured at every
# step while drafting is kept, a plain one a few steps per exploration.
DRAFTING_STEP_WINDOW = 8
PLAIN_STEP_WINDOW = 4
# Weight of a new measurement in the moving average of tokens per drafting step (1 to
# k + 1 from one step to the next).
TOKENS_SMOOTHING = 0.05
# Steps measured with each choice before the bucket compares them: more for drafting,
# whose tokens per step vary from 1 to k + 1 from one step to the next (three steps that
# accepted nothing at the start of an answer once settled a bucket on not drafting where
# drafting was 1.3x faster), than for a plain step, whose time hardly varies.
MIN_DRAFTING_SAMPLES = 8
MIN_PLAIN_SAMPLES = 3
# Steps of each exploration (the first of them, a switch, is not measured): more for
# drafting, whose acceptance needs more samples.
EXPLORATION_STEPS = 4
DRAFTING_EXPLORATION_STEPS = 8
# Periods between explorations of plain steps while drafting is kept (the first, the
# longest); those of drafting while it is not are `algorithm.exploration`'s.
PLAIN_FIRST_EXPLORATION_PERIOD = 32
PLAIN_EXPLORATION_PERIOD = 256


def batch_size_bucket(batch_size: int) -> int:
    """1 -> 0, 2-3 -> 1, 4-7 -> 2, 8-15 -> 3, ...

    >>> [batch_size_bucket(b) for b in (1, 2, 3, 4, 7, 8, 300)]
    [0, 1, 1, 2, 2, 3, 8]
    """
    return max(batch_size, 1).bit_length() - 1


@dataclasses.dataclass
class BucketState:
    drafting_step_s: RecentMedian = dataclasses.field(
        default_factory=lambda: RecentMedian(DRAFTING_STEP_WINDOW)
    )
    plain_step_s: RecentMedian = dataclasses.field(
        default_factory=lambda: RecentMedian(PLAIN_STEP_WINDOW)
    )
    prefers_drafting: bool = True
    plain_exploration: Exploration = dataclasses.field(
        default_factory=lambda: Exploration(PLAIN_FIRST_EXPLORATION_PERIOD, PLAIN_EXPLORATION_PERIOD)
    )
    drafting_exploration: Exploration = dataclasses.field(default_factory=Exploration)

    @property
    def exploration(self) -> Exploration:
        """When the choice kept now measures the other one again."""
        return self.plain_exploration if self.prefers_drafting else self.drafting_exploration

    def measured(self) -> bool:
        return (
            self.drafting_step_s.samples >= MIN_DRAFTING_SAMPLES
            and self.plain_step_s.samples >= MIN_PLAIN_SAMPLES
        )

    def drafts(self) -> bool:
        """What the bucket schedules now: each choice until measured, then the preferred
        one, or the other one while exploring."""
        if self.drafting_step_s.samples < MIN_DRAFTING_SAMPLES:
            return True
        if self.plain_step_s.samples < MIN_PLAIN_SAMPLES:
            return False
        return self.prefers_drafting != self.exploration.exploring


class DraftLengthChooser:
    """Chooses, per batch size, between `num_speculative_tokens` drafts and none.

    `lookup` is the table vLLM's scheduler reads (`dynamic_sd_lookup`: draft tokens by
    batch size); `record_step` feeds it one decoding step's measurements.

    Drafting costs 0.5 s a step for 2.5 tokens, a plain step 0.3 s for 1: drafting pays
    at batch 1 (5 tokens/s against 3.3). At batch 8 it costs 1.5 s for 2.5 tokens against
    0.35 s for 1: it does not (1.7 tokens/s against 2.9).

    >>> chooser = DraftLengthChooser(num_speculative_tokens=4, max_batch_size=8)
    >>> for _ in range(MIN_DRAFTING_SAMPLES):
    ...     chooser.record_step(1, 4, 4, 0.5, tokens_per_step=2.5)
    ...     chooser.record_step(8, 4, 4, 1.5, tokens_per_step=2.5)
    >>> for _ in range(MIN_PLAIN_SAMPLES):
    ...     chooser.record_step(1, 0, 0, 0.3)
    ...     chooser.record_step(8, 0, 0, 0.35)
    >>> chooser.lookup[1], chooser.lookup[8]
    (4, 0)
    """

    def __init__(self, num_speculative_tokens: int, max_batch_size: int):
        self.num_speculative_tokens = num_speculative_tokens
        self.buckets = [BucketState() for _ in range(batch_size_bucket(max_batch_size) + 1)]
        self.tokens_per_drafting_step = MovingAverage(TOKENS_SMOOTHING)
        self.lookup = [num_speculative_tokens] * (max_batch_size + 1)

    def record_step(
        self,
        batch_size: int,
        verified_drafts: int,
        next_drafts: int,
        step_seconds: float,
        tokens_per_step: float | None = None,
    ) -> None:
        """One decoding step of `batch_size` requests, none prefilling: each verified
        `verified_drafts` drafts (on average `tokens_per_step` tokens came out) and the
        step scheduled `next_drafts` for the next one. Steps that switch between drafting
        and not, or draft another number of tokens, measure neither choice."""
        index = min(batch_size_bucket(batch_size), len(self.buckets) - 1)
        bucket = self.buckets[index]
        if verified_drafts == next_drafts == self.num_speculative_tokens:
            bucket.drafting_step_s.add(step_seconds)
            if tokens_per_step is not None:
                self.tokens_per_drafting_step.add(tokens_per_step)
        elif verified_drafts == next_drafts == 0:
            bucket.plain_step_s.add(step_seconds)
        if bucket.measured():
            preferred = bucket.prefers_drafting
            win = self._update_preference(bucket)
            tokens = self._tokens_per_drafting_step()
            bucket.exploration.count_step(
                bucket.prefers_drafting != preferred,
                win,
                EXPLORATION_STEPS if bucket.prefers_drafting else DRAFTING_EXPLORATION_STEPS,
                1 / tokens if bucket.prefers_drafting else tokens,
            )
        self._write_lookup(index, bucket.drafts())

    def _tokens_per_drafting_step(self) -> float:
        """At least the one token every step gives (none measured yet: steps whose
        sampled tokens did not come back)."""
        return max(self.tokens_per_drafting_step.value, 1.0)

    def _update_preference(self, bucket: BucketState) -> float:
        """Updates the bucket's choice; returns how many times faster it measures."""
        drafting_rate = self._tokens_per_drafting_step() / bucket.drafting_step_s.value
        plain_rate = 1.0 / bucket.plain_step_s.value
        bucket.prefers_drafting = keeps_preference(
            bucket.prefers_drafting, drafting_rate, plain_rate
        )
        if bucket.prefers_drafting:
            return drafting_rate / plain_rate
        return plain_rate / drafting_rate

    def _write_lookup(self, index: int, drafts: bool) -> None:
        first = 1 << index
        last = min((first << 1) - 1, len(self.lookup) - 1)
        self.lookup[first : last + 1] = [self.num_speculative_tokens if drafts else 0] * (
            last + 1 - first
        )
