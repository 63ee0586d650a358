"""Pure-torch pieces of speculative sampling that replace broken vLLM CPU kernels."""

from __future__ import annotations

import torch


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """Repeats each request's value once per draft token, replacing `replace_from`.

    >>> expand_batch_to_tokens(torch.tensor([7, 8, 9]), torch.tensor([2, 5, 6]), 6)
    tensor([7, 7, 8, 8, 8, 9])
    """
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    return x.repeat_interleave(counts, output_size=num_tokens)
