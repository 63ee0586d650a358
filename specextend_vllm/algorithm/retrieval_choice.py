"""Whether requests draft on retrieval's reduced cache or on the full one, per context
length, from measured step times and acceptance (`retrieval: auto`).

Retrieval trades acceptance for a cheaper draft: drafting on the kept chunks costs less
than on the whole context (the draft's attention reads fewer keys), and the draft sees
less of what the target sees. Which wins depends on the context length, the draft and
the text: at 3K on the real pair the reduced cache lost more acceptance than it saved
time. A decoding step that drafts with choice c gives each request `tokens_per_step(c)`
tokens (1 + accepted drafts) in `step_seconds(c)` (the draft's passes, then the target's
verification of what they drafted); the choice with more tokens per second is kept:

    tokens_per_step(reduced) / step_seconds(reduced)  vs  tokens_per_step(full) / step_seconds(full).

Both sides are measured per bucket of context lengths (`activation_length` to twice it,
then to four times it, ...): the bucket measures the full cache (what `draft_model` does)
and the reduced one in turns of 4 steps, 8 steps each, keeps the faster and re-explores the
other as `algorithm.exploration` schedules, on steps of any number of drafts. A batch
follows the choice of the bucket holding most of its context tokens (the requests long
enough to be reduced all draft the same way), and its step is measured for that bucket, so
batches that mix lengths measure too.

The number of drafts changes from one step to the next (`drafting: auto` keeps one length
and explores one more for a few steps now and then), and each step compares the two ways,
and keeps a preference, for its own number of drafts:
- tokens per step: each way's acceptance of the i-th draft is measured over the bucket's
  steps of any number of drafts (`algorithm.draft_acceptance`), and a number of drafts'
  tokens follow from it;
- step time: the reduced cache's step time over the full one's, measured per number of
  drafts on the steps of the two ways around their switches (`StepTimeRatio`). Each way's
  own recent steps compared the kept way's steps now with the other's from the last
  exploration, on another text or a busier machine: at 4K on essays the reduced cache
  measured 18% faster (363 against 442 ms) where the decodes held on either cache spent
  the same time in the target's forward.

A new text may be served better by the other way: each way's acceptance is a long average,
and the way not kept is measured only while exploring. Where a batch's requests are all
new (a request decoding alone after another, as in the speed suite) and the kept way wins
by less than `exploration.NARROW_WIN`, the other way is explored then, for 16 steps, if
the steps since the last exploration are as many as the budget asks of a scheduled one of
8 (`Exploration.explore_early`; these may lose up to twice the budget, at changes of batch
only): in `benchmarks.retrieval_choice_simulation`, 4K fiction after essays (the reduced
cache accepting 0.55 where the full one accepts 0.72, each step 0.97x as long) kept 0.91
of the better cache's rate over its first 99 steps, where it kept 0.88 without.

When each number of drafts measured and explored the two ways on its own schedule, in
`benchmarks.retrieval_choice_simulation` a reduced cache twice as fast kept 0.79 of its
rate over 99 steps of 1 to 4 drafts (the median of 40 seeds), each number measuring the
slower cache for 8 steps; now 0.92. What the bucket's one schedule costs: a number of
drafts whose deeper drafts the way not kept has measured in few steps compares on its few
steps' acceptance, with their noise, until an exploration at that number measures more.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Sequence

import torch

from specextend_vllm.algorithm.draft_acceptance import DraftAcceptance, TokensEstimate
from specextend_vllm.algorithm.exploration import (
    SHORTEST_STEP_SECONDS,
    Exploration,
    compare_ways,
    measuring_uses_second,
    tokens_beyond_noise,
)

# Buckets of context lengths from activation_length up; longer contexts share the last.
NUM_LENGTH_BUCKETS = 8
# The two ways' step times are compared over their steps within 8 of the switch between
# them, once each has a measuring turn's worth there (`StepTimeRatio`).
SWITCH_STEPS = 8
PAIRED_STEPS = 4
# A number of drafts' ratio is the median of its last 5 switches' (about one exploration
# of 8 steps gives two: its first steps against the kept way's before it, its last against
# those after).
RATIO_SWITCHES = 5
# Each draft is accepted or not from one step to the next, and the two choices'
# acceptance is often within 10% of each other: a long average.
TOKENS_SMOOTHING = 0.02
# Steps measured with each choice before comparing them, and per exploration.
MIN_SAMPLES = 8
EXPLORATION_STEPS = 8
# An exploration at a new batch of requests, where a choice wins narrowly: tokens per step
# vary from 1 to k + 1, and 8 steps of a new text seldom tell two ways apart by more than
# their noise.
NEW_BATCH_EXPLORATION_STEPS = 2 * EXPLORATION_STEPS
# Before the first comparison the two choices take turns of this many measured steps, so
# that both sample the same stretches of the output (acceptance differs between the start
# of an answer and its middle more than between the two choices); a turn on the reduced
# cache starts with a selection, as every `retrieval_interval` (4) steps.
MEASURING_TURN = 4
# Explorations (of 8 steps) after 16 steps, then 32, ... at most 256: a bucket's trade-off
# changes with the texts, slowly; a settled choice explores 3% of its steps.
FIRST_EXPLORATION_PERIOD = 16
EXPLORATION_PERIOD = 256


def length_buckets(context_lens: torch.Tensor, activation_length: int) -> torch.Tensor:
    """[R] context lengths -> [R] buckets: -1 below `activation_length` (never reduced),
    0 up to twice it, 1 up to four times, ..., at most NUM_LENGTH_BUCKETS - 1.

    >>> length_buckets(torch.tensor([100, 2048, 4095, 4096, 9000, 10**7]), 2048).tolist()
    [-1, 0, 0, 1, 2, 7]
    """
    multiples = torch.div(context_lens, activation_length, rounding_mode="floor")
    buckets = torch.log2(multiples.clamp(min=1).double()).floor().long()
    return torch.where(multiples > 0, buckets.clamp(max=NUM_LENGTH_BUCKETS - 1), -1)


class StepTimeRatio:
    """The reduced cache's step time over the full one's, per number of drafts, from the
    steps of the two ways around their switches: at each switch, the lower medians of each
    way's steps of that number of drafts within SWITCH_STEPS steps of the older way's last
    one, once each way has PAIRED_STEPS of them there; the ratio is the median of the last
    RATIO_SWITCHES switches'.

    The two ways' steps are measured at different times, and a bucket's steps take longer
    on a longer text, or when the machine is busier: each way's own recent steps would
    compare the kept way's steps now with the other way's from the last exploration. A
    number of drafts measured around fewer than RATIO_SWITCHES switches takes the latest
    switches of the nearest numbers too: one switch's ratio moves with the machine as much
    as with the reduced cache (at 4K on fiction, 4 drafts measured 0.85 at one switch where
    2 and 3 measured 0.98-1.0 at several, and kept the reduced cache that lost).
    Full steps of 0.50 s, reduced ones of 0.40 s, then the full cache kept while the machine
    slows down:

    >>> ratio = StepTimeRatio()
    >>> for reduced, seconds in [(False, 0.50), (False, 0.52)] * 2 + [(True, 0.40)] * 4:
    ...     ratio.add(reduced, 3, seconds)
    >>> for seconds in [0.50] * SWITCH_STEPS + [0.70] * 2 * SWITCH_STEPS:
    ...     ratio.add(False, 3, seconds)
    >>> ratio.value(3), ratio.value(4), StepTimeRatio().value(3)
    (0.8, 0.8, None)
    """

    def __init__(self) -> None:
        self.steps = 0
        # Per (reduced, drafts per step): (step index, seconds) of its last steps.
        self.recent: dict[tuple[bool, int], collections.deque[tuple[int, float]]] = {}
        # Per drafts per step: the ratio around each of the last switches, by the step
        # index that switch is measured around.
        self.switch_ratios: dict[int, dict[int, float]] = {}

    def add(self, reduced: bool, num_drafts: int, step_seconds: float) -> None:
        self.steps += 1
        self.recent.setdefault(
            (reduced, num_drafts), collections.deque(maxlen=2 * SWITCH_STEPS)
        ).append((self.steps, max(step_seconds, SHORTEST_STEP_SECONDS)))
        ways = [self.recent.get((way, num_drafts)) for way in (False, True)]
        if not (ways[0] and ways[1]):
            return
        switch = min(steps[-1][0] for steps in ways)
        around_switch = [
            [seconds for index, seconds in steps if abs(index - switch) <= SWITCH_STEPS]
            for steps in ways
        ]
        if min(len(times) for times in around_switch) >= PAIRED_STEPS:
            full, reduced_seconds = (statistics.median_low(times) for times in around_switch)
            ratios = self.switch_ratios.setdefault(num_drafts, {})
            ratios[switch] = reduced_seconds / full
            if len(ratios) > RATIO_SWITCHES:
                del ratios[next(iter(ratios))]

    def nearest_switches(self, num_drafts: int) -> list[float]:
        """The last RATIO_SWITCHES switches' ratios of `num_drafts`, the latest first, and
        the nearest numbers' latest where it has fewer."""
        nearest_first = sorted(
            self.switch_ratios, key=lambda count: (abs(count - num_drafts), count)
        )
        return [
            ratio
            for count in nearest_first
            for ratio in reversed(self.switch_ratios[count].values())
        ][:RATIO_SWITCHES]

    def ratios(self) -> dict[int, float]:
        """Per number of drafts measured both ways, its value."""
        return {
            num_drafts: statistics.median(self.nearest_switches(num_drafts))
            for num_drafts in sorted(self.switch_ratios)
        }

    def value(self, num_drafts: int) -> float | None:
        switches = self.nearest_switches(num_drafts)
        return statistics.median(switches) if switches else None


