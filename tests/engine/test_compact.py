"""Compact positions and cross-tokenizer drafts through the engine: a draft trained on
256 positions drafts for prompts up to 880 tokens, and output stays the target's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specextend_vllm import reconfigure, retrieval_stats
from tests.harness import (
    MAX_TOKENS,
    PROMPT_LENGTHS,
    generate_ids,
    decode,
    make_llm,
    spec_decode_counts,
    specextend_config,
)
from tests.tiny_models import save_cross_tokenizer_pair, set_trained_length

pytestmark = pytest.mark.engine

DRAFT_TRAINED_LENGTH = 256


@pytest.fixture(scope="module")
def short_trained_draft(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    import shutil

    draft = tmp_path_factory.mktemp("short") / "draft"
    shutil.copytree(tiny_models["draft_noisy"], draft)
    return set_trained_length(draft, DRAFT_TRAINED_LENGTH)


@pytest.fixture(scope="module")
def compact_llm(
    short_trained_draft: Path, tiny_models: dict[str, Path], plain_outputs: list[list[int]]
) -> Any:
    llm = make_llm(
        tiny_models["target"], specextend_config(short_trained_draft, positions="compact")
    )
    yield llm
    del llm


def test_prompts_past_the_draft_range_are_lossless_on_compact_positions(
    compact_llm: Any, prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    assert max(PROMPT_LENGTHS) > DRAFT_TRAINED_LENGTH
    before = spec_decode_counts(compact_llm)
    assert generate_ids(compact_llm, prompts, MAX_TOKENS) == plain_outputs
    after = spec_decode_counts(compact_llm)
    assert after["num_accepted_tokens"] > before.get("num_accepted_tokens", 0)
    stats = retrieval_stats(compact_llm)[0]
    assert stats["compact_draft_steps"] > 0
    assert stats["compact_draft_steps"] == stats["reduced_draft_steps"]


def test_auto_positions_compact_only_past_the_trained_length(
    compact_llm: Any, prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    reconfigure(compact_llm, positions="auto")
    short = [p for p in prompts if len(p) + MAX_TOKENS < DRAFT_TRAINED_LENGTH]
    long = [p for p in prompts if len(p) > DRAFT_TRAINED_LENGTH]
    expected = {tuple(p): o for p, o in zip(prompts, plain_outputs)}

    before = retrieval_stats(compact_llm)[0]
    assert generate_ids(compact_llm, short, MAX_TOKENS) == [expected[tuple(p)] for p in short]
    after_short = retrieval_stats(compact_llm)[0]
    assert after_short["reduced_draft_steps"] > before["reduced_draft_steps"]
    assert after_short["compact_draft_steps"] == before["compact_draft_steps"]

    assert generate_ids(compact_llm, long, MAX_TOKENS) == [expected[tuple(p)] for p in long]
    assert (
        retrieval_stats(compact_llm)[0]["compact_draft_steps"] > after_short["compact_draft_steps"]
    )


def test_adaptive_retrieval_is_lossless(
    compact_llm: Any, prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    reconfigure(
        compact_llm, positions="compact", retrieval_trigger="adaptive", retrieval_interval=8
    )
    before = retrieval_stats(compact_llm)[0]["retrievals"]
    assert generate_ids(compact_llm, prompts, MAX_TOKENS) == plain_outputs
    assert retrieval_stats(compact_llm)[0]["retrievals"] > before


def test_chunk_size_switched_on_a_running_engine_stays_lossless(
    compact_llm: Any, prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    """Whole-block chunks on a running engine that started with half-block ones."""
    [config] = reconfigure(
        compact_llm, positions="compact", retrieval_trigger="interval", chunk_size=64
    )
    assert config["chunk_size"] == 64
    assert generate_ids(compact_llm, prompts, MAX_TOKENS) == plain_outputs
    assert len(retrieval_stats(compact_llm)[0]["selections"][-1]["kept_chunks"]) == 1


@pytest.mark.parametrize(
    "drafts", [{}, {"tree": "dynamic", "num_speculative_tokens": 6, "tree_max_depth": 3}]
)
def test_cross_tokenizer_draft_with_compact_positions(
    tiny_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[list[int]],
    plain_outputs: list[list[int]],
    drafts: dict[str, Any],
) -> None:
    """A draft with its own tokenizer (400 of 512 tokens shared) through vLLM's
    use_heterogeneous_vocab, drafting chains or trees: it starts, drafts, has tokens
    accepted, and output is the target's."""
    target, draft = save_cross_tokenizer_pair(
        tmp_path_factory.mktemp("cross"), tiny_models["target"], 400, seed=5
    )
    set_trained_length(draft, DRAFT_TRAINED_LENGTH)
    config = specextend_config(
        draft, positions="compact", use_heterogeneous_vocab=True, **drafts
    )
    run = decode(target, prompts, MAX_TOKENS, config, skip_tokenizer_init=False)
    assert run.outputs == plain_outputs
    assert run.counts["num_accepted_tokens"] > 0
    assert run.stats["compact_draft_steps"] > 0
