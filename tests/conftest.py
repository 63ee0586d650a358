from __future__ import annotations

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tiny_models import save_tiny_model

BLOCK_SIZE = 32
NUM_SPECULATIVE_TOKENS = 3
# Small enough for prompts of a few hundred tokens to cross it.
METHOD_KEYS = {"chunk_size": 32, "token_budget": 64, "retrieval_interval": 2, "activation_length": 128}
# Lossless checks: some prompts below the activation length, some far above it.
PROMPT_LENGTHS = [40, 100, 150, 260, 400, 520, 700, 880]
MAX_TOKENS = 24


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_models: uses the real Qwen2.5-Coder pair (built offline, minutes)")
    config.addinivalue_line("markers", "engine: starts a vLLM engine")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    target = save_tiny_model(root / "target", seed=0)
    sharp = save_tiny_model(root / "sharp", seed=3, logit_scale=6.0)
    return {
        "target": target,
        "draft_noisy": save_tiny_model(root / "draft_noisy", seed=1, base=target, noise=0.05),
        "sharp": sharp,
        "sharp_draft": save_tiny_model(root / "sharp_draft", seed=4, base=sharp, noise=0.05),
    }


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    return random_prompts(PROMPT_LENGTHS)


@pytest.fixture(scope="session")
def plain_outputs(tiny_models: dict[str, Path], prompts: list[list[int]]) -> list[list[int]]:
    llm = make_llm(tiny_models["target"])
    outputs = generate_ids(llm, prompts, MAX_TOKENS)
    del llm
    return outputs


def make_llm(model: Path, speculative_config: dict[str, Any] | None = None, **overrides: Any) -> Any:
    from vllm import LLM

    kwargs: dict[str, Any] = dict(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        block_size=BLOCK_SIZE,
        skip_tokenizer_init=True,
        max_num_seqs=16,
        seed=0,
        disable_log_stats=False,
    )
    kwargs.update(overrides)
    return LLM(speculative_config=speculative_config, **kwargs)


def specextend_config(draft: Path, **keys: Any) -> dict[str, Any]:
    return {
        "method": "specextend",
        "model": str(draft),
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        **METHOD_KEYS,
        **keys,
    }


def random_prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 500, (n,), generator=generator).tolist() for n in lengths]


def generate_ids(llm: Any, prompts: list[list[int]], max_tokens: int, **sampling: Any) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **sampling)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def spec_decode_counts(llm: Any) -> dict[str, float]:
    """vLLM's own spec-decode counters (drafts, draft tokens, accepted tokens)."""
    counts: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            counts[metric.name.removeprefix("vllm:spec_decode_")] = metric.value
    return counts
