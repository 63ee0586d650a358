"""The draft's prefill through a window drafts alike however the prompt reached the engine:
in chunks, or from the prefix cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specextend_vllm import retrieval_stats
from tests.harness import BLOCK_SIZE, MAX_TOKENS, on_engine, random_prompts, specextend_config

pytestmark = pytest.mark.engine

# Prefill chunks that end inside the window's pieces of 4 blocks.
MAX_NUM_BATCHED_TOKENS = 336


def test_a_prompt_from_the_prefix_cache_drafts_as_in_its_first_prefill(
    tiny_models: dict[str, Path],
) -> None:
    """The target as its own draft, on the full cache, its prefill through a window of 2
    blocks; a 700-token prompt prefilled in chunks of 336 tokens, then decoded again from
    the prefix cache (vLLM recomputes its last block). Both decodes accept the same drafts
    at every step (and give the same tokens). Injected: the window's pieces counted from each
    pass's first token, as before: the second decode's first step accepted none of its 3
    drafts where the first accepted all 3; caught."""
    from benchmarks.engine import generate

    [prompt] = random_prompts([700])
    config = specextend_config(
        tiny_models["target"],
        activation_length=2048,
        draft_prefill_window=2 * BLOCK_SIZE,
    )

    def run(llm: Any) -> list[Any]:
        runs = []
        for _ in range(2):
            runs.append(generate(llm, [prompt], MAX_TOKENS)[0][0])
            runs.append(retrieval_stats(llm)[0]["windowed_prompt_tokens"])
        hits = [m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits"]
        return [*runs, hits[0]]

    first, windowed_first, cached, windowed_both, prefix_cache_hits = on_engine(
        tiny_models["target"],
        config,
        run,
        per_request_spec_decode_metrics="detailed",
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        enable_chunked_prefill=True,
    )
    assert first.tokens == cached.tokens
    assert cached.accepted_per_step == first.accepted_per_step
    assert sum(first.accepted_per_step) > 0
    # Most of the first prefill's draft passes cut their attention by the window; the
    # second decode came from the prefix cache, and the draft computed (through the window)
    # only the little the cache did not hold.
    assert windowed_first > len(prompt) // 2
    assert 0 < windowed_both - windowed_first < len(prompt) // 4
    assert prefix_cache_hits >= len(prompt) - BLOCK_SIZE
