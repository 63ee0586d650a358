"""How many tokens to draft, per batch size, from measured step times and acceptance.

A decoding step with j drafts gives each request `tokens(j)` tokens (1 + accepted drafts)
in `step_seconds(j)`; a step with none gives 1 token in `step_seconds(0)` (the draft does
not run: the next step that drafts first writes its KV of the missed tokens in one pass, a
cost that falls on the first drafting step, which is not measured). The chooser drafts the
j in 0..k giving the most tokens per second, `tokens(j) / step_seconds(j)`.

Both step times depend on the batch size (on a CPU the target becomes compute-bound as the
batch grows, and verifying j + 1 tokens per request costs up to j + 1 times a plain step),
so they are measured per bucket of batch sizes (1, 2-3, 4-7, ...), each as the lower
median of its recent steps (a pause of the process moves it by one rank, not by its size);
a length not measured yet is interpolated between the measured ones. Acceptance depends on
the requests, not the batch size: a length's tokens follow, for all buckets, from the
share of requests accepting the i-th draft among those that accepted the drafts before it,
p_i, each a moving average over recent steps that drafted i or more,
`tokens(j) = 1 + p_1 + p_1 p_2 + ... + p_1 ... p_j` (`algorithm.draft_acceptance`). A
depth not drafted yet takes the deepest measured one's p. Shorter chains' tokens are
then what the same steps gave: one rate for all drafts put them up to 10% off in 8K
runs, as far off as lengths differ by, and undervalues drafts that follow accepted ones
where whole chains are accepted together. A chain of k drafts that narrowly loses to
plain decoding often wins with fewer: the first drafts are the likeliest accepted, the
last ones cost as much and pay least. (Trees are drafted whole or not at all, j is 0 or
k, and a tree's tokens per step are taken as measured: they do not follow a chain's.)

Each bucket measures k drafts first (8 steps), then none, then keeps the best length. A
bucket whose first step comes once acceptance is measured needs only step times, and
measures the cheapest drafting step, one draft (3 steps), then none: lengths beyond the
longest measured are extrapolated, linear in the number of drafts, and the best one, once
drafted, measured (in 2K serving, 4 requests' first steps drafting 4 tokens took 2.0-3.2x
a plain step and gave 1.4-1.8 tokens a request, where one draft took 1.2-1.6x and gave 1.7,
two 1.5-1.6x and 2.2-2.3). Then the bucket tries drafting or not drafting, whichever it
left, again for a few steps after a number of steps that starts small and doubles while the
choice holds (`algorithm.exploration`), so a wrong first choice is left quickly and a
changed workload changes it. While drafting is kept its own rate is measured at every step,
and a plain step's time hardly changes (it depends on the batch and the context length,
not on the text): plain steps are measured again rarely
(after 32 steps, up to 256). While not drafting is kept, drafting (at the best length) is
measured again sooner (after 8 steps, up to 64): only drafting tells whether the draft is
accepted again. After the first check, a choice that wins clearly is checked no more often
than keeps what the checks lose within 3% of the time, the draft's catch-up on each return
to drafting included (`algorithm.exploration.budgeted_period`, `catch_up_steps`; up to 256
steps apart): a draft that narrowly loses (on a CPU where it costs 0.4 of a target step)
would otherwise lose 4%. A choice made by less than `exploration.NARROW_WIN` is checked
again soon, whichever it is: the few steps that made it may come from a slower or faster
stretch than those after them. A kept length below k
also drafts one more token for a few steps now and then (after 8 steps, up to 128): only
that measures the next draft's acceptance and step time as they are now, not as they were
when the length was last drafted (at 8K, chains kept 3 drafts a step where an engine
drafting 4 at every step decoded 1.15-1.2x faster; 4 had been measured only in the
engine's first requests). A length not measured for STALE_STEPS steps of its bucket while
lengths on both sides of it were is interpolated between them, and measured afresh when
drafted again: a length no longer chosen is not drafted again, and its last reading, maybe
from a slow stretch, would otherwise stand for good (on an AVX2 EPYC at 4K one draft's
time read 1.36x its earlier one in a slow stretch and stayed so for 15 requests, plain
steps kept where one draft at its earlier time promised 1.1x). A plain step's reading
has no shorter length to be interpolated from: where it is older than STALE_STEPS steps
and slower than a drafting length's reading made since, plain steps are measured again at
once (a plain step runs the least of any step; on a 2-core Zen 4 EPYC at 8K, an engine's
first three plain steps, in a slow stretch, read 924 ms where later ones took 385 ms, two
or three drafts a step were kept at 598-914 ms, and plain steps were not measured again
for 256 steps, through a text that plain decoding decoded 1.10x faster). Where the kept
choice measured more than `exploration.CLEAR_WIN` (1.5x) faster when it was made, each of
these checks waits its longest period first (at 16K, a 4-draft step of 1.15 s in an
engine's first answer, where 3 drafts took 0.46-0.83 s, held 3 drafts a step for 100
steps).
"""

