"""Which tokens the draft missed on steps it did not run, and which it must write before it
runs again, per request and through the prefix cache's blocks."""

from __future__ import annotations

import numpy as np

from specextend_vllm.algorithm.draft_lag import DraftLag, StepTokens

BLOCK_SIZE = 4
TABLE = np.arange(30).reshape(3, 10)  # request rows' blocks: 0-9, 10-19, 20-29


def step(first_positions: list[int], query_lens: list[int] | None = None) -> StepTokens:
    rows = len(first_positions)
    return StepTokens(
        np.array(first_positions), np.array(query_lens or [1] * rows), TABLE[:rows]
    )


def test_a_request_lags_from_its_first_skipped_step_to_the_step_that_drafts() -> None:
    lag = DraftLag(4, num_blocks=30, block_size=BLOCK_SIZE)
    lag.skipped(["a"], step([20]))
    lag.skipped(["a"], step([21], [4]))  # verified 3 drafts (positions 21-24), accepted 1
    catch_up = lag.catch_up(["a"], step([23]))
    assert catch_up is not None
    assert catch_up.token_rows_and_positions()[1].tolist() == [20, 21, 22]
    # Block 6 (positions 24-27) held a rejected draft: flagged until the draft writes it.
    assert lag.may_lag
    assert lag.catch_up(["a"], step([24])) is None and not lag.may_lag


def test_requests_absent_from_a_drafting_step_keep_lagging() -> None:
    """... whatever their blocks say (the blocks cleared here: a request's own lag is what
    the proposer asks about before it skips catching up)."""
    lag = DraftLag(4, num_blocks=30, block_size=BLOCK_SIZE)
    lag.skipped(["a", "b"], step([10, 20]))
    lag.missing_blocks[:] = False
    assert lag.may_lag
    catch_up = lag.catch_up(["b"], step([22]))
    assert catch_up is not None and catch_up.rows.tolist() == [0]
    assert lag.may_lag
    catch_up = lag.catch_up(["c", "a"], step([0, 13], [5, 1]))
    assert catch_up is not None and catch_up.rows.tolist() == [1]
    assert catch_up.lengths.tolist() == [3]


def test_a_new_request_on_cached_blocks_the_draft_missed_catches_up_from_the_first() -> None:
    lag = DraftLag(4, num_blocks=30, block_size=BLOCK_SIZE)
    lag.skipped(["a"], step([0], [10]))  # a deferred prefill: blocks 0-2
    lag.on_requests_changed(finished=["a"], restarted=[])
    catch_up = lag.catch_up(["b"], step([9]))  # b hit blocks 0-2 in the prefix cache
    assert catch_up is not None and catch_up.starts.tolist() == [0]
    assert catch_up.lengths.tolist() == [9]
    assert not lag.may_lag  # the blocks are complete once b has caught up
    assert lag.catch_up(["c"], step([9])) is None


def test_new_requests_catch_up_from_their_own_first_flagged_cached_block() -> None:
    lag = DraftLag(4, num_blocks=30, block_size=BLOCK_SIZE)
    lag.missing_blocks[[2, 5, 13, 25]] = True
    # a's cached blocks 0-2 hold flagged block 2 (5 is past them); b's 10-12 hold none
    # (13 is past them); c's 20-27 hold 25.
    catch_up = lag.catch_up(["a", "b", "c"], step([12, 12, 32]))
    assert catch_up is not None and catch_up.rows.tolist() == [0, 2]
    assert catch_up.starts.tolist() == [8, 20] and catch_up.lengths.tolist() == [4, 12]
    # d's cached blocks 0-2 hold none; block 5, past them, is not d's to catch up from.
    lag = DraftLag(4, num_blocks=30, block_size=BLOCK_SIZE)
    lag.missing_blocks[5] = True
    lag.skipped(["d"], step([12]))
    catch_up = lag.catch_up(["d"], step([13]))
    assert catch_up is not None and catch_up.starts.tolist() == [12]
    # e's first new token is position 13: block 3 (12-15) holds its cached position 12.
    lag = DraftLag(4, num_blocks=30, block_size=BLOCK_SIZE)
    lag.missing_blocks[3] = True
    catch_up = lag.catch_up(["e"], step([13]))
    assert catch_up is not None and catch_up.starts.tolist() == [12]
    assert catch_up.lengths.tolist() == [1]


def test_restarted_requests_lag_no_more_and_free_slots_are_reused() -> None:
    lag = DraftLag(2, num_blocks=30, block_size=BLOCK_SIZE)
    lag.skipped(["a", "b"], step([10, 20]))
    lag.on_requests_changed(finished=["a"], restarted=["b"])
    lag.missing_blocks[:] = False  # as if both had been computed again with the draft
    assert lag.catch_up(["b"], step([30])) is None
    lag.skipped(["c"], step([5]))
    catch_up = lag.catch_up(["c"], step([7]))
    assert catch_up is not None and catch_up.starts.tolist() == [5]
