"""Quantized linear layers on CPU."""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.kernels.linear.scaled_mm import cpu as cpu_scaled_mm

from specextend_vllm.patches.base import VllmPatch
from specextend_vllm.vllm_access.cpu_int8 import (
    SmallBatchInt8Linear,
    cpu_flags,
    has_small_batch_kernel,
    warn_int8_layers_without_dot_products,
)
from specextend_vllm.vllm_access.quantization import DRAFT_MODEL_PREFIX

# Activation dtypes that vLLM's AMX int8 kernel (`int8_scaled_mm_with_quant`) takes.
AMX_INT8_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)


class Int8LayersOfFp32ModelsOnOneDnn(VllmPatch):
    """On x86 CPUs with AMX, vLLM 0.32 runs int8 W8A8 layers (a compressed-tensors
    checkpoint: the cheap int8 draft) through its AMX kernel, `int8_scaled_mm_with_quant`,
    which takes bf16 or fp16 activations only: a model in fp32 crashes at its first forward
    ("expect A to be bfloat16 or half"). The check that picks the kernel reads the weight's
    dtype (int8), never the activations'. With other activations the layer takes the
    oneDNN kernel instead, the one vLLM takes on CPUs without AMX. The model's dtype is the
    default dtype while vLLM loads it (the oneDNN path reads it there too). On CPUs
    without int8 dot products the first int8 layer logs that int8 may not pay there.

    The draft's layers with per-token symmetric activations also keep their int8 weights
    for the plugin's small-batch kernel (`SmallBatchInt8Linear`), on CPUs where it is
    vectorized: a draft's decoding steps multiply a few tokens at a time. The target's
    layers stay exactly as vLLM runs them."""

    target = cpu_scaled_mm.CPUInt8ScaledMMLinearKernel
    attribute = "process_weights_after_loading"

    @staticmethod
    def replacement(self: Any, layer: torch.nn.Module) -> None:
        warn_int8_layers_without_dot_products(cpu_flags())
        if torch.get_default_dtype() in AMX_INT8_ACTIVATION_DTYPES:
            return Int8LayersOfFp32ModelsOnOneDnn.original(self, layer)
        weight_name, scales_name = self.layer_param_names[:2]
        int8_weight = getattr(layer, weight_name).data
        self.linear_method = self._apply_weights_onednn
        self.process_weights_for_onednn(layer)
        if (
            getattr(layer, "prefix", "").startswith(f"{DRAFT_MODEL_PREFIX}.")
            and self.config.input_symmetric
            and not self.config.is_static_input_scheme
            and has_small_batch_kernel(cpu_flags())
        ):
            small_batches = SmallBatchInt8Linear(
                int8_weight, getattr(layer, scales_name).data, self.dnnl_handler.handler_tensor
            )
            self.linear_method = small_batches.apply_to_layer
        return None
