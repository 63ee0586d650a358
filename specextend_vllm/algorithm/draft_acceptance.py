"""Each draft's acceptance in a chain, measured over steps of any number of drafts, and
the tokens a step of j drafts gives from it (`drafting: auto` and `retrieval: auto`).

The i-th draft is accepted by a share p_i of the requests that accepted the drafts
before it; a step of j drafts gives each request
`tokens(j) = 1 + p_1 + p_1 p_2 + ... + p_1 ... p_j` tokens. Each p_i is a moving average
over the steps that drafted i or more, so steps of 1, 2, 3 or 4 drafts all measure the
first draft's acceptance: a choice made per number of drafts reads them all.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from specextend_vllm.algorithm.exploration import MovingAverage

# A draft is accepted or not: its acceptance's variance is at most 1/4. Its measured
# variance is taken as if one more step had measured that much, so that a draft measured
# in one step or in a few that agreed does not count as measured exactly.
PRIOR_VARIANCE = 0.25


def chain_tokens(draft_acceptance: Sequence[float]) -> float:
    """Tokens a step of a chain of drafts gives (1 + accepted drafts) when its i-th draft
    is accepted with probability `draft_acceptance[i]` once those before it were:
    1 + p_1 + p_1 p_2 + ... + p_1 ... p_j.

    >>> chain_tokens([0.5, 0.5, 0.5]), chain_tokens([0.5, 1.0, 1.0]), chain_tokens([])
    (1.875, 2.5, 1.0)
    """
    tokens, accepting = 1.0, 1.0
    for rate in draft_acceptance:
        accepting *= rate
        tokens += accepting
    return tokens


def accepted_shares(accepted_drafts: np.ndarray, num_drafts: int) -> tuple[float, ...]:
    """[R] drafts each request accepted -> the share of requests that accepted 1, 2, ...
    `num_drafts` drafts or more (a request whose tokens were discarded counts as accepting
    none: -1 reads as 0).

    >>> accepted_shares(np.array([0, 2, 2, 4]), num_drafts=4)
    (0.75, 0.75, 0.25, 0.25)
    >>> accepted_shares(np.array([-1, 1]), num_drafts=2)
    (0.5, 0.0)
    """
    accepted = np.clip(accepted_drafts, 0, num_drafts)
    accepted = np.bincount(accepted, minlength=num_drafts + 1)
    at_least = np.cumsum(accepted[::-1])[::-1]
    return tuple((at_least[1 : num_drafts + 1] / len(accepted_drafts)).tolist())


@dataclasses.dataclass(frozen=True)
class TokensEstimate:
    """Tokens per step, and how far that may be from the true mean."""

    value: float
    standard_error: float


class DraftAcceptance:
    """p_i for the drafts of a chain of up to `max_drafts`, from each step's
    `accepted_shares` (the share of requests that accepted i + 1 drafts or more).

    Steps of 2 drafts where half the requests accept the first and a quarter both, then a
    step of 1 draft accepted by all: the first draft's acceptance is the mean of 0.5, 0.5
    and 1.0; the fourth, never drafted, takes the deepest measured one's:

    >>> acceptance = DraftAcceptance(max_drafts=4, smoothing=0.05)
    >>> for shares in ([0.5, 0.25], [0.5, 0.25], [1.0]):
    ...     acceptance.add(shares)
    >>> [round(rate, 3) for rate in acceptance.rates()]
    [0.667, 0.5, 0.5, 0.5]
    >>> round(acceptance.tokens(2), 3)  # 1 + 0.667 + 0.667 * 0.5
    2.0
    """

    def __init__(self, max_drafts: int, smoothing: float):
        self.drafts = [MovingAverage(smoothing) for _ in range(max_drafts)]

    @property
    def samples(self) -> int:
        """Steps that measured the first draft."""
        return self.drafts[0].samples

    def add(self, accepted_shares: Sequence[float]) -> None:
        """One step's shares of requests accepting 1, 2, ... drafts or more; a draft that no
        request reached is not measured."""
        reaching = 1.0
        for acceptance, accepting in zip(self.drafts, accepted_shares):
            if not reaching:
                break
            acceptance.add(accepting / reaching)
            reaching = accepting

    def rates(self) -> list[float]:
        """Each draft's p_i; a draft not measured yet takes the deepest measured one's
        (0 before any step)."""
        rates: list[float] = []
        for acceptance in self.drafts:
            rates.append(acceptance.value if acceptance.samples else (rates[-1] if rates else 0.0))
        return rates

    def tokens(self, num_drafts: int) -> float:
        return chain_tokens(self.rates()[:num_drafts])

    def tokens_estimate(self, num_drafts: int) -> TokensEstimate:
        """`tokens(num_drafts)` and its standard error, from each draft's (to first order:
        the i-th draft's error moves the tokens by p_1 ... p_(i-1) times the tokens of the
        chain after it). A draft not measured yet counts as measured by one step.

        Two drafts accepted at 0.5 each, the first measured in 20 steps (a standard error
        of 0.11), the second in the 10 that reached it (0.16): tokens 1.75; the first
        draft's error weighs 1.5, the second's 0.5:

        >>> acceptance = DraftAcceptance(max_drafts=2, smoothing=0.05)
        >>> for shares in ([1.0, 1.0], [0.0], [1.0, 0.0], [0.0]) * 5:
        ...     acceptance.add(shares)
        >>> estimate = acceptance.tokens_estimate(2)
        >>> round(estimate.value, 3), round(estimate.standard_error, 3)
        (1.75, 0.185)
        """
        rates = self.rates()[:num_drafts]
        variance, reaching = 0.0, 1.0
        for index, acceptance in enumerate(self.drafts[:num_drafts]):
            samples = acceptance.samples
            draft_variance = (acceptance.variance * samples + PRIOR_VARIANCE) / (samples + 1)
            averaged = min(max(samples, 1), (2 - acceptance.smoothing) / acceptance.smoothing)
            sensitivity = reaching * chain_tokens(rates[index + 1 :])
            variance += sensitivity**2 * draft_variance / averaged
            reaching *= rates[index]
        return TokensEstimate(chain_tokens(rates), math.sqrt(variance))
