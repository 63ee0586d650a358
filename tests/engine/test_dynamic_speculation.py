"""vLLM's batch-size schedule for the number of draft tokens works with `specextend`: it
drafts for a lone request, steps back from drafting for a full batch, and stays lossless."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import MAX_TOKENS, generate_ids, on_engine, spec_decode_counts, specextend_config

pytestmark = pytest.mark.engine

# Batch size 1: 3 draft tokens; batches of 2 to 16: none.
SCHEDULE = [[1, 1, 3], [2, 16, 0]]


def test_drafting_follows_the_batch_size_schedule_losslessly(
    tiny_models: dict[str, Path], prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    config = specextend_config(
        tiny_models["draft_noisy"], num_speculative_tokens_per_batch_size=SCHEDULE
    )

    def run(llm: Any) -> None:
        assert generate_ids(llm, prompts, MAX_TOKENS) == plain_outputs
        drafts_in_batches = spec_decode_counts(llm).get("num_drafts", 0)
        assert generate_ids(llm, prompts[-1:], MAX_TOKENS) == plain_outputs[-1:]
        drafts_alone = spec_decode_counts(llm)["num_drafts"] - drafts_in_batches
        assert drafts_alone > 0
        assert drafts_in_batches < drafts_alone

    on_engine(tiny_models["target"], config, run)
