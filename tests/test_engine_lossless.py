"""Greedy specextend output equals plain decoding, token for token, through vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specextend_vllm import retrieval_stats
from tests.conftest import (
    MAX_TOKENS,
    METHOD_KEYS,
    generate_ids,
    make_llm,
    spec_decode_counts,
    specextend_config,
)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", params=["cmr", "streaming", "full"])
def specextend_run(request: pytest.FixtureRequest, tiny_models: dict[str, Path], prompts: list[list[int]]) -> dict[str, Any]:
    llm = make_llm(tiny_models["target"], specextend_config(tiny_models["draft_noisy"], policy=request.param))
    outputs = generate_ids(llm, prompts, MAX_TOKENS)
    run = {
        "policy": request.param,
        "outputs": outputs,
        "counts": spec_decode_counts(llm),
        "stats": retrieval_stats(llm)[0],
    }
    del llm
    return run


def test_greedy_output_equals_plain_decoding(specextend_run: dict[str, Any], plain_outputs: list[list[int]]) -> None:
    assert specextend_run["outputs"] == plain_outputs


def test_drafts_are_verified_and_some_accepted(specextend_run: dict[str, Any]) -> None:
    counts = specextend_run["counts"]
    assert counts["num_drafts"] > 0
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"]


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
