"""With temperature > 0, speculative sampling keeps the target's output distribution.

Each run samples `NUM_SAMPLES` continuations of one prompt; the tokens at the positions
that verification decides are compared with plain sampling's, position by position."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from vllm import SamplingParams

from tests.distributions import MAX_TOKENS, NUM_SAMPLES, P_VALUE_THRESHOLD, TESTED_POSITIONS, min_p_value
from tests.harness import on_engine, random_prompts, spec_decode_counts, specextend_config

pytestmark = pytest.mark.engine

PROMPT = random_prompts([300], seed=21)[0]
SPECULATIVE_METHODS = ["draft_model", "specextend", "specextend_tree", "specextend_dynamic_tree"]
BIAS_POINTS = 0.05


def sample_tokens(llm, **sampling) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, ignore_eos=True, **sampling)
    outputs = llm.generate([{"prompt_token_ids": PROMPT}] * NUM_SAMPLES, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def biased_position_and_token(samples: list[list[int]]) -> tuple[int, int, float]:
    """The tested position whose most frequent token's share is nearest 0.25 (a spread
    distribution, where a logit bias moves the share about as it moves each conditional),
    that token, and its share."""
    tops = []
    for position in TESTED_POSITIONS:
        token, count = Counter(s[position] for s in samples).most_common(1)[0]
        tops.append((abs(count / len(samples) - 0.25), position, token, count / len(samples)))
    _, position, token, share = min(tops)
    return position, token, share


def bias_moving(token: int, share: float, points: float) -> dict[int, float]:
    """A logit bias that raises a token's probability p by `points`:
    logit += log(odds(p + points) / odds(p))."""
    p = share
    return {token: math.log((p + points) * (1 - p) / (p * (1 - p - points)))}


def plain_and_biased(llm) -> dict[str, list[list[int]]]:
    plain = sample_tokens(llm)
    _, token, share = biased_position_and_token(plain)
    biased = sample_tokens(llm, logit_bias=bias_moving(token, share, BIAS_POINTS))
    return {"plain": plain, "biased": biased}


def speculative(llm) -> dict[str, list[list[int]]]:
    tokens = sample_tokens(llm)
    counts = spec_decode_counts(llm)
    return {"tokens": tokens, "accepted": counts["num_accepted_tokens"], "drafted": counts["num_draft_tokens"]}


@pytest.fixture(scope="module")
def samples(tiny_models: dict[str, Path]) -> dict[str, dict]:
    draft = tiny_models["sharp_draft"]
    configs = {
        "draft_model": {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3},
        "specextend": specextend_config(draft),
        "specextend_tree": specextend_config(
            draft, tree=[[0], [1], [0, 0], [0, 1]], num_speculative_tokens=4
        ),
        "specextend_dynamic_tree": specextend_config(
            draft, tree="dynamic", num_speculative_tokens=6, tree_max_depth=3
        ),
    }
    runs: dict[str, dict] = {"plain": on_engine(tiny_models["sharp"], None, plain_and_biased, max_num_seqs=256)}
    for name, config in configs.items():
        runs[name] = on_engine(tiny_models["sharp"], config, speculative, max_num_seqs=256)
    return runs


def test_the_tested_positions_vary(samples: dict[str, dict]) -> None:
    """A position whose token is (nearly) fixed would pass any sampler."""
    for position in TESTED_POSITIONS:
        counts = Counter(s[position] for s in samples["plain"]["plain"])
        assert counts.most_common(1)[0][1] < 0.8 * NUM_SAMPLES
        assert sum(count >= 5 for count in counts.values()) >= 10


@pytest.mark.parametrize("method", SPECULATIVE_METHODS)
def test_verification_decides_the_tested_positions(samples: dict[str, dict], method: str) -> None:
    """Drafts are both accepted and rejected, so the tested tokens come from accepted
    drafts, from the target's residual distribution (or its sample at a tree node) and
    from bonus tokens."""
    run = samples[method]
    assert 0.2 * NUM_SAMPLES * len(TESTED_POSITIONS) < run["accepted"] < 0.9 * run["drafted"]


def test_the_statistic_rejects_a_sampler_biased_by_five_points(samples: dict[str, dict]) -> None:
    plain, biased = samples["plain"]["plain"], samples["plain"]["biased"]
    position, token, share = biased_position_and_token(plain)
    biased_share = sum(s[position] == token for s in biased) / NUM_SAMPLES
    assert 0.03 < biased_share - share < 0.07
    assert min_p_value(plain, biased, TESTED_POSITIONS) < P_VALUE_THRESHOLD


@pytest.mark.parametrize("method", SPECULATIVE_METHODS)
def test_sampled_tokens_follow_the_target_distribution(samples: dict[str, dict], method: str) -> None:
    """draft_model too: on CPU it relies on the plugin's fix of vLLM's expand kernel."""
    p_value = min_p_value(samples["plain"]["plain"], samples[method]["tokens"], TESTED_POSITIONS)
    assert p_value > P_VALUE_THRESHOLD
