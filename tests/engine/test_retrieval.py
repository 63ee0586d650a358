"""The chunks the draft keeps are the ones the target's final-layer attention ranks highest,
computed independently with Hugging Face transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2ForCausalLM
from vllm import SamplingParams

from specextend_vllm import retrieval_stats
from tests.harness import (
    MAX_TOKENS,
    METHOD_KEYS,
    decode,
    on_engine,
    random_prompts,
    specextend_config,
)
from tests.tiny_models import NEEDLE_TOKEN, save_needle_model

pytestmark = pytest.mark.engine

CHUNK = METHOD_KEYS["chunk_size"]
KEPT = METHOD_KEYS["token_budget"] // CHUNK


def target_chunk_scores(model: Qwen2ForCausalLM, context: list[int]) -> torch.Tensor:
    """Mean over heads of the final layer's attention of the last token, averaged per chunk."""
    with torch.no_grad():
        out = model(torch.tensor([context]), output_attentions=True)
    token_scores = out.attentions[-1][0, :, -1, :].double().mean(0)
    num_chunks = -(-len(context) // CHUNK)
    padded = torch.nn.functional.pad(token_scores, (0, num_chunks * CHUNK - len(context)))
    counts = torch.nn.functional.pad(torch.ones(len(context)), (0, num_chunks * CHUNK - len(context)))
    return padded.view(num_chunks, CHUNK).sum(1) / counts.view(num_chunks, CHUNK).sum(1)


def ranked(scores: torch.Tensor, chunk_ranking: str) -> torch.Tensor:
    """What each ranking orders chunks by: their scores, or under `continuation` the larger
    of each chunk's and its predecessor's."""
    if chunk_ranking == "attention":
        return scores
    return torch.maximum(scores, torch.cat([scores[:1], scores[:-1]]))


@pytest.mark.parametrize("chunk_ranking", ["attention", "continuation"])
def test_kept_chunks_rank_highest_in_target_attention(
    tiny_models: dict[str, Path], chunk_ranking: str
) -> None:
    prompts = random_prompts([500, 700], seed=5)
    config = specextend_config(
        tiny_models["draft_noisy"], retrieval_interval=1, chunk_ranking=chunk_ranking
    )

    def generate_and_read_selections(llm: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return outputs, retrieval_stats(llm)[0]["selections"]

    outputs, selections = on_engine(tiny_models["target"], config, generate_and_read_selections)
    model = Qwen2ForCausalLM.from_pretrained(tiny_models["target"], attn_implementation="eager", dtype=torch.float32)
    checked = 0
    for prompt, output in zip(prompts, outputs):
        tokens = prompt + list(output.outputs[0].token_ids)
        # A verification may run past max_tokens: those tokens are not in the output.
        mine = [
            s
            for s in selections
            if s["request_id"].split("-")[0] == output.request_id.split("-")[0]
            and s["context_len"] <= len(tokens)
        ]
        assert mine, "no selection was made for a request above the activation length"
        for selection in mine[-3:]:
            scores = target_chunk_scores(model, tokens[: selection["context_len"]])
            candidates = ranked(scores[: selection["num_candidates"]], chunk_ranking)
            kept = selection["kept_chunks"]
            assert kept == sorted(kept) and len(kept) == KEPT
            kth_best = candidates.topk(KEPT).values[-1]
            assert (candidates[kept] >= kth_best - 1e-6).all(), (kept, candidates.topk(KEPT))
            checked += 1
    assert checked >= 4


@pytest.fixture(scope="module")
def needle_runs(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A target that attends to one needle token only, drafted by a copy of itself, on
    prompts that hold the needle a third of the way in: under `cmr` (whose selection
    finds the needle's chunk) and `streaming` (which keeps the first and the newest
    chunks, and misses it)."""
    target = save_needle_model(tmp_path_factory.mktemp("needle") / "target", tiny_models["target"])
    generator = torch.Generator().manual_seed(0)
    prompts = []
    for length in (300, 500, 700, 880):
        prompt = torch.randint(NEEDLE_TOKEN + 1, 500, (length,), generator=generator).tolist()
        prompt[length // 3] = NEEDLE_TOKEN
        prompts.append(prompt)
    return {
        policy: decode(target, prompts, MAX_TOKENS, specextend_config(target, policy=policy))
        for policy in ("cmr", "streaming")
    }


def test_drafts_on_a_reduced_cache_that_keeps_what_the_target_attends_to_are_accepted(
    needle_runs: dict[str, Any],
) -> None:
    """Catches any reduced view that loses the kept chunks: working copies not filled,
    kept blocks pointing elsewhere, a selection other than the target's top chunks."""
    cmr, streaming = needle_runs["cmr"], needle_runs["streaming"]
    assert cmr.outputs == streaming.outputs
    for run in (cmr, streaming):
        assert run.stats["full_verified_drafts"] == 0 and run.stats["reduced_verified_drafts"] > 0
    kept = cmr.stats["reduced_accepted_drafts"] / cmr.stats["reduced_verified_drafts"]
    missed = streaming.stats["reduced_accepted_drafts"] / streaming.stats["reduced_verified_drafts"]
    assert kept >= 0.9, cmr.stats
    assert missed <= 0.25, streaming.stats
