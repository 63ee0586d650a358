"""Every target attention layer gets a hybrid verification path on its seam; whether the
layers compute through it (`hybrid`), stay on vLLM's kernel (`native`) or take the faster
of the two as measured per step (`measured`, which measures plain decoding steps too)
follows `verification_attention` once the layers' backends and cache layouts are known."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specextend_vllm.algorithm.verification_choice import VerificationChooser
from specextend_vllm.config import SpecExtendConfig
from specextend_vllm.verification.hybrid import HybridVerificationAttention, TreeMasks
from specextend_vllm.verification.measured import (
    MeasuredVerificationAttention,
    MeasuredVerificationStep,
)
from specextend_vllm.verification.prefix_attention import prefix_attention_for
from specextend_vllm.vllm_access import logger
from specextend_vllm.vllm_access.attention import (
    hybrid_cache_layout_blocker,
    plain_attention_blockers,
)
from specextend_vllm.vllm_access.attention_seam import (
    AttentionLayerSeam,
    AttentionPath,
    attention_layer_seam,
)


class VerificationRouting:
    """target_layers: the target's attention layers; max_verified_tokens: drafts + 1 per
    request; on_verification: called once per hybrid verification (first layer only);
    on_native_verification: called once per verification on vLLM's attention that
    `measured` chose; on_kernel_decode: once per plain decoding step that `measured` ran on
    the prefix kernel; tree_masks: with token trees, who holds the step's masks."""

    def __init__(
        self,
        target_layers: list[object],
        max_verified_tokens: int,
        device: torch.device,
        on_verification: Callable[[], None],
        on_native_verification: Callable[[], None],
        on_kernel_decode: Callable[[], None],
        tree_masks: TreeMasks | None,
    ):
        prefix_attention = prefix_attention_for(device)
        self.device_type = device.type
        self._target_layers = target_layers
        self._paths: list[tuple[AttentionLayerSeam, HybridVerificationAttention]] = [
            (
                attention_layer_seam(layer),
                HybridVerificationAttention(
                    layer.impl.scale,
                    max_verified_tokens,
                    prefix_attention,
                    on_verification if index == 0 else None,
                    tree_masks,
                ),
            )
            for index, layer in enumerate(target_layers)
        ]
        self._on_native_verification = on_native_verification
        self._on_kernel_decode = on_kernel_decode
        self._blockers: list[str] = []
        self.verifying_chooser: VerificationChooser | None = None
        """Under `measured`: the choice of verifying steps' attention."""
        self.decoding_chooser: VerificationChooser | None = None
        """Under `measured`: the choice of plain decoding steps' attention."""

    def find_blockers(self) -> None:
        """What keeps hybrid attention from verifying exactly, read off the target's
        layers once their backends are built (what the configs showed was checked before loading)."""
        self._blockers = sorted(
            {
                blocker
                for layer in self._target_layers
                for blocker in [
                    *plain_attention_blockers(layer.impl),
                    hybrid_cache_layout_blocker(layer),
                ]
                if blocker is not None
            }
        )

    def route(self, config: SpecExtendConfig) -> None:
        """Raises where the config asks for an attention the layers cannot verify exactly."""
        verification = config.exact_verification_attention(self._blockers, self.device_type)
        paths: list[AttentionPath | None]
        if verification == "measured":
            self.verifying_chooser = VerificationChooser()
            verification_step = MeasuredVerificationStep(
                self.verifying_chooser, on_native=self._on_native_verification
            )
            self.decoding_chooser = VerificationChooser()
            decoding_step = MeasuredVerificationStep(
                self.decoding_chooser, on_kernel=self._on_kernel_decode
            )
            paths = [
                MeasuredVerificationAttention(
                    path, verification_step, decoding_step, starts_step=index == 0
                )
                for index, (_, path) in enumerate(self._paths)
            ]
        else:
            self.verifying_chooser = self.decoding_chooser = None
            paths = [path if verification == "hybrid" else None for _, path in self._paths]
        for (seam, _), path in zip(self._paths, paths):
            seam.compute_with(path)
        logger.info("SpecExtend: verification attention %s", verification)
