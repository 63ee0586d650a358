"""Attention layers of the target and the draft, their paged KV caches, the draft's LM head."""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models.utils import extract_layer_index

from specextend_vllm.algorithm import kv_cache_layout
from specextend_vllm.algorithm.int8_rows import quantize_rows
from specextend_vllm.config import METHOD_NAME
from specextend_vllm.vllm_access.cpu_int8 import SmallBatchInt8Linear, cpu_flags, has_small_batch_kernel
from specextend_vllm.vllm_access.parallel import sum_over_tensor_parallel_ranks


def target_final_attention_layer(vllm_config: VllmConfig, draft_layer_names: set[str]) -> Attention:
    """The target model's attention layer with the highest layer index."""
    target_layers = {
        name: layer
        for name, layer in get_layers_from_vllm_config(vllm_config, Attention).items()
        if name not in draft_layer_names
    }
    if not target_layers:
        raise ValueError(f"method '{METHOD_NAME}' found no attention layer in the target model")
    return target_layers[max(target_layers, key=extract_layer_index)]


def attention_layers(vllm_config: VllmConfig, layer_names: set[str]) -> list[Attention]:
    layers = get_layers_from_vllm_config(vllm_config, Attention)
    return [layers[name] for name in sorted(layer_names)]


def target_attention_layers(vllm_config: VllmConfig, draft_layer_names: set[str]) -> list[Attention]:
    layers = get_layers_from_vllm_config(vllm_config, Attention)
    return [layers[name] for name in sorted(layers) if name not in draft_layer_names]


def _unbound_raw_kv_cache(layer: Attention) -> torch.Tensor:
    kv_cache = layer.kv_cache
    return kv_cache[0] if isinstance(kv_cache, list) else kv_cache


def has_supported_cache_layout(layer: Attention) -> bool:
    """Whether the layer's cache is in one of the layouts of `kv_cache_layout`: the
    FlashAttention one, or the CPU backend's 'vec' one (its AMX layout is not)."""
    raw_cache = _unbound_raw_kv_cache(layer)
    return kv_cache_layout.is_flash_attn_layout(raw_cache) or getattr(layer, "isa", None) == "vec"


def raw_kv_cache(layer: Attention) -> torch.Tensor:
    """The layer's paged KV cache in its backend's own layout, one of those in
    `kv_cache_layout`."""
    if not has_supported_cache_layout(layer):
        raise ValueError(
            f"method '{METHOD_NAME}' reads the CPU KV cache in the 'vec' layout "
            "(float32/float16 caches on x86 without AMX); this layer uses "
            f"'{getattr(layer, 'isa', None)}'."
        )
    return _unbound_raw_kv_cache(layer)


def key_cache_view(layer: Attention) -> torch.Tensor:
    """The layer's paged keys as a [num_blocks, block_size, kv_heads, head_dim] view."""
    return kv_cache_layout.key_cache_view(raw_kv_cache(layer))


def lm_head_logits(
    model: torch.nn.Module, token_ids: torch.Tensor, int8: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden states [T, H] -> logits [T, N] of these N tokens, through the rows of
    `model`'s LM head: in int8 (`Int8RowsLogits`), or as loaded on the GEMM vLLM uses for an
    unquantized layer on this platform (on CPU a prepacked oneDNN one, several times faster
    than torch's here)."""
    rows = lm_head_rows(model, token_ids)
    if int8:
        return Int8RowsLogits(rows)
    if rows.device.type != "cpu":
        return lambda hidden_states: torch.nn.functional.linear(hidden_states, rows)
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    kept_head = torch.nn.Module()
    kept_head.weight = torch.nn.Parameter(rows, requires_grad=False)
    dispatch_cpu_unquantized_gemm(kept_head, remove_weight=False)
    return lambda hidden_states: kept_head.cpu_linear(hidden_states, kept_head.weight, None)


class Int8RowsLogits:
    """hidden states [T, H] -> logits [T, N]: the N rows in int8 with one scale per row,
    the hidden states quantized per token, multiplied as the int8 draft's other linear
    layers are: on `SmallBatchInt8Linear` (fp32) where this CPU runs it vectorized, else on vLLM's
    CPU int8 GEMM (oneDNN, prepacked). The GEMM reads the weights and scales it was made
    with at its calls: they are kept."""

    def __init__(self, rows: torch.Tensor):
        from vllm import _custom_ops as ops

        self._weights, self._scales = quantize_rows(rows)
        self.num_rows = rows.shape[0]
        self._gemm = ops.create_onednn_scaled_mm(
            self._weights.t(), self._scales, rows.dtype, True, False, 32
        )
        self._small_batches = (
            SmallBatchInt8Linear(self._weights, self._scales, self._gemm.handler_tensor)
            if has_small_batch_kernel(cpu_flags()) and rows.dtype == torch.float32
            else None
        )

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        from vllm import _custom_ops as ops

        if self._small_batches is not None:
            return self._small_batches(hidden_states)
        quantized, token_scales, _ = ops.onednn_scaled_int8_quant(hidden_states.contiguous(), None, None, True)
        logits = hidden_states.new_empty((hidden_states.shape[0], self.num_rows))
        ops.onednn_scaled_mm(self._gemm, quantized, logits, token_scales, None, None, None)
        return logits


def has_unquantized_lm_head(model: torch.nn.Module) -> bool:
    return type(model.lm_head.quant_method).__name__ == "UnquantizedEmbeddingMethod"


def has_int8_linear_layers(model: torch.nn.Module) -> bool:
    """Whether `model` has linear layers loaded as int8 W8A8 (compressed-tensors)."""
    return any(
        type(getattr(module, "scheme", None)).__name__ == "CompressedTensorsW8A8Int8"
        for module in model.modules()
    )


def lm_head_rows(model: torch.nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
    """[N, H] the rows of `model`'s LM head for these token ids, on every rank (a
    tensor-parallel LM head holds one slice of the vocabulary per rank)."""
    lm_head = model.lm_head
    if not has_unquantized_lm_head(model):
        raise ValueError(
            "speculative_config['draft_vocab'] and draft_lm_head 'int8' need the draft's LM "
            f"head unquantized, and it is quantized ({type(lm_head.quant_method).__name__})."
        )
    shard = lm_head.shard_indices
    on_this_rank = (token_ids >= shard.org_vocab_start_index) & (token_ids < shard.org_vocab_end_index)
    rows = lm_head.weight.new_zeros(len(token_ids), lm_head.weight.shape[1])
    rows[on_this_rank] = lm_head.weight[token_ids[on_this_rank] - shard.org_vocab_start_index]
    return sum_over_tensor_parallel_ranks(rows)