from __future__ import annotations

from collections.abc import Sequence

from specextend_vllm.algorithm.draft_acceptance import DraftAcceptance
from specextend_vllm.algorithm.exploration import (
    Exploration,
    MovingAverage,
    RecentMedian,
    keeps_preference,
)

# Recent steps whose median is a length's step time: a drafting length is measured at
# every step while it is kept, no drafts a few steps per exploration.
DRAFTING_STEP_WINDOW = 8
PLAIN_STEP_WINDOW = 4
# Weight of a new measurement in the moving averages of accepted drafts per request and
# step, and of each draft's acceptance (0 to j accepted from one step to the next).
TOKENS_SMOOTHING = 0.05
# Steps measured with each choice before the bucket compares them: more for drafting,
# whose tokens per step vary from 1 to k + 1 from one step to the next (three steps that
# accepted nothing at the start of an answer once settled a bucket on not drafting where
# drafting was 1.3x faster), than for a plain step, whose time hardly varies. Once the
# engine has measured acceptance in MIN_DRAFTING_SAMPLES drafting steps of any batch size,
# a new bucket needs only a step time's MIN_PLAIN_SAMPLES drafting steps: acceptance
# depends on the requests, not the batch size (4 requests of 64 tokens, after requests
# alone had measured acceptance, spent 8 of their first 11 steps drafting 4 tokens where
# that lost 1.5x).
MIN_DRAFTING_SAMPLES = 8
MIN_PLAIN_SAMPLES = 3
# Steps of each exploration (the first of them, a switch, is not measured): more for
# drafting, whose acceptance needs more samples.
EXPLORATION_STEPS = 4
DRAFTING_EXPLORATION_STEPS = 8
# Steps of an exploration of one more draft: all but the last (which switches back) measure
# its step time, most of DRAFTING_STEP_WINDOW, so that its median is one measured now.
LONGER_EXPLORATION_STEPS = DRAFTING_STEP_WINDOW // 2 + 2
LONGER_EXPLORATION_PERIOD = 128
# Periods between explorations of plain steps while drafting is kept (the first, the
# longest); those of drafting while it is not are `algorithm.exploration`'s.
PLAIN_FIRST_EXPLORATION_PERIOD = 32
PLAIN_EXPLORATION_PERIOD = 256
# Steps of a bucket after which a length measured before lengths on both sides of it were
# measured again is interpolated between them: a length that stops being chosen is not
# drafted again, so its last reading would otherwise stand for the engine's life.
STALE_STEPS = 128


def batch_size_bucket(batch_size: int) -> int:
    """1 -> 0, 2-3 -> 1, 4-7 -> 2, 8-15 -> 3, ...

    >>> [batch_size_bucket(b) for b in (1, 2, 3, 4, 7, 8, 300)]
    [0, 1, 1, 2, 2, 3, 8]
    """
    return max(batch_size, 1).bit_length() - 1


