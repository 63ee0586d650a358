"""How many tokens a request may still decode, from the answers that ended before it.

`drafting: auto` weighs the draft's work on a batch's prompts against what drafting saves
over the tokens the batch's requests still decode (`algorithm.prompt_work`). A request's
`max_tokens` bounds them, but most answers end sooner, at a stop token, and a request
that sets none (vLLM then allows up to the model's length) would always count as
repaying any work. So once a few answers have ended, a request that has decoded d tokens
counts on the median of the answers seen that ran longer than d, less d; where none ran
longer, on d more (it has outlived every answer seen, as a long answer does); and never
on more than its `max_tokens` allows.
"""

from __future__ import annotations

import numpy as np

# Answers remembered (the latest), and how many must have ended before they are counted on.
WINDOW = 64
MIN_ANSWERS = 4


class AnswerLengths:
    """The lengths, in output tokens, of the latest answers that ended (stopped or reached
    their `max_tokens`; aborted requests say nothing of how long they would have run).

    >>> answers = AnswerLengths()
    >>> for length in (6, 6, 6, 40, 300):
    ...     answers.add(length)

    Decoded 0, 5, 6, 100 and 400 tokens, each allowed 1,000 more, and one allowed 3:

    >>> answers.tokens_left(np.array([0, 5, 6, 100, 400, 0]),
    ...                     np.array([1000, 1000, 1000, 1000, 1000, 3])).tolist()
    [6, 1, 34, 200, 400, 3]

    Too few answers to count on: `max_tokens` alone.

    >>> AnswerLengths().tokens_left(np.array([0, 10]), np.array([64, 20])).tolist()
    [64, 20]
    """

    def __init__(self) -> None:
        self._lengths = np.zeros(WINDOW, dtype=np.int64)
        self._count = 0

    def add(self, length: int) -> None:
        self._lengths[self._count % WINDOW] = length
        self._count += 1

    def tokens_left(self, decoded: np.ndarray, max_left: np.ndarray) -> np.ndarray:
        """decoded [B]: the tokens each request has decoded; max_left [B]: how many more
        its `max_tokens` allows. Returns [B], the tokens each may still decode."""
        if self._count < MIN_ANSWERS:
            return max_left
        lengths = np.sort(self._lengths[: min(self._count, WINDOW)])
        first_longer = np.searchsorted(lengths, decoded, side="right")
        median_longer = lengths[
            np.minimum(first_longer + (len(lengths) - 1 - first_longer) // 2, len(lengths) - 1)
        ]
        expected = np.where(first_longer < len(lengths), median_longer - decoded, decoded)
        return np.minimum(expected, max_left)
