"""vLLM's sampler pieces the tree verifier reuses: top-k/top-p masking, the sampler
output type, and where the step's slot mapping lives."""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

__all__ = ["SamplerOutput", "apply_top_k_top_p", "step_slot_mapping"]


def step_slot_mapping(runner: Any) -> torch.Tensor:
    """The KV cache slot of each token of the runner's current step (rows past the
    step's tokens are stale)."""
    return runner.input_batch.block_table.block_tables[0].slot_mapping.gpu
