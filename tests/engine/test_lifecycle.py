"""Aborted, preempted and failing requests neither crash the engine nor change the
outputs of the others; nothing of a finished request leaks into the next one."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from specextend_vllm import retrieval_stats
from tests.harness import decode, generate_ids, make_llm, random_prompts, specextend_config
from tests.tiny_models import set_trained_length

pytestmark = pytest.mark.engine

MAX_TOKENS = 24
PROMPT_LENGTHS = [300, 450, 600, 700, 380, 520]
# Chains, and dynamic token trees (whose accepted paths move in the KV cache).
DRAFTS = {
    "chain": {},
    "dynamic_tree": {"tree": "dynamic", "num_speculative_tokens": 3, "tree_max_depth": 2},
}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(PROMPT_LENGTHS, seed=11)


@pytest.fixture(scope="module")
def plain_outputs(tiny_models: dict[str, Path], prompts: list[list[int]]) -> list[list[int]]:
    return decode(tiny_models["target"], prompts, MAX_TOKENS).outputs


def run_engine_until_done(
    engine: Any, abort_after_steps: int, to_abort: set[str], max_steps: int = 2000
) -> dict[str, list[int]]:
    """Steps the engine until every request is done (at most `max_steps`); returns the
    outputs of those that finished, and asserts that the aborted ones did not."""
    finished: dict[str, list[int]] = {}
    for step in range(1, max_steps + 1):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
        if step == abort_after_steps:
            assert not to_abort & set(finished), "aborted too late: already finished"
            engine.abort_request(sorted(to_abort))
    assert not engine.has_unfinished_requests()
    assert not to_abort & set(finished)
    return finished


@pytest.mark.parametrize("drafts", list(DRAFTS))
def test_aborts_and_reused_ids_do_not_disturb_other_requests(
    tiny_models: dict[str, Path], prompts: list[list[int]], plain_outputs: list[list[int]], drafts: str
) -> None:
    llm = make_llm(
        tiny_models["target"], specextend_config(tiny_models["draft_noisy"], **DRAFTS[drafts])
    )
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", {"prompt_token_ids": prompt}, params)
    to_abort = {"r1", "r4"}
    finished = run_engine_until_done(engine, abort_after_steps=6, to_abort=to_abort)
    for index, expected in enumerate(plain_outputs):
        if f"r{index}" not in to_abort:
            assert finished[f"r{index}"] == expected

    # The aborted ids come back with other prompts: no state of the first ones survives.
    swapped = {"r1": 3, "r4": 0}
    for request_id, prompt_index in swapped.items():
        engine.add_request(request_id, {"prompt_token_ids": prompts[prompt_index]}, params)
    finished = run_engine_until_done(engine, abort_after_steps=-1, to_abort=set())
    for request_id, prompt_index in swapped.items():
        assert finished[request_id] == plain_outputs[prompt_index]
    stats = retrieval_stats(llm)[0]
    assert stats["retrievals"] > 0


@pytest.mark.parametrize("drafts", list(DRAFTS))
def test_preemption_keeps_outputs_exact(tiny_models: dict[str, Path], drafts: str) -> None:
    # Four prompts of 10 blocks of 32 tokens fill 42 blocks; their growth past 320 tokens
    # does not fit, and the scheduler preempts.
    prompts = random_prompts([310, 315, 318, 312], seed=12)
    expected = decode(tiny_models["target"], prompts, MAX_TOKENS).outputs
    llm = make_llm(
        tiny_models["target"],
        specextend_config(tiny_models["draft_noisy"], **DRAFTS[drafts]),
        num_gpu_blocks_override=42,
        enable_prefix_caching=False,
    )
    assert generate_ids(llm, prompts, MAX_TOKENS) == expected
    preemptions = [m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions" and hasattr(m, "value")]
    assert preemptions and preemptions[0] > 0
    assert retrieval_stats(llm)[0]["retrievals"] > 0


def test_a_failing_request_leaves_the_engine_serving(
    tiny_models: dict[str, Path], prompts: list[list[int]], plain_outputs: list[list[int]]
) -> None:
    llm = make_llm(tiny_models["target"], specextend_config(tiny_models["draft_noisy"]))
    too_long = random_prompts([2000], seed=3)
    with pytest.raises(VLLMValidationError, match="maximum context length"):
        generate_ids(llm, too_long, MAX_TOKENS)
    assert generate_ids(llm, prompts[:2], MAX_TOKENS) == plain_outputs[:2]


def test_no_request_state_outlives_a_thousand_requests(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Dynamic trees on compact positions and working copies, some requests aborted:
    every per-request structure (retrieval slots, whose working copies and tree shapes
    are indexed by slot) is released."""
    draft = tmp_path_factory.mktemp("thousand") / "draft"
    shutil.copytree(tiny_models["draft_noisy"], draft)
    set_trained_length(draft, 256)
    config = specextend_config(
        draft, positions="auto", tree="dynamic", num_speculative_tokens=6, tree_max_depth=3
    )
    llm = make_llm(tiny_models["target"], config)
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    prompts = random_prompts([130 + (index * 37) % 200 for index in range(1000)], seed=21)
    aborted: set[str] = set()
    for start in range(0, 1000, 100):
        for index in range(start, start + 100):
            engine.add_request(f"q{index}", {"prompt_token_ids": prompts[index]}, params)
        to_abort = {f"q{start + offset}" for offset in (3, 50)}
        finished = run_engine_until_done(engine, abort_after_steps=1, to_abort=to_abort)
        aborted |= to_abort
        assert len(finished) == 98
        if start == 200:
            [tensors_after_300] = llm.collective_rpc(_num_live_tensors)
    stats = retrieval_stats(llm)[0]
    assert stats["compact_draft_steps"] > 0 and stats["retrievals"] >= 900
    # Workers learn of finished requests at the next step: run one more request.
    engine.add_request("last", {"prompt_token_ids": prompts[0]}, params)
    assert set(run_engine_until_done(engine, abort_after_steps=-1, to_abort=set())) == {"last"}
    assert retrieval_stats(llm)[0]["tracked_requests"] <= 1
    [free_slots] = llm.collective_rpc(_free_retrieval_slots)
    assert free_slots >= engine.vllm_config.scheduler_config.max_num_seqs - 1
    [tensors_after_1001] = llm.collective_rpc(_num_live_tensors)
    assert tensors_after_1001 <= tensors_after_300 + 16, (tensors_after_300, tensors_after_1001)
    del engine, llm
    gc.collect()


