"""The engine-test harness, written once: engines on the tiny generated models, the
method's test keys, random prompts, and what a run reports."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

BLOCK_SIZE = 32
NUM_SPECULATIVE_TOKENS = 3
# Small enough for prompts of a few hundred tokens to cross it; chunks of half a block.
# Drafting every step, and on the reduced cache from the activation length on, so that
# every test drafts whatever the step times say.
METHOD_KEYS = {
    "chunk_size": 16,
    "token_budget": 64,
    "retrieval_interval": 2,
    "activation_length": 128,
    "drafting": "always",
    "retrieval": "always",
}
# Lossless checks: some prompts below the activation length, some far above it.
PROMPT_LENGTHS = [40, 100, 150, 260, 400, 520, 700, 880]
MAX_TOKENS = 24

T = TypeVar("T")


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


def on_engine(
    model: Path,
    speculative_config: dict[str, Any] | None,
    use: Callable[[Any], T],
    **overrides: Any,
) -> T:
    """`use(llm)` on an engine that lives for that call only: vLLM keeps one engine's
    parallel state per process, and releasing an engine late tears down the next one's."""
    llm = make_llm(model, speculative_config, **overrides)
    try:
        return use(llm)
    finally:
        del llm


@dataclasses.dataclass
class EngineRun:
    outputs: list[list[int]]
    counts: dict[str, float]
    stats: dict[str, Any]


def decode(
    model: Path,
    prompts: list[list[int]],
    max_tokens: int,
    speculative_config: dict[str, Any] | None = None,
    **overrides: Any,
) -> EngineRun:
    """Greedy outputs of one engine start, with vLLM's spec-decode counters and the
    method's retrieval stats (empty without speculation)."""
    from specextend_vllm import retrieval_stats

    def run(llm: Any) -> EngineRun:
        outputs = generate_ids(llm, prompts, max_tokens)
        stats = retrieval_stats(llm)[0] if speculative_config else {}
        return EngineRun(outputs, spec_decode_counts(llm), stats)

    return on_engine(model, speculative_config, run, **overrides)


def two_tensor_parallel_ranks(monkeypatch: Any) -> dict[str, Any]:
    """Engine overrides for TP=2 on CPU, one core per rank (vLLM's automatic binding asks
    for a NUMA node per rank)."""
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    return {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


class SimulatedTime:
    """A clock that moves only by `advance`. As `profiling.drafting_clock`, with the models'
    forwards delayed by `delay_calls(..., wait=clock.advance)`, it lets `drafting: auto`
    measure exactly the step and pass times a test gives, however busy the machine is
    (the tiny models' own work costs no simulated time)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.seconds += seconds


def delay_calls(
    owner: Any, name: str, seconds: float, wait: Callable[[float], None] = time.sleep
) -> None:
    """Makes `owner.name(...)` wait `seconds` before each call (a slower kernel or model,
    in a worker through `collective_rpc`): sleep, or advance a `SimulatedTime`;
    `undo_delay` takes it back."""
    call = getattr(owner, name)

    @functools.wraps(call)
    def delayed_call(*args: Any, **kwargs: Any) -> Any:
        wait(seconds)
        return call(*args, **kwargs)

    setattr(owner, name, delayed_call)


def undo_delay(owner: Any, name: str) -> None:
    setattr(owner, name, getattr(owner, name).__wrapped__)
