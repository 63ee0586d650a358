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
then to four times it, ...). Step times are measured per number of drafts per step too:
each measures the full cache (what `draft_model` does) and the reduced one in turns of 4
steps, 8 steps each, keeps the faster and re-explores the other as `algorithm.exploration`
schedules. A batch follows the choice of the bucket holding most of its context tokens
(the requests long enough to be reduced all draft the same way), and its step is measured
for that bucket, so batches that mix lengths measure too.

The number of drafts is part of a step time's key because `drafting: auto` changes it
from one step to the next (it keeps one length and explores one more for a few steps now
and then): a way's step time is the median of its last 8 steps, so steps of two lengths
mixed in one way made the way that ran a longer exploration look slower by the longer
steps' time. A new length's measuring turns start with the way the bucket's most measured
length prefers.

Tokens per step are not: each way's acceptance of the i-th draft is measured over the
bucket's steps of any number of drafts (`algorithm.draft_acceptance`), and a number of
drafts' tokens follow from it. At 4K fiction, with tokens measured per number of drafts,
steps of 2 drafts kept the reduced cache on a 4% win in step time (1.79 tokens against
1.85, 137 steps) while steps of 1 draft in the same bucket (most of them on the essay
decoded before) had the first draft accepted at 0.55 on the reduced cache against 0.83 on
the full one; decodes held on the full cache ran 1.06-1.23x faster.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specextend_vllm.algorithm.draft_acceptance import DraftAcceptance, TokensEstimate
from specextend_vllm.algorithm.exploration import TwoWayChoice, TwoWaySchedule

# Buckets of context lengths from activation_length up; longer contexts share the last.
NUM_LENGTH_BUCKETS = 8
# A way's step time: the median of its last 8 steps (two selections' worth).
STEP_WINDOW = 8
# Each draft is accepted or not from one step to the next, and the two choices'
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

    At 3K a reduced step of 4 drafts takes 0.50 s, a full one 0.52 s; each draft is
    accepted at 0.6 on the reduced cache (2.3 tokens a step), 0.7 on the full one (2.8):
    the full cache wins (5.3 tokens/s against 4.6). At 12K: 0.55 s against 0.80 s, the
    reduced one wins (4.2 against 3.5, tokens as at 3K); steps of 3 drafts there start
    measuring on the reduced cache:

    >>> chooser = RetrievalChooser(activation_length=2048, max_drafts=4)
    >>> for reduced, seconds_3k, seconds_12k, acceptance in (
    ...     (False, 0.52, 0.80, 0.7), (True, 0.50, 0.55, 0.6)
    ... ):
    ...     shares = [acceptance**depth for depth in range(1, 5)]
    ...     for _ in range(MIN_SAMPLES):
    ...         chooser.record_step(0, 4, reduced, seconds_3k, shares)
    ...         chooser.record_step(2, 4, reduced, seconds_12k, shares)
    >>> chooser.reduces(0, 4), chooser.reduces(2, 4), chooser.reduces(2, 3)
    (False, True, True)
    """

    def __init__(self, activation_length: int, max_drafts: int):
        self.activation_length = activation_length
        self.max_drafts = max_drafts
        # Per (bucket, drafts per step): the full cache (the first way) against the reduced
        # one (the second).
        self.choices: dict[tuple[int, int], TwoWayChoice] = {}
        # Per bucket: each way's acceptance of each draft, the full cache's first.
        self.acceptance: dict[int, tuple[DraftAcceptance, DraftAcceptance]] = {}

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
            self.choices[key] = TwoWayChoice(
                SCHEDULE,
                starts_second=starts_reduced,
                pooled_tokens=lambda: self.tokens_estimates(bucket_index, num_drafts),
            )
        return self.choices[key]

    def bucket_acceptance(self, bucket_index: int) -> tuple[DraftAcceptance, DraftAcceptance]:
        """The bucket's acceptance of each draft on the full cache and on the reduced one."""
        if bucket_index not in self.acceptance:
            self.acceptance[bucket_index] = (
                DraftAcceptance(self.max_drafts, TOKENS_SMOOTHING),
                DraftAcceptance(self.max_drafts, TOKENS_SMOOTHING),
            )
        return self.acceptance[bucket_index]

    def tokens_estimates(
        self, bucket_index: int, num_drafts: int
    ) -> tuple[TokensEstimate, TokensEstimate]:
        """Tokens per step of `num_drafts` drafts on the full cache and on the reduced one,
        from the bucket's steps of any number of drafts."""
        full, reduced = self.bucket_acceptance(bucket_index)
        return full.tokens_estimate(num_drafts), reduced.tokens_estimate(num_drafts)

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
        accepted_shares: Sequence[float],
    ) -> None:
        """One decoding step of `num_drafts` drafts of a batch whose bucket is
        `bucket_index`, whose requests drafted on the reduced cache (or all on the full
        one), then verified: it took `step_seconds`, and a share `accepted_shares[i]` of
        its requests accepted i + 1 drafts or more."""
        self.bucket_acceptance(bucket_index)[int(reduced)].add(accepted_shares)
        self.choice(bucket_index, num_drafts).record(
            reduced, step_seconds, 1.0 + sum(accepted_shares)
        )
