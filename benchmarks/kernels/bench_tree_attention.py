"""Times the tree part and the merge of hybrid verification per target layer: the compiled
`tree_attention` and `merge_attention_states` ops against the pure-torch reference of the
tree part followed by vLLM's `merge_attn_states` (its CPU fallback is torch too), which is
what hybrid verification ran on CPU before the ops.

Shapes are Qwen2.5-1.5B's (12 query heads, 2 KV heads, head_dim 128), one request verifying
q tokens (a chain of k = q - 1, or a tree of q - 1 nodes), causal. Each call is repeated 200
times per timing; median of the timings. Prints a table and writes
benchmarks/results/tree_attention_cpu.json.

    python -m benchmarks.kernels.bench_tree_attention [--threads 2] [--repeats 9]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import torch
import vllm

from benchmarks.kernels.common import cpu_model, median_ms, write_report
from specextend_vllm.ops import merge_attention_states, tree_attention, tree_attention_reference
from specextend_vllm.vllm_access.attention import merge_attn_states

NUM_Q_HEADS = 12
NUM_KV_HEADS = 2
HEAD_DIM = 128
CALLS_PER_TIMING = 200
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "results" / "tree_attention_cpu.json"


def tree_and_merge(query_len: int, compiled: bool) -> Callable[[], None]:
    """CALLS_PER_TIMING calls of the tree part and the merge for one request's tokens."""
    generator = torch.Generator().manual_seed(query_len)
    query = torch.randn(query_len, NUM_Q_HEADS, HEAD_DIM, generator=generator)
    key = torch.randn(query_len, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    value = torch.randn(query_len, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    query_start_loc = torch.tensor([0, query_len], dtype=torch.int32)
    prefix_output = torch.randn(query_len, NUM_Q_HEADS, HEAD_DIM, generator=generator)
    prefix_lse = torch.randn(NUM_Q_HEADS, query_len, generator=generator)
    output = torch.empty_like(prefix_output)
    tree = tree_attention if compiled else tree_attention_reference
    merge = merge_attention_states if compiled else merge_attn_states

    def calls() -> None:
        for _ in range(CALLS_PER_TIMING):
            tree_output, tree_lse = tree(
                query, key, value, query_start_loc, query_len, HEAD_DIM**-0.5
            )
            merge(output, prefix_output, prefix_lse, tree_output, tree_lse)

    return calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--repeats", type=int, default=9, help="timings per case (median)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(f"{cpu_model()}, torch {torch.__version__}, vLLM {vllm.__version__}, {args.threads} threads")
    print(f"{'q':>3} {'ops ms':>8} {'torch + vLLM merge ms':>22} {'speedup':>8}")
    results = []
    for query_len in (2, 3, 5, 9, 17):
        ops_ms = median_ms(tree_and_merge(query_len, True), args.repeats) / CALLS_PER_TIMING
        torch_ms = median_ms(tree_and_merge(query_len, False), args.repeats) / CALLS_PER_TIMING
        print(f"{query_len:>3} {ops_ms:>8.3f} {torch_ms:>22.3f} {torch_ms / ops_ms:>7.1f}x")
        results.append(
            {
                "query_len": query_len,
                "ops_ms": round(ops_ms, 4),
                "torch_and_vllm_merge_ms": round(torch_ms, 4),
                "speedup": round(torch_ms / ops_ms, 1),
            }
        )
    report = {
        "machine": {
            "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "threads": args.threads,
            "torch_version": torch.__version__,
            "vllm_version": vllm.__version__,
        },
        "config": {
            "num_q_heads": NUM_Q_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "calls_per_timing": CALLS_PER_TIMING,
            "repeats": args.repeats,
            "statistic": "median",
        },
        "results": results,
    }
    write_report(args.output, report)


if __name__ == "__main__":
    main()
