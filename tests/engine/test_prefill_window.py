"""The draft's prefill through a window drafts alike however the prompt reached the engine:
in chunks, or from the prefix cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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
        return [generate(llm, [prompt], MAX_TOKENS)[0][0] for _ in range(2)]

    first, cached = on_engine(
        tiny_models["target"],
        config,
        run,
        per_request_spec_decode_metrics="detailed",
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        enable_chunked_prefill=True,
    )
    assert first.tokens == cached.tokens
    assert cached.accepted_per_step == first.accepted_per_step
