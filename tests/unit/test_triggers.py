"""When requests select chunks again, without an engine."""

import torch

from specextend_vllm.algorithm.triggers import due_by_schedule, lost_attention_share


def test_due_without_selection_after_the_interval_after_rollback_or_position_switch() -> None:
    due = due_by_schedule(
        eligible=torch.tensor([True, True, True, False, True, True]),
        steps_since_selection=torch.tensor([-1, 4, 1, 9, 1, 1]),
        first_query_positions=torch.tensor([300, 300, 300, 300, 250, 300]),
        tail_start_tokens=torch.tensor([256, 256, 256, 256, 256, 256]),
        compact=torch.tensor([False, False, False, False, False, True]),
        selected_compact=torch.tensor([False] * 6),
        retrieval_interval=4,
    )
    assert due.tolist() == [True, True, False, False, True, True]


def test_lost_share_is_relative_to_the_share_at_selection() -> None:
    lost = lost_attention_share(torch.tensor([0.5, 0.88, 0.0]), torch.tensor([0.8, 0.9, 0.0]))
    assert lost.tolist() == [True, False, False]
