"""The method's counts (what a step adds, what it reports), the decoding steps the scheduler
timed, and the log lines of them."""

from __future__ import annotations

import dataclasses

import torch

from specextend_vllm.metrics import DecodingSteps, RetrievalMetrics, SpecExtendCounts
from specextend_vllm.metrics_exporters import PROMETHEUS_COUNTERS, SpecExtendLogging


def draft_step(metrics: RetrievalMetrics) -> None:
    """Three requests: two draft on reduced caches (one of them on compact positions).
    The first verified 3 drafts it drafted on a reduced cache and accepted 2, the second
    3 drafted on the full cache and accepted 1; the third was a prompt."""
    metrics.record_draft_step(
        active=torch.tensor([True, False, True]),
        compact=torch.tensor([True, True, False]),
        context_lens=torch.tensor([500, 60, 300]),
        seq_len_offset=torch.tensor([400, 0, 160]),
        verified_drafts=torch.tensor([3, 3, 0]),
        accepted_drafts=torch.tensor([2, 1, 299]),
        verified_reduced=torch.tensor([True, False, True]),
    )


def test_a_draft_step_counts_requests_and_the_tokens_of_the_reduced_ones() -> None:
    metrics = RetrievalMetrics()
    draft_step(metrics)
    counts = metrics.take_new_counts()
    assert counts == SpecExtendCounts(
        reduced_draft_steps=2,
        compact_draft_steps=1,
        full_draft_steps=1,
        kept_tokens=100 + 140,
        context_tokens=500 + 300,
        reduced_verified_drafts=3,
        reduced_accepted_drafts=2,
        full_verified_drafts=3,
        full_accepted_drafts=1,
    )
    assert metrics.summary()["mean_kept_tokens"] == 120


def test_each_report_holds_the_counts_since_the_last_and_the_totals_hold_all() -> None:
    metrics = RetrievalMetrics()
    assert metrics.take_new_counts() is None
    metrics.record_scoring(0.5)
    metrics.record_hybrid_verification()
    first = metrics.take_new_counts()
    assert first == SpecExtendCounts(scorer_calls=1, scorer_seconds=0.5, hybrid_verifications=1)
    assert metrics.take_new_counts() is None
    draft_step(metrics)
    metrics.record_scoring(0.25)
    second = metrics.take_new_counts()
    assert second is not None and second.scorer_calls == 1 and second.reduced_draft_steps == 2
    draft_step(metrics)  # not reported yet, but in the totals
    totals = metrics.totals()
    assert (totals.scorer_calls, totals.scorer_seconds) == (2, 0.75)
    assert totals.reduced_draft_steps == 4 and totals.hybrid_verifications == 1
    assert metrics.summary() == totals.summary()


def test_every_count_has_a_prometheus_counter() -> None:
    assert list(PROMETHEUS_COUNTERS) == [f.name for f in dataclasses.fields(SpecExtendCounts)]
    names = [name for name, _ in PROMETHEUS_COUNTERS.values()]
    assert all(name.startswith("vllm:specextend_") for name in names)
    assert not any(name.endswith("_total") for name in names)  # prometheus_client adds it


def test_the_log_line_sums_each_engines_counts_since_the_last_line() -> None:
    logging = SpecExtendLogging()
    lines: list[str] = []

    def log_fn(message: str, *args: object) -> None:
        lines.append(message % args)

    logging.log(log_fn)
    assert lines == []
    step = SpecExtendCounts(
        retrievals=1, reduced_draft_steps=2, kept_tokens=200, context_tokens=900
    )
    logging.observe(step, engine_idx=1)
    logging.observe(step, engine_idx=1)
    logging.observe(SpecExtendCounts(full_draft_steps=3), engine_idx=0)
    logging.log(log_fn)
    assert lines[0].startswith("Engine 000: SpecExtend metrics: Retrievals: 0,")
    assert lines[1] == (
        "Engine 001: SpecExtend metrics: Retrievals: 2, Reduced draft steps: 4 (compact "
        "positions: 0), Full draft steps: 0, Mean kept tokens: 100.0 of 450.0 context tokens, "
        "Scorer: 0 calls, 0.000 s, Verifications: 0 hybrid, 0 native, Plain decoding steps on "
        "the prefix kernel: 0, Accepted drafts: 0 of 0 on "
        "reduced caches, 0 of 0 on full caches, Skipped draft steps: 0, Catch-up: 0 passes, "
        "0 tokens, Copied prompt tokens: 0, Windowed prompt tokens: 0, Draft prompt passes: "
        "0 tokens, 0.000 s, Steps not drafted for the draft's prompt work: 0"
    )
    logging.log(log_fn)
    assert len(lines) == 2


def test_decoding_steps_add_up_per_bucket_of_batch_sizes_and_drafts_verified_and_proposed() -> None:
    first, second = DecodingSteps(), DecodingSteps()
    first.record(batch_size=1, num_drafts=4, next_drafts=4, seconds=0.5, tokens=4)
    second.record(batch_size=1, num_drafts=4, next_drafts=4, seconds=0.25, tokens=2)
    second.record(batch_size=1, num_drafts=4, next_drafts=0, seconds=0.25, tokens=3)
    second.record(batch_size=3, num_drafts=0, next_drafts=0, seconds=0.5, tokens=3)
    first.add(second)
    assert [(t.batch_sizes, t.drafts, t.steps, t.seconds, t.tokens) for t in first.rows()] == [
        ("1", "4->0", 1, 0.25, 3),
        ("1", "4", 2, 0.75, 6),
        ("2-3", "0", 1, 0.5, 3),
    ]
    assert second.rows()[1].steps == 1  # what was added stays as it was
    assert DecodingSteps().is_empty() and not first.is_empty()


def test_the_decoding_steps_log_line_gives_steps_mean_step_and_tokens_per_second() -> None:
    logging = SpecExtendLogging()
    lines: list[str] = []

    def log_fn(message: str, *args: object) -> None:
        lines.append(message % args)

    steps = DecodingSteps()
    steps.record(batch_size=4, num_drafts=0, next_drafts=0, seconds=0.25, tokens=4)
    steps.record(batch_size=5, num_drafts=0, next_drafts=3, seconds=0.5, tokens=5)
    steps.record(batch_size=5, num_drafts=3, next_drafts=3, seconds=0.5, tokens=11)
    logging.observe_decoding_steps(steps, engine_idx=0)
    logging.observe_decoding_steps(steps, engine_idx=0)
    logging.log(log_fn)
    assert lines == [
        "Engine 000: SpecExtend decoding steps (batch sizes x drafts: steps, mean step, "
        "tokens/s): 4-7 x 0: 2, 250.0 ms, 16.00; 4-7 x 0->3: 2, 500.0 ms, 10.00; "
        "4-7 x 3: 2, 500.0 ms, 22.00"
    ]
    logging.log(log_fn)
    assert len(lines) == 1
