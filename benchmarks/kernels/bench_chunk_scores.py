"""Times the chunk-scores kernel of a device against the pure-torch reference there.

Shapes are those of Qwen2.5-1.5B's final attention layer (12 query heads, 2 KV heads,
head_dim 128), every request's context full, its blocks shuffled, over the cache the method
reads on that device by default:

- cpu: a float32 vLLM CPU ("vec") cache, blocks and chunks of 128 tokens; wall-clock
  medians; writes benchmarks/results/scorer_cpu.json.
- cuda: a bfloat16 FlashAttention cache, 16-token blocks, 32-token chunks; medians of
  CUDA-event times; writes benchmarks/results/scorer_cuda.json. Needs the package built
  with its CUDA kernels (`bash scripts/gpu_check.sh` builds it and runs this).

Every case first checks the kernel's scores against the reference's. Key GB/s: the bytes
of the keys scored over the kernel's time.

    python -m benchmarks.kernels.bench_chunk_scores [--device cpu|cuda] [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.kernels.common import cpu_model, median_ms, shuffled_vec_cache, write_report
from specextend_vllm import ops
from specextend_vllm.algorithm.kv_cache_layout import (
    cpu_vec_key_cache_view,
    flash_attn_key_cache_view,
)

NUM_Q_HEADS = 12
NUM_KV_HEADS = 2
HEAD_DIM = 128
RESULTS = Path(__file__).resolve().parents[1] / "results"


@dataclasses.dataclass(frozen=True)
class DeviceSetup:
    layout: str
    dtype: torch.dtype
    block_size: int
    chunk_size: int
    context_lens: list[int]
    batches: list[int]
    repeats: int
    statistic: str
    output: Path


SETUPS = {
    "cpu": DeviceSetup(
        "cpu_vec", torch.float32, 128, 128, [4096, 16384, 32768], [1, 8], 10, "median",
        RESULTS / "scorer_cpu.json",
    ),
    "cuda": DeviceSetup(
        "flash_attn", torch.bfloat16, 16, 32, [4096, 16384, 32768, 131072], [1, 8, 32], 20,
        "median of CUDA-event times", RESULTS / "scorer_cuda.json",
    ),
}


def make_inputs(device: str, batch: int, context_len: int, seed: int = 0) -> tuple[Any, ...]:
    """The kernel's arguments over a shuffled paged cache of `device`'s setup."""
    setup = SETUPS[device]
    generator = torch.Generator(device=device).manual_seed(seed)
    if device == "cpu":
        raw_cache, block_table = shuffled_vec_cache(
            batch, context_len, NUM_KV_HEADS, setup.block_size, HEAD_DIM, generator
        )
        key_cache = cpu_vec_key_cache_view(raw_cache)
    else:
        blocks_per_request = -(-context_len // setup.block_size)
        num_blocks = batch * blocks_per_request
        raw_cache = torch.randn(
            2, num_blocks, setup.block_size, NUM_KV_HEADS, HEAD_DIM,
            generator=generator, device=device, dtype=setup.dtype,
        )
        key_cache = flash_attn_key_cache_view(raw_cache)
        block_table = torch.randperm(num_blocks, generator=generator, device=device)
        block_table = block_table.to(torch.int32).view(batch, blocks_per_request)
    query = torch.randn(
        batch, NUM_Q_HEADS, HEAD_DIM, generator=generator, device=device, dtype=setup.dtype
    )
    return (
        query,
        key_cache,
        block_table,
        torch.full((batch,), context_len, dtype=torch.int32, device=device),
        setup.chunk_size,
        HEAD_DIM**-0.5,
        context_len // setup.chunk_size,
    )


def median_cuda_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median of `repeats` runs timed with CUDA events, after two warm-up runs."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(device: str, context_lens: list[int], repeats: int) -> list[dict[str, Any]]:
    setup = SETUPS[device]
    timer = median_ms if device == "cpu" else median_cuda_ms
    results = []
    print(
        f"{'tokens':>7} {'batch':>5} {'kernel ms':>10} {'reference ms':>13} {'speedup':>8} "
        f"{'key GB/s':>9}"
    )
    for context_len in context_lens:
        for batch in setup.batches:
            inputs = make_inputs(device, batch, context_len)
            kernel_scores = ops.chunk_scores(*inputs)
            expected = ops.chunk_scores_reference(*inputs)
            torch.testing.assert_close(kernel_scores, expected, rtol=1e-4, atol=1e-7)
            kernel_ms = timer(lambda: ops.chunk_scores(*inputs), repeats)
            reference_ms = timer(lambda: ops.chunk_scores_reference(*inputs), repeats)
            key_bytes = batch * context_len * NUM_KV_HEADS * HEAD_DIM * setup.dtype.itemsize
            key_gb_per_s = key_bytes / kernel_ms / 1e6
            print(
                f"{context_len:>7} {batch:>5} {kernel_ms:>10.3f} {reference_ms:>13.3f} "
                f"{reference_ms / kernel_ms:>7.1f}x {key_gb_per_s:>9.0f}"
            )
            results.append(
                {
                    "context_len": context_len,
                    "batch": batch,
                    "kernel_ms": round(kernel_ms, 4),
                    "reference_ms": round(reference_ms, 4),
                    "speedup": round(reference_ms / kernel_ms, 2),
                    "key_gb_per_s": round(key_gb_per_s, 1),
                }
            )
            del inputs, kernel_scores, expected
    return results


def describe_machine(device: str) -> dict[str, Any]:
    machine: dict[str, Any] = {
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    if device == "cpu":
        machine.update(
            cpu_model=cpu_model(),
            logical_cpus=os.cpu_count(),
            torch_threads=torch.get_num_threads(),
        )
    else:
        properties = torch.cuda.get_device_properties(0)
        machine.update(
            gpu=properties.name,
            gpu_memory_gib=round(properties.total_memory / 2**30, 1),
            multiprocessors=properties.multi_processor_count,
            cuda_version=torch.version.cuda,
        )
    return machine


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=sorted(SETUPS), default="cpu")
    parser.add_argument("--quick", action="store_true", help="4K tokens only, fewer repeats")
    parser.add_argument("--repeats", type=int, help="timed runs per case (median reported)")
    parser.add_argument("--threads", type=int, help="torch threads on the CPU (default: torch's)")
    parser.add_argument("--output", type=Path, help="default: the device's file in benchmarks/results")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA device")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    setup = SETUPS[args.device]
    context_lens = setup.context_lens[:1] if args.quick else setup.context_lens
    repeats = args.repeats or (3 if args.quick else setup.repeats)
    machine = describe_machine(args.device)
    print(", ".join(f"{key} {value}" for key, value in machine.items()))
    results = run(args.device, context_lens, repeats)

    report = {
        "machine": machine,
        "config": {
            "num_q_heads": NUM_Q_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "block_size": setup.block_size,
            "chunk_size": setup.chunk_size,
            "dtype": str(setup.dtype).removeprefix("torch."),
            "layout": setup.layout,
            "repeats": repeats,
            "statistic": setup.statistic,
        },
        "results": results,
    }
    output = args.output or setup.output
    write_report(output, report)


if __name__ == "__main__":
    main()
