"""Which requests of a step copy the draft's KV of the blocks they compute from cached
twins: those computing whole blocks that all have twins, none written by the step, in
kernel blocks where the scheduler's blocks hold several; and the tokens the draft's pass
keeps."""

from __future__ import annotations

import numpy as np

from specextend_vllm.algorithm.block_twins import BlockTwins, twin_copies
from specextend_vllm.algorithm.draft_lag import StepTokens

# Scheduler blocks of 8 tokens, each two kernel blocks of 4.
BLOCK_SIZE, KERNEL_BLOCKS_PER_BLOCK = 8, 2
# Request a: scheduler blocks 1 and 3 (kernel blocks 2-3, 6-7); b: 4 and 5 (8-9, 10-11).
TABLE = np.array([[2, 3, 6, 7], [8, 9, 10, 11]])


def test_the_kernel_blocks_of_each_twin_are_copied_in_order() -> None:
    step = StepTokens(np.array([8, 0]), np.array([8, 16]), TABLE)
    twins = {"a": BlockTwins((3,), (0,)), "b": BlockTwins((4, 5), (12, 13))}
    copies = twin_copies(["a", "b"], twins, step, BLOCK_SIZE, KERNEL_BLOCKS_PER_BLOCK)
    assert copies is not None
    assert copies.rows.tolist() == [True, True]
    assert copies.sources.tolist() == [0, 1, 24, 25, 26, 27]
    assert copies.destinations.tolist() == [6, 7, 8, 9, 10, 11]
    # The draft's pass keeps each request's last token: a's 15th, b's 15th.
    kept, query_start_loc = copies.kept_tokens(np.array([0, 8, 24]))
    assert kept.tolist() == [7, 23] and query_start_loc.tolist() == [0, 1, 2]


def test_requests_without_twins_keep_all_their_tokens_beside_copied_ones() -> None:
    step = StepTokens(np.array([8, 0]), np.array([8, 5]), TABLE)
    copies = twin_copies(["a", "b"], {"a": BlockTwins((3,), (0,))}, step, BLOCK_SIZE, 2)
    assert copies is not None and copies.rows.tolist() == [True, False]
    kept, query_start_loc = copies.kept_tokens(np.array([0, 8, 13]))
    assert kept.tolist() == [7, 8, 9, 10, 11, 12] and query_start_loc.tolist() == [0, 1, 6]


def test_a_request_that_also_computes_tokens_without_twins_copies_nothing() -> None:
    twins = {"a": BlockTwins((3,), (0,))}
    ends_past_the_block = StepTokens(np.array([8]), np.array([9]), TABLE[:1])
    starts_inside_the_block = StepTokens(np.array([12]), np.array([4]), TABLE[:1])
    for step in (ends_past_the_block, starts_inside_the_block):
        assert twin_copies(["a"], twins, step, BLOCK_SIZE, KERNEL_BLOCKS_PER_BLOCK) is None


def test_twins_that_are_not_the_blocks_the_step_computes_copy_nothing() -> None:
    step = StepTokens(np.array([8]), np.array([8]), TABLE[:1])
    stale = {"a": BlockTwins((1,), (0,))}  # the scheduler's twins of another step
    assert twin_copies(["a"], stale, step, BLOCK_SIZE, KERNEL_BLOCKS_PER_BLOCK) is None


def test_twins_the_step_writes_copy_nothing() -> None:
    """a's twin of its block 3 is block 4, which b computes in the same step: its draft KV
    is not written yet when the copy would run."""
    step = StepTokens(np.array([8, 0]), np.array([8, 16]), TABLE)
    written_by_b = {"a": BlockTwins((3,), (4,))}
    assert twin_copies(["a", "b"], written_by_b, step, BLOCK_SIZE, KERNEL_BLOCKS_PER_BLOCK) is None
