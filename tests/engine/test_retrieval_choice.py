"""`retrieval: auto` through the engine: each bucket of context lengths measures drafting
on the full cache and on the reduced one, keeps the one giving more tokens per second, and
stays lossless while switching."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from specextend_vllm import reconfigure, retrieval_stats
from tests.harness import (
    SimulatedTime,
    decode,
    delay_calls,
    generate_ids,
    on_engine,
    random_prompts,
    specextend_config,
)

pytestmark = pytest.mark.engine

# One request at a time (batch size 1: every step measured), contexts of 600 to 700
# tokens: one bucket of context lengths (512-1023 at activation length 128).
PROMPTS = random_prompts([600] * 4, seed=5)
OUTPUT_TOKENS = 96
# Batched with the first of PROMPTS: two buckets in one batch (256-511 and 512-1023).
SHORTER_PROMPT = random_prompts([300], seed=6)[0]
# Simulated seconds (`SimulatedTime`), which alone set the step times the chooser measures:
# each target forward's, and what every step drafting on the full cache adds in the second
# phase (a draft whose attention over the whole context is slow, as a large draft's is on
# long prompts).
TARGET_FORWARD_S = 0.02
FULL_CACHE_DELAY_S = 0.1


def measure_on_simulated_time(worker: Any, clock: SimulatedTime) -> None:
    worker.model_runner.drafter.planner.clock = clock.now
    delay_calls(worker.model_runner.model, "forward", TARGET_FORWARD_S, wait=clock.advance)


def slow_down_full_cache_drafts(worker: Any, clock: SimulatedTime) -> None:
    planner = worker.model_runner.drafter.planner
    lay_out = planner.lay_out

    def lay_out_slowly(*args: Any) -> Any:
        view, active = lay_out(*args)
        if not bool(active.any()):
            clock.advance(FULL_CACHE_DELAY_S)
        return view, active

    planner.lay_out = lay_out_slowly


def count_new_batches(worker: Any) -> None:
    chooser = worker.model_runner.drafter.planner.chooser
    new_batch = chooser.new_batch
    chooser.new_batches = 0

    def counting_new_batch(bucket_index: int) -> None:
        chooser.new_batches += 1
        new_batch(bucket_index)

    chooser.new_batch = counting_new_batch


def new_batches(worker: Any) -> int:
    return worker.model_runner.drafter.planner.chooser.new_batches


def draft_steps(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int]:
    return (
        after["reduced_draft_steps"] - before["reduced_draft_steps"],
        after["full_draft_steps"] - before["full_draft_steps"],
    )


def test_auto_retrieval_keeps_the_faster_cache_losslessly(tiny_models: dict[str, Path]) -> None:
    """The target as its own draft, streaming retrieval (the first chunk and the newest),
    every step's time simulated: on the full cache every draft is accepted, on the reduced
    one fewer, at the same step time, so the full cache wins (96 full, 16 reduced steps;
    comparing step times alone, blind to the tokens, 77 and 67). Once full-cache steps cost
    FULL_CACHE_DELAY_S more, the reduced one wins (9 full, 257 reduced; with the chooser
    left on the full cache once measured, it fails). Either way the other choice is
    measured (8 steps) and re-explored now and then. Then a batch of two requests in two
    buckets, measured afresh: it follows the bucket holding most of its context and
    measures it, so it reaches the reduced cache's turn (83 reduced steps; a chooser that
    measured only batches within one bucket left that batch on the full cache, 0). Each
    request of a phase is a new batch to the chooser, once (`RetrievalChooser.new_batch`).
    (With sleeps and the wall clock, one run of the suite saw 48 full and 151 reduced in
    the first phase: with ~10 ms steps, one pause of the process weighs like a slower
    cache.)"""
    target = tiny_models["target"]
    *plain, plain_shorter = decode(target, [*PROMPTS, SHORTER_PROMPT], OUTPUT_TOKENS).outputs
    config = specextend_config(target, retrieval="auto", policy="streaming")

    clock = SimulatedTime()

    def run(llm: Any) -> list[tuple[int, int, dict[str, Any]]]:
        llm.collective_rpc(functools.partial(measure_on_simulated_time, clock=clock))
        phases = []
        for slow_full_cache in (False, True):
            if slow_full_cache:
                reconfigure(llm, retrieval="auto")
                llm.collective_rpc(functools.partial(slow_down_full_cache_drafts, clock=clock))
            llm.collective_rpc(count_new_batches)
            before = retrieval_stats(llm)[0]
            for prompt, expected in zip(PROMPTS, plain):
                assert generate_ids(llm, [prompt], OUTPUT_TOKENS) == [expected]
            after = retrieval_stats(llm)[0]
            # Each request, alone in its batch, is a new batch to the chooser once.
            assert llm.collective_rpc(new_batches) == [len(PROMPTS)]
            phases.append((*draft_steps(before, after), after))
        reconfigure(llm, retrieval="auto")
        before = retrieval_stats(llm)[0]
        mixed = generate_ids(llm, [PROMPTS[0], SHORTER_PROMPT], OUTPUT_TOKENS)
        assert mixed == [plain[0], plain_shorter]
        phases.append((*draft_steps(before, retrieval_stats(llm)[0]), {}))
        return phases

    (reduced_fast, full_fast, stats_fast), (reduced_slow, full_slow, _), (reduced_mixed, _, _) = (
        on_engine(target, config, run)
    )
    print(
        f"reduced and full draft steps: {reduced_fast}, {full_fast}; slowed full cache "
        f"{reduced_slow}, {full_slow}; two buckets {reduced_mixed} reduced"
    )
    assert stats_fast["full_accepted_drafts"] / stats_fast["full_verified_drafts"] > (
        stats_fast["reduced_accepted_drafts"] / stats_fast["reduced_verified_drafts"]
    )
    assert reduced_fast >= 8 and full_fast >= 2 * reduced_fast
    assert full_slow >= 8 and reduced_slow >= 2 * full_slow
    assert reduced_mixed > 0