class BucketChoice:
    """One bucket's choice. It measures the two ways, then explores the one not preferred,
    over steps of any number of drafts, and prefers a way per number of drafts: each step's
    comparison is for its own number (a draft lost costs more tokens at 4 drafts a step than
    at 1, and the time a reduced cache saves grows with the draft's passes). A number not
    compared yet follows the nearest one compared.

    Each draft accepted at 0.5 on the reduced cache and 0.8 on the full one, whose steps
    take 1.25x as long: at 1 draft a step the reduced cache wins (1.5 tokens against 1.8),
    at 4 the full one (1.9 against 3.4). Steps of 1 draft measure the two ways in turns of
    4, then keep the reduced cache; steps of 4 start with it, as the nearest number
    compared, and turn to the full cache; steps of 1 go back to the reduced one at once:

    >>> bucket = BucketChoice(max_drafts=4)
    >>> def step(num_drafts):
    ...     reduced = bucket.reduces(num_drafts)
    ...     acceptance = 0.5 if reduced else 0.8
    ...     shares = [acceptance**depth for depth in range(1, num_drafts + 1)]
    ...     seconds = (0.8 if reduced else 1.0) * (1 + 0.25 * num_drafts)
    ...     bucket.record_step(num_drafts, reduced, seconds, shares)
    ...     return int(reduced)
    >>> [step(1) for _ in range(20)]
    [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    >>> [step(4) for _ in range(12)], [step(1) for _ in range(4)]
    ([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1])
    """

    def __init__(self, max_drafts: int):
        # Each way's acceptance of each draft, the full cache's first.
        self.acceptance = (
            DraftAcceptance(max_drafts, TOKENS_SMOOTHING),
            DraftAcceptance(max_drafts, TOKENS_SMOOTHING),
        )
        self.time_ratio = StepTimeRatio()
        # Measured steps on the full cache and on the reduced one.
        self.steps = [0, 0]
        self.prefers_reduced: dict[int, bool] = {}
        self.exploration = Exploration(FIRST_EXPLORATION_PERIOD, EXPLORATION_PERIOD)

    def measured(self, num_drafts: int) -> bool:
        return min(self.steps) >= MIN_SAMPLES and self.time_ratio.value(num_drafts) is not None

    def preference(self, num_drafts: int) -> bool:
        """Whether steps of `num_drafts` drafts prefer the reduced cache."""
        if not self.prefers_reduced:
            return False
        nearest = min(self.prefers_reduced, key=lambda count: (abs(count - num_drafts), count))
        return self.prefers_reduced[nearest]

    def reduces(self, num_drafts: int) -> bool:
        """Each way in turns until both are measured, then the preferred one, or the other
        one while exploring."""
        if not self.measured(num_drafts):
            return measuring_uses_second(*self.steps, MIN_SAMPLES, MEASURING_TURN)
        return self.preference(num_drafts) != self.exploration.exploring

    def new_batch(self) -> None:
        """The batch's requests are all new to it: a narrow choice is explored early."""
        self.exploration.explore_early(NEW_BATCH_EXPLORATION_STEPS, EXPLORATION_STEPS)

    def tokens_estimates(self, num_drafts: int) -> tuple[TokensEstimate, TokensEstimate]:
        """Tokens per step of `num_drafts` drafts on the full cache and on the reduced one."""
        full, reduced = self.acceptance
        return full.tokens_estimate(num_drafts), reduced.tokens_estimate(num_drafts)

    def record_step(
        self,
        num_drafts: int,
        reduced: bool,
        step_seconds: float,
        accepted_shares: Sequence[float],
    ) -> None:
        self.acceptance[int(reduced)].add(accepted_shares)
        self.time_ratio.add(reduced, num_drafts, step_seconds)
        self.steps[int(reduced)] += 1
        time_ratio = self.time_ratio.value(num_drafts)
        if min(self.steps) < MIN_SAMPLES or time_ratio is None:
            return
        full_tokens, reduced_tokens = tokens_beyond_noise(*self.tokens_estimates(num_drafts))
        tokens_ratio = reduced_tokens / full_tokens
        self.prefers_reduced[num_drafts] = compare_ways(
            self.exploration,
            self.preference(num_drafts),
            1.0,
            tokens_ratio / time_ratio,
            tokens_ratio,
            EXPLORATION_STEPS,
        )


