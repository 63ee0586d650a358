"""Times the C++ paged prefix-attention kernel against vLLM's own CPU attention on the same tokens.

Shapes are Qwen2.5-1.5B's (12 query heads, 2 KV heads, head_dim 128) over a float32 vLLM CPU
("vec") KV cache in blocks of 128 tokens. For q = k + 1 verified tokens per request, the kernel
attends them to the request's prefix; vLLM's `cpu_attention_with_kv_cache` verifies them as the
engine does (causal, over the prefix and the q tokens, with the scheduler metadata of its CPU
attention backend). vLLM's plain decode step (one token per request, same prefix) is the
baseline. Each case first checks the kernel against vLLM's non-causal attention over the prefix
alone. With --layers N, each call runs once on each of N caches in turn, as a model's layers
read theirs in a step (from memory, not from a cache that one layer's repeats keep warm), and
the times are per layer. With --kernel-only, vLLM is neither imported nor timed (a machine
without it, such as the GPU machines lent here) and each case is checked against the op's
pure-torch reference. Prints a table and writes benchmarks/results/prefix_attention_cpu.json.

    python -m benchmarks.kernels.bench_prefix_attention [--quick] [--threads 1 2] [--layers 28]
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.kernels.common import cpu_model, median_ms, shuffled_vec_cache, write_report
from specextend_vllm import ops
from specextend_vllm.algorithm.kv_cache_layout import cpu_vec_key_cache_view, cpu_vec_value_cache_view

NUM_Q_HEADS = 12
NUM_KV_HEADS = 2
HEAD_DIM = 128
BLOCK_SIZE = 128
SCALE = HEAD_DIM**-0.5
VLLM_ISA = "vec"  # what vLLM's CPU backend picks for float32 caches without AMX
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "results" / "prefix_attention_cpu.json"


@dataclass
class PagedCache:
    raw: torch.Tensor  # [num_blocks, Hkv, block_size, 2 * D], vLLM's CPU "vec" layout
    block_table: torch.Tensor  # [B, W] int32, shuffled blocks


def make_cache(batch: int, num_tokens: int, seed: int = 0) -> PagedCache:
    """Random keys and values for num_tokens tokens of each request."""
    generator = torch.Generator().manual_seed(seed)
    return PagedCache(
        *shuffled_vec_cache(batch, num_tokens, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM, generator)
    )


def query_start_loc(batch: int, query_len: int) -> torch.Tensor:  # [B + 1] int32
    return torch.arange(0, batch * query_len + 1, query_len, dtype=torch.int32)


def vllm_attention(
    cache: PagedCache, query: torch.Tensor, query_len: int, seq_len: int, causal: bool
) -> tuple[Callable[[], None], torch.Tensor]:
    """vLLM's CPU attention call of its backend (vllm/v1/attention/backends/cpu_attn.py) for
    `query` [B * query_len, Hq, D], each request's tokens being the last query_len of seq_len:
    the call, and the output [B * query_len, Hq, D] it writes."""
    from vllm import _custom_ops as vllm_ops
    from vllm import envs as vllm_envs

    batch = cache.block_table.shape[0]
    starts = query_start_loc(batch, query_len)
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32)
    scheduler_metadata = vllm_ops.cpu_attn_get_scheduler_metadata(
        num_reqs=batch,
        num_heads=NUM_Q_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        seq_lens=seq_lens,
        dtype=torch.float32,
        query_start_loc=starts,
        causal=causal,
        sliding_window_size=-1,
        isa=VLLM_ISA,
        enable_kv_split=vllm_envs.VLLM_CPU_ATTN_SPLIT_KV,
    )
    num_blocks = cache.raw.shape[0]
    blocks = cache.raw.view(num_blocks, NUM_KV_HEADS, 2 * BLOCK_SIZE, HEAD_DIM)
    key_cache, value_cache = blocks.chunk(2, dim=2)
    output = torch.empty_like(query)

    def call() -> None:
        vllm_ops.cpu_attention_with_kv_cache(
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            output=output,
            query_start_loc=starts,
            seq_lens=seq_lens,
            scale=SCALE,
            causal=causal,
            alibi_slopes=None,
            sliding_window=-1,
            block_table=cache.block_table,
            softcap=0,
            scheduler_metadata=scheduler_metadata,
            s_aux=None,
        )

    return call, output


def kernel_args(
    cache: PagedCache, query: torch.Tensor, query_len: int, prefix_len: int
) -> tuple[Any, ...]:
    batch = cache.block_table.shape[0]
    return (
        query,
        cpu_vec_key_cache_view(cache.raw),
        cpu_vec_value_cache_view(cache.raw),
        cache.block_table,
        torch.full((batch,), prefix_len, dtype=torch.int32),
        query_start_loc(batch, query_len),
        SCALE,
    )


def kernel_call(
    cache: PagedCache, query: torch.Tensor, query_len: int, prefix_len: int
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    args = kernel_args(cache, query, query_len, prefix_len)
    return lambda: ops.paged_prefix_attention(*args)


def check_kernel(
    cache: PagedCache, query: torch.Tensor, query_len: int, prefix_len: int, against_vllm: bool
) -> None:
    """The kernel's output against vLLM's non-causal attention over the prefix alone, or
    (output and LSE) against the op's reference."""
    args = kernel_args(cache, query, query_len, prefix_len)
    output, lse = ops.paged_prefix_attention(*args)
    if against_vllm:
        prefix_only, expected = vllm_attention(cache, query, query_len, prefix_len, causal=False)
        prefix_only()
        torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5)
        return
    expected_output, expected_lse = ops.paged_prefix_attention_reference(*args)
    torch.testing.assert_close(output, expected_output, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-4, atol=1e-5)


