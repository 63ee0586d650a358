from __future__ import annotations

import gc
import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("SPECEXTEND_STEP_TIMINGS", "1")

from pathlib import Path
from typing import Any

import pytest

from tests.harness import MAX_TOKENS, PROMPT_LENGTHS, decode, random_prompts
from tests.tiny_models import save_tiny_model


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real_models: uses the real Qwen2.5-Coder pair (built offline, minutes)")
    config.addinivalue_line("markers", "engine: starts a vLLM engine")
    config.addinivalue_line("markers", "serving: starts `vllm serve` processes")


@pytest.fixture(autouse=True)
def release_dead_engines() -> Any:
    """An engine that ended in a reference cycle (a refused start, an exception's frames)
    is released at the end of its test, not by a garbage collection in the middle of the
    next engine's life, where tearing down vLLM's process-wide state breaks that engine."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    target = save_tiny_model(root / "target", seed=0)
    sharp = save_tiny_model(root / "sharp", seed=3, logit_scale=20.0)
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
    return decode(tiny_models["target"], prompts, MAX_TOKENS).outputs
