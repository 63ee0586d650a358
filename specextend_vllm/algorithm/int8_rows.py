"""Rows of a weight matrix in int8 with one scale per row (symmetric, rounded to nearest):
the weight scheme of the int8 draft's checkpoint (per-channel W8), for the draft's LM head,
which vLLM loads unquantized."""

from __future__ import annotations

import torch

INT8_MAX = 127


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, H] float -> ([N, H] int8, [N, 1] float32 scales), rows ~ int8 * scales; a row
    of zeros keeps zeros.

    >>> weights, scales = quantize_rows(torch.tensor([[1.27, -0.63], [0.0, 0.0]]))
    >>> weights.tolist(), [round(s, 4) for s in scales.flatten().tolist()]
    ([[127, -63], [0, 0]], [0.01, 1.0])
    """
    absmax = rows.abs().amax(dim=1, keepdim=True).float()
    scales = torch.where(absmax > 0, absmax / INT8_MAX, torch.ones_like(absmax))
    weights = torch.round(rows.float() / scales).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return weights, scales
