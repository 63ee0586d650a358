"""Every contact with vLLM's internals: one small declarative patch per seam.

Each patch names its target (a class or module and an attribute), keeps the original
and installs a replacement that calls it. `apply_all()` installs them once per process.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.config.speculative import SpeculativeConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.logger import init_logger
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.rotary_embedding import (
    LinearScalingRotaryEmbedding,
    Llama3RotaryEmbedding,
    RotaryEmbedding,
)
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbeddingBase
from vllm.model_executor.models.utils import extract_layer_index
from vllm.platforms import current_platform
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.sample import rejection_sampler
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.worker_base import WorkerBase

from specextend_vllm import ops, positions, sampling
from specextend_vllm.config import METHOD_NAME, SpecExtendConfig
from specextend_vllm.profiling import StepTimer, device_synchronizer, step_timings_enabled

logger = init_logger("vllm.specextend")

__all__ = ["DraftModelProposer", "apply_all"]


class VllmPatch:
    """Replaces `target.attribute` with `replacement`, keeping the original."""

    target: ClassVar[Any]
    attribute: ClassVar[str]
    original: ClassVar[Any]

    @classmethod
    def replacement(cls, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{cls.__name__} defines no replacement")

    @classmethod
    def apply(cls) -> None:
        if "original" in cls.__dict__:
            return
        namespace = cls.target.__dict__ if isinstance(cls.target, type) else vars(cls.target)
        cls.original = namespace.get(cls.attribute)
        setattr(cls.target, cls.attribute, cls.new_attribute())

    @classmethod
    def new_attribute(cls) -> Any:
        return cls.replacement


def _specextend_config(vllm_config: VllmConfig) -> SpecExtendConfig | None:
    additional = vllm_config.additional_config
    if isinstance(additional, dict) and METHOD_NAME in additional:
        return SpecExtendConfig(**additional[METHOD_NAME])
    return None


_VLLM_SPECULATIVE_KEYS = frozenset(
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
            user_config, _VLLM_SPECULATIVE_KEYS
        )
        self.speculative_config = vllm_keys
        try:
            speculative_config = original(self, *args, **kwargs)
        finally:
            self.speculative_config = user_config
        if not speculative_config.use_heterogeneous_vocab:
            speculative_config.verify_equal_vocab_size_if_draft_model()
        method_config.check_draft_trained_length(draft_trained_length(speculative_config))
        self._specextend_config = method_config
        return speculative_config


def draft_trained_length(speculative_config: SpeculativeConfig) -> int:
    draft_config = speculative_config.draft_model_config
    assert draft_config is not None
    return int(
        getattr(draft_config.hf_text_config, "max_position_embeddings", draft_config.max_model_len)
    )


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
        method_config = method_config.resolve_chunk_size(vllm_config.cache_config.block_size)
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
            if _specextend_config(vllm_config) is None:
                return original_getter(vllm_config)
            logger.info_once(f"Method '{METHOD_NAME}' runs on the V1 model runner.")
            return False

        return property(use_v2_model_runner)


class _ProposerSelector(type):
    """A stand-in for `DraftModelProposer` in the V1 runner's module: builds
    `SpecExtendProposer` when the method is configured, and answers isinstance checks
    as the original class does."""

    def __call__(cls, vllm_config: VllmConfig, device: torch.device, runner: Any = None) -> Any:
        if _specextend_config(vllm_config) is None:
            return DraftModelProposer(vllm_config=vllm_config, device=device, runner=runner)
        from specextend_vllm.proposer import SpecExtendProposer

        return SpecExtendProposer(vllm_config, device, runner)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, DraftModelProposer)


class ProposerForSpecExtend(VllmPatch):
    target = gpu_model_runner
    attribute = "DraftModelProposer"

    @classmethod
    def new_attribute(cls) -> Any:
        return _ProposerSelector("DraftModelProposer", (), {})


class RequestLifecycle(VllmPatch):
    """Frees a request's retrieval state when it finishes or is aborted, and resets it
    when it resumes after preemption."""

    target = gpu_model_runner.GPUModelRunner
    attribute = "_update_states"

    @staticmethod
    def replacement(self: Any, scheduler_output: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        on_requests_changed = getattr(drafter, "on_requests_changed", None)
        if on_requests_changed is not None:
            on_requests_changed(
                scheduler_output.finished_req_ids,
                scheduler_output.scheduled_cached_reqs.resumed_req_ids,
            )
        return RequestLifecycle.original(self, scheduler_output)


class DraftsPastTrainedLength(VllmPatch):
    """vLLM runs no draft for a batch holding a request longer than the draft's own
    max_model_len (it verifies dummy drafts instead). `specextend` drafts for requests up
    to the target's length: on compact positions, or on absolute positions with the
    draft's RoPE table extended."""

    target = gpu_model_runner.GPUModelRunner
    attribute = "_input_fits_in_drafter"

    @staticmethod
    def replacement(self: Any, common_attn_metadata: Any) -> bool:
        if _specextend_config(self.vllm_config) is None or common_attn_metadata is None:
            return DraftsPastTrainedLength.original(self, common_attn_metadata)
        return common_attn_metadata.max_seq_len + self.num_spec_tokens <= self.max_model_len


