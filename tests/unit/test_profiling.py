from __future__ import annotations

from specextend_vllm.profiling import StepTimer


def test_step_timer_attributes_draft_passes_to_the_step_they_follow() -> None:
    timer = StepTimer()
    timer.draft_pass_started()
    timer.draft_pass_finished()  # a warm-up pass before any step: not recorded
    with timer.target_forward(num_target_tokens=5):
        pass
    with timer.sample():
        pass
    with timer.propose():
        for _ in range(3):
            timer.draft_pass_started()
            timer.draft_pass_finished()
    with timer.target_forward(num_target_tokens=2):
        pass
    first, second = timer.drain()
    assert (first.num_target_tokens, second.num_target_tokens) == (5, 2)
    assert len(first.draft_passes_s) == 3 and second.draft_passes_s == []
    assert first.propose_s >= sum(first.draft_passes_s) >= 0
    assert first.target_forward_s >= 0 and first.sample_s >= 0 and second.sample_s == 0
    assert timer.drain() == []
