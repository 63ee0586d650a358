"""Greedy specextend output equals plain decoding, token for token, through vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import MAX_TOKENS, METHOD_KEYS, decode, specextend_config

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", params=["cmr", "streaming", "full"])
def specextend_run(request: pytest.FixtureRequest, tiny_models: dict[str, Path], prompts: list[list[int]]) -> dict[str, Any]:
    config = specextend_config(tiny_models["draft_noisy"], policy=request.param)
    run = decode(tiny_models["target"], prompts, MAX_TOKENS, config)
    return {"policy": request.param, "outputs": run.outputs, "counts": run.counts, "stats": run.stats}


def test_greedy_output_equals_plain_decoding(specextend_run: dict[str, Any], plain_outputs: list[list[int]]) -> None:
    assert specextend_run["outputs"] == plain_outputs


def test_drafts_are_verified_and_some_accepted(specextend_run: dict[str, Any]) -> None:
    counts = specextend_run["counts"]
    assert counts["num_drafts"] > 0
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"]


def test_the_target_verifies_through_hybrid_attention_on_cpu(specextend_run: dict[str, Any]) -> None:
    assert specextend_run["stats"]["hybrid_verifications"] > 0


def test_long_requests_draft_on_fewer_tokens_than_their_context(specextend_run: dict[str, Any]) -> None:
    stats = specextend_run["stats"]
    if specextend_run["policy"] == "full":
        assert stats["retrievals"] == 0 and stats["reduced_draft_steps"] == 0
        return
    assert stats["retrievals"] > 0
    assert stats["reduced_draft_steps"] > 0 and stats["full_draft_steps"] > 0
    budget = METHOD_KEYS["token_budget"]
    assert stats["mean_kept_tokens"] < stats["mean_context_tokens"]
    assert stats["mean_kept_tokens"] <= budget + METHOD_KEYS["chunk_size"] * 3
    assert all(len(s["kept_chunks"]) == budget // METHOD_KEYS["chunk_size"] for s in stats["selections"])
