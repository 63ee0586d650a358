"""Tensor parallelism on CPU: every rank scores chunks from its own query heads, the ranks'
scores are averaged so that they keep the same chunks, and output is the target's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specextend_vllm import retrieval_stats
from tests.harness import (
    MAX_TOKENS,
    generate_ids,
    on_engine,
    spec_decode_counts,
    specextend_config,
    two_tensor_parallel_ranks,
)

pytestmark = pytest.mark.engine


def test_two_ranks_keep_the_same_chunks_and_stay_lossless(
    tiny_models: dict[str, Path],
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def run(llm: Any) -> tuple[list[list[int]], dict[str, float], list[dict[str, Any]]]:
        return generate_ids(llm, prompts, MAX_TOKENS), spec_decode_counts(llm), retrieval_stats(llm)

    outputs, counts, ranks = on_engine(
        tiny_models["target"],
        specextend_config(tiny_models["draft_noisy"]),
        run,
        **two_tensor_parallel_ranks(monkeypatch),
    )
    assert outputs == plain_outputs
    assert counts["num_accepted_tokens"] > 0
    assert len(ranks) == 2 and ranks[0]["retrievals"] > 0
    assert ranks[0]["selections"] == ranks[1]["selections"]