def catch_up_steps(step_times: Sequence[float], kept_length: int) -> float:
    """What a return to drafting after plain steps costs more, in steps of the kept length
    (0: plain steps): the draft's catch-up pass over the tokens it missed, about one draft
    forward, taken as what a draft adds to a step, on average from none to the most. At 8K
    with the fp32 draft on a 2-core Zen 4 EPYC, such returns took a median 137 ms more than
    a step of the same drafts (23 of them, about flat in the tokens missed), and each of 2-4
    drafts added a median 119 ms to a step (73-177 ms per decode and length; one draft a
    step, 122-246 ms more than a plain one, verifies a second token too):

    >>> step_times = [0.285, 0.406, 0.52, 0.64, 0.765]
    >>> round(catch_up_steps(step_times, 4), 3), round(catch_up_steps(step_times, 0), 3)
    (0.157, 0.421)
    """
    max_drafts = len(step_times) - 1
    per_draft_s = max(step_times[max_drafts] - step_times[0], 0.0) / max_drafts
    return per_draft_s / step_times[kept_length]


class BucketState:
    """One bucket of batch sizes: its step times per number of drafts, the number it
    keeps (0: not drafting), the drafting length its explorations draft, and when a kept
    length drafts one more."""

    def __init__(self, max_drafts: int):
        self.step_s = [RecentMedian(PLAIN_STEP_WINDOW)] + [
            RecentMedian(DRAFTING_STEP_WINDOW) for _ in range(max_drafts)
        ]
        self.first_length = max_drafts
        self.length = max_drafts
        self.drafting_length = max_drafts
        self.plain_exploration = Exploration(
            PLAIN_FIRST_EXPLORATION_PERIOD, PLAIN_EXPLORATION_PERIOD
        )
        self.drafting_exploration = Exploration()
        self.longer_exploration = Exploration(max_period=LONGER_EXPLORATION_PERIOD)
        self.steps = 0
        self.measured_at = [0] * (max_drafts + 1)

    def measure_first(self, num_drafts: int) -> None:
        """Before the bucket's first step: it measures `num_drafts` drafts first, not k."""
        self.first_length = self.length = self.drafting_length = num_drafts

    def add_step_time(self, num_drafts: int, seconds: float) -> None:
        """One step's time of `num_drafts` drafts; a stale length's readings are dropped
        first, so that it is interpolated until measured afresh."""
        if num_drafts in self.stale_lengths():
            self.step_s[num_drafts] = RecentMedian(DRAFTING_STEP_WINDOW)
        self.step_s[num_drafts].add(seconds)
        self.measured_at[num_drafts] = self.steps

    @property
    def prefers_drafting(self) -> bool:
        return self.length > 0

    @property
    def exploration(self) -> Exploration:
        """When the choice kept now measures the other one again."""
        return self.plain_exploration if self.prefers_drafting else self.drafting_exploration

    def doubts_plain_time(self) -> bool:
        """Whether a plain step's reading, made more than STALE_STEPS steps ago, is slower
        than a drafting length's current reading made since.

        Zen 4 at 8K: plain steps read 924 ms in a slow stretch, then three drafts a step
        717 ms for STALE_STEPS steps; one more and the plain reading is in doubt:

        >>> bucket = BucketState(max_drafts=3)
        >>> for _ in range(MIN_PLAIN_SAMPLES):
        ...     bucket.add_step_time(0, 0.924)
        >>> for step in range(1, STALE_STEPS + 2):
        ...     bucket.steps = step
        ...     bucket.add_step_time(3, 0.717)
        ...     if step == STALE_STEPS: print(bucket.doubts_plain_time())
        False
        >>> bucket.doubts_plain_time()
        True
        """
        if self.step_s[0].samples < MIN_PLAIN_SAMPLES:
            return False
        if self.steps - self.measured_at[0] <= STALE_STEPS:
            return False
        plain_s = self.step_s[0].value
        return any(
            self.measured_at[j] > self.measured_at[0] and self.step_s[j].value < plain_s
            for j in self.current_lengths()
            if j
        )

    def measured(self, drafting_samples: int) -> bool:
        return (
            self.step_s[self.first_length].samples >= drafting_samples
            and self.step_s[0].samples >= MIN_PLAIN_SAMPLES
        )

    def scheduled_length(self, drafting_samples: int) -> int:
        """What the bucket drafts now: its first length until measured in
        `drafting_samples` steps, then none until measured, then the kept length, or while
        exploring none or the best drafting length, or one draft more than the kept
        length."""
        if self.step_s[self.first_length].samples < drafting_samples:
            return self.first_length
        if self.step_s[0].samples < MIN_PLAIN_SAMPLES:
            return 0
        if self.exploration.exploring:
            return 0 if self.prefers_drafting else self.drafting_length
        if self.prefers_drafting and self.longer_exploration.exploring:
            return min(self.length + 1, len(self.step_s) - 1)
        return self.length

    def step_times(self) -> list[float]:
        """Each length's step time, 0 to k drafts: its median, or, measured fewer than
        MIN_PLAIN_SAMPLES times or stale (`current_lengths`), interpolated between the
        nearest measured lengths, or beyond the longest measured, extrapolated from it and
        the next shorter one, no shorter than its time (none and the bucket's first length
        are measured first).

        >>> bucket = BucketState(max_drafts=4)
        >>> for _ in range(MIN_DRAFTING_SAMPLES):
        ...     bucket.add_step_time(0, 0.5)
        ...     bucket.add_step_time(4, 1.5)
        >>> bucket.step_times()
        [0.5, 0.75, 1.0, 1.25, 1.5]

        A batch of 4 in 2K serving, none and one draft measured (its first length):

        >>> bucket = BucketState(max_drafts=4)
        >>> bucket.measure_first(1)
        >>> for _ in range(MIN_PLAIN_SAMPLES):
        ...     bucket.add_step_time(0, 0.348)
        ...     bucket.add_step_time(1, 0.554)
        >>> [round(seconds, 3) for seconds in bucket.step_times()]
        [0.348, 0.554, 0.76, 0.966, 1.172]
        """
        measured = self.current_lengths()
        times = []
        for num_drafts, recent in enumerate(self.step_s):
            if num_drafts in measured:
                times.append(recent.value)
                continue
            shorter = [j for j in measured if j < num_drafts]
            longer = [j for j in measured if j > num_drafts]
            low, high = (shorter[-1], longer[0]) if longer else (shorter[-2], shorter[-1])
            low_s, high_s = self.step_s[low].value, self.step_s[high].value
            line_s = low_s + (num_drafts - low) / (high - low) * (high_s - low_s)
            times.append(line_s if longer else max(line_s, high_s))
        return times

    def current_lengths(self) -> list[int]:
        """The lengths whose median step time stands: measured MIN_PLAIN_SAMPLES times and
        not stale.

        One draft measured at 0.47 s in a slow stretch, then none and 3 drafts for 200
        steps at 0.22 s and 0.61 s: one draft's time is interpolated, 0.35 s, until it is
        measured again.

        >>> bucket = BucketState(max_drafts=3)
        >>> for _ in range(MIN_DRAFTING_SAMPLES):
        ...     bucket.add_step_time(1, 0.47)
        >>> for step in range(1, 201):
        ...     bucket.steps = step
        ...     bucket.add_step_time(0, 0.22)
        ...     bucket.add_step_time(3, 0.61)
        >>> bucket.current_lengths(), round(bucket.step_times()[1], 2)
        ([0, 3], 0.35)
        >>> bucket.add_step_time(1, 0.36)
        >>> bucket.step_s[1].samples, round(bucket.step_times()[1], 2)
        (1, 0.35)
        """
        stale = self.stale_lengths()
        return [j for j in self.measured_lengths() if j not in stale]

    def measured_lengths(self) -> list[int]:
        return [j for j, times in enumerate(self.step_s) if times.samples >= MIN_PLAIN_SAMPLES]

    def stale_lengths(self) -> list[int]:
        """Measured lengths not measured in the last STALE_STEPS steps while lengths on
        both sides of them were."""
        measured = self.measured_lengths()
        recent = [j for j in measured if self.steps - self.measured_at[j] <= STALE_STEPS]
        return [
            j for j in measured
            if j not in recent and any(i < j for i in recent) and any(i > j for i in recent)
        ]


