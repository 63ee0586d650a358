"""Tensor parallelism: each rank holds a slice of the attention heads."""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_reduce


def mean_over_tensor_parallel_ranks() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The mean of a tensor over the ranks (each holding the same number of query heads),
    or None without tensor parallelism."""
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return None
    return lambda tensor: tensor_model_parallel_all_reduce(tensor) / world_size


def sum_over_tensor_parallel_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of a tensor over the ranks (the tensor itself without tensor parallelism)."""
    if get_tensor_model_parallel_world_size() == 1:
        return tensor
    return tensor_model_parallel_all_reduce(tensor)
