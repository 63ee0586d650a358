"""What the kernel benchmarks share: the CPU's name, a median timer, a shuffled paged cache
in vLLM's CPU "vec" layout, and the writing of their JSON reports."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Saves a benchmark's figures as indented JSON and says where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def shuffled_vec_cache(
    batch: int,
    num_tokens: int,
    num_kv_heads: int,
    block_size: int,
    head_dim: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw cache [num_blocks, Hkv, block_size, 2 * D] of random keys and values,
    block table [batch, blocks per request] int32 of shuffled blocks): num_tokens tokens
    for every request."""
    blocks_per_request = -(-num_tokens // block_size)
    num_blocks = batch * blocks_per_request
    raw = torch.randn(num_blocks, num_kv_heads, block_size, 2 * head_dim, generator=generator)
    block_table = torch.randperm(num_blocks, generator=generator, dtype=torch.int32)
    return raw, block_table.view(batch, blocks_per_request)
