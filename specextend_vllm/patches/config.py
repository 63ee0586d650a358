"""Config seams: `method: specextend` in the user's speculative config becomes vLLM's
draft-model config plus the method's own keys, validated before any model loads."""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig
from vllm.config.speculative import SpeculativeConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform

from specextend_vllm.config import METHOD_NAME, SpecExtendConfig, SpecExtendConfigError
from specextend_vllm.patches.base import VllmPatch
from specextend_vllm.vllm_access import logger
from specextend_vllm.vllm_access.config import (
    VLLM_SPECULATIVE_KEYS,
    draft_rope_type,
    draft_trained_length,
    draft_vocab_size,
    specextend_config,
    target_attention_blockers,
)


class SpeculativeConfigFromDict(VllmPatch):
    """`method: specextend` becomes vLLM's `draft_model` plus the method's own config,
    validated before any model loads; the draft must pair with the target."""

    target = EngineArgs
    attribute = "create_speculative_config"

    @staticmethod
    def replacement(self: EngineArgs, *args: Any, **kwargs: Any) -> SpeculativeConfig | None:
        original = SpeculativeConfigFromDict.original
        user_config = self.speculative_config
        if not isinstance(user_config, dict) or user_config.get("method") != METHOD_NAME:
            return original(self, *args, **kwargs)
        method_config, vllm_keys = SpecExtendConfig.split_speculative_config(
            user_config, VLLM_SPECULATIVE_KEYS
        )
        if self.pipeline_parallel_size > 1:
            raise SpecExtendConfigError(
                f"pipeline_parallel_size must be 1 with method '{METHOD_NAME}', got "
                f"{self.pipeline_parallel_size}: the draft's chunk selection reads the target's "
                "final attention layer on the rank that drafts. Use tensor_parallel_size."
            )
        if method_config.tree != "chain":
            if self.async_scheduling:
                raise SpecExtendConfigError(
                    "async_scheduling cannot be used with speculative_config['tree']: trees "
                    "are verified with synchronous scheduling. Leave async_scheduling unset "
                    "(trees turn it off) or set it false."
                )
            self.async_scheduling = False
        self.speculative_config = vllm_keys
        try:
            speculative_config = original(self, *args, **kwargs)
        finally:
            self.speculative_config = user_config
        if not speculative_config.use_heterogeneous_vocab:
            speculative_config.verify_equal_vocab_size_if_draft_model()
        method_config.check_draft_trained_length(draft_trained_length(speculative_config))
        method_config.check_draft_rope(draft_rope_type(speculative_config))
        method_config.check_draft_vocab(draft_vocab_size(speculative_config))
        method_config.check_draft_lm_head(current_platform.device_type)
        self._specextend_config = method_config
        return speculative_config


class EngineConfigCarriesSpecExtend(VllmPatch):
    """The method's config travels to every process in `VllmConfig.additional_config`."""

    target = EngineArgs
    attribute = "create_engine_config"

    @staticmethod
    def replacement(self: EngineArgs, *args: Any, **kwargs: Any) -> VllmConfig:
        vllm_config = EngineConfigCarriesSpecExtend.original(self, *args, **kwargs)
        method_config: SpecExtendConfig | None = getattr(self, "_specextend_config", None)
        if method_config is None:
            return vllm_config
        method_config.check_block_size(vllm_config.cache_config.block_size)
        method_config.exact_verification_attention(
            target_attention_blockers(vllm_config), current_platform.device_type
        )
        logprobs_mode = vllm_config.model_config.logprobs_mode
        if method_config.tree != "chain" and logprobs_mode not in ("raw_logprobs", "raw_logits"):
            raise SpecExtendConfigError(
                f"logprobs_mode {logprobs_mode!r} cannot be used with "
                "speculative_config['tree']: trees report raw_logprobs or raw_logits."
            )
        if not isinstance(vllm_config.additional_config, dict):
            raise ValueError(
                f"method '{METHOD_NAME}' needs additional_config to be a dict, "
                f"got {type(vllm_config.additional_config).__name__}."
            )
        vllm_config.additional_config[METHOD_NAME] = method_config.to_dict()
        logger.info("SpecExtend enabled: %s", method_config.to_dict())
        return vllm_config


class V1ModelRunnerForSpecExtend(VllmPatch):
    """Model Runner V2 has no seam for the proposer yet: `specextend` uses the V1 runner."""

    target = VllmConfig
    attribute = "use_v2_model_runner"

    @classmethod
    def new_attribute(cls) -> Any:
        original_getter = cls.original.fget

        def use_v2_model_runner(vllm_config: VllmConfig) -> bool:
            if specextend_config(vllm_config) is None:
                return original_getter(vllm_config)
            logger.info_once(f"Method '{METHOD_NAME}' runs on the V1 model runner.")
            return False

        return property(use_v2_model_runner)
