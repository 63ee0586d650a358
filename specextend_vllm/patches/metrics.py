"""Metrics seams: each step's new counts from the worker, through the scheduler's stats, to
the front end's stat logger (`SpecExtendStatLogger`, a `vllm.stat_logger_plugins` entry
point); the worker methods that report the counters and step timings; the timers around
the target's forward pass and the draft proposal."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.metrics.loggers import AggregateStatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.worker_base import WorkerBase

from specextend_vllm.metrics import DecodingSteps, RetrievalMetrics, SpecExtendCounts
from specextend_vllm.metrics_exporters import SpecExtendLogging, SpecExtendProm
from specextend_vllm.patches.base import VllmDataclassField, VllmOverrides, VllmPatch
from specextend_vllm.profiling import StepTimer, device_synchronizer
from specextend_vllm.vllm_access import logger
from specextend_vllm.vllm_access.config import specextend_config


class RunnerOutputCarriesCounts(VllmDataclassField):
    """A step's new counts, from the worker to the scheduler."""

    target = ModelRunnerOutput
    attribute = "specextend_counts"
    field_type = SpecExtendCounts | None


class SchedulerStatsCarryCounts(VllmDataclassField):
    """A step's new counts, from the engine core to the front end's stat loggers."""

    target = SchedulerStats
    attribute = "specextend_counts"
    field_type = SpecExtendCounts | None


class SchedulerStatsCarryDecodingSteps(VllmDataclassField):
    """The decoding steps the scheduler timed since the last stats, from the engine core to
    the front end's stat loggers (`patches.scheduler.SchedulerMeasuresDrafting`)."""

    target = SchedulerStats
    attribute = "specextend_decoding_steps"
    field_type = DecodingSteps | None


class _AsyncOutputWithCounts(AsyncModelRunnerOutput):
    """An asynchronous step output that hands over the step's counts with its output."""

    def __init__(self, output: AsyncModelRunnerOutput, counts: SpecExtendCounts):
        self._output = output
        self._counts = counts

    def get_output(self) -> ModelRunnerOutput:
        output = self._output.get_output()
        output.specextend_counts = self._counts
        return output

    def get_kv_connector_output(self) -> Any:
        return self._output.get_kv_connector_output()


