"""Times one selection's working copy: the kept chunks of one request packed into its copy,
in every draft layer, for each chunk size, on both cache layouts (CPU tensors).

Shapes are Qwen2.5-0.5B's (24 layers, 2 KV heads, head_dim 64), float32, 128-token blocks,
a 16K-token request keeping `token_budget` tokens in chunks of 16 to 128 tokens. `plain`
copies (absolute positions), `rotated` re-rotates the keys too (compact positions). A draft
pass attends to the same number of tokens whether they sit in a copy or in place, so the
copy is the whole cost of sub-block chunks. Prints a table and writes
benchmarks/results/working_copies_cpu.json.

    python -m benchmarks.kernels.bench_working_copies [--budget 1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from benchmarks.kernels.common import cpu_model, median_ms
from specextend_vllm.algorithm.positions import (
    DraftRotation,
    copy_kept_tokens,
    packed_chunk_tokens,
    packed_copy_slots,
)

NUM_LAYERS = 24
NUM_KV_HEADS = 2
HEAD_DIM = 64
BLOCK_SIZE = 128
CONTEXT_LEN = 16384
CHUNK_SIZES = (16, 32, 64, 128)
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "results" / "working_copies_cpu.json"


def make_caches(layout: str, num_blocks: int) -> list[torch.Tensor]:
    if layout == "cpu_vec":
        shape = (num_blocks, NUM_KV_HEADS, BLOCK_SIZE, 2 * HEAD_DIM)
    else:
        shape = (2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    return [torch.randn(shape) for _ in range(NUM_LAYERS)]


def time_one_selection(layout: str, chunk_size: int, budget: int, rotated: bool, repeats: int) -> float:
    request_blocks = CONTEXT_LEN // BLOCK_SIZE
    copy_blocks = budget // BLOCK_SIZE
    caches = make_caches(layout, request_blocks + copy_blocks)
    block_table = torch.randperm(request_blocks)[None, :]
    copy_block_ids = torch.arange(request_blocks, request_blocks + copy_blocks)[None, :]
    num_candidates = (CONTEXT_LEN - BLOCK_SIZE) // chunk_size
    num_kept = budget // chunk_size
    kept = torch.randperm(num_candidates)[:num_kept].sort().values[None, :]
    angles = torch.rand(CONTEXT_LEN, HEAD_DIM // 2)
    rotation = DraftRotation(torch.cat([angles.cos(), angles.sin()], dim=1), HEAD_DIM, True)

    def select() -> None:
        sources, shifts, is_kept = packed_chunk_tokens(
            kept, torch.tensor([num_kept]), chunk_size, torch.tensor([CONTEXT_LEN - BLOCK_SIZE])
        )
        source_slots, copy_slots = packed_copy_slots(
            block_table, copy_block_ids, sources, is_kept, BLOCK_SIZE
        )
        cos_sin = rotation.cos_sin[shifts[is_kept]] if rotated else None
        for cache in caches:
            copy_kept_tokens(cache, source_slots, copy_slots, cos_sin, rotation)

    return median_ms(select, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print("layout     chunk  plain ms  rotated ms")
    for layout in ("cpu_vec", "flash_attn"):
        for chunk_size in CHUNK_SIZES:
            row = {"layout": layout, "chunk_size": chunk_size, "budget": args.budget}
            for mode in ("plain", "rotated"):
                row[f"{mode}_ms"] = time_one_selection(
                    layout, chunk_size, args.budget, mode == "rotated", args.repeats
                )
            rows.append(row)
            print(f"{layout:10} {chunk_size:5} {row['plain_ms']:9.2f} {row['rotated_ms']:11.2f}")
    record = {
        "machine": {"cpu": cpu_model(), "threads": args.threads, "python": platform.python_version(), "torch": torch.__version__},
        "shapes": {"layers": NUM_LAYERS, "kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM, "block_size": BLOCK_SIZE, "context_len": CONTEXT_LEN},
        "table": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1))
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