def per_layer(calls: list[Callable[[], Any]]) -> Callable[[], None]:
    """One call on each layer's cache in turn."""

    def call() -> None:
        for layer_call in calls:
            layer_call()

    return call


def run(
    threads: list[int],
    prefix_lens: list[int],
    batches: list[int],
    query_lens: list[int],
    repeats: int,
    layers: int = 1,
    with_vllm: bool = True,
) -> list[dict[str, Any]]:
    results = []
    header = f"{'threads':>7} {'prefix':>6} {'batch':>5} {'q':>3} {'kernel ms':>10}"
    if with_vllm:
        header += (
            f" {'vLLM verify ms':>15} {'vLLM decode ms':>15} {'vs verify':>9} {'vs decode':>9}"
        )
    print(header)
    for num_threads in threads:
        torch.set_num_threads(num_threads)
        for prefix_len in prefix_lens:
            for batch in batches:
                caches = [
                    make_cache(batch, prefix_len + max(query_lens), seed=layer)
                    for layer in range(layers)
                ]
                cache = caches[0]
                generator = torch.Generator().manual_seed(1)
                decode_query = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, generator=generator)
                if with_vllm:
                    decode = per_layer(
                        [
                            vllm_attention(c, decode_query, 1, prefix_len + 1, causal=True)[0]
                            for c in caches
                        ]
                    )
                    decode_ms = median_ms(decode, repeats) / layers
                for query_len in query_lens:
                    query = torch.randn(
                        batch * query_len, NUM_Q_HEADS, HEAD_DIM, generator=generator
                    )
                    check_kernel(cache, query, query_len, prefix_len, against_vllm=with_vllm)
                    kernels = per_layer(
                        [kernel_call(c, query, query_len, prefix_len) for c in caches]
                    )
                    kernel_ms = median_ms(kernels, repeats) / layers
                    row = (
                        f"{num_threads:>7} {prefix_len:>6} {batch:>5} {query_len:>3} "
                        f"{kernel_ms:>10.3f}"
                    )
                    result = {
                        "threads": num_threads,
                        "layers": layers,
                        "prefix_len": prefix_len,
                        "batch": batch,
                        "query_len": query_len,
                        "kernel_ms": round(kernel_ms, 4),
                    }
                    if not with_vllm:
                        print(row)
                        results.append(result)
                        continue
                    verify = per_layer(
                        [
                            vllm_attention(
                                c, query, query_len, prefix_len + query_len, causal=True
                            )[0]
                            for c in caches
                        ]
                    )
                    verify_ms = median_ms(verify, repeats) / layers
                    print(
                        f"{row} {verify_ms:>15.3f} {decode_ms:>15.3f} "
                        f"{verify_ms / kernel_ms:>8.2f}x {kernel_ms / decode_ms:>8.2f}x"
                    )
                    results.append(
                        {
                            **result,
                            "vllm_verify_ms": round(verify_ms, 4),
                            "vllm_decode_ms": round(decode_ms, 4),
                            "speedup_vs_vllm_verify": round(verify_ms / kernel_ms, 2),
                            "kernel_over_vllm_decode": round(kernel_ms / decode_ms, 2),
                        }
                    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4K tokens only, fewer repeats")
    parser.add_argument("--repeats", type=int, help="timed runs per case (median reported)")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts to time"
    )
    parser.add_argument(
        "--layers", type=int, default=1, help="caches read in turn per timed call (default 1)"
    )
    parser.add_argument("--prefix-lens", type=int, nargs="+", help="default 4096 16384 32768")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--query-lens", type=int, nargs="+", default=[3, 5, 9])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--kernel-only", action="store_true", help="time the kernel alone, without vLLM"
    )
    args = parser.parse_args()

    prefix_lens = args.prefix_lens or ([4096] if args.quick else [4096, 16384, 32768])
    repeats = args.repeats or (3 if args.quick else 10)
    machine = {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    config = {
        "num_q_heads": NUM_Q_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "block_size": BLOCK_SIZE,
        "dtype": "float32",
        "layout": "cpu_vec",
        "repeats": repeats,
        "statistic": "median",
    }
    if not args.kernel_only:
        import vllm
        from vllm import envs as vllm_envs

        machine["vllm_version"] = vllm.__version__
        config["vllm_isa"] = VLLM_ISA
        config["vllm_split_kv"] = vllm_envs.VLLM_CPU_ATTN_SPLIT_KV
    print(", ".join(f"{key} {value}" for key, value in machine.items()))
    results = run(
        args.threads,
        prefix_lens,
        args.batches,
        args.query_lens,
        repeats,
        args.layers,
        with_vllm=not args.kernel_only,
    )
    write_report(args.output, {"machine": machine, "config": config, "results": results})


if __name__ == "__main__":
    main()