def _free_retrieval_slots(worker: Any) -> int:
    return worker.model_runner.drafter.planner.state.num_free_slots


def _num_live_tensors(worker: Any) -> int:
    """Tensors the worker's Python objects reach (a tensor kept per finished request adds
    one each), less those of the metrics' history of recent selections (bounded)."""
    import torch

    gc.collect()
    history = {
        id(item)
        for selection in worker.model_runner.drafter.metrics._selections
        for item in selection
    }
    return sum(
        isinstance(item, torch.Tensor) and id(item) not in history for item in gc.get_objects()
    )


EDGE_REQUESTS = {
    "prompt_one_short_of_max_model_len": ([1023], {"max_tokens": 1}),
    "prompt_at_max_model_len": ([1024], {"max_tokens": 1}),
    "two_sampled_completions": ([300], {"max_tokens": 8, "n": 2, "temperature": 1.0, "seed": 3}),
    "prompt_logprobs": ([300], {"max_tokens": 4, "prompt_logprobs": 2}),
    "logprobs": ([300], {"max_tokens": 4, "logprobs": 2}),
}


@pytest.mark.parametrize("drafts", list(DRAFTS))
def test_requests_at_the_edges_are_served_or_refused_and_the_engine_keeps_serving(
    tiny_models: dict[str, Path], prompts: list[list[int]], plain_outputs: list[list[int]], drafts: str
) -> None:
    """Requests that reach the method's own path (drafting at the end of the context, fan-out,
    logprobs): each is served, or refused with vLLM's validation error; none stops the
    engine or changes another request's output."""
    llm = make_llm(
        tiny_models["target"], specextend_config(tiny_models["draft_noisy"], **DRAFTS[drafts])
    )
    outcomes: dict[str, str] = {}
    for name, (lengths, sampling) in EDGE_REQUESTS.items():
        try:
            params = SamplingParams(**{"temperature": 0.0, "ignore_eos": True, **sampling})
            [output] = llm.generate(
                [{"prompt_token_ids": random_prompts(lengths, seed=5)[0]}], params, use_tqdm=False
            )
        except VLLMValidationError:
            outcomes[name] = "refused"
        else:
            completions = output.outputs
            assert len(completions) == sampling.get("n", 1)
            assert all(len(c.token_ids) == sampling["max_tokens"] for c in completions)
            outcomes[name] = "served"
        assert generate_ids(llm, prompts[:2], MAX_TOKENS) == plain_outputs[:2], name
    assert outcomes["prompt_at_max_model_len"] == "refused"
    assert outcomes["prompt_one_short_of_max_model_len"] == "served"
    assert outcomes["two_sampled_completions"] == outcomes["logprobs"] == "served"
    del llm
    gc.collect()
