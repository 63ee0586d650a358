"""A draft restricted to a frequency-ranked part of its vocabulary (FR-Spec).

The draft's LM head is most of a small draft's weights and of its time per token; most of
its rows are tokens a draft almost never needs to propose. Keeping only the rows of the
`N` most frequent tokens, the draft computes `N` logits per token instead of the whole
vocabulary, and every other token gets probability 0. The draft is only a proposal:
verification accepts or resamples against the target's distribution, so output stays
the target's, in greedy and in sampling (the rejection sampler sees the proposal's
probabilities, 0 outside the kept tokens).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def scatter_kept_logits(kept_logits: torch.Tensor, kept_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[T, vocab_size] logits: the kept tokens' from `kept_logits` [T, N], -inf elsewhere.

    >>> scatter_kept_logits(torch.tensor([[-2.0, 1.0]]), torch.tensor([3, 1]), 4)
    tensor([[-inf,  1., -inf, -2.]])
    """
    logits = kept_logits.new_full((kept_logits.shape[0], vocab_size), float("-inf"))
    return logits.index_copy_(1, kept_ids, kept_logits)


class KeptVocabLogits:
    """The draft's logits from the kept rows only: hidden states [T, H] -> [T, vocab_size]
    logits, `kept_logits` ([T, H] -> [T, N], the kept rows' product) scattered to their
    token ids `kept_ids` [N], -inf elsewhere."""

    def __init__(
        self,
        kept_logits: Callable[[torch.Tensor], torch.Tensor],
        kept_ids: torch.Tensor,
        vocab_size: int,
    ):
        self.kept_logits = kept_logits
        self.kept_ids = kept_ids
        self.vocab_size = vocab_size

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return scatter_kept_logits(self.kept_logits(hidden_states), self.kept_ids, self.vocab_size)
