"""Times the C++ chunk-scores kernel against the pure-torch reference on the CPU.

Shapes are those of Qwen2.5-1.5B's final attention layer (12 query heads, 2 KV
heads, head_dim 128) over a float32 vLLM CPU ("vec") KV cache with blocks and
chunks of 128 tokens. Prints a table and writes benchmarks/results/scorer_cpu.json.

    python -m benchmarks.kernels.bench_chunk_scores [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from benchmarks.kernels.common import cpu_model, median_ms, shuffled_vec_cache
from specextend_vllm import ops
from specextend_vllm.algorithm.kv_cache_layout import cpu_vec_key_cache_view

NUM_Q_HEADS = 12
NUM_KV_HEADS = 2
HEAD_DIM = 128
BLOCK_SIZE = 128
CHUNK_SIZE = 128
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "results" / "scorer_cpu.json"


def make_inputs(batch: int, context_len: int, seed: int = 0) -> tuple[Any, ...]:
    """A shuffled paged fp32 cache in the CPU vec layout, every request full."""
    generator = torch.Generator().manual_seed(seed)
    raw_cache, block_table = shuffled_vec_cache(
        batch, context_len, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM, generator
    )
    query = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, generator=generator)
    return (
        query,
        cpu_vec_key_cache_view(raw_cache),
        block_table,
        torch.full((batch,), context_len, dtype=torch.int32),
        CHUNK_SIZE,
        HEAD_DIM**-0.5,
        context_len // CHUNK_SIZE,
    )


def run(context_lens: list[int], batches: list[int], repeats: int) -> list[dict[str, Any]]:
    results = []
    print(f"{'tokens':>7} {'batch':>5} {'kernel ms':>10} {'reference ms':>13} {'speedup':>8}")
    for context_len in context_lens:
        for batch in batches:
            inputs = make_inputs(batch, context_len)
            kernel_scores = ops.chunk_scores(*inputs)
            expected = ops.chunk_scores_reference(*inputs)
            torch.testing.assert_close(kernel_scores, expected, rtol=1e-4, atol=1e-7)
            kernel_ms = median_ms(lambda: ops.chunk_scores(*inputs), repeats)
            reference_ms = median_ms(lambda: ops.chunk_scores_reference(*inputs), repeats)
            print(
                f"{context_len:>7} {batch:>5} {kernel_ms:>10.3f} {reference_ms:>13.3f} "
                f"{reference_ms / kernel_ms:>7.1f}x"
            )
            results.append(
                {
                    "context_len": context_len,
                    "batch": batch,
                    "kernel_ms": round(kernel_ms, 4),
                    "reference_ms": round(reference_ms, 4),
                    "speedup": round(reference_ms / kernel_ms, 2),
                }
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4K tokens only, fewer repeats")
    parser.add_argument("--repeats", type=int, help="timed runs per case (median reported)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    context_lens = [4096] if args.quick else [4096, 16384, 32768]
    repeats = args.repeats or (3 if args.quick else 10)
    machine = {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    print(
        f"{machine['cpu_model']}, {machine['torch_threads']} torch threads, "
        f"torch {machine['torch_version']}"
    )
    results = run(context_lens, batches=[1, 8], repeats=repeats)

    report = {
        "machine": machine,
        "config": {
            "num_q_heads": NUM_Q_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "block_size": BLOCK_SIZE,
            "chunk_size": CHUNK_SIZE,
            "dtype": "float32",
            "layout": "cpu_vec",
            "repeats": repeats,
            "statistic": "median",
        },
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