class SchedulerLeavesWorkingCopyBlocks(VllmPatch):
    """With compact positions the scheduler allocates from fewer blocks than the workers
    hold: the last ones keep the draft's re-rotated working copies."""

    target = Scheduler
    attribute = "__init__"

    @staticmethod
    def replacement(
        self: Any,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        reserved = working_copy_manager_blocks(vllm_config, kv_cache_config)
        if reserved:
            logger.info(
                "SpecExtend: %d of %d KV cache blocks hold the draft's compact working copies",
                reserved,
                kv_cache_config.num_blocks,
            )
            kv_cache_config = dataclasses.replace(
                kv_cache_config, num_blocks=kv_cache_config.num_blocks - reserved
            )
        SchedulerLeavesWorkingCopyBlocks.original(
            self, vllm_config, kv_cache_config, *args, **kwargs
        )


def working_copy_manager_blocks(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> int:
    """Blocks (of the scheduler's size) the workers keep for compact working copies."""
    method_config = _specextend_config(vllm_config)
    if method_config is None or not method_config.uses_compact_positions():
        return 0
    block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
    return positions.reserved_manager_blocks(
        kv_cache_config.num_blocks,
        vllm_config.scheduler_config.max_num_seqs,
        method_config.max_kept_tokens,
        block_size,
    )


class WorkerReportsRetrievalStats(VllmPatch):
    """Adds the worker method that `specextend_vllm.retrieval_stats` calls by name through
    `collective_rpc` (a name needs no pickling across processes)."""

    target = WorkerBase
    attribute = "specextend_retrieval_stats"

    @staticmethod
    def replacement(self: Any) -> dict[str, Any]:
        drafter = getattr(self.model_runner, "drafter", None)
        stats = getattr(drafter, "stats", None)
        if stats is None:
            return {}
        return {
            **stats.summary(),
            "selections": [dataclasses.asdict(s) for s in stats.selections()],
        }


class WorkerReconfiguresSpecExtend(VllmPatch):
    """Adds the worker method behind `specextend_vllm.reconfigure`."""

    target = WorkerBase
    attribute = "specextend_reconfigure"

    @staticmethod
    def replacement(self: Any, changes: dict[str, Any]) -> dict[str, Any]:
        reconfigure = getattr(getattr(self.model_runner, "drafter", None), "reconfigure", None)
        if reconfigure is None:
            raise ValueError(f"this engine does not run method '{METHOD_NAME}'")
        return reconfigure(changes).to_dict()


def _step_timer(runner: Any) -> StepTimer:
    timer = getattr(runner, "_specextend_step_timer", None)
    if timer is None:
        timer = StepTimer(device_synchronizer(runner.device))
        runner._specextend_step_timer = timer
    return timer


class TimeTargetForward(VllmPatch):
    target = gpu_model_runner.GPUModelRunner
    attribute = "_model_forward"

    @staticmethod
    def replacement(
        self: Any, input_ids: Any = None, positions: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        num_tokens = positions.shape[-1] if positions is not None else input_ids.shape[-1]
        with _step_timer(self).target_forward(num_tokens):
            return TimeTargetForward.original(self, input_ids, positions, *args, **kwargs)


class TimeDraftProposal(VllmPatch):
    """Times the whole proposal, and each draft pass through hooks on the draft model."""

    target = gpu_model_runner.GPUModelRunner
    attribute = "propose_draft_token_ids"

    @staticmethod
    def replacement(self: Any, *args: Any, **kwargs: Any) -> Any:
        timer = _step_timer(self)
        draft_model = getattr(self.drafter, "model", None)
        if isinstance(draft_model, torch.nn.Module) and not getattr(
            draft_model, "_specextend_timed", False
        ):
            draft_model.register_forward_pre_hook(lambda *_: timer.draft_pass_started())
            draft_model.register_forward_hook(lambda *_: timer.draft_pass_finished())
            draft_model._specextend_timed = True
        with timer.propose():
            return TimeDraftProposal.original(self, *args, **kwargs)


class WorkerReportsStepTimings(VllmPatch):
    """Adds the worker method behind `specextend_vllm.step_timings`."""

    target = WorkerBase
    attribute = "specextend_step_timings"

    @staticmethod
    def replacement(self: Any) -> list[dict[str, Any]]:
        return [dataclasses.asdict(record) for record in _step_timer(self.model_runner).drain()]


class ExpandBatchToTokensOnCpu(VllmPatch):
    """vLLM 0.32's CPU stand-in for the Triton `expand_kernel` casts its output to int64
    and writes into that temporary copy, so `expand_batch_to_tokens` returns uninitialised
    memory: the rejection sampler then divides the target's logits by garbage temperatures
    and speculative sampling at temperature > 0 stops following the target's distribution
    (every speculative method, not only this one). The replacement is the same function in
    plain torch."""

    target = rejection_sampler
    attribute = "expand_batch_to_tokens"
    replacement = staticmethod(sampling.expand_batch_to_tokens)


PATCHES: tuple[type[VllmPatch], ...] = (
    SpeculativeConfigFromDict,
    EngineConfigCarriesSpecExtend,
    V1ModelRunnerForSpecExtend,
    ProposerForSpecExtend,
    RequestLifecycle,
    DraftsPastTrainedLength,
    SchedulerLeavesWorkingCopyBlocks,
    WorkerReportsRetrievalStats,
    WorkerReconfiguresSpecExtend,
)

STEP_TIMING_PATCHES: tuple[type[VllmPatch], ...] = (
    TimeTargetForward,
    TimeDraftProposal,
    WorkerReportsStepTimings,
)


def apply_all() -> None:
    patches = PATCHES + (STEP_TIMING_PATCHES if step_timings_enabled() else ())
    if current_platform.is_cpu():
        patches += (ExpandBatchToTokensOnCpu,)
    for patch in patches:
        patch.apply()


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


def observe_attention_query(layer: Attention, observe: Callable[[torch.Tensor], None]) -> None:
    """Calls `observe(query)` with the post-RoPE query of each forward of `layer`."""
    forward = layer.impl.forward

    @functools.wraps(forward)
    def forward_observing_query(
        attn_layer: Any, query: torch.Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        observe(query)
        return forward(attn_layer, query, *args, **kwargs)

    layer.impl.forward = forward_observing_query


def key_cache_view(layer: Attention) -> torch.Tensor:
    """The layer's paged keys as a [num_blocks, block_size, kv_heads, head_dim] view."""
    kv_cache = layer.kv_cache
    if isinstance(kv_cache, list):
        kv_cache = kv_cache[0]
    if kv_cache.dim() == 5:
        return ops.flash_attn_key_cache_view(kv_cache)
    isa = getattr(layer, "isa", None)
    if isa != "vec":
        raise ValueError(
            f"method '{METHOD_NAME}' reads the CPU KV cache in the 'vec' layout "
            f"(float32/float16 caches on x86 without AMX); this layer uses '{isa}'."
        )
    return ops.cpu_vec_key_cache_view(kv_cache)


def kv_cache_blocks(layer: Attention) -> torch.Tensor:
    """The layer's paged KV cache with the block index first (keys and values together)."""
    kv_cache = layer.kv_cache
    if isinstance(kv_cache, list):
        kv_cache = kv_cache[0]
    return kv_cache.transpose(0, 1) if kv_cache.dim() == 5 else kv_cache


# RoPE variants whose angles are the position times fixed frequencies, with cosines and
# sines of unit scale: their tables extend to any length and compose by adding positions.
_LINEAR_ROPE_TYPES = (RotaryEmbedding, Llama3RotaryEmbedding, LinearScalingRotaryEmbedding)


@dataclasses.dataclass
class DraftRotation:
    """The draft's rotary embedding, as the working copies re-rotate keys with it."""

    cos_sin: torch.Tensor  # [positions, rotary_dim], float32
    rotary_dim: int
    is_neox_style: bool


def extend_draft_rotary_table(
    draft_model: torch.nn.Module, num_positions: int
) -> DraftRotation | None:
    """Extends the draft's RoPE table to `num_positions` rows, so that the draft computes
    the angles of positions past its trained length instead of reading past the table.
    Returns None for a draft whose RoPE does not compose by adding positions."""
    rotaries = {id(m): m for m in draft_model.modules() if isinstance(m, RotaryEmbeddingBase)}
    linear = [m for m in rotaries.values() if type(m) in _LINEAR_ROPE_TYPES]
    if len(rotaries) != 1 or len(linear) != 1:
        logger.warning(
            "SpecExtend: the draft's rotary embeddings %s are not one plain RoPE; compact "
            "positions are off and its table is left as it is",
            sorted({type(m).__name__ for m in rotaries.values()}),
        )
        return None
    [rotary] = linear
    if rotary.cos_sin_cache.shape[0] < num_positions:
        rotary.max_position_embeddings = num_positions
        table = rotary._compute_cos_sin_cache()
        rotary.cos_sin_cache = table.to(rotary.cos_sin_cache.device, rotary.cos_sin_cache.dtype)
    else:
        table = rotary._compute_cos_sin_cache()
    return DraftRotation(
        table.float().to(rotary.cos_sin_cache.device), rotary.rotary_dim, rotary.is_neox_style
    )


def limit_attention_window(layers: list[Attention], window: int) -> None:
    """Each layer attends to its last `window` tokens at most (FlashAttention keeps the
    window as a (left, right) pair, the CPU backend as a token count)."""
    for layer in layers:
        if isinstance(layer.impl.sliding_window, tuple):
            layer.impl.sliding_window = (window - 1, 0)
        else:
            layer.impl.sliding_window = window
