"""Token trees through the engine: greedy output equals plain decoding with static trees
under every retrieval policy and with dynamic trees, on absolute and on compact positions
past the draft's trained length; a chain-shaped tree gives the chain's outputs and its
acceptance."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from tests.harness import (
    MAX_TOKENS,
    NUM_SPECULATIVE_TOKENS,
    PROMPT_LENGTHS,
    EngineRun,
    decode,
    make_llm,
    specextend_config,
)
from tests.tiny_models import set_trained_length

pytestmark = pytest.mark.engine

TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]
DRAFT_TRAINED_LENGTH = 256
DYNAMIC = {"tree": "dynamic", "num_speculative_tokens": 10, "tree_max_depth": 4}
RUNS = {
    "cmr": {"policy": "cmr"},
    "streaming": {"policy": "streaming"},
    "full": {"policy": "full"},
    "compact": {"policy": "cmr", "positions": "compact"},
    "dynamic": {"policy": "cmr", **DYNAMIC},
    "dynamic_compact": {"policy": "cmr", "positions": "compact", **DYNAMIC},
}


def tree_config(draft: Path, tree: list[list[int]] | str = TREE, **keys: Any) -> dict[str, Any]:
    keys.setdefault("num_speculative_tokens", len(tree))
    return specextend_config(draft, tree=tree, **keys)


@pytest.fixture(scope="module")
def short_trained_draft(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    draft = tmp_path_factory.mktemp("short_tree") / "draft"
    shutil.copytree(tiny_models["draft_noisy"], draft)
    return set_trained_length(draft, DRAFT_TRAINED_LENGTH)


@pytest.fixture(scope="module", params=list(RUNS))
def tree_run(
    request: pytest.FixtureRequest,
    tiny_models: dict[str, Path],
    short_trained_draft: Path,
    prompts: list[list[int]],
) -> tuple[str, EngineRun]:
    draft = short_trained_draft if "compact" in request.param else tiny_models["draft_noisy"]
    config = tree_config(draft, **RUNS[request.param])
    return request.param, decode(tiny_models["target"], prompts, MAX_TOKENS, config)


def test_greedy_tree_output_equals_plain_decoding(
    tree_run: tuple[str, EngineRun], plain_outputs: list[list[int]]
) -> None:
    _, run = tree_run
    assert run.outputs == plain_outputs


def test_trees_are_verified_and_paths_accepted(tree_run: tuple[str, EngineRun]) -> None:
    name, run = tree_run
    assert run.counts["num_drafts"] > 0
    assert 0 < run.counts["num_accepted_tokens"] < run.counts["num_draft_tokens"]
    assert run.stats["hybrid_verifications"] > 0
    if "compact" in name:
        assert max(PROMPT_LENGTHS) > DRAFT_TRAINED_LENGTH
        assert run.stats["compact_draft_steps"] > 0


def test_a_chain_shaped_tree_gives_the_chains_outputs_and_acceptance(
    tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    chain = decode(
        tiny_models["target"], prompts, MAX_TOKENS, specextend_config(tiny_models["draft_noisy"])
    )
    chain_tree = [[0] * depth for depth in range(1, NUM_SPECULATIVE_TOKENS + 1)]
    tree = decode(
        tiny_models["target"], prompts, MAX_TOKENS, tree_config(tiny_models["draft_noisy"], chain_tree)
    )
    assert tree.outputs == chain.outputs
    assert tree.counts == chain.counts


@pytest.fixture(scope="module")
def tree_llm(tiny_models: dict[str, Path]) -> Any:
    llm = make_llm(tiny_models["target"], tree_config(tiny_models["draft_noisy"]))
    yield llm
    del llm


def test_logprobs_follow_the_accepted_path(tree_llm: Any, prompts: list[list[int]]) -> None:
    """Greedy tokens are each the most probable one of the row vLLM reports for them."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=3)
    outputs = tree_llm.generate(
        [{"prompt_token_ids": p} for p in prompts[-3:]], params, use_tqdm=False
    )
    for output in outputs:
        completion = output.outputs[0]
        assert len(completion.logprobs) == len(completion.token_ids) == MAX_TOKENS
        for token, logprobs in zip(completion.token_ids, completion.logprobs):
            assert logprobs[token].logprob == max(entry.logprob for entry in logprobs.values())


@pytest.mark.parametrize(
    "sampling", [{"presence_penalty": 0.5}, {"min_tokens": 4}, {"repetition_penalty": 1.2}]
)
def test_requests_with_history_dependent_sampling_are_refused(
    tree_llm: Any, sampling: dict[str, Any]
) -> None:
    params = SamplingParams(max_tokens=4, **sampling)
    with pytest.raises(VLLMValidationError, match=rf"\['{next(iter(sampling))}'\] cannot be used with"):
        tree_llm.generate([{"prompt_token_ids": [5, 6, 7]}], params, use_tqdm=False)
    ok = tree_llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4), use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) == 4


def test_cached_keys_and_values_of_tree_decoded_tokens_are_the_prefills(
    tree_llm: Any, prompts: list[list[int]]
) -> None:
    """A prompt extended by its tree-decoded output finds in the prefix cache the blocks
    that tree verification wrote (accepted paths moved into place); the continuation from
    them equals the one from a fresh prefill of the same tokens."""
    prompt = prompts[3]  # 260 tokens: 60 decoded tokens fill the block at 256-287
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    [first] = tree_llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    extended = {"prompt_token_ids": prompt + list(first.outputs[0].token_ids)}
    continuation = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    [from_cache] = tree_llm.generate([extended], continuation, use_tqdm=False)
    assert from_cache.num_cached_tokens >= 288
    assert tree_llm.reset_prefix_cache()
    [fresh] = tree_llm.generate([extended], continuation, use_tqdm=False)
    assert fresh.num_cached_tokens == 0
    assert from_cache.outputs[0].token_ids == fresh.outputs[0].token_ids


def test_a_tree_accepts_side_branches_and_more_than_its_first_child_chain(
    tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    """The chain of the tree's first children ([0], [0, 0], ...) as a chain of the same
    depth: were only first children ever accepted, the tree would step exactly as that
    chain does, so a higher acceptance per verification means side branches ([1],
    [0, 1], [1, 0]) were accepted."""
    draft = tiny_models["draft_noisy"]
    spine_depth = max(len(path) for path in TREE)
    chain = decode(
        tiny_models["target"], prompts, MAX_TOKENS,
        specextend_config(draft, num_speculative_tokens=spine_depth),
    )
    tree = decode(tiny_models["target"], prompts, MAX_TOKENS, tree_config(draft))
    assert tree.outputs == chain.outputs

    def acceptance(run: EngineRun) -> float:
        return run.counts["num_accepted_tokens"] / run.counts["num_drafts"]

    assert acceptance(tree) >= 1.1 * acceptance(chain), (tree.counts, chain.counts)
