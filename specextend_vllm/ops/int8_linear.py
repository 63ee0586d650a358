"""A linear layer with int8 weights for a few rows of fp32 activations: the compiled op, its
fake kernel and a pure-torch reference.

Each activation row is quantized to int8 with its own scale (its largest magnitude / 127,
values rounded half to even), multiplied with the int8 weight rows in exact integer
arithmetic, and scaled back by the row's scale and the weight row's scale: the W8A8 scheme
of an int8 draft (weights per output channel, activations per token, symmetric). The kernel
streams the weights once for all rows, which is what decoding steps of a small batch need.
"""

from __future__ import annotations

import torch


def int8_linear(
    input: torch.Tensor,  # [M, K] float32
    weight: torch.Tensor,  # [N, K] int8, contiguous
    weight_scales: torch.Tensor,  # [N] float32
    bias: torch.Tensor | None = None,  # [N] float32
) -> torch.Tensor:  # [M, N] float32
    """One row [2, -4] (scale 4/127, quantized to [64, -127]) through two weight rows
    [1, 1] and [3, 0] with scales 0.5 and 0.1, plus bias [0, 1]: the integer products
    are -63 and 192, so the output is [-63 * 4/127 * 0.5, 192 * 4/127 * 0.1 + 1]:

    >>> int8_linear(
    ...     torch.tensor([[2.0, -4.0]]),
    ...     torch.tensor([[1, 1], [3, 0]], dtype=torch.int8),
    ...     torch.tensor([0.5, 0.1]),
    ...     torch.tensor([0.0, 1.0]),
    ... )
    tensor([[-0.9921,  1.6047]])
    """
    return torch.ops.specextend.int8_linear(input, weight, weight_scales, bias)


@torch.library.register_fake("specextend::int8_linear")
def _int8_linear_fake(
    input: torch.Tensor,
    weight: torch.Tensor,
    weight_scales: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:  # [M, N] float32
    return input.new_empty((input.shape[0], weight.shape[0]))


def int8_linear_reference(
    input: torch.Tensor,  # [M, K] float32
    weight: torch.Tensor,  # [N, K] int8
    weight_scales: torch.Tensor,  # [N] float32
    bias: torch.Tensor | None = None,  # [N] float32
) -> torch.Tensor:  # [M, N] float32
    """Pure-torch `int8_linear`, equal to the kernel to the bit.

    >>> int8_linear_reference(
    ...     torch.tensor([[2.0, -4.0], [0.0, 0.0]]),
    ...     torch.tensor([[1, 1], [3, 0]], dtype=torch.int8),
    ...     torch.tensor([0.5, 0.1]),
    ... )
    tensor([[-0.9921,  0.6047],
            [ 0.0000,  0.0000]])
    """
    row_scales = input.abs().amax(dim=1) / 127.0  # [M]
    quantized = torch.where(
        row_scales[:, None] == 0, 0.0, torch.round(input / row_scales[:, None])
    ).to(torch.int64)
    products = quantized @ weight.to(torch.int64).t()  # [M, N], exact
    output = products.to(torch.int32).float() * row_scales[:, None] * weight_scales[None, :]
    return output if bias is None else output + bias