class RetrievalChooser:
    """Chooses, per bucket of context lengths, between drafting on the reduced cache and on
    the full one. `reduces` reads the choice for a batch's bucket; `record_step` feeds one
    measured step.

    At 3K a reduced step of 4 drafts takes 0.50 s, a full one 0.52 s; each draft is
    accepted at 0.6 on the reduced cache (2.3 tokens a step), 0.7 on the full one (2.8):
    the full cache wins (5.3 tokens/s against 4.6). At 12K: 0.55 s against 0.80 s, the
    reduced one wins (4.2 against 3.5, tokens as at 3K):

    >>> chooser = RetrievalChooser(activation_length=2048, max_drafts=4)
    >>> for _ in range(2 * MIN_SAMPLES):
    ...     for bucket, times in ((0, (0.52, 0.50)), (2, (0.80, 0.55))):
    ...         reduced = chooser.reduces(bucket, 4)
    ...         acceptance = 0.6 if reduced else 0.7
    ...         shares = [acceptance**depth for depth in range(1, 5)]
    ...         chooser.record_step(bucket, 4, reduced, times[reduced], shares)
    >>> chooser.reduces(0, 4), chooser.reduces(2, 4)
    (False, True)
    """

    def __init__(self, activation_length: int, max_drafts: int):
        self.activation_length = activation_length
        self.max_drafts = max_drafts
        self.buckets: dict[int, BucketChoice] = {}

    def bucket(self, bucket_index: int) -> BucketChoice:
        if bucket_index not in self.buckets:
            self.buckets[bucket_index] = BucketChoice(self.max_drafts)
        return self.buckets[bucket_index]

    def batch_bucket(self, context_lens: torch.Tensor) -> int:
        """[R] context lengths -> the bucket holding most of the context tokens of the
        requests long enough to be reduced; -1 where none is.

        >>> RetrievalChooser(2048, 4).batch_bucket(torch.tensor([1000, 3000, 3500, 5000]))
        0
        >>> RetrievalChooser(2048, 4).batch_bucket(torch.tensor([1000, 2047]))
        -1
        """
        buckets = length_buckets(context_lens, self.activation_length)
        eligible = buckets >= 0
        tokens = torch.zeros(NUM_LENGTH_BUCKETS, dtype=torch.int64, device=context_lens.device)
        tokens.index_add_(0, buckets[eligible], context_lens[eligible].long())
        most_tokens, bucket = torch.stack(tokens.max(0)).tolist()
        return bucket if most_tokens > 0 else -1

    def new_batch(self, bucket_index: int) -> None:
        """A batch whose bucket is `bucket_index` holds only requests new to the
        planner."""
        self.bucket(bucket_index).new_batch()

    def reduces(self, bucket_index: int, num_drafts: int) -> bool:
        """Whether the requests of a batch whose bucket is `bucket_index` draft their
        `num_drafts` tokens on the reduced cache now."""
        return self.bucket(bucket_index).reduces(num_drafts)

    def record_step(
        self,
        bucket_index: int,
        num_drafts: int,
        reduced: bool,
        step_seconds: float,
        accepted_shares: Sequence[float],
    ) -> None:
        """One decoding step of `num_drafts` drafts of a batch whose bucket is
        `bucket_index`, whose requests drafted on the reduced cache (or all on the full
        one), then verified: it took `step_seconds`, and a share `accepted_shares[i]` of
        its requests accepted i + 1 drafts or more."""
        self.bucket(bucket_index).record_step(num_drafts, reduced, step_seconds, accepted_shares)
