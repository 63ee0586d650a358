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
then to four times it, ...) and number of drafts per step: each measures the full cache
(what `draft_model` does) and the reduced one in turns of 4 steps, 8 steps each, keeps the
faster and re-explores the other as `algorithm.exploration` schedules. A batch follows the
choice of the bucket holding most of its context tokens (the requests long enough to be
reduced all draft the same way), and its step is measured for that bucket, so batches that
mix lengths measure too.

The number of drafts is part of the key because `drafting: auto` changes it from one
step to the next (it keeps one length and explores one more for a few steps now and
then): a way's step time is the median of its last 8 steps and its tokens a long
average, so steps of two lengths mixed in one way made the way that ran a longer
exploration look slower by the longer steps' time, with hardly more tokens. A new
length's measuring turns start with the way the bucket's most measured length prefers.
"""

from __future__ import annotations

import torch

from specextend_vllm.algorithm.exploration import TwoWayChoice, TwoWaySchedule

# Buckets of context lengths from activation_length up; longer contexts share the last.
NUM_LENGTH_BUCKETS = 8
# A way's step time: the median of its last 8 steps (two selections' worth).
STEP_WINDOW = 8
# Tokens per step vary from 1 to k + 1 from one step to the next, and the two choices'
# acceptance is often within 10% of each other: a long average.
TOKENS_SMOOTHING = 0.02
# Steps measured with each choice before comparing them, and per exploration.
MIN_SAMPLES = 8
EXPLORATION_STEPS = 8
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


# How each bucket measures its two ways, the full cache first.
SCHEDULE = TwoWaySchedule(
    min_samples=MIN_SAMPLES,
    measuring_turn=MEASURING_TURN,
    exploration_steps=EXPLORATION_STEPS,
    first_period=FIRST_EXPLORATION_PERIOD,
    max_period=EXPLORATION_PERIOD,
    step_window=STEP_WINDOW,
    tokens_smoothing=TOKENS_SMOOTHING,
)


class RetrievalChooser:
    """Chooses, per bucket of context lengths and number of drafts per step, between
    drafting on the reduced cache and on the full one. `reduces` reads the choice for a
    batch's bucket; `record_step` feeds one measured step.

    At 3K a reduced step of 4 drafts takes 0.50 s for 2.4 tokens, a full one 0.52 s for
    2.6: the full cache wins (5.0 tokens/s against 4.8). At 12K: 0.55 s for 2.4 against
    0.80 s for 2.5, the reduced one wins (4.4 against 3.1); steps of 3 drafts there start
    measuring on the reduced cache:

    >>> chooser = RetrievalChooser(activation_length=2048)
    >>> for reduced, seconds_3k, tokens_3k, seconds_12k, tokens_12k in (
    ...     (False, 0.52, 2.6, 0.80, 2.5), (True, 0.50, 2.4, 0.55, 2.4)
    ... ):
    ...     for _ in range(MIN_SAMPLES):
    ...         chooser.record_step(0, 4, reduced, seconds_3k, tokens_3k)
    ...         chooser.record_step(2, 4, reduced, seconds_12k, tokens_12k)
    >>> chooser.reduces(0, 4), chooser.reduces(2, 4), chooser.reduces(2, 3)
    (False, True, True)
    """

    def __init__(self, activation_length: int):
        self.activation_length = activation_length
        # Per (bucket, drafts per step): the full cache (the first way) against the reduced
        # one (the second).
        self.choices: dict[tuple[int, int], TwoWayChoice] = {}

    def choice(self, bucket_index: int, num_drafts: int) -> TwoWayChoice:
        """The choice for steps of `num_drafts` drafts in bucket `bucket_index`; a new one
        starts measuring with the way the bucket's most measured choice prefers."""
        key = (bucket_index, num_drafts)
        if key not in self.choices:
            measured = [
                choice
                for (bucket, _), choice in self.choices.items()
                if bucket == bucket_index and choice.measured()
            ]
            most_measured = max(
                measured,
                key=lambda choice: choice.first.samples + choice.second.samples,
                default=None,
            )
            starts_reduced = most_measured is not None and most_measured.prefers_second
            self.choices[key] = TwoWayChoice(SCHEDULE, starts_second=starts_reduced)
        return self.choices[key]

    def batch_bucket(self, context_lens: torch.Tensor) -> int:
        """[R] context lengths -> the bucket holding most of the context tokens of the
        requests long enough to be reduced; -1 where none is.

        >>> RetrievalChooser(2048).batch_bucket(torch.tensor([1000, 3000, 3500, 5000]))
        0
        >>> RetrievalChooser(2048).batch_bucket(torch.tensor([1000, 2047]))
        -1
        """
        buckets = length_buckets(context_lens, self.activation_length)
        eligible = buckets >= 0
        tokens = torch.zeros(NUM_LENGTH_BUCKETS, dtype=torch.int64, device=context_lens.device)
        tokens.index_add_(0, buckets[eligible], context_lens[eligible].long())
        most_tokens, bucket = torch.stack(tokens.max(0)).tolist()
        return bucket if most_tokens > 0 else -1

    def reduces(self, bucket_index: int, num_drafts: int) -> bool:
        """Whether the requests of a batch whose bucket is `bucket_index` draft their
        `num_drafts` tokens on the reduced cache now."""
        return self.choice(bucket_index, num_drafts).uses_second()

    def record_step(
        self,
        bucket_index: int,
        num_drafts: int,
        reduced: bool,
        step_seconds: float,
        tokens_per_step: float,
    ) -> None:
        """One decoding step of `num_drafts` drafts of a batch whose bucket is
        `bucket_index`, whose requests drafted on the reduced cache (or all on the full
        one), then verified: it took `step_seconds` and gave each request
        `tokens_per_step` tokens on average."""
        self.choice(bucket_index, num_drafts).record(reduced, step_seconds, tokens_per_step)
