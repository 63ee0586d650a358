"""vLLM's default on CPU compiles the models with torch.compile (inductor, traced once), which
every other engine test skips (`enforce_eager=True`, to save the compile). With the target
and the draft compiled, greedy output equals plain decoding: on a chain verified by hybrid
attention, drafting on the reduced cache, and on a dynamic tree on compact positions past
the draft's trained length. Retrieval keeps the chunks it keeps in eager mode (the scorer
once read the target's query after the compiled forward had reused its buffer, and kept
recent chunks instead: lossless, and half the acceptance on the real pair)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    MAX_TOKENS,
    EngineRun,
    decode,
    generate_ids,
    on_engine,
    spec_decode_counts,
    specextend_config,
)
from tests.tiny_models import set_trained_length

pytestmark = pytest.mark.engine

DRAFT_TRAINED_LENGTH = 256
# vLLM's default CPU block size, chunks of a quarter block: the layout of the real pair's
# engines, where the compiled graph reused the query's buffer (at 32-token blocks it did not).
CHAIN_BLOCK_SIZE = 128
CHAIN_KEYS = {
    "verification_attention": "hybrid",
    "chunk_size": 32,
    "token_budget": 128,
    "activation_length": 256,
}
RUNS = {
    "chain": CHAIN_KEYS,
    "dynamic_tree_compact": {
        "tree": "dynamic",
        "num_speculative_tokens": 10,
        "tree_max_depth": 4,
        "positions": "compact",
    },
}


@pytest.fixture(scope="module", params=list(RUNS))
def compiled_run(
    request: pytest.FixtureRequest,
    tiny_models: dict[str, Path],
    prompts: list[list[int]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, EngineRun, Any]:
    from specextend_vllm import retrieval_stats

    draft = tiny_models["draft_noisy"]
    if "compact" in request.param:
        draft = tmp_path_factory.mktemp("compiled") / "draft"
        shutil.copytree(tiny_models["draft_noisy"], draft)
        set_trained_length(draft, DRAFT_TRAINED_LENGTH)
    config = specextend_config(draft, **RUNS[request.param])
    overrides = {"block_size": CHAIN_BLOCK_SIZE} if request.param == "chain" else {}

    def run(llm: Any) -> tuple[EngineRun, Any]:
        outputs = generate_ids(llm, prompts, MAX_TOKENS)
        mode = llm.llm_engine.vllm_config.compilation_config.mode
        return EngineRun(outputs, spec_decode_counts(llm), retrieval_stats(llm)[0]), mode

    engine_run, mode = on_engine(tiny_models["target"], config, run, enforce_eager=False, **overrides)
    return request.param, engine_run, mode


def kept_chunks(stats: dict[str, Any]) -> list[tuple[str, int, list[int]]]:
    """(request index, context length, kept chunks) per selection; vLLM's request ids end
    in a random suffix."""
    return [
        (s["request_id"].split("-")[0], s["context_len"], s["kept_chunks"]) for s in stats["selections"]
    ]


def test_compiled_greedy_output_equals_plain_decoding(
    compiled_run: tuple[str, EngineRun, Any], plain_outputs: list[list[int]]
) -> None:
    from vllm.config import CompilationMode

    name, run, mode = compiled_run
    assert mode != CompilationMode.NONE
    assert run.outputs == plain_outputs
    assert 0 < run.counts["num_accepted_tokens"] < run.counts["num_draft_tokens"]
    assert run.stats["hybrid_verifications"] > 0 and run.stats["reduced_draft_steps"] > 0
    if "compact" in name:
        assert run.stats["compact_draft_steps"] > 0


def test_compiled_retrieval_keeps_the_chunks_eager_mode_keeps(
    compiled_run: tuple[str, EngineRun, Any], tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    name, run, _ = compiled_run
    if name != "chain":
        pytest.skip("compared on the chain's engine")
    config = specextend_config(tiny_models["draft_noisy"], **CHAIN_KEYS)
    eager = decode(tiny_models["target"], prompts, MAX_TOKENS, config, block_size=CHAIN_BLOCK_SIZE)
    compiled, expected = kept_chunks(run.stats), kept_chunks(eager.stats)
    assert len(compiled) == len(expected) > 0
    same = sum(a == b for a, b in zip(compiled, expected))
    assert same >= 0.9 * len(expected)
