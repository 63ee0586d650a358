"""When a request selects its chunks again."""

from __future__ import annotations

import torch

# Adaptive retrieval selects again once the kept chunks' share of the target's attention
# falls below this fraction of their share when selected.
ADAPTIVE_SHARE_RATIO = 0.9


def due_by_schedule(
    eligible: torch.Tensor,
    steps_since_selection: torch.Tensor,
    first_query_positions: torch.Tensor,
    tail_start_tokens: torch.Tensor,
    compact: torch.Tensor,
    selected_compact: torch.Tensor,
    retrieval_interval: int,
) -> torch.Tensor:
    """Eligible requests with no selection yet, `retrieval_interval` steps after their
    last one, whose newest tokens start before their kept tail (they were rolled back),
    or that switch between compact and absolute positions. All [R].

    Not selected yet, due, not due, not eligible (nothing rolled back or switched):

    >>> T, F, no = True, False, torch.zeros(4, dtype=torch.bool)
    >>> due_by_schedule(
    ...     torch.tensor([T, T, T, F]), torch.tensor([-1, 4, 1, 9]), torch.full((4,), 300),
    ...     torch.full((4,), 256), no, no, retrieval_interval=4,
    ... )
    tensor([ True,  True, False, False])
    """
    selected = steps_since_selection >= 0
    return eligible & (
        ~selected
        | (steps_since_selection >= retrieval_interval)
        | (first_query_positions < tail_start_tokens)
        | (compact != selected_compact)
    )


def lost_attention_share(share: torch.Tensor, selected_share: torch.Tensor) -> torch.Tensor:
    """Whether the kept chunks' attention share fell well below its value at selection.

    >>> lost_attention_share(torch.tensor([0.5, 0.88]), torch.tensor([0.8, 0.9]))
    tensor([ True, False])
    """
    return share < ADAPTIVE_SHARE_RATIO * selected_share
