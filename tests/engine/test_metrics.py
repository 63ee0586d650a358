"""The method's counts reach vLLM's front end: Prometheus counters `vllm:specextend_*` next
to vLLM's `vllm:spec_decode_*` (read by `LLM.get_metrics()`, served on `/metrics`) and a line
in vLLM's periodic stats log, equal to the worker's own totals (`retrieval_stats`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from specextend_vllm import retrieval_stats
from specextend_vllm.metrics_exporters import DECODING_STEP_COUNTERS, PROMETHEUS_COUNTERS
from specextend_vllm.patches import metrics as metrics_patches
from tests.harness import BLOCK_SIZE, generate_ids, on_engine, random_prompts, specextend_config

pytestmark = pytest.mark.engine

# One request below the activation length (full draft steps), two above it.
PROMPT_LENGTHS = [40, 300, 520]
MAX_TOKENS = 16


class LogLines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: object) -> None:
        self.lines.append(message % args)


@pytest.fixture(scope="module")
def front_end(tiny_models: dict[str, Path]) -> dict[str, Any]:
    """One engine's Prometheus samples, vLLM's spec-decode ones, the worker's totals and the
    method's log lines (those vLLM logged while it ran, and one more at the end)."""
    log = LogLines()

    def run(llm: Any) -> dict[str, Any]:
        generate_ids(llm, random_prompts(PROMPT_LENGTHS), MAX_TOKENS)
        for _ in range(2):
            generate_ids(llm, random_prompts([4 * BLOCK_SIZE]), MAX_TOKENS)
        llm.llm_engine.do_log_stats()
        samples = llm.get_metrics()
        specextend = {
            m.name: m
            for m in samples
            if m.name.startswith("vllm:specextend_") and "batch_sizes" not in m.labels
        }
        labels = specextend["vllm:specextend_scorer_seconds"].labels
        return {
            "specextend": specextend,
            "scorer_seconds": REGISTRY.get_sample_value(
                "vllm:specextend_scorer_seconds_total", labels
            ),
            "spec_decode": {
                m.name: m for m in samples if m.name.startswith("vllm:spec_decode_num_drafts")
            },
            "decoding_steps": [m for m in samples if "batch_sizes" in m.labels],
            "stats": retrieval_stats(llm)[0],
        }

    # Deferring the draft's prefill skips the prefill step, and the first drafting step
    # catches up, through a window on the longest prompt; a prompt of whole blocks decoded
    # again copies the draft's KV of the last block vLLM computes again: every counter moves.
    config = specextend_config(
        tiny_models["draft_noisy"],
        positions="compact",
        draft_prefill="deferred",
        draft_prefill_window=64,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metrics_patches, "logger", log)
        result = on_engine(tiny_models["target"], config, run)
    return {**result, "log": log.lines}


def test_every_counter_reaches_the_front_end_next_to_vllms(front_end: dict[str, Any]) -> None:
    specextend = front_end["specextend"]
    assert sorted(specextend) == sorted(name for name, _ in PROMETHEUS_COUNTERS.values())
    counts = {name: metric.value for name, metric in specextend.items()}
    # Steps not drafted for the draft's prompt work need `drafting: auto` to weigh it
    # (`test_dynamic_speculation.py` reads that count); every other counter moves here.
    unmoved = {"vllm:specextend_unrepaid_drafting_steps"}
    moved = [name for name in counts.keys() - unmoved if "seconds" not in name]
    assert all(counts[name] > 0 for name in moved), counts
    assert front_end["scorer_seconds"] > 0
    [num_drafts] = front_end["spec_decode"].values()
    assert num_drafts.value > 0
    assert all(metric.labels == num_drafts.labels for metric in specextend.values())
    decoding_steps = front_end["decoding_steps"]
    assert {m.name for m in decoding_steps} == {n for n, _ in DECODING_STEP_COUNTERS.values()}
    assert all(
        m.labels.keys() == num_drafts.labels.keys() | {"batch_sizes", "num_drafts", "next_drafts"}
        and m.labels["engine"] == num_drafts.labels["engine"]
        for m in decoding_steps
    )


def test_the_front_end_counts_equal_the_workers_totals(front_end: dict[str, Any]) -> None:
    value = {name: front_end["specextend"][name].value for name, _ in PROMETHEUS_COUNTERS.values()}
    stats = front_end["stats"]
    for count in (
        "retrievals",
        "reduced_draft_steps",
        "compact_draft_steps",
        "full_draft_steps",
        "scorer_calls",
        "hybrid_verifications",
        "native_verifications",
        "kernel_decode_steps",
        "reduced_verified_drafts",
        "reduced_accepted_drafts",
        "full_verified_drafts",
        "full_accepted_drafts",
        "skipped_draft_steps",
        "catch_up_passes",
        "catch_up_tokens",
        "copied_prompt_tokens",
        "windowed_prompt_tokens",
        "prompt_pass_tokens",
        "unrepaid_drafting_steps",
    ):
        assert value[f"vllm:specextend_{count}"] == stats[count], count
    reduced = stats["reduced_draft_steps"]
    assert value["vllm:specextend_kept_tokens"] == pytest.approx(
        stats["mean_kept_tokens"] * reduced
    )
    assert value["vllm:specextend_context_tokens"] == pytest.approx(
        stats["mean_context_tokens"] * reduced
    )
    assert front_end["scorer_seconds"] == pytest.approx(stats["scorer_seconds"])


def test_the_periodic_log_lines_add_up_to_the_totals(front_end: dict[str, Any]) -> None:
    lines = [line for line in front_end["log"] if "SpecExtend metrics" in line]
    assert lines and all(line.startswith("Engine 000: SpecExtend metrics: ") for line in lines)
    logged = sum(int(re.search(r"Retrievals: (\d+)", line).group(1)) for line in lines)
    assert logged == front_end["stats"]["retrievals"]
