"""The CUDA kernel source compiles standalone; on a CUDA machine the CUDA op matches the
reference."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from specextend_vllm import ops
from specextend_vllm.algorithm.kv_cache_layout import key_cache_view
from tests.paged_cache import HEAD_COUNTS, LAYOUTS, make_paged_batch, ragged_context_lens

CSRC = Path(__file__).resolve().parents[2] / "csrc"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_kernel_source_compiles(tmp_path: Path) -> None:
    object_file = tmp_path / "chunk_scores_cuda.o"
    source = CSRC / "chunk_scores" / "cuda.cu"
    result = subprocess.run(
        ["nvcc", "-c", "-std=c++17", f"-I{CSRC}", "-o", str(object_file), str(source)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert object_file.stat().st_size > 0


def cuda_scores(
    layout: str,
    num_q_heads: int,
    num_kv_heads: int,
    block_size: int,
    cache_dtype: torch.dtype,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(CUDA kernel scores, reference scores) on ragged contexts, chunks of 2 blocks."""
    context_lens = ragged_context_lens(block_size)
    batch = make_paged_batch(
        context_lens, num_q_heads, num_kv_heads, block_size, layout, cache_dtype, cache_dtype
    )
    chunk_size = 2 * block_size
    num_chunks = math.ceil(max(context_lens) / chunk_size) + 1
    args = (
        batch.query.cuda(),
        key_cache_view(batch.raw_cache.cuda()),
        batch.block_table.cuda(),
        batch.context_lens.cuda(),
        chunk_size,
        batch.scale if scale is None else scale,
        num_chunks,
    )
    scores = ops.chunk_scores(*args)
    assert scores.device.type == "cuda"
    return scores.cpu(), ops.chunk_scores_reference(*args).cpu()


# 18 query heads on one KV head: more than the 8 the kernel takes at once (three passes).
CUDA_HEAD_COUNTS = [*HEAD_COUNTS, (18, 1)]


@requires_cuda
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", CUDA_HEAD_COUNTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_op_matches_reference(
    layout: str, num_q_heads: int, num_kv_heads: int, block_size: int, cache_dtype: torch.dtype
) -> None:
    scores, expected = cuda_scores(layout, num_q_heads, num_kv_heads, block_size, cache_dtype)
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-7)


@requires_cuda
def test_cuda_op_is_stable_for_large_logits() -> None:
    scores, expected = cuda_scores("flash_attn", 12, 2, 16, torch.float32, scale=8.0)
    assert torch.isfinite(scores[:, 0]).all()
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-7)
