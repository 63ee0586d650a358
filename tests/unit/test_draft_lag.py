"""Which tokens the draft missed on steps it did not run, and which it must write before it
runs again."""

from __future__ import annotations

import numpy as np

from specextend_vllm.algorithm.draft_lag import DraftLag


def test_a_request_lags_from_its_first_skipped_step_to_the_step_that_drafts() -> None:
    lag = DraftLag(4)
    lag.skipped(["a"], np.array([100]))
    lag.skipped(["a"], np.array([101]))
    lag.skipped(["a"], np.array([104]))  # a step that verified drafts: several tokens
    catch_up = lag.catch_up(["a"], np.array([106]))
    assert catch_up is not None
    assert catch_up.token_rows_and_positions()[1].tolist() == list(range(100, 106))
    assert not lag.any_lagging


def test_requests_absent_from_a_drafting_step_keep_lagging() -> None:
    lag = DraftLag(4)
    lag.skipped(["a", "b"], np.array([10, 20]))
    catch_up = lag.catch_up(["b"], np.array([22]))
    assert catch_up is not None and catch_up.rows.tolist() == [0]
    assert lag.any_lagging
    catch_up = lag.catch_up(["c", "a"], np.array([0, 13]))
    assert catch_up is not None and catch_up.rows.tolist() == [1]
    assert catch_up.lengths.tolist() == [3]


def test_finished_and_restarted_requests_lag_no_more() -> None:
    lag = DraftLag(2)
    lag.skipped(["a", "b"], np.array([10, 20]))
    lag.on_requests_changed(finished=["a"], restarted=["b"])
    assert lag.catch_up(["b"], np.array([30])) is None
    lag.skipped(["c"], np.array([5]))  # takes the slot "a" freed, lagging from 5 only
    catch_up = lag.catch_up(["c"], np.array([7]))
    assert catch_up is not None and catch_up.starts.tolist() == [5]
