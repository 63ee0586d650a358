"""Fewer drafts where drafting cannot pay, losslessly: vLLM's batch-size schedule for the
number of draft tokens, and the method's own choice from measured step times
(`drafting: auto`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    MAX_TOKENS,
    NUM_SPECULATIVE_TOKENS,
    decode,
    generate_ids,
    on_engine,
    spec_decode_counts,
    specextend_config,
)
from tests.tiny_models import save_tiny_model

pytestmark = pytest.mark.engine

# Long enough for `drafting: auto` to measure both choices and then keep one.
LONG_OUTPUT_TOKENS = 64
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


def test_auto_drafting_steps_back_from_a_draft_that_is_never_accepted(
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[list[int]],
) -> None:
    """A draft unrelated to the target: each step with drafts costs more and gives one
    token, as a plain step does. Once both are measured (8 drafting steps, 3 plain), the
    batch stops drafting, and measures drafting again only after 64 steps."""
    unrelated = save_tiny_model(tmp_path_factory.mktemp("unrelated") / "draft", seed=11)
    config = specextend_config(unrelated, drafting="auto")
    plain = decode(tiny_models["target"], prompts, LONG_OUTPUT_TOKENS).outputs

    def run(llm: Any) -> dict[str, float]:
        assert generate_ids(llm, prompts, LONG_OUTPUT_TOKENS) == plain
        return spec_decode_counts(llm)

    counts = on_engine(tiny_models["target"], config, run)
    request_steps = len(prompts) * LONG_OUTPUT_TOKENS
    assert 0 < counts["num_draft_tokens"] < request_steps * NUM_SPECULATIVE_TOKENS / 4
    assert counts["num_accepted_tokens"] < counts["num_draft_tokens"] / 10
