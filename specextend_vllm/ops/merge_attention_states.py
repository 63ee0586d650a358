"""Merging two attention outputs over disjoint sets of keys by their log-sum-exps, exactly:
the last step of hybrid tree attention (the prefix part and the tree part). The compiled op
(CPU), its fake kernel and a pure-torch reference with the semantics of vLLM's
`merge_attn_states`, which GPUs run (vllm_access.attention)."""

from __future__ import annotations

import torch


def merge_attention_states(
    output: torch.Tensor,  # [T, H, D], written
    prefix_output: torch.Tensor,  # [T, H, D]
    prefix_lse: torch.Tensor,  # [H, T]
    suffix_output: torch.Tensor,  # [T, H, D]
    suffix_lse: torch.Tensor,  # [H, T]
) -> None:
    """Writes into `output` each row's attention over the keys of both parts: the parts'
    outputs weighted by their shares of the softmax mass, exp(lse - merged lse); 0 where
    both parts are empty (an lse of -inf; +inf counts as -inf, as in vLLM).

    One head, one token: the prefix holds mass e^0 = 1 (output 2), the suffix e^(ln 3) = 3
    (output 6), so the merged output is (1 * 2 + 3 * 6) / 4 = 5:

    >>> import math
    >>> output = torch.empty(1, 1, 1)
    >>> merge_attention_states(
    ...     output,
    ...     prefix_output=torch.tensor([[[2.0]]]),
    ...     prefix_lse=torch.tensor([[0.0]]),
    ...     suffix_output=torch.tensor([[[6.0]]]),
    ...     suffix_lse=torch.tensor([[math.log(3.0)]]),
    ... )
    >>> [round(x, 4) for x in output.flatten().tolist()]
    [5.0]
    """
    torch.ops.specextend.merge_attention_states(
        output, prefix_output, prefix_lse, suffix_output, suffix_lse
    )


@torch.library.register_fake("specextend::merge_attention_states")
def _merge_attention_states_fake(
    output: torch.Tensor,
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
) -> None:
    return None


def merge_attention_states_reference(
    output: torch.Tensor,  # [T, H, D], written
    prefix_output: torch.Tensor,  # [T, H, D]
    prefix_lse: torch.Tensor,  # [H, T]
    suffix_output: torch.Tensor,  # [T, H, D]
    suffix_lse: torch.Tensor,  # [H, T]
) -> None:
    """Pure-torch `merge_attention_states`, fp32 throughout.

    A row whose prefix is empty (lse -inf) takes the suffix's output, and a row with both
    parts empty gets 0:

    >>> output = torch.empty(2, 1, 1)
    >>> merge_attention_states_reference(
    ...     output,
    ...     prefix_output=torch.tensor([[[2.0]], [[7.0]]]),
    ...     prefix_lse=torch.tensor([[float("-inf"), float("-inf")]]),
    ...     suffix_output=torch.tensor([[[6.0]], [[9.0]]]),
    ...     suffix_lse=torch.tensor([[0.5, float("inf")]]),
    ... )
    >>> output.flatten().tolist()
    [6.0, 0.0]
    """
    prefix_lse = prefix_lse.float().masked_fill(prefix_lse.isinf(), float("-inf"))
    suffix_lse = suffix_lse.float().masked_fill(suffix_lse.isinf(), float("-inf"))
    max_lse = torch.maximum(prefix_lse, suffix_lse)
    empty = torch.isneginf(max_lse)
    max_lse = max_lse.masked_fill(empty, 0.0)
    prefix_mass = torch.exp(prefix_lse - max_lse)
    suffix_mass = torch.exp(suffix_lse - max_lse)
    total = (prefix_mass + suffix_mass).masked_fill(empty, 1.0)
    prefix_share = (prefix_mass / total).transpose(0, 1).unsqueeze(-1)  # [T, H, 1]
    suffix_share = (suffix_mass / total).transpose(0, 1).unsqueeze(-1)
    merged = prefix_output.float() * prefix_share + suffix_output.float() * suffix_share
    output.copy_(merged.to(output.dtype))
