"""The draft's rotary table, extended past its trained length once the draft is loaded."""

from __future__ import annotations

import torch

from specextend_vllm.algorithm.positions import DraftRotation
from specextend_vllm.vllm_access import logger
from specextend_vllm.vllm_access.rotary import (
    linear_rotary_embedding,
    rotary_embedding_types,
    rotation_table,
)


def extend_draft_rotary_table(
    draft_model: torch.nn.Module, num_positions: int
) -> DraftRotation | None:
    """Extends the draft's RoPE table to `num_positions` rows, so that the draft computes
    the angles of positions past its trained length instead of reading past the table.
    Returns the rotation, or None for a draft whose RoPE does not compose by adding
    positions (its table is left as it is)."""
    rotary = linear_rotary_embedding(draft_model)
    if rotary is None:
        logger.warning(
            "SpecExtend: the draft's rotary embeddings %s are not one plain RoPE; compact "
            "positions are off and its table is left as it is",
            rotary_embedding_types(draft_model),
        )
        return None
    if rotary.cos_sin_cache.shape[0] < num_positions:
        rotary.max_position_embeddings = num_positions
        table = rotary._compute_cos_sin_cache()
        rotary.cos_sin_cache = table.to(rotary.cos_sin_cache.device, rotary.cos_sin_cache.dtype)
    return rotation_table(rotary)
