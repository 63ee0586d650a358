"""vLLM's default on CPU compiles the models with torch.compile (inductor, traced once), which
every other engine test skips (`enforce_eager=True`, to save the compile). With the target
and the draft compiled, greedy output equals plain decoding: on a chain verified by hybrid
attention, drafting on the reduced cache, and on a dynamic tree on compact positions past
the draft's trained length."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.harness import MAX_TOKENS, EngineRun, generate_ids, on_engine, spec_decode_counts, specextend_config
from tests.tiny_models import set_trained_length

pytestmark = pytest.mark.engine

DRAFT_TRAINED_LENGTH = 256
RUNS = {
    "chain": {"verification_attention": "hybrid"},
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

    draft = tmp_path_factory.mktemp("compiled") / "draft"
    shutil.copytree(tiny_models["draft_noisy"], draft)
    set_trained_length(draft, DRAFT_TRAINED_LENGTH)
    config = specextend_config(draft, **RUNS[request.param])

    def run(llm: Any) -> tuple[EngineRun, Any]:
        outputs = generate_ids(llm, prompts, MAX_TOKENS)
        mode = llm.llm_engine.vllm_config.compilation_config.mode
        return EngineRun(outputs, spec_decode_counts(llm), retrieval_stats(llm)[0]), mode

    engine_run, mode = on_engine(tiny_models["target"], config, run, enforce_eager=False)
    return request.param, engine_run, mode


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
