"""The ordered list of declarative patches, and their installation."""

from __future__ import annotations

from vllm.platforms import current_platform

from specextend_vllm.patches import (
    config,
    entrypoints,
    metrics,
    quantization,
    runner,
    sampler,
    scheduler,
)
from specextend_vllm.patches.base import VllmPatch
from specextend_vllm.profiling import step_timings_enabled

PATCHES: tuple[type[VllmPatch], ...] = (
    runner.ProposerOverrides,
    metrics.StatLoggerOverrides,
    metrics.AsyncOutputOverrides,
    config.SpeculativeConfigFromDict,
    config.EngineConfigCarriesSpecExtend,
    config.V1ModelRunnerForSpecExtend,
    entrypoints.ServeReportsConfigErrors,
    entrypoints.TreesRefuseUnsupportedSamplingParams,
    runner.ProposerForSpecExtend,
    runner.RequestLifecycle,
    runner.DraftsPastTrainedLength,
    runner.WorkerReconfiguresSpecExtend,
    runner.TreePositionsAndMasks,
    runner.TreeSampling,
    scheduler.SchedulerLeavesWorkingCopyBlocks,
    scheduler.SchedulerOutputCarriesBlockTwins,
    scheduler.SchedulerOutputCarriesUnrepaidDrafting,
    scheduler.SchedulerPreparesDrafting,
    scheduler.SchedulerWeighsPromptWork,
    scheduler.SchedulerLearnsAnswerLengths,
    scheduler.SchedulerMeasuresDrafting,
    metrics.WorkerReportsRetrievalStats,
    metrics.RunnerOutputCarriesCounts,
    metrics.SchedulerStatsCarryCounts,
    metrics.SchedulerStatsCarryDecodingSteps,
    metrics.RunnerSendsNewCounts,
    metrics.SchedulerForwardsNewCounts,
    metrics.OfflineEngineLogsSpecExtendStats,
)

STEP_TIMING_PATCHES: tuple[type[VllmPatch], ...] = (
    metrics.TimeTargetForward,
    metrics.TimeSampling,
    metrics.TimeDraftProposal,
    metrics.WorkerReportsStepTimings,
)

CPU_PATCHES: tuple[type[VllmPatch], ...] = (
    sampler.ExpandBatchToTokensOnCpu,
    quantization.Int8LayersOfFp32ModelsOnOneDnn,
)

ALL_PATCHES = PATCHES + STEP_TIMING_PATCHES + CPU_PATCHES


def patches_for_this_process() -> tuple[type[VllmPatch], ...]:
    patches = PATCHES + (STEP_TIMING_PATCHES if step_timings_enabled() else ())
    return patches + (CPU_PATCHES if current_platform.is_cpu() else ())


def apply_all() -> None:
    """Checks every target first, so that a missing one leaves vLLM unpatched."""
    patches = patches_for_this_process()
    for patch in patches:
        if not patch.is_applied():
            patch.check_target()
    for patch in patches:
        patch.apply()
