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

import torch


def reduced_vocab_logits(
    hidden_states: torch.Tensor, kept_rows: torch.Tensor, kept_ids: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """[T, vocab_size] logits of the kept tokens, -inf for every other token.

    hidden_states: [T, H]; kept_rows: [N, H], the LM head's rows of the kept tokens;
    kept_ids: [N], their token ids.

    >>> head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    >>> kept = torch.tensor([3, 1])
    >>> reduced_vocab_logits(torch.tensor([[2.0, 1.0]]), head[kept], kept, 4)
    tensor([[-inf,  1., -inf, -2.]])
    """
    logits = hidden_states.new_full((hidden_states.shape[0], vocab_size), float("-inf"))
    logits[:, kept_ids] = hidden_states @ kept_rows.to(hidden_states.dtype).T
    return logits
