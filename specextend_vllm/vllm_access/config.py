"""The method's config as it travels inside vLLM's configs."""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.config.speculative import SpeculativeConfig
from vllm.platforms import current_platform
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


def target_attention_blockers(vllm_config: VllmConfig) -> list[str]:
    """What the target's attention does beyond softmax(q k^T * scale) v over a cache the
    verification kernels read, as far as the configs tell before any model loads: a
    sliding window, ALiBi, a logit soft cap, a quantized KV cache, a CPU cache layout
    other than 'vec'. (Attention sinks show on the loaded layers only.)"""
    model_config, cache_config = vllm_config.model_config, vllm_config.cache_config
    text_config = model_config.hf_text_config
    blockers = {
        "sliding window": model_config.get_sliding_window() is not None,
        "ALiBi": bool(getattr(text_config, "alibi", False))
        or getattr(text_config, "position_embedding_type", None) == "alibi",
        "logit soft cap": bool(getattr(text_config, "attn_logit_softcapping", None)),
        f"KV cache dtype {cache_config.cache_dtype}": cache_config.cache_dtype != "auto",
    }
    found = [name for name, present in blockers.items() if present]
    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        isa = _get_attn_isa(
            model_config.dtype, cache_config.block_size, model_config.get_head_size()
        )
        if isa != "vec":
            found.append(f"CPU KV cache layout '{isa}'")
    return found


def draft_trained_length(speculative_config: SpeculativeConfig) -> int:
    draft_config = speculative_config.draft_model_config
    assert draft_config is not None
    return int(
        getattr(draft_config.hf_text_config, "max_position_embeddings", draft_config.max_model_len)
    )


def draft_rope_type(speculative_config: SpeculativeConfig) -> str:
    """The draft's RoPE variant as its config names it ("default" for plain RoPE)."""
    draft_config = speculative_config.draft_model_config
    assert draft_config is not None
    text_config = draft_config.hf_text_config
    for name in ("rope_parameters", "rope_scaling"):
        parameters = getattr(text_config, name, None)
        if isinstance(parameters, dict):
            return str(parameters.get("rope_type", parameters.get("type", "default")))
    return "default"


def draft_vocab_size(speculative_config: SpeculativeConfig) -> int:
    draft_config = speculative_config.draft_model_config
    assert draft_config is not None
    return draft_config.get_vocab_size()


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
