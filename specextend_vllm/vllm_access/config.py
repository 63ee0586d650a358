"""The method's config as it travels inside vLLM's configs."""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.config.speculative import SpeculativeConfig
from vllm.v1.kv_cache_interface import KVCacheConfig

from specextend_vllm.algorithm.positions import reserved_manager_blocks
from specextend_vllm.config import METHOD_NAME, SpecExtendConfig

# vLLM's own keys of the user's speculative_config (the derived ones excluded).
VLLM_SPECULATIVE_KEYS = frozenset(
    field.name
    for field in dataclasses.fields(SpeculativeConfig)
    if field.name
    not in {
        "target_model_config",
        "target_parallel_config",
        "draft_model_config",
        "draft_parallel_config",
    }
)


def specextend_config(vllm_config: VllmConfig) -> SpecExtendConfig | None:
    """The method's config, or None where the engine does not run `specextend`."""
    additional = vllm_config.additional_config
    if isinstance(additional, dict) and METHOD_NAME in additional:
        return SpecExtendConfig(**additional[METHOD_NAME])
    return None


def draft_trained_length(speculative_config: SpeculativeConfig) -> int:
    draft_config = speculative_config.draft_model_config
    assert draft_config is not None
    return int(
        getattr(draft_config.hf_text_config, "max_position_embeddings", draft_config.max_model_len)
    )


def manager_block_size(kv_cache_config: KVCacheConfig) -> int:
    """Tokens per block as the scheduler counts them (a multiple of the kernel's)."""
    return kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size


def working_copy_manager_blocks(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> int:
    """Blocks (of the scheduler's size) the workers keep for working copies."""
    method_config = specextend_config(vllm_config)
    block_size = manager_block_size(kv_cache_config)
    if method_config is None or not method_config.uses_working_copies(block_size):
        return 0
    return reserved_manager_blocks(
        kv_cache_config.num_blocks,
        vllm_config.scheduler_config.max_num_seqs,
        method_config.max_kept_tokens(block_size),
        block_size,
    )
