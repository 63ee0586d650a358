"""The selection policy and reduced block tables, without an engine."""

import torch

from specextend_vllm.algorithm.retrieval_state import RetrievalState
from specextend_vllm.algorithm.selection import (
    chunks_to_blocks,
    kept_attention_share,
    reduced_block_indices,
    select_chunks,
    select_streaming_chunks,
    select_top_chunks,
)


def test_top_chunks_keeps_best_candidates_in_order() -> None:
    scores = torch.tensor([[0.1, 0.5, 0.2, 0.9, 0.3], [0.9, 0.1, 0.8, 0.7, 0.6]])
    kept, counts = select_top_chunks(scores, torch.tensor([4, 5]), num_kept=2)
    assert counts.tolist() == [2, 2]
    assert kept.tolist() == [[1, 3], [0, 2]]


def test_top_chunks_ignores_chunks_past_the_candidates() -> None:
    scores = torch.tensor([[0.1, 0.2, 0.9, 0.9]])
    kept, counts = select_top_chunks(scores, torch.tensor([2]), num_kept=3)
    assert counts.tolist() == [2]
    assert kept[0, :2].tolist() == [0, 1]


def test_continuation_ranking_keeps_the_chunk_after_the_most_attended_one() -> None:
    scores = torch.tensor([[0.1, 0.9, 0.05, 0.5, 0.3, 0.2]])
    candidates = torch.tensor([6])
    by_attention, _ = select_chunks("cmr", "attention", scores, candidates, num_kept=2)
    by_continuation, _ = select_chunks("cmr", "continuation", scores, candidates, num_kept=2)
    assert by_attention.tolist() == [[1, 3]]
    assert by_continuation.tolist() == [[1, 2]]


def test_continuation_ranking_keeps_only_candidates() -> None:
    """The chunk after the last candidate is the tail's, kept anyway: it is not selected."""
    scores = torch.tensor([[0.1, 0.2, 0.9, 0.8]])
    kept, counts = select_chunks("cmr", "continuation", scores, torch.tensor([3]), num_kept=2)
    assert counts.tolist() == [2]
    assert kept.tolist() == [[1, 2]]


def test_streaming_keeps_first_and_most_recent_chunks() -> None:
    kept, counts = select_streaming_chunks(torch.tensor([10, 2]), num_kept=3)
    assert counts.tolist() == [3, 2]
    assert kept[0].tolist() == [0, 8, 9]
    assert kept[1, :2].tolist() == [0, 1]


def test_chunks_to_blocks() -> None:
    assert chunks_to_blocks(torch.tensor([[1, 3]]), 2).tolist() == [[2, 3, 6, 7]]


def test_reduced_block_indices_puts_kept_blocks_before_the_tail() -> None:
    indices = reduced_block_indices(
        kept_blocks=torch.tensor([[2, 5, 0], [0, 0, 0]]),
        num_kept_blocks=torch.tensor([2, 0]),
        tail_start_block=torch.tensor([9, 0]),
        width=14,
    )
    assert indices[0, :6].tolist() == [2, 5, 9, 10, 11, 12]
    assert indices[1].tolist() == list(range(14))


def test_reduced_table_attends_to_the_same_tokens_as_a_mask() -> None:
    """Attention through the reduced table and shortened length equals attention over the
    full sequence with the left-out chunks masked."""
    torch.manual_seed(0)
    block_size, num_blocks, head_dim = 4, 12, 8
    seq_len = 43
    physical = torch.randperm(num_blocks)
    keys = torch.randn(num_blocks, block_size, head_dim)
    query = torch.randn(head_dim)
    kept_blocks = torch.tensor([[1, 4, 6]])
    tail_start = torch.tensor([8])
    indices = reduced_block_indices(kept_blocks, torch.tensor([3]), tail_start, num_blocks)
    reduced_table = physical[indices[0]]
    reduced_len = seq_len - (8 - 3) * block_size
    reduced_keys = keys[reduced_table].reshape(-1, head_dim)[:reduced_len]

    full_keys = keys[physical].reshape(-1, head_dim)[:seq_len]
    token_block = torch.arange(seq_len) // block_size
    visible = torch.isin(token_block, torch.tensor([1, 4, 6])) | (token_block >= 8)
    expected = torch.softmax((full_keys @ query).masked_fill(~visible, float("-inf")), 0)[visible]
    torch.testing.assert_close(torch.softmax(reduced_keys @ query, 0), expected)


def test_state_slots_are_created_reset_and_freed() -> None:
    state = RetrievalState(max_requests=2, max_kept_chunks=2, device=torch.device("cpu"))
    slots = state.slots(["a", "b"])
    state.store(
        slots,
        torch.tensor([[1, 2], [3, 4]]),
        torch.tensor([2, 2]),
        torch.tensor([5, 6]),
        torch.tensor([True, False]),
        torch.tensor([0.5, 0.25]),
    )
    assert state.steps_since_selection[slots].tolist() == [0, 0]
    state.reset(["a"])
    assert state.steps_since_selection[slots].tolist() == [-1, 0]
    state.free(["a", "b"])
    assert not state.request_ids
    new_slot = state.slots(["c"])
    assert state.steps_since_selection[new_slot].tolist() == [-1]


def test_kept_attention_share_counts_kept_chunks_among_candidates() -> None:
    """Row 1's unused kept slot points past its candidates, row 2's at a candidate left
    there by an earlier selection: neither counts."""
    padded = [0.25, 0.25, 0.5, float("-inf"), float("-inf")]
    share = kept_attention_share(
        torch.tensor([[0.1, 0.5, 0.2, 0.9, 0.3], padded, padded]),
        torch.tensor([[1, 3], [2, 5], [2, 0]]),
        torch.tensor([2, 1, 1]),
        torch.tensor([4, 3, 3]),
    )
    torch.testing.assert_close(share, torch.tensor([1.4 / 1.7, 0.5, 0.5]))
