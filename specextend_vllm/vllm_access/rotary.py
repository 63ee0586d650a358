"""The draft's rotary embedding, where it is one whose keys the working copies can move,
and its table, extended past the trained length once the draft is loaded."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.rotary_embedding import (
    LinearScalingRotaryEmbedding,
    Llama3RotaryEmbedding,
    RotaryEmbedding,
)
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbeddingBase

from specextend_vllm.algorithm.positions import DraftRotation
from specextend_vllm.vllm_access import logger

# RoPE variants whose angles are the position times fixed frequencies, with cosines and
# sines of unit scale: their tables extend to any length and compose by adding positions.
LINEAR_ROPE_TYPES = (RotaryEmbedding, Llama3RotaryEmbedding, LinearScalingRotaryEmbedding)


def rotary_embedding_types(model: torch.nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, RotaryEmbeddingBase)})


def linear_rotary_embedding(model: torch.nn.Module) -> RotaryEmbeddingBase | None:
    """The model's one rotary embedding if it is a plain RoPE, else None."""
    rotaries = {id(m): m for m in model.modules() if isinstance(m, RotaryEmbeddingBase)}
    linear = [m for m in rotaries.values() if type(m) in LINEAR_ROPE_TYPES]
    if len(rotaries) != 1 or len(linear) != 1:
        return None
    return linear[0]


def rotation_table(rotary: RotaryEmbeddingBase) -> DraftRotation:
    """The rotary's angles for every position of its current table, in float32."""
    table = rotary._compute_cos_sin_cache()
    return DraftRotation(
        table.float().to(rotary.cos_sin_cache.device), rotary.rotary_dim, rotary.is_neox_style
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
            "SpecExtend: the draft's rotary embeddings %s are not one plain RoPE: it drafts "
            "on absolute positions (positions 'compact' is refused) and its table is left "
            "as it is",
            rotary_embedding_types(draft_model),
        )
        return None
    if rotary.cos_sin_cache.shape[0] < num_positions:
        rotary.max_position_embeddings = num_positions
        table = rotary._compute_cos_sin_cache()
        rotary.cos_sin_cache = table.to(rotary.cos_sin_cache.device, rotary.cos_sin_cache.dtype)
    return rotation_table(rotary)
