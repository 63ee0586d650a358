"""Lossless at scale on the tiny models: 200 prompts with lengths around the activation
length and the draft's trained length and up to the context limit, decoded greedily by
the chain, a static tree and a dynamic tree, on absolute and compact positions, with
batches of 1, 4 and 16 requests; every output equals plain decoding, token for token."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.test_trees import TREE
from tests.harness import METHOD_KEYS, decode, specextend_config
from tests.tiny_models import set_trained_length

pytestmark = pytest.mark.engine

DRAFT_TRAINED_LENGTH = 256
MAX_TOKENS = 16
NUM_PROMPTS = 200
DYNAMIC = {"tree": "dynamic", "num_speculative_tokens": 10, "tree_max_depth": 4}
# name: (method keys, max_num_seqs, prompts decoded: every one, or every 4th for batch 1)
RUNS: dict[str, tuple[dict[str, Any], int, int]] = {
    "chain_cmr_batch16": ({"policy": "cmr", "positions": "absolute"}, 16, 1),
    "chain_compact_batch4": ({"policy": "cmr", "positions": "compact"}, 4, 1),
    "static_tree_streaming_batch16": (
        {"policy": "streaming", "tree": TREE, "num_speculative_tokens": len(TREE)}, 16, 1,
    ),
    "dynamic_tree_auto_positions_batch16": ({"policy": "cmr", **DYNAMIC}, 16, 1),
    "chain_auto_positions_batch1": ({"policy": "cmr"}, 1, 4),
}


def sweep_prompts() -> list[list[int]]:
    activation, trained = METHOD_KEYS["activation_length"], DRAFT_TRAINED_LENGTH
    generator = torch.Generator().manual_seed(11)
    near = [activation - 8, activation - 1, activation, activation + 1, activation + 16]
    near += [trained - 16, trained - 1, trained, trained + 1, trained + 17]
    lengths = [near[i % len(near)] if i % 2 else int(torch.randint(8, 1000 - MAX_TOKENS, (1,), generator=generator)) for i in range(NUM_PROMPTS)]
    return [torch.randint(2, 500, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="module")
def sweep(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    draft = tmp_path_factory.mktemp("sweep") / "draft"
    shutil.copytree(tiny_models["draft_noisy"], draft)
    set_trained_length(draft, DRAFT_TRAINED_LENGTH)
    prompts = sweep_prompts()
    plain = decode(tiny_models["target"], prompts, MAX_TOKENS).outputs
    return {"prompts": prompts, "plain": plain, "draft": draft}


@pytest.mark.parametrize("name", list(RUNS))
def test_every_output_equals_plain_decoding(
    name: str, sweep: dict[str, Any], tiny_models: dict[str, Path]
) -> None:
    keys, max_num_seqs, stride = RUNS[name]
    prompts = sweep["prompts"][::stride]
    run = decode(
        tiny_models["target"], prompts, MAX_TOKENS,
        specextend_config(sweep["draft"], **keys), max_num_seqs=max_num_seqs,
    )
    differing = [
        (index, sum(a != b for a, b in zip(out, expected)))
        for index, (out, expected) in enumerate(zip(run.outputs, sweep["plain"][::stride]))
        if out != expected
    ]
    assert differing == [], differing
    assert run.counts["num_accepted_tokens"] > 0
    if keys.get("positions") != "absolute":
        assert run.stats["compact_draft_steps"] > 0
    assert run.stats["reduced_verified_drafts"] > 0 and run.stats["full_verified_drafts"] > 0
