"""With temperature > 0, specextend keeps the target's output distribution."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from scipy.stats import chi2_contingency
from vllm import SamplingParams

from tests.conftest import make_llm, random_prompts, spec_decode_counts, specextend_config

pytestmark = pytest.mark.engine

NUM_SAMPLES = 400
MAX_TOKENS = 5
PROMPT = random_prompts([300], seed=21)[0]


def sample_tokens(llm) -> list[list[int]]:
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed, ignore_eos=True)
        for seed in range(NUM_SAMPLES)
    ]
    outputs = llm.generate([{"prompt_token_ids": PROMPT}] * NUM_SAMPLES, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def two_sample_p_value(first: list[int], second: list[int], min_count: int = 5) -> float:
    """Chi-square test of homogeneity; tokens rarer than `min_count` are pooled."""
    counts_first, counts_second = Counter(first), Counter(second)
    frequent = sorted(t for t in counts_first | counts_second if counts_first[t] + counts_second[t] >= min_count)
    table = [[counts[t] for t in frequent] for counts in (counts_first, counts_second)]
    for row, counts, sample in zip(table, (counts_first, counts_second), (first, second)):
        row.append(len(sample) - sum(counts[t] for t in frequent))
    if table[0][-1] + table[1][-1] == 0:
        for row in table:
            row.pop()
    return chi2_contingency(table).pvalue


def test_sampled_tokens_follow_the_target_distribution(tiny_models: dict[str, Path]) -> None:
    plain = make_llm(tiny_models["sharp"], max_num_seqs=64)
    plain_samples = sample_tokens(plain)
    del plain
    spec = make_llm(tiny_models["sharp"], specextend_config(tiny_models["sharp_draft"]), max_num_seqs=64)
    spec_samples = sample_tokens(spec)
    counts = spec_decode_counts(spec)
    del spec
    assert counts["num_accepted_tokens"] > 0
    for position in range(MAX_TOKENS):
        p_value = two_sample_p_value([s[position] for s in plain_samples], [s[position] for s in spec_samples])
        assert p_value > 0.001 / MAX_TOKENS, f"token {position}: p = {p_value:.2e}"
