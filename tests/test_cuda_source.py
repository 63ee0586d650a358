"""The CUDA kernel source compiles standalone; on a CUDA machine the CUDA op matches
the reference."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from specextend_vllm import ops
from tests.test_ops import (
    HEAD_COUNTS,
    LAYOUTS,
    key_cache_view,
    make_paged_batch,
    ragged_context_lens,
)

KERNEL_SOURCE = Path(__file__).resolve().parents[1] / "csrc" / "cuda" / "chunk_scores_kernel.cu"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_kernel_source_compiles(tmp_path: Path) -> None:
    object_file = tmp_path / "chunk_scores_kernel.o"
    result = subprocess.run(
        ["nvcc", "-c", "-std=c++17", "-o", str(object_file), str(KERNEL_SOURCE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert object_file.stat().st_size > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", HEAD_COUNTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_op_matches_reference(
    layout: str, num_q_heads: int, num_kv_heads: int, block_size: int, cache_dtype: torch.dtype
) -> None:
    context_lens = ragged_context_lens(block_size)
    batch = make_paged_batch(
        context_lens, num_q_heads, num_kv_heads, block_size, layout, cache_dtype, cache_dtype
    )
    chunk_size = 2 * block_size
    num_chunks = math.ceil(max(context_lens) / chunk_size) + 1
    args = (
        batch.query.cuda(),
        key_cache_view(batch.raw_cache.cuda(), layout),
        batch.block_table.cuda(),
        batch.context_lens.cuda(),
        chunk_size,
        batch.scale,
        num_chunks,
    )
    scores = ops.chunk_scores(*args)
    assert scores.device.type == "cuda"
    expected = ops.chunk_scores_reference(*args)
    torch.testing.assert_close(scores.cpu(), expected.cpu(), rtol=1e-4, atol=1e-7)
