"""Engines and measured generation shared by the benchmarks.

Every figure comes from vLLM itself: per-request timestamps (`RequestOutput.metrics`),
per-request acceptance (`per_request_spec_decode_metrics="detailed"`), the method's
counters (`retrieval_stats`) and, where asked, the plugin's step timings.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "8")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
# A step prefilling 8K tokens of the 1.5B target took over 300 s here (vLLM's default limit
# for a step) while other work shared the 2 cores.
os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")

RESULTS = Path(__file__).parent / "results"
# Decoding steps verify at most this many tokens; longer steps are prefill.
MAX_DECODE_STEP_TOKENS = 64


def source_commit(repository: Path = Path(__file__).parent.parent) -> str | None:
    """The commit the plugin's code was taken from, with `+changes` where its package or
    kernels differ from it; None outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repository, capture_output=True, text=True, check=True
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "status", "--porcelain", "--", "specextend_vllm", "csrc", "setup.py"],
            cwd=repository, capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit}+changes" if changes else commit


# A commit made while a benchmark runs is not the code its engine imported.
STARTED_AT_COMMIT = source_commit()


def machine() -> dict[str, Any]:
    import torch
    import vllm

    from specextend_vllm.vllm_access.cpu_int8 import cpu_flags, has_int8_dot_products

    cpu_model = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu_model,
        "cores": os.cpu_count(),
        "cpu_int8_dot_products": has_int8_dot_products(cpu_flags()),
        "allocator": "tcmalloc" if "libtcmalloc" in os.environ.get("LD_PRELOAD", "") else "system malloc",
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": vllm.__version__,
        "commit": STARTED_AT_COMMIT,
    }


MATMUL_SIZE = 512
COPY_BYTES = 256 * 2**20


def fastest_rate(work: Callable[[], None], units: float, seconds: float, slices: int) -> float:
    """`units` per second of `work` (units done per call), the fastest of `slices`
    stretches of `seconds` of calling it."""
    rates = []
    for _ in range(slices):
        calls = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            work()
            calls += 1
        rates.append(units * calls / elapsed)
    return max(rates)


def machine_gflops(seconds: float = 0.1, slices: int = 3) -> float:
    """The machine's fp32 matrix-multiply rate now, in GFLOP/s: 512 x 512 products in this
    process, the fastest of `slices` stretches of `seconds` (a stretch that overlaps the
    engine's last work of a request is slower). Taken between requests, it shows whether
    the machine ran slower during a cell than during its neighbours (on shared machines it
    does, by up to 1.4x within a run)."""
    import torch

    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    return fastest_rate(lambda: torch.mm(a, a), 2 * MATMUL_SIZE**3 / 1e9, seconds, slices)


