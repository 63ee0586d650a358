"""Tensor parallelism on CPU: every rank scores chunks from its own query heads, the ranks'
scores are averaged so that they keep the same chunks, and output is the target's; with
`retrieval: auto` the ranks average their step times, so that they choose alike."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from specextend_vllm import reconfigure, retrieval_stats
from tests.harness import (
    BLOCK_SIZE,
    MAX_TOKENS,
    decode,
    generate_ids,
    on_engine,
    random_prompts,
    spec_decode_counts,
    specextend_config,
    two_tensor_parallel_ranks,
)

pytestmark = pytest.mark.engine


# With `retrieval: auto`: one request decoding alone (every step measured), and the second
# rank's clock gaining this much at each step drafted on the full cache: the ranks wait for
# each other at every collective, so real delays are the same on both, and this stands for
# the jitter that tells them apart.
AUTO_OUTPUT_TOKENS = 96
SECOND_RANK_CLOCK_GAIN_S = 0.1


def skew_the_second_ranks_clock_on_full_cache_drafts(worker: Any) -> None:
    if worker.rank != 1:
        return
    planner = worker.model_runner.drafter.planner
    lay_out = planner.lay_out
    gained_s = [0.0]

    def lay_out_and_skew(*args: Any) -> Any:
        view, active = lay_out(*args)
        if not bool(active.any()):
            gained_s[0] += SECOND_RANK_CLOCK_GAIN_S
        return view, active

    planner.lay_out = lay_out_and_skew
    planner.clock = lambda: time.perf_counter() + gained_s[0]


def test_two_ranks_keep_the_same_chunks_and_stay_lossless(
    tiny_models: dict[str, Path],
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Then `retrieval: auto` on one request, streaming retrieval (the full cache accepts
    more of the near-target draft's tokens) and the second rank's clock gaining on full-cache
    steps: with each rank choosing from its own times, the first keeps the full cache and
    the second the reduced one, and the second's scoring waits for the first forever (seen
    with the averaging removed); with the times averaged both choose alike. Between the two,
    a prompt of whole blocks decoded again: each rank copies its shard of the draft's KV of
    the block vLLM computes again (the twins travel with the scheduler's output)."""
    [whole_blocks] = random_prompts([8 * BLOCK_SIZE], seed=3)

    def run(llm: Any) -> tuple[list[list[int]], dict[str, float], list[dict[str, Any]], list[int], list[dict[str, Any]]]:
        outputs = generate_ids(llm, prompts, MAX_TOKENS)
        generate_ids(llm, [whole_blocks], 1)
        outputs += generate_ids(llm, [whole_blocks], MAX_TOKENS)
        counts, ranks = spec_decode_counts(llm), retrieval_stats(llm)
        reconfigure(llm, retrieval="auto", policy="streaming")
        llm.collective_rpc(skew_the_second_ranks_clock_on_full_cache_drafts)
        [auto_output] = generate_ids(llm, prompts[-1:], AUTO_OUTPUT_TOKENS)
        return outputs, counts, ranks, auto_output, retrieval_stats(llm)

    outputs, counts, ranks, auto_output, auto_ranks = on_engine(
        tiny_models["target"],
        specextend_config(tiny_models["draft_noisy"]),
        run,
        **two_tensor_parallel_ranks(monkeypatch),
    )
    plain_whole_blocks = decode(tiny_models["target"], [whole_blocks], MAX_TOKENS).outputs
    assert outputs == plain_outputs + plain_whole_blocks
    assert [rank["copied_prompt_tokens"] for rank in ranks] == [BLOCK_SIZE - 1] * 2
    assert counts["num_accepted_tokens"] > 0
    assert len(ranks) == 2 and ranks[0]["retrievals"] > 0
    assert ranks[0]["selections"] == ranks[1]["selections"]
    assert auto_output[:MAX_TOKENS] == plain_outputs[-1]
    steps = [(rank["reduced_draft_steps"], rank["full_draft_steps"]) for rank in auto_ranks]
    assert steps[0] == steps[1] and min(steps[0]) > 0
    assert auto_ranks[0]["selections"] == auto_ranks[1]["selections"]
