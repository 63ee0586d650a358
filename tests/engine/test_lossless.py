"""Greedy specextend output equals plain decoding, token for token, through vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import BLOCK_SIZE, MAX_TOKENS, METHOD_KEYS, decode, specextend_config

pytestmark = pytest.mark.engine


# Chunks of half a KV block, read from working copies; whole-block chunks, read in place;
# the draft's prefill of each prompt past 7 blocks through a window of 2.
PREFILL_WINDOW = 2 * BLOCK_SIZE
RUNS = {
    "cmr": {"policy": "cmr"},
    "cmr_continuation": {"policy": "cmr", "chunk_ranking": "continuation"},
    "streaming": {"policy": "streaming"},
    "full": {"policy": "full"},
    "cmr_whole_blocks": {"policy": "cmr", "chunk_size": 32, "positions": "absolute"},
    "cmr_windowed_prefill": {"policy": "cmr", "draft_prefill_window": PREFILL_WINDOW},
}


@pytest.fixture(scope="module", params=list(RUNS))
def specextend_run(request: pytest.FixtureRequest, tiny_models: dict[str, Path], prompts: list[list[int]]) -> dict[str, Any]:
    keys = RUNS[request.param]
    config = specextend_config(tiny_models["draft_noisy"], **keys)
    run = decode(tiny_models["target"], prompts, MAX_TOKENS, config)
    return {**keys, "outputs": run.outputs, "counts": run.counts, "stats": run.stats}


def test_greedy_output_equals_plain_decoding(specextend_run: dict[str, Any], plain_outputs: list[list[int]]) -> None:
    assert specextend_run["outputs"] == plain_outputs


def test_drafts_are_verified_and_some_accepted(specextend_run: dict[str, Any]) -> None:
    counts = specextend_run["counts"]
    assert counts["num_drafts"] > 0
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"]


def test_the_target_verifies_through_hybrid_attention_on_cpu(specextend_run: dict[str, Any]) -> None:
    assert specextend_run["stats"]["hybrid_verifications"] > 0


def test_the_drafts_prefill_attends_through_its_window_where_set(
    specextend_run: dict[str, Any], prompts: list[list[int]]
) -> None:
    """Every prompt token past the sink block, the window and the first piece of 4 blocks
    (the first piece of each prompt reads whole) is written through the window; the
    default window (1,024 tokens) is longer than any prompt here."""
    windowed = specextend_run["stats"]["windowed_prompt_tokens"]
    if "draft_prefill_window" not in specextend_run:
        assert windowed == 0
        return
    first_windowed = BLOCK_SIZE + PREFILL_WINDOW + 4 * BLOCK_SIZE
    assert windowed >= sum(len(p) - first_windowed for p in prompts if len(p) > first_windowed)


def test_long_requests_draft_on_fewer_tokens_than_their_context(specextend_run: dict[str, Any]) -> None:
    stats = specextend_run["stats"]
    if specextend_run["policy"] == "full":
        assert stats["retrievals"] == 0 and stats["reduced_draft_steps"] == 0
        return
    assert stats["retrievals"] > 0
    assert stats["reduced_draft_steps"] > 0 and stats["full_draft_steps"] > 0
    budget = METHOD_KEYS["token_budget"]
    chunk_size = specextend_run.get("chunk_size", METHOD_KEYS["chunk_size"])
    assert stats["mean_kept_tokens"] < stats["mean_context_tokens"]
    assert stats["mean_kept_tokens"] <= budget + BLOCK_SIZE * 3
    assert all(len(s["kept_chunks"]) == budget // chunk_size for s in stats["selections"])


def test_requests_select_chunks_right_after_their_prefill(
    specextend_run: dict[str, Any], prompts: list[list[int]]
) -> None:
    """The first drafts after a prompt already run on the reduced cache."""
    if specextend_run["policy"] == "full":
        return
    long_prompt_lengths = {len(p) for p in prompts if len(p) >= METHOD_KEYS["activation_length"]}
    first_selection_lengths = {s["context_len"] for s in specextend_run["stats"]["selections"]}
    assert long_prompt_lengths <= first_selection_lengths
