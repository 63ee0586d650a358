"""Model runner and worker seams: the proposer, request lifecycle, drafting past the
draft's trained length, and the worker methods behind the public helpers."""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.worker_base import WorkerBase

from specextend_vllm.config import METHOD_NAME
from specextend_vllm.patches.base import VllmOverrides, VllmPatch
from specextend_vllm.vllm_access.config import specextend_config
from specextend_vllm.vllm_access.runner import DraftModelProposer
from specextend_vllm.vllm_access.sampling import step_slot_mapping


class _ProposerSelector(type):
    """A stand-in for `DraftModelProposer` in the V1 runner's module: builds
    `SpecExtendProposer` when the method is configured, and answers isinstance checks
    as the original class does."""

    def __call__(cls, vllm_config: VllmConfig, device: torch.device, runner: Any = None) -> Any:
        if specextend_config(vllm_config) is None:
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


class ProposerOverrides(VllmOverrides):
    target = DraftModelProposer
    subclass = "specextend_vllm.proposer:SpecExtendProposer"
    methods = (
        "__init__",
        "_create_draft_vllm_config",
        "load_model",
        "initialize_attn_backend",
        "propose",
        "set_inputs_first_pass",
        "_sample_draft_tokens",
        "build_per_group_and_layer_attn_metadata",
    )


class RequestLifecycle(VllmPatch):
    """Frees a request's retrieval state when it finishes or is aborted, and resets it
    when it resumes after preemption; hands the proposer the cached twins of the blocks
    the step computes again, and whether the scheduler took the step's drafts back."""

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
            drafter.note_scheduled_step(
                scheduler_output.specextend_block_twins or {},
                bool(scheduler_output.specextend_unrepaid_drafting),
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
        if specextend_config(self.vllm_config) is None or common_attn_metadata is None:
            return DraftsPastTrainedLength.original(self, common_attn_metadata)
        return common_attn_metadata.max_seq_len + self.num_spec_tokens <= self.max_model_len


class WorkerReconfiguresSpecExtend(VllmPatch):
    """Adds the worker method behind `specextend_vllm.reconfigure`."""

    target = WorkerBase
    attribute = "specextend_reconfigure"
    adds = True

    @staticmethod
    def replacement(self: Any, changes: dict[str, Any]) -> dict[str, Any]:
        reconfigure = getattr(getattr(self.model_runner, "drafter", None), "reconfigure", None)
        if reconfigure is None:
            raise ValueError(f"this engine does not run method '{METHOD_NAME}'")
        return reconfigure(changes).to_dict()


def _tree_session(runner: Any) -> Any:
    return getattr(getattr(runner, "drafter", None), "tree_session", None)


class TreePositionsAndMasks(VllmPatch):
    """With token trees, each step's drafted nodes go to positions by depth once vLLM
    has laid out the step (their KV slots stay in flat order), and the hybrid
    verification attention gets the step's masks."""

    target = gpu_model_runner.GPUModelRunner
    attribute = "_prepare_inputs"

    @staticmethod
    def replacement(self: Any, scheduler_output: Any, num_scheduled_tokens: Any) -> Any:
        prepared = TreePositionsAndMasks.original(self, scheduler_output, num_scheduled_tokens)
        session = _tree_session(self)
        if session is not None:
            session.plan_verification(prepared[1], self.positions, self.input_batch.req_ids)
        return prepared


class TreeSampling(VllmPatch):
    """With token trees, verification accepts the longest path of the tree in place of
    vLLM's chain rejection sampler, then leaves the step as the chain of that path."""

    target = gpu_model_runner.GPUModelRunner
    attribute = "_sample"

    @staticmethod
    def replacement(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        session = _tree_session(self)
        if session is None or spec_decode_metadata is None or not session.verifies_this_step():
            return TreeSampling.original(self, logits, spec_decode_metadata)
        self.input_batch.update_async_output_token_ids()
        return session.verify(
            logits,
            spec_decode_metadata.cu_num_sampled_tokens,
            self.input_batch.sampling_metadata,
            self.sampler,
            self.input_ids.gpu,
            self.positions,
            step_slot_mapping(self),
        )
