"""A step's counts on their way to vLLM's front end: from the worker's step output, through
the scheduler's stats and their transports, to the stat logger's Prometheus counters."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.metrics.prometheus import unregister_vllm_metrics
from vllm.v1.metrics.reader import get_metrics_snapshot
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from specextend_vllm import register
from specextend_vllm.metrics import DecodingSteps, RetrievalMetrics, SpecExtendCounts
from specextend_vllm.metrics_exporters import DECODING_STEP_COUNTERS, PROMETHEUS_COUNTERS
from specextend_vllm.patches.metrics import (
    RunnerSendsNewCounts,
    SchedulerForwardsNewCounts,
    SpecExtendStatLogger,
)
from specextend_vllm.patches.scheduler import hand_over_decoding_steps

STEP = SpecExtendCounts(retrievals=2, reduced_draft_steps=3, kept_tokens=300, scorer_seconds=0.5)


@pytest.fixture(autouse=True, scope="module")
def plugin_registered() -> None:
    """The carriers' fields exist once the plugin is registered (before msgspec first
    decodes vLLM's outputs, as at vLLM's start)."""
    register()


def runner_output() -> ModelRunnerOutput:
    return ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0})


def scheduler_stats(counts: SpecExtendCounts | None) -> SchedulerStats:
    stats = SchedulerStats()
    stats.specextend_counts = counts
    return stats


def decoding_steps() -> DecodingSteps:
    """A plain step of one request, and two of 4 requests verifying 3 drafts each, the
    second then drafting none."""
    steps = DecodingSteps()
    steps.record(batch_size=1, num_drafts=0, next_drafts=0, seconds=0.25, tokens=1)
    steps.record(batch_size=4, num_drafts=3, next_drafts=3, seconds=0.5, tokens=10)
    steps.record(batch_size=4, num_drafts=3, next_drafts=0, seconds=0.75, tokens=12)
    return steps


def test_the_carriers_default_to_no_counts() -> None:
    assert runner_output().specextend_counts is None
    assert SchedulerStats().specextend_counts is None
    assert SchedulerStats().specextend_decoding_steps is None


def test_a_steps_counts_survive_pickling_from_a_worker_process() -> None:
    output = runner_output()
    output.specextend_counts = STEP
    assert pickle.loads(pickle.dumps(output)).specextend_counts == STEP


def test_a_steps_counts_survive_msgspec_from_the_engine_core_to_the_front_end() -> None:
    encoded = MsgpackEncoder().encode(EngineCoreOutputs(scheduler_stats=scheduler_stats(STEP)))
    decoded = MsgpackDecoder(EngineCoreOutputs).decode(encoded)
    assert decoded.scheduler_stats.specextend_counts == STEP


def test_decoding_steps_survive_msgspec_from_the_engine_core_to_the_front_end() -> None:
    stats = SchedulerStats()
    stats.specextend_decoding_steps = decoding_steps()
    encoded = MsgpackEncoder().encode(EngineCoreOutputs(scheduler_stats=stats))
    decoded = MsgpackDecoder(EngineCoreOutputs).decode(encoded)
    assert decoded.scheduler_stats.specextend_decoding_steps == decoding_steps()


class FinishedAsyncOutput(AsyncModelRunnerOutput):
    def get_output(self) -> ModelRunnerOutput:
        return runner_output()

    def get_kv_connector_output(self) -> None:
        return None


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_runner_sends_the_counts_since_its_last_step(
    monkeypatch: pytest.MonkeyPatch, asynchronous: bool
) -> None:
    def sample_tokens(runner: Any, grammar_output: Any) -> Any:
        return FinishedAsyncOutput() if asynchronous else runner_output()

    def step_output(runner: Any) -> ModelRunnerOutput:
        output = RunnerSendsNewCounts.replacement(runner, None)
        return output.get_output() if asynchronous else output

    monkeypatch.setattr(RunnerSendsNewCounts, "original", sample_tokens)
    metrics = RetrievalMetrics()
    runner = SimpleNamespace(drafter=SimpleNamespace(metrics=metrics))
    metrics.record_scoring(0.5)
    assert step_output(runner).specextend_counts == SpecExtendCounts(
        scorer_calls=1, scorer_seconds=0.5
    )
    assert step_output(runner).specextend_counts is None
    assert step_output(SimpleNamespace()).specextend_counts is None  # no speculation


def test_the_scheduler_puts_a_steps_counts_into_that_steps_stats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def update_from_output(scheduler: Any, *args: Any) -> dict[int, EngineCoreOutputs]:
        return {0: EngineCoreOutputs(), 1: EngineCoreOutputs(scheduler_stats=SchedulerStats())}

    monkeypatch.setattr(SchedulerForwardsNewCounts, "original", update_from_output)
    output = runner_output()
    output.specextend_counts = STEP
    outputs = SchedulerForwardsNewCounts.replacement(None, None, output)
    assert outputs[0].scheduler_stats is None
    assert outputs[1].scheduler_stats.specextend_counts == STEP


def test_the_scheduler_hands_its_decoding_steps_to_the_first_stats_it_makes() -> None:
    """Steps timed while vLLM made no stats wait for the next stats; once handed over,
    they are counted afresh (kept, the next stats would count them twice)."""
    scheduler = SimpleNamespace(_specextend_decoding_steps=decoding_steps())
    without_stats = {0: EngineCoreOutputs()}
    hand_over_decoding_steps(scheduler, without_stats)
    assert without_stats[0].scheduler_stats is None
    outputs = {0: EngineCoreOutputs(), 1: EngineCoreOutputs(scheduler_stats=SchedulerStats())}
    hand_over_decoding_steps(scheduler, outputs)
    assert outputs[1].scheduler_stats.specextend_decoding_steps == decoding_steps()
    assert scheduler._specextend_decoding_steps.is_empty()
    later = {0: EngineCoreOutputs(scheduler_stats=SchedulerStats())}
    hand_over_decoding_steps(scheduler, later)
    assert later[0].scheduler_stats.specextend_decoding_steps is None


def engine_config(runs_specextend: bool) -> Any:
    return SimpleNamespace(
        additional_config={"specextend": {}} if runs_specextend else {},
        model_config=SimpleNamespace(served_model_name="tiny"),
    )


@pytest.fixture
def prometheus_registry() -> Iterator[None]:
    unregister_vllm_metrics()
    yield
    unregister_vllm_metrics()


def specextend_samples() -> dict[tuple[str, str], float]:
    """(name, engine label) -> value of the `vllm:specextend_*` counters, as
    `LLM.get_metrics()` reads them."""
    return {
        (metric.name, metric.labels["engine"]): metric.value
        for metric in get_metrics_snapshot()
        if metric.name.startswith("vllm:specextend_")
    }


def test_the_stat_logger_counts_each_engines_steps(prometheus_registry: None) -> None:
    stat_logger = SpecExtendStatLogger(engine_config(True), engine_indexes=[0, 1])
    stat_logger.log_engine_initialized()
    assert set(specextend_samples().values()) == {0}
    assert len(specextend_samples()) == 2 * len(PROMETHEUS_COUNTERS)
    stat_logger.record(scheduler_stats(STEP), None, engine_idx=1)
    stat_logger.record(scheduler_stats(STEP), None, engine_idx=1)
    stat_logger.record(scheduler_stats(None), None, engine_idx=0)
    stat_logger.record(None, None, engine_idx=0)
    samples = specextend_samples()
    assert samples[("vllm:specextend_retrievals", "1")] == 4
    assert samples[("vllm:specextend_reduced_draft_steps", "1")] == 6
    assert samples[("vllm:specextend_kept_tokens", "1")] == 600
    assert samples[("vllm:specextend_scorer_seconds", "1")] == 1.0
    assert samples[("vllm:specextend_retrievals", "0")] == 0


def test_each_count_reaches_the_counter_named_after_it(prometheus_registry: None) -> None:
    """Every field of a step's counts, each a different value, in `vllm:specextend_<field>`
    (two fields' counters swapped, or a field read into another's, fails here)."""
    stat_logger = SpecExtendStatLogger(engine_config(True), engine_indexes=[0])
    stat_logger.log_engine_initialized()
    values = {field: index + 1 for index, field in enumerate(PROMETHEUS_COUNTERS)}
    stat_logger.record(scheduler_stats(SpecExtendCounts(**values)), None, engine_idx=0)
    assert specextend_samples() == {
        (f"vllm:specextend_{field}", "0"): value for field, value in values.items()
    }


def test_decoding_steps_reach_counters_labelled_by_batch_sizes_and_drafts(
    prometheus_registry: None,
) -> None:
    stat_logger = SpecExtendStatLogger(engine_config(True), engine_indexes=[0, 1])
    stat_logger.log_engine_initialized()
    stats = SchedulerStats()
    stats.specextend_decoding_steps = decoding_steps()
    stat_logger.record(stats, None, engine_idx=1)
    stat_logger.record(stats, None, engine_idx=1)
    samples = {
        (sample.name, sample.labels["engine"], sample.labels["batch_sizes"],
         sample.labels["num_drafts"], sample.labels["next_drafts"]): sample.value
        for family in REGISTRY.collect()
        if family.name in {name for name, _ in DECODING_STEP_COUNTERS.values()}
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert samples == {
        ("vllm:specextend_decoding_steps_total", "1", "1", "0", "0"): 2,
        ("vllm:specextend_decoding_step_seconds_total", "1", "1", "0", "0"): 0.5,
        ("vllm:specextend_decoding_step_tokens_total", "1", "1", "0", "0"): 2,
        ("vllm:specextend_decoding_steps_total", "1", "4-7", "3", "3"): 2,
        ("vllm:specextend_decoding_step_seconds_total", "1", "4-7", "3", "3"): 1.0,
        ("vllm:specextend_decoding_step_tokens_total", "1", "4-7", "3", "3"): 20,
        ("vllm:specextend_decoding_steps_total", "1", "4-7", "3", "0"): 2,
        ("vllm:specextend_decoding_step_seconds_total", "1", "4-7", "3", "0"): 1.5,
        ("vllm:specextend_decoding_step_tokens_total", "1", "4-7", "3", "0"): 24,
    }


def test_the_stat_logger_does_nothing_for_an_engine_without_the_method(
    prometheus_registry: None,
) -> None:
    stat_logger = SpecExtendStatLogger(engine_config(False), engine_indexes=[0])
    stat_logger.log_engine_initialized()
    stat_logger.record(scheduler_stats(STEP), None)
    stat_logger.log()
    assert specextend_samples() == {}
