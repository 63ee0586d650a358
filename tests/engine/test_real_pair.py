"""Lossless on the real Qwen2.5-Coder pair (0.5B draft, 1.5B target) with a 2K+ prompt."""

from __future__ import annotations

import pytest

from tests.harness import decode

pytestmark = [pytest.mark.engine, pytest.mark.real_models]

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def pair_and_prompt() -> tuple:
    from benchmarks.assets import qwen_pair
    from benchmarks.demo import long_prompt

    draft, target = qwen_pair()
    return draft, target, long_prompt(target, 2100)


def test_greedy_output_equals_plain_decoding_on_the_real_pair(pair_and_prompt: tuple) -> None:
    draft, target, prompt = pair_and_prompt
    overrides = dict(max_model_len=2304, block_size=128, skip_tokenizer_init=False)
    expected = decode(target, [prompt], MAX_TOKENS, **overrides).outputs
    config = {
        "method": "specextend",
        "model": str(draft),
        "num_speculative_tokens": 4,
        "token_budget": 512,
        "activation_length": 1024,
        "retrieval_interval": 2,
        "retrieval": "always",
    }
    run = decode(target, [prompt], MAX_TOKENS, config, **overrides)
    assert run.outputs == expected
    counts, stats = run.counts, run.stats
    assert counts["num_accepted_tokens"] > 0
    assert stats["retrievals"] > 0 and stats["mean_kept_tokens"] < stats["mean_context_tokens"]
