"""Metrics seams: the worker methods that report the method's counters and step
timings, and the timers around the target's forward pass and the draft proposal."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.worker_base import WorkerBase

from specextend_vllm.patches.base import VllmPatch
from specextend_vllm.profiling import StepTimer, device_synchronizer


class WorkerReportsRetrievalStats(VllmPatch):
    """Adds the worker method that `specextend_vllm.retrieval_stats` calls by name through
    `collective_rpc` (a name needs no pickling across processes)."""

    target = WorkerBase
    attribute = "specextend_retrieval_stats"
    adds = True

    @staticmethod
    def replacement(self: Any) -> dict[str, Any]:
        metrics = getattr(getattr(self.model_runner, "drafter", None), "metrics", None)
        if metrics is None:
            return {}
        return {
            **metrics.summary(),
            "selections": [dataclasses.asdict(s) for s in metrics.selections()],
        }


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
    adds = True

    @staticmethod
    def replacement(self: Any) -> list[dict[str, Any]]:
        return [dataclasses.asdict(record) for record in _step_timer(self.model_runner).drain()]
