from __future__ import annotations

import torch

from specextend_vllm.algorithm.sampling import expand_batch_to_tokens


def expand_by_loop(x: torch.Tensor, cu_num_tokens: list[int], replace_from: float, replace_to: float) -> list:
    expanded, start = [], 0
    for value, end in zip(x.tolist(), cu_num_tokens):
        expanded += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return expanded


def test_expand_repeats_each_value_per_draft_token_and_replaces() -> None:
    temperature = torch.tensor([0.7, -1.0, 1.3, 2.0])
    cu_num_tokens = torch.tensor([2, 5, 5, 6], dtype=torch.int32)
    expanded = expand_batch_to_tokens(temperature, cu_num_tokens, 6, replace_from=-1, replace_to=1)
    assert expanded.dtype == torch.float32
    assert expanded.tolist() == expand_by_loop(temperature, [2, 5, 5, 6], -1.0, 1.0)
    top_k = torch.tensor([5, 0, 40], dtype=torch.int32)
    expanded_k = expand_batch_to_tokens(top_k, torch.tensor([1, 4, 7], dtype=torch.int32), 7)
    assert expanded_k.dtype == torch.int32
    assert expanded_k.tolist() == [5, 0, 0, 0, 40, 40, 40]
