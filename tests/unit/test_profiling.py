from __future__ import annotations

import time

import pytest

from specextend_vllm.profiling import StepTimer


def test_step_timer_attributes_draft_passes_to_the_step_they_follow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def spend(seconds: float) -> None:
        clock[0] += seconds

    timer = StepTimer()
    timer.draft_pass_started()
    spend(1.0)
    timer.draft_pass_finished()  # a warm-up pass before any step: not recorded
    with timer.target_forward(num_target_tokens=5):
        spend(0.5)
    with timer.sample():
        spend(0.25)
    with timer.propose():
        spend(0.125)
        for _ in range(3):
            timer.draft_pass_started()
            spend(0.0625)
            timer.draft_pass_finished()
    with timer.target_forward(num_target_tokens=2):
        spend(0.75)
    first, second = timer.drain()
    assert (first.num_target_tokens, second.num_target_tokens) == (5, 2)
    assert (first.target_forward_s, first.sample_s) == (0.5, 0.25)
    assert first.draft_passes_s == [0.0625] * 3
    assert first.propose_s == 0.125 + 3 * 0.0625
    assert (second.target_forward_s, second.sample_s, second.propose_s) == (0.75, 0.0, 0.0)
    assert second.draft_passes_s == []
    assert timer.drain() == []