class DraftLengthChooser:
    """Chooses, per batch size, how many of `num_speculative_tokens` drafts to draft
    (any number, or with `chooses_length` False all or none: trees).

    `lookup` is the table vLLM's scheduler reads (`dynamic_sd_lookup`: draft tokens by
    batch size); `record_step` feeds it one decoding step's measurements.

    Each draft is accepted with probability 0.75 once those before it were (4 drafts give
    3.05 tokens a step, one gives 1.75); a plain step costs 0.3 s at batch 1, 0.35 s at
    batch 8. At batch 1, 4 drafts take 0.5 s a step (6.1 tokens/s against 3.3 plain); at
    batch 8, 1.8 s, where even one draft, costing a quarter of the difference, takes 0.71 s
    (2.5 tokens/s against 2.9 plain). Once measured, batches of 1 draft 4, of 8 none:

    >>> accepted = [0.75, 0.75**2, 0.75**3, 0.75**4]
    >>> chooser = DraftLengthChooser(num_speculative_tokens=4, max_batch_size=8)
    >>> for _ in range(MIN_DRAFTING_SAMPLES):
    ...     chooser.record_step(1, 4, 4, 0.5, accepted)
    ...     chooser.record_step(8, 4, 4, 1.8, accepted)
    >>> for _ in range(MIN_PLAIN_SAMPLES):
    ...     chooser.record_step(1, 0, 0, 0.3)
    ...     chooser.record_step(8, 0, 0, 0.35)
    >>> chooser.lookup[1], chooser.lookup[8]
    (4, 0)

    With drafts accepted with probability 0.6, 4 drafts in 0.6 s a step give 3.8 tokens/s
    against 3.3 plain; 2 drafts, in 0.45 s, give 4.4:

    >>> chooser = DraftLengthChooser(num_speculative_tokens=4, max_batch_size=1)
    >>> for _ in range(MIN_DRAFTING_SAMPLES):
    ...     chooser.record_step(1, 4, 4, 0.6, [0.6, 0.6**2, 0.6**3, 0.6**4])
    >>> for _ in range(MIN_PLAIN_SAMPLES):
    ...     chooser.record_step(1, 0, 0, 0.3)
    >>> chooser.lookup[1]
    2
    """

    def __init__(self, num_speculative_tokens: int, max_batch_size: int, chooses_length: bool = True):
        self.max_drafts = num_speculative_tokens
        self.drafting_lengths = (
            range(1, num_speculative_tokens + 1) if chooses_length else (num_speculative_tokens,)
        )
        self.buckets = [
            BucketState(num_speculative_tokens) for _ in range(batch_size_bucket(max_batch_size) + 1)
        ]
        self.accepted_drafts = MovingAverage(TOKENS_SMOOTHING)
        self.draft_acceptance = DraftAcceptance(num_speculative_tokens, TOKENS_SMOOTHING)
        self.lookup = [num_speculative_tokens] * (max_batch_size + 1)

    def record_step(
        self,
        batch_size: int,
        verified_drafts: int,
        next_drafts: int,
        step_seconds: float,
        accepted_shares: Sequence[float] | None = None,
    ) -> None:
        """One decoding step of `batch_size` requests, none prefilling: each verified
        `verified_drafts` drafts (`accepted_shares[i]`: the share of the requests that
        accepted i + 1 of them or more), and the step scheduled `next_drafts` for the next
        one. Steps that change the number of drafts measure no length's step time."""
        index = self._bucket_index(batch_size)
        bucket = self.buckets[index]
        bucket.steps += 1
        if verified_drafts == next_drafts and verified_drafts <= self.max_drafts:
            bucket.add_step_time(verified_drafts, step_seconds)
        if verified_drafts and accepted_shares is not None:
            self._record_acceptance(accepted_shares)
        drafting_samples = (
            MIN_PLAIN_SAMPLES if self.acceptance_measured else MIN_DRAFTING_SAMPLES
        )
        if bucket.measured(drafting_samples):
            preferred, length = bucket.prefers_drafting, bucket.length
            tokens = self._tokens_per_length()
            step_times = bucket.step_times()
            rates = {j: tokens[j] / step_times[j] for j in self.drafting_lengths}
            win, explored_tokens_ratio = self._update_choice(bucket, tokens, rates, step_times[0])
            bucket.exploration.count_step(
                bucket.prefers_drafting != preferred,
                win,
                EXPLORATION_STEPS if bucket.prefers_drafting else DRAFTING_EXPLORATION_STEPS,
                explored_tokens_ratio,
                catch_up_steps(step_times, bucket.length),
            )
            if bucket.prefers_drafting and bucket.doubts_plain_time():
                bucket.plain_exploration.explore_now(EXPLORATION_STEPS)
            if (
                bucket.prefers_drafting
                and bucket.length < self.max_drafts
                and not bucket.exploration.exploring
            ):
                self._count_longer_exploration_step(bucket, bucket.length != length, tokens, rates)
        self._write_lookup(index, bucket.scheduled_length(drafting_samples))

    def seconds_saved_per_token(self, batch_size: int, num_drafts: int) -> float | None:
        """Where the bucket of this batch size keeps drafting (measured, drafting won), how
        much sooner a step of `num_drafts` drafts gives each request a token than a plain
        step does: a plain step's time less a drafting step's over its tokens. None where
        it measures drafting: not measured yet, or keeping plain steps.

        >>> chooser = DraftLengthChooser(num_speculative_tokens=2, max_batch_size=4)
        >>> for _ in range(MIN_DRAFTING_SAMPLES):
        ...     chooser.record_step(2, 2, 2, 0.5, [0.5, 0.25])
        >>> chooser.seconds_saved_per_token(2, 2) is None
        True
        >>> for _ in range(MIN_PLAIN_SAMPLES):
        ...     chooser.record_step(2, 0, 0, 0.4)
        >>> round(chooser.seconds_saved_per_token(2, 2), 3)  # 0.4 - 0.5 / (1 + 0.5 + 0.25)
        0.114
        """
        bucket = self.buckets[self._bucket_index(batch_size)]
        measured = bucket.measured(MIN_PLAIN_SAMPLES)
        if not num_drafts or not measured or not bucket.prefers_drafting:
            return None
        tokens = self._tokens_per_length()[num_drafts]
        step_times = bucket.step_times()
        return step_times[0] - step_times[num_drafts] / tokens

    def plain_step_seconds(self, batch_size: int) -> float | None:
        """A plain step's time in the bucket of this batch size, or, not measured there,
        in the nearest bucket that measured one; None where none has.

        >>> chooser = DraftLengthChooser(num_speculative_tokens=2, max_batch_size=8)
        >>> chooser.plain_step_seconds(1) is None
        True
        >>> for _ in range(MIN_PLAIN_SAMPLES):
        ...     chooser.record_step(4, 0, 0, 0.3)
        >>> chooser.plain_step_seconds(1), chooser.plain_step_seconds(4)
        (0.3, 0.3)
        """
        index = self._bucket_index(batch_size)
        measured = [
            i for i, bucket in enumerate(self.buckets)
            if bucket.step_s[0].samples >= MIN_PLAIN_SAMPLES
        ]
        if not measured:
            return None
        nearest = min(measured, key=lambda i: abs(i - index))
        return self.buckets[nearest].step_s[0].value

    def _bucket_index(self, batch_size: int) -> int:
        return min(batch_size_bucket(batch_size), len(self.buckets) - 1)

    def draft_acceptance_rates(self) -> list[float]:
        """Each draft's share of acceptance among the requests that accepted the drafts
        before it, in recent steps that drafted it; a draft not drafted yet takes the
        deepest drafted one's.

        >>> chooser = DraftLengthChooser(num_speculative_tokens=4, max_batch_size=1)
        >>> chooser.record_step(1, 2, 2, 0.4, accepted_shares=[0.5, 0.25])
        >>> chooser.record_step(1, 2, 2, 0.4, accepted_shares=[1.0, 1.0])
        >>> chooser.draft_acceptance_rates()
        [0.75, 0.75, 0.75, 0.75]
        """
        return self.draft_acceptance.rates()

    @property
    def acceptance_measured(self) -> bool:
        """Whether drafting steps of any batch size have measured acceptance."""
        return self.accepted_drafts.samples >= MIN_DRAFTING_SAMPLES

    def _record_acceptance(self, accepted_shares: Sequence[float]) -> None:
        measured_before = self.acceptance_measured
        self.accepted_drafts.add(sum(accepted_shares))
        self.draft_acceptance.add(accepted_shares)
        if self.acceptance_measured and not measured_before:
            self._measure_new_buckets_from(self.drafting_lengths[0])

    def _measure_new_buckets_from(self, first_length: int) -> None:
        """Buckets that have not stepped yet measure `first_length` drafts first."""
        for index, bucket in enumerate(self.buckets):
            if not bucket.steps:
                bucket.measure_first(first_length)
                self._write_lookup(index, first_length)

    def _tokens_per_length(self) -> dict[int, float]:
        """Each drafting length's tokens per step: a chain's from each draft's acceptance;
        a tree's (one size, whose tokens do not follow a chain's) as measured."""
        if len(self.drafting_lengths) == 1:
            return {self.max_drafts: 1.0 + self.accepted_drafts.value}
        return {j: self.draft_acceptance.tokens(j) for j in self.drafting_lengths}

    def _update_choice(
        self,
        bucket: BucketState,
        tokens: dict[int, float],
        rates: dict[int, float],
        plain_step_seconds: float,
    ) -> tuple[float, float]:
        """Updates the bucket's length from each drafting length's tokens per step and per
        second and a plain step's time; returns how many times faster drafting or not,
        whichever is kept, measures than the other, and the other's tokens per step over the
        kept one's."""
        best = max(rates, key=rates.__getitem__)
        kept = bucket.length
        if kept and keeps_preference(True, rates[kept], rates[best]):
            best = kept
        drafting_rate = rates[best]
        plain_rate = 1.0 / plain_step_seconds
        drafts = keeps_preference(bucket.prefers_drafting, drafting_rate, plain_rate)
        bucket.drafting_length = best
        bucket.length = best if drafts else 0
        if drafts:
            return drafting_rate / plain_rate, 1 / tokens[best]
        return plain_rate / drafting_rate, tokens[best]

    def _count_longer_exploration_step(
        self,
        bucket: BucketState,
        length_changed: bool,
        tokens: dict[int, float],
        rates: dict[int, float],
    ) -> None:
        kept, longer = bucket.length, bucket.length + 1
        bucket.longer_exploration.count_step(
            length_changed,
            rates[kept] / rates[longer],
            LONGER_EXPLORATION_STEPS,
            tokens[longer] / tokens[kept],
        )

    def _write_lookup(self, index: int, num_drafts: int) -> None:
        first = 1 << index
        last = min((first << 1) - 1, len(self.lookup) - 1)
        self.lookup[first : last + 1] = [num_drafts] * (last + 1 - first)
