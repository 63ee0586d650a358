"""The draft's LM head in int8 (`draft_lm_head: int8`) against the same rows unquantized:
vLLM's CPU int8 GEMM with per-row weight scales and per-token activation scales."""

import pytest
import torch

from specextend_vllm.algorithm.int8_rows import quantize_rows
from specextend_vllm.vllm_access.layers import Int8RowsLogits
from tests.unit.test_cpu_int8 import requires_exact_onednn_int8, requires_vllm_onednn


@requires_vllm_onednn
@requires_exact_onednn_int8
@pytest.mark.parametrize("num_tokens", [1, 5])
def test_int8_rows_logits_match_the_unquantized_rows(num_tokens: int) -> None:
    """Catches a wrong scale (per column instead of per row, or the activations' left
    out) and rows multiplied out of order: each moves the logits far from the reference."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(4096, 256, generator=generator) * torch.rand(4096, 1, generator=generator)
    hidden_states = torch.randn(num_tokens, 256, generator=generator) * 3
    reference = hidden_states @ rows.T
    logits = Int8RowsLogits(rows)(hidden_states)
    assert logits.shape == reference.shape and logits.dtype == reference.dtype
    error = (logits - reference).norm(dim=1) / reference.norm(dim=1)
    assert error.max() < 0.02
    assert (logits.argmax(dim=1) == reference.argmax(dim=1)).all()


def test_quantized_rows_reconstruct_within_half_a_step() -> None:
    rows = torch.randn(64, 32)
    weights, scales = quantize_rows(rows)
    assert weights.dtype == torch.int8 and scales.shape == (64, 1)
    assert ((weights.float() * scales - rows).abs() <= scales / 2 + 1e-6).all()
    assert (weights.abs().amax(dim=1) == 127).all()