def machine_memory_gbps(seconds: float = 0.1, slices: int = 3) -> float:
    """The machine's memory bandwidth now, in GB/s read and written: copies of 256 MiB, far
    larger than any cache (512 MiB held while it runs), the fastest of `slices` stretches of
    `seconds`. Decoding is bound by memory more than by arithmetic: in a stretch where every
    engine step ran about twice as slowly, `machine_gflops` read only 10-20% less."""
    import torch

    source = torch.empty(COPY_BYTES // 4)
    source.fill_(1.0)
    destination = torch.empty_like(source)
    return fastest_rate(lambda: destination.copy_(source), 2 * COPY_BYTES / 1e9, seconds, slices)


def make_llm(target: Path | str, speculative_config: dict[str, Any] | None, max_model_len: int, **kwargs: Any) -> Any:
    from vllm import LLM

    if speculative_config is not None:
        kwargs.setdefault("per_request_spec_decode_metrics", "detailed")
    if kwargs.get("block_size") is None:
        kwargs.pop("block_size", None)
    kwargs.setdefault("enforce_eager", True)
    return LLM(
        model=str(target),
        dtype="float32",
        max_model_len=max_model_len,
        speculative_config=speculative_config,
        disable_log_stats=False,
        seed=0,
        **kwargs,
    )


def save_record(output: str, args: Any, results: dict[str, Any]) -> Path:
    """Writes benchmarks/results/<output>.json: the arguments, the machine and the results."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{output}.json"
    record = {"args": vars(args), "machine": machine(), "results": results}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def specextend_every_step(draft: Path, num_speculative_tokens: int) -> dict[str, Any]:
    """`specextend` drafting at every step, on the reduced cache from the activation length
    on: the configuration of the benchmarks that measure the method's parts."""
    return {
        "method": "specextend",
        "model": str(draft),
        "num_speculative_tokens": num_speculative_tokens,
        "drafting": "always",
        "retrieval": "always",
    }


def close(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def retrieval_counters(llm: Any) -> dict[str, Any]:
    """The method's counters since the engine started (`retrieval_stats`, no selections)."""
    from specextend_vllm import retrieval_stats

    stats = retrieval_stats(llm)[0]
    stats.pop("selections", None)
    return stats


def reduced_steps_between(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, float | None]:
    """Draft steps on a reduced cache between two `retrieval_counters` readings, and the
    mean tokens kept in them.

    >>> reduced_steps_between(
    ...     {"reduced_draft_steps": 10, "mean_kept_tokens": 100.0},
    ...     {"reduced_draft_steps": 30, "mean_kept_tokens": 150.0},
    ... )
    (20, 175.0)
    """
    steps = after["reduced_draft_steps"] - before["reduced_draft_steps"]
    kept = (
        after["mean_kept_tokens"] * after["reduced_draft_steps"]
        - before["mean_kept_tokens"] * before["reduced_draft_steps"]
    )
    return steps, kept / steps if steps else None


@dataclasses.dataclass
class RequestFigures:
    """One request: its output and timings, and per verify step the accepted drafts."""

    tokens: list[int]
    ttft_s: float
    decode_s: float
    accepted_per_step: list[int]
    drafted_per_step: list[int]

    @property
    def mean_acceptance_length(self) -> float | None:
        steps = len(self.accepted_per_step)
        return 1 + sum(self.accepted_per_step) / steps if steps else None


def generate(llm: Any, prompts: list[list[int]], max_tokens: int) -> tuple[list[RequestFigures], float]:
    """Greedy generation of exactly `max_tokens` per prompt; returns each request's
    figures and the wall time of the whole call."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    wall_s = time.perf_counter() - start
    figures = []
    for output in outputs:
        completion = output.outputs[0]
        stats = output.metrics
        spec = completion.spec_decode_metrics
        figures.append(
            RequestFigures(
                tokens=list(completion.token_ids),
                ttft_s=stats.first_token_latency,
                decode_s=stats.last_token_ts - stats.first_token_ts,
                accepted_per_step=list(spec.per_step_accepted) if spec else [],
                drafted_per_step=list(spec.per_step_drafted) if spec else [],
            )
        )
    return figures, wall_s


def acceptance_per_position(requests: list[RequestFigures], num_speculative_tokens: int) -> list[float]:
    """Share of verify steps whose i-th draft token was accepted, i = 1..k.

    Example: steps accepting [4, 1, 0, 2] of k=4 give [0.75, 0.5, 0.25, 0.25].
    """
    steps = [accepted for request in requests for accepted in request.accepted_per_step]
    if not steps:
        return []
    return [sum(a >= position for a in steps) / len(steps) for position in range(1, num_speculative_tokens + 1)]


def mean_acceptance_length(requests: list[RequestFigures]) -> float | None:
    steps = [accepted for request in requests for accepted in request.accepted_per_step]
    return 1 + sum(steps) / len(steps) if steps else None


def time_breakdown(step_records: list[dict[str, Any]], max_decode_tokens: int, decode_wall_s: float) -> dict[str, Any]:
    """Mean seconds per decoding step: target forward, sampling (with verification: the
    rejection sampler, or a tree's acceptance and KV moves), the draft proposal and its
    passes, the method's retrieval planning within the proposal (of which the chunk
    scores and the working copies), and the rest of the step (scheduling, bookkeeping). Steps that processed more
    than `max_decode_tokens` target tokens are prefill and left out."""
    decode = [r for r in step_records if r["num_target_tokens"] <= max_decode_tokens]
    if not decode:
        return {}
    n = len(decode)
    passes = [r["draft_passes_s"] for r in decode if r["draft_passes_s"]]
    later = [s for p in passes for s in p[1:]]
    target = sum(r["target_forward_s"] for r in decode) / n
    propose = sum(r["propose_s"] for r in decode) / n
    sample = sum(r.get("sample_s", 0.0) for r in decode) / n
    step = decode_wall_s / n
    return {
        "steps": n,
        "step_s": step,
        "target_forward_s": target,
        "sample_s": sample,
        "propose_s": propose,
        "first_draft_pass_s": sum(p[0] for p in passes) / len(passes) if passes else 0.0,
        "later_draft_pass_s": sum(later) / len(later) if later else 0.0,
        **{
            field: sum(r.get(field, 0.0) for r in decode) / n
            for field in ("retrieval_s", "chunk_scores_s", "working_copies_s")
        },
        "other_s": max(step - target - sample - propose, 0.0),
    }
