"""The choice between drafting and not, per batch size, from synthetic step measurements."""

from specextend_vllm.algorithm.draft_length import (
    EXPLORATION_PERIOD,
    EXPLORATION_STEPS,
    MIN_SAMPLES,
    DraftLengthChooser,
)

K = 3


def run_steps(
    chooser: DraftLengthChooser,
    batch_size: int,
    steps: int,
    drafting_s: float,
    plain_s: float,
    tokens: float,
) -> list[int]:
    """Steps as the scheduler would run them, following the chooser's table; returns the
    drafts scheduled at each step."""
    scheduled = []
    verified = chooser.lookup[batch_size]
    for _ in range(steps):
        next_drafts = chooser.lookup[batch_size]
        seconds = drafting_s if verified else plain_s
        chooser.record_step(batch_size, verified, next_drafts, seconds, tokens if verified else None)
        scheduled.append(next_drafts)
        verified = next_drafts
    return scheduled


def test_measures_both_choices_then_keeps_the_faster() -> None:
    chooser = DraftLengthChooser(K, max_batch_size=16)
    scheduled = run_steps(chooser, 8, 20, drafting_s=1.0, plain_s=0.3, tokens=2.0)
    assert scheduled[0] == K and 0 in scheduled[: 2 * MIN_SAMPLES + 2]
    assert set(scheduled[2 * MIN_SAMPLES + 2 :]) == {0}
    assert chooser.lookup[8:16] == [0] * 8 and chooser.lookup[1] == K


def test_batch_sizes_are_measured_apart() -> None:
    chooser = DraftLengthChooser(K, max_batch_size=16)
    run_steps(chooser, 1, 20, drafting_s=0.4, plain_s=0.3, tokens=2.5)
    run_steps(chooser, 12, 20, drafting_s=1.2, plain_s=0.35, tokens=2.5)
    assert chooser.lookup[1] == K and chooser.lookup[12] == 0


def test_switching_steps_measure_neither_choice() -> None:
    chooser = DraftLengthChooser(K, max_batch_size=4)
    chooser.record_step(2, verified_drafts=K, next_drafts=0, step_seconds=9.0, tokens_per_step=1.0)
    chooser.record_step(2, verified_drafts=0, next_drafts=K, step_seconds=9.0)
    bucket = chooser.buckets[1]
    assert bucket.drafting_step_s.samples == bucket.plain_step_s.samples == 0


def test_explores_the_other_choice_and_returns_when_it_pays_again() -> None:
    chooser = DraftLengthChooser(K, max_batch_size=4)
    scheduled = run_steps(chooser, 4, EXPLORATION_PERIOD, drafting_s=1.0, plain_s=0.3, tokens=1.5)
    assert scheduled[-10:] == [0] * 10
    later = run_steps(chooser, 4, 3 * EXPLORATION_PERIOD, drafting_s=0.5, plain_s=0.3, tokens=3.5)
    assert K in later[:EXPLORATION_STEPS]
    assert later[-EXPLORATION_PERIOD // 2 :] == [K] * (EXPLORATION_PERIOD // 2)


def test_close_rates_do_not_flap() -> None:
    chooser = DraftLengthChooser(K, max_batch_size=2)
    scheduled = run_steps(chooser, 1, 40, drafting_s=0.6, plain_s=0.3, tokens=1.98)
    after_measuring = scheduled[2 * MIN_SAMPLES + 2 :]
    assert set(after_measuring) == {K}
