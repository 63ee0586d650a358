"""Whether the target verifies a chain of drafts on hybrid attention or on vLLM's own, per
size of the batch's context, from the measured time of the attention calls
(`verification_attention: auto` on CPU).

Both verify exactly; which is faster depends on the machine, the context and the batch.
On 2 CPU cores with the real pair, vLLM's attention verified a 5-token chain at 3K faster
(the target's forward 205 ms a step against 228 ms), and hybrid attention saved 24-30% of
it at 8K and 16K. The two ways differ only inside the attention layers, so a verification
step's time is taken there: the sum over the layers of their attention calls, with no
draft and no acceptance in it (the same tokens are verified either way). Per bucket of the
batch's context tokens (below 2K, 2K to 4K, 4K to 8K, ...), hybrid and native attention
take turns of 2 steps until each has 4 samples; the faster is kept and the other explored
again for 2 steps after 16 steps, then 32, ... up to 256 (after 256 from the start where the
kept one measured more than 1.5x faster).
"""

from __future__ import annotations

from specextend_vllm.algorithm.exploration import TwoWayChoice, TwoWaySchedule

NUM_CONTEXT_BUCKETS = 8
# Context tokens below which a batch falls into the first bucket (twice this and more
# into the next ones).
FIRST_BUCKET_TOKENS = 2048
# The attention's time hardly varies from one step to the next: few samples suffice,
# their median (of the last 4) against a pause of the process.
SCHEDULE = TwoWaySchedule(
    min_samples=4,
    measuring_turn=2,
    exploration_steps=2,
    first_period=16,
    max_period=256,
    step_window=4,
    tokens_smoothing=1.0,
)


def context_bucket(context_tokens: int) -> int:
    """A verification batch's context tokens (the requests' lengths summed) -> its bucket:
    0 below 2K, 1 up to 4K, 2 up to 8K, ..., at most NUM_CONTEXT_BUCKETS - 1.

    >>> [context_bucket(n) for n in (100, 2047, 2048, 4096, 9000, 10**7)]
    [0, 0, 1, 2, 3, 7]
    """
    halves = max(context_tokens // (FIRST_BUCKET_TOKENS // 2), 1)
    return min(halves.bit_length() - 1, NUM_CONTEXT_BUCKETS - 1)


class VerificationChooser:
    """Chooses, per bucket of context tokens, between hybrid attention (the first way) and
    vLLM's attention (the second) for verifying a chain.

    At 3K hybrid attention takes 80 ms a step where vLLM's takes 60 ms; at 12K, 90 ms
    against 130 ms:

    >>> chooser = VerificationChooser()
    >>> for native, seconds_3k, seconds_12k in ((False, 0.08, 0.09), (True, 0.06, 0.13)):
    ...     for _ in range(SCHEDULE.min_samples):
    ...         chooser.record_step(context_bucket(3000), native, seconds_3k)
    ...         chooser.record_step(context_bucket(12000), native, seconds_12k)
    >>> chooser.verifies_natively(context_bucket(3000)), chooser.verifies_natively(context_bucket(12000))
    (True, False)
    """

    def __init__(self) -> None:
        self.buckets = [TwoWayChoice(SCHEDULE) for _ in range(NUM_CONTEXT_BUCKETS)]

    def verifies_natively(self, bucket_index: int) -> bool:
        """Whether a verification step of a batch in `bucket_index` runs on vLLM's attention."""
        return self.buckets[bucket_index].uses_second()

    def record_step(self, bucket_index: int, native: bool, attention_seconds: float) -> None:
        """One verification step of a batch in `bucket_index`: its attention calls, every
        layer's, took `attention_seconds` on vLLM's attention (`native`) or on hybrid."""
        self.buckets[bucket_index].record(native, attention_seconds, 1.0)