class RunnerSendsNewCounts(VllmPatch):
    """The proposer's counts since the last step leave the worker with the step's output
    (built where the draft proposal runs). Every executor hands that output to the
    scheduler: the same object in process, pickled from worker processes."""

    target = gpu_model_runner.GPUModelRunner
    attribute = "sample_tokens"

    @staticmethod
    def replacement(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = RunnerSendsNewCounts.original(self, *args, **kwargs)
        metrics = getattr(getattr(self, "drafter", None), "metrics", None)
        if not isinstance(metrics, RetrievalMetrics) or not isinstance(
            output, ModelRunnerOutput | AsyncModelRunnerOutput
        ):
            return output
        counts = metrics.take_new_counts()
        if counts is None:
            return output
        if isinstance(output, AsyncModelRunnerOutput):
            return _AsyncOutputWithCounts(output, counts)
        output.specextend_counts = counts
        return output


class SchedulerForwardsNewCounts(VllmPatch):
    """A step's counts join the SchedulerStats that vLLM makes for that step and sends to
    the front end with its outputs (when it logs stats)."""

    target = Scheduler
    attribute = "update_from_output"

    @staticmethod
    def replacement(
        self: Any, scheduler_output: Any, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        outputs = SchedulerForwardsNewCounts.original(self, scheduler_output, model_runner_output)
        counts = model_runner_output.specextend_counts
        if counts is not None:
            for engine_core_outputs in outputs.values():
                if engine_core_outputs.scheduler_stats is not None:
                    engine_core_outputs.scheduler_stats.specextend_counts = counts
        return outputs


class SpecExtendStatLogger(AggregateStatLoggerBase):
    """The method's stat logger: Prometheus counters `vllm:specextend_*` (labels
    `model_name` and `engine`, as vLLM's) and a line in vLLM's periodic stats log, from the
    counts each step's SchedulerStats carries. Does nothing where the engine does not run
    the method. vLLM loads it from the `vllm.stat_logger_plugins` entry point for
    `AsyncLLM` (`vllm serve`), and `OfflineEngineLogsSpecExtendStats` gives it to `LLM`."""

    def __init__(self, vllm_config: VllmConfig, engine_indexes: list[int] | None = None):
        self.vllm_config = vllm_config
        self.engine_indexes = engine_indexes or [0]
        self.enabled = specextend_config(vllm_config) is not None
        self.logging = SpecExtendLogging()
        self._prom: SpecExtendProm | None = None

    def _prometheus(self) -> SpecExtendProm:
        """Built on first use, not in `__init__`: vLLM builds its own Prometheus logger
        after the plugins' loggers, and that unregisters every `vllm:` collector."""
        if self._prom is None:
            model_name = self.vllm_config.model_config.served_model_name
            labelvalues = {idx: [model_name, str(idx)] for idx in self.engine_indexes}
            self._prom = SpecExtendProm(["model_name", "engine"], labelvalues)
        return self._prom

    def log_engine_initialized(self) -> None:
        if self.enabled:
            self._prometheus()

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        if not self.enabled or scheduler_stats is None:
            return
        counts = scheduler_stats.specextend_counts
        if counts is not None:
            self._prometheus().observe(counts, engine_idx)
            self.logging.observe(counts, engine_idx)
        steps = scheduler_stats.specextend_decoding_steps
        if steps is not None:
            self._prometheus().observe_decoding_steps(steps, engine_idx)
            self.logging.observe_decoding_steps(steps, engine_idx)

    def log(self) -> None:
        self.logging.log(logger.info)


class StatLoggerOverrides(VllmOverrides):
    target = AggregateStatLoggerBase
    subclass = "specextend_vllm.patches.metrics:SpecExtendStatLogger"
    methods = ("__init__", "log_engine_initialized", "record", "log")


class AsyncOutputOverrides(VllmOverrides):
    target = AsyncModelRunnerOutput
    subclass = "specextend_vllm.patches.metrics:_AsyncOutputWithCounts"
    methods = ("__init__", "get_output")
    newer_methods = ("get_kv_connector_output",)


class OfflineEngineLogsSpecExtendStats(VllmPatch):
    """vLLM loads stat logger plugins for `AsyncLLM` only; `LLM`'s engine gets the
    method's stat logger here (used where it logs stats: `disable_log_stats=False`)."""

    target = LLMEngine
    attribute = "__init__"

    @staticmethod
    def replacement(self: Any, *args: Any, **kwargs: Any) -> None:
        original = OfflineEngineLogsSpecExtendStats.original
        call = inspect.signature(original).bind(self, *args, **kwargs)
        stat_loggers = list(call.arguments.get("stat_loggers") or [])
        if specextend_config(call.arguments["vllm_config"]) is not None and (
            SpecExtendStatLogger not in stat_loggers
        ):
            call.arguments["stat_loggers"] = [*stat_loggers, SpecExtendStatLogger]
        original(*call.args, **call.kwargs)


class WorkerReportsRetrievalStats(VllmPatch):
    """Adds the worker method that `specextend_vllm.retrieval_stats` calls by name through
    `collective_rpc` (a name needs no pickling across processes)."""

    target = WorkerBase
    attribute = "specextend_retrieval_stats"
    adds = True

    @staticmethod
    def replacement(self: Any) -> dict[str, Any]:
        drafter = getattr(self.model_runner, "drafter", None)
        metrics = getattr(drafter, "metrics", None)
        if metrics is None:
            return {}
        return {
            **metrics.summary(),
            "tracked_requests": drafter.num_tracked_requests(),
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


class TimeSampling(VllmPatch):
    """Times the sampling of each step (with trees: acceptance and the KV moves)."""

    target = gpu_model_runner.GPUModelRunner
    attribute = "_sample"

    @staticmethod
    def replacement(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _step_timer(self).sample():
            return TimeSampling.original(self, *args, **kwargs)


class TimeDraftProposal(VllmPatch):
    """Times the whole proposal, each draft pass through hooks on the draft model, and the
    retrieval planner's work (the working copies of a prompt are built during the draft's
    passes, so their time counts there too)."""

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
        planner = getattr(self.drafter, "planner", None)
        if planner is not None and not getattr(planner, "_specextend_timed", False):
            timer.time_method(planner, "plan", "retrieval_s")
            timer.time_method(planner, "_chunk_scores", "chunk_scores_s")
            timer.time_method(planner.working_copies, "build", "working_copies_s")
            planner._specextend_timed = True
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
