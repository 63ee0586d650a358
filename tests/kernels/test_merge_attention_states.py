"""The merge of two attention parts by their log-sum-exps: the compiled op against its
reference, against attention over both parts' keys at once, and on empty parts."""

from __future__ import annotations

import pytest
import torch

from specextend_vllm.ops import merge_attention_states, merge_attention_states_reference

INF = float("inf")


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, H, D] over key/value [N, H, D]: (output [T, H, D], lse [H, T])."""
    logits = torch.einsum("thd,nhd->htn", query, key)
    return torch.einsum("htn,nhd->thd", logits.softmax(-1), value), logits.logsumexp(-1)


def test_merge_equals_attention_over_both_parts() -> None:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(5, 12, 128, generator=generator) * 0.1
    key = torch.randn(40, 12, 128, generator=generator)
    value = torch.randn(40, 12, 128, generator=generator)
    prefix_output, prefix_lse = attention(query, key[:33], value[:33])
    suffix_output, suffix_lse = attention(query, key[33:], value[33:])
    expected, _ = attention(query, key, value)
    output = torch.empty_like(query)
    merge_attention_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference_with_empty_parts(dtype: torch.dtype) -> None:
    """Rows whose prefix, suffix or both are empty (-inf, and +inf as vLLM reads it)."""
    generator = torch.Generator().manual_seed(1)
    prefix_output = torch.randn(6, 4, 32, generator=generator)
    suffix_output = torch.randn(6, 4, 32, generator=generator)
    prefix_lse = torch.randn(4, 6, generator=generator) * 3
    suffix_lse = torch.randn(4, 6, generator=generator) * 3
    prefix_lse[:, 1] = -INF
    suffix_lse[:, 2] = -INF
    prefix_lse[:, 3] = suffix_lse[:, 3] = -INF
    suffix_lse[:, 4] = INF
    output = torch.empty(6, 4, 32, dtype=dtype)
    expected = torch.empty(6, 4, 32, dtype=dtype)
    args = (prefix_output, prefix_lse, suffix_output, suffix_lse)
    merge_attention_states(output, *args)
    merge_attention_states_reference(expected, *args)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(output[1], suffix_output[1].to(dtype))
    assert torch.equal(output[2], prefix_output[2].to(dtype))
    assert (output[3] == 0).all()
    assert torch.equal(output[4], prefix_output[4].to(dtype))


def test_kernel_rejects_malformed_inputs() -> None:
    output = torch.empty(3, 2, 8)
    with pytest.raises(RuntimeError, match="prefix_lse and suffix_lse must be"):
        merge_attention_states(output, torch.zeros(3, 2, 8), torch.zeros(3, 2), torch.zeros(3, 2, 8), torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="must be \\[T, H, D\\] alike"):
        merge_attention_states(output, torch.zeros(3, 2, 4), torch.zeros(2, 3), torch.zeros(3, 2, 8), torch.zeros(2, 3))


def test_op_registration_and_fake_kernel() -> None:
    generator = torch.Generator().manual_seed(2)
    torch.library.opcheck(
        torch.ops.specextend.merge_attention_states.default,
        (
            torch.empty(3, 2, 8),
            torch.randn(3, 2, 8, generator=generator),
            torch.randn(2, 3, generator=generator),
            torch.randn(3, 2, 8, generator=generator),
            torch.randn(2, 3, generator=generator),
        ),
    )
