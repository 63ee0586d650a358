"""Times the CUDA chunk-scores kernel against the pure-torch reference on the GPU.

Shapes are those of Qwen2.5-1.5B's final attention layer (12 query heads, 2 KV heads,
head_dim 128) over a bfloat16 FlashAttention KV cache ([2, num_blocks, 16, Hkv, D], blocks
shuffled) with the method's default 32-token chunks. Every case first checks the kernel's
scores against the reference's. Prints a table and writes
benchmarks/results/scorer_cuda.json. Needs a CUDA device and the package built with its
CUDA kernels (`bash scripts/gpu_check.sh` does both).

    python -m benchmarks.kernels.bench_chunk_scores_cuda [--quick] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specextend_vllm import ops
from specextend_vllm.algorithm.kv_cache_layout import flash_attn_key_cache_view

NUM_Q_HEADS = 12
NUM_KV_HEADS = 2
HEAD_DIM = 128
BLOCK_SIZE = 16
CHUNK_SIZE = 32
CACHE_DTYPE = torch.bfloat16
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "results" / "scorer_cuda.json"


def make_inputs(batch: int, context_len: int, seed: int = 0) -> tuple[Any, ...]:
    """A shuffled paged cache in FlashAttention's layout on the GPU, every request full."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per_request = -(-context_len // BLOCK_SIZE)
    num_blocks = batch * blocks_per_request
    raw_cache = torch.randn(
        2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM,
        generator=generator, device="cuda", dtype=CACHE_DTYPE,
    )
    block_table = torch.randperm(num_blocks, generator=generator, device="cuda")
    query = torch.randn(
        batch, NUM_Q_HEADS, HEAD_DIM, generator=generator, device="cuda", dtype=CACHE_DTYPE
    )
    return (
        query,
        flash_attn_key_cache_view(raw_cache),
        block_table.to(torch.int32).view(batch, blocks_per_request),
        torch.full((batch,), context_len, dtype=torch.int32, device="cuda"),
        CHUNK_SIZE,
        HEAD_DIM**-0.5,
        context_len // CHUNK_SIZE,
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


def run(context_lens: list[int], batches: list[int], repeats: int) -> list[dict[str, Any]]:
    results = []
    print(
        f"{'tokens':>7} {'batch':>5} {'kernel ms':>10} {'reference ms':>13} {'speedup':>8} "
        f"{'key GB/s':>9}"
    )
    for context_len in context_lens:
        for batch in batches:
            inputs = make_inputs(batch, context_len)
            kernel_scores = ops.chunk_scores(*inputs)
            expected = ops.chunk_scores_reference(*inputs)
            torch.testing.assert_close(kernel_scores, expected, rtol=1e-4, atol=1e-7)
            kernel_ms = median_cuda_ms(lambda: ops.chunk_scores(*inputs), repeats)
            reference_ms = median_cuda_ms(lambda: ops.chunk_scores_reference(*inputs), repeats)
            key_bytes = batch * context_len * NUM_KV_HEADS * HEAD_DIM * CACHE_DTYPE.itemsize
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
            torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4K tokens only, fewer repeats")
    parser.add_argument("--repeats", type=int, help="timed runs per case (median reported)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_chunk_scores_cuda needs a CUDA device")

    context_lens = [4096] if args.quick else [4096, 16384, 32768, 131072]
    repeats = args.repeats or (5 if args.quick else 20)
    properties = torch.cuda.get_device_properties(0)
    machine = {
        "gpu": properties.name,
        "gpu_memory_gib": round(properties.total_memory / 2**30, 1),
        "multiprocessors": properties.multi_processor_count,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
    }
    print(f"{machine['gpu']}, torch {machine['torch_version']}, CUDA {machine['cuda_version']}")
    results = run(context_lens, batches=[1, 8, 32], repeats=repeats)

    report = {
        "machine": machine,
        "config": {
            "num_q_heads": NUM_Q_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "block_size": BLOCK_SIZE,
            "chunk_size": CHUNK_SIZE,
            "dtype": str(CACHE_DTYPE).removeprefix("torch."),
            "layout": "flash_attn",
            "repeats": repeats,
            "statistic": "median of CUDA-event times",
        },
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
